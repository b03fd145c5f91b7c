"""Checkpoints users name that the offline catalog lacked until stop 67: Qwen2.5-Coder 0.5B-14B, Qwen3-Embedding,
the embedding encoders (BGE, E5, MiniLM, MPNet), mT5 and BART, BLOOM 1B1-7B1, StarCoder2-15B, Mistral-Large,
Command-R, OLMoE, Granite 3.3, DeepSeek-V2-Lite, GLM-4 9B / GLM-4.6, Phi-4-reasoning and LFM2. Each resolves offline,
counts what transformers builds (or, for mT5, loads) from its config, and matches the total its publisher states."""

from __future__ import annotations

import pytest
from helpers import meta_total

from perfguide import ModelSpec
from perfguide.errors import InvalidModelError
from perfguide.model.catalog import config_of, lookup

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# (hub id, published total, how close): model cards and READMEs; 0 means the publisher states the exact count
PUBLISHED = [
    ("Qwen/Qwen2.5-Coder-0.5B", 0.49e9, 0.03),             # card: "Number of Parameters: 0.49B"
    ("Qwen/Qwen2.5-Coder-1.5B", 1.54e9, 0.03),             # card: "Number of Parameters: 1.54B"
    ("Qwen/Qwen2.5-Coder-3B", 3.09e9, 0.03),               # card: "Number of Parameters: 3.09B"
    ("Qwen/Qwen2.5-Coder-14B", 14.7e9, 0.03),              # card: "Number of Parameters: 14.7B"
    ("Qwen/Qwen3-Embedding-0.6B", 0.6e9, 0.03), ("Qwen/Qwen3-Embedding-4B", 4e9, 0.03),   # the cards' series table
    ("bigscience/bloom-1b1", 1_065_314_304, 0),            # card: "1,065,314,304 parameters"
    ("bigscience/bloom-3b", 3_002_557_440, 0),             # card: "3,002,557,440 parameters"
    ("stabilityai/stablelm-2-1_6b", 1.6e9, 0.03),          # card: "a 1.6 billion parameter decoder-only language model"
    ("mistralai/Mistral-Large-Instruct-2411", 123e9, 0.03),  # card: "dense Large Language Model (LLM) of 123B parameters"
    ("CohereForAI/c4ai-command-r-v01", 35e9, 0.03),        # card: "a 35 billion parameter highly performant generative model"
    ("allenai/OLMoE-1B-7B-0924", 7e9, 0.03),               # transformers' OLMoE page: "7B parameters but only 1B ... per input token"
    ("ibm-granite/granite-3.3-8b-instruct", 8e9, 0.03),    # card: "a 8-billion parameter 128K context length"
    ("deepseek-ai/DeepSeek-V2-Lite", 16e9, 0.03),          # card: "16B total params, 2.4B active params"
    ("google/mt5-small", 300e6, 0.03), ("google/mt5-base", 580e6, 0.03),   # the mT5 paper (arXiv:2010.11934): 300M / 580M / 1.2B / 3.7B
    ("google/mt5-large", 1.2e9, 0.03), ("google/mt5-xl", 3.7e9, 0.03),
    ("facebook/bart-base", 140e6, 0.03), ("facebook/bart-large", 400e6, 0.03),  # fairseq's BART README
    ("google/electra-base-discriminator", 110e6, 0.03),   # google-research/electra README: "110M"
    ("distilbert/distilroberta-base", 82e6, 0.03),         # transformers' distillation README: "82M parameters"
    ("albert/albert-base-v2", 11e6, 0.03),                 # transformers' ALBERT docs: "11M parameters"
    ("LiquidAI/LFM2-350M", 354_483_968, 0), ("LiquidAI/LFM2-700M", 742_489_344, 0),   # cards: exact counts
    ("LiquidAI/LFM2-1.2B", 1_170_340_608, 0),
]
#: mT5's config class ties the head in a bare build (transformers 5.x forces tie_word_embeddings); its checkpoints load untied
MT5 = {"google/mt5-small", "google/mt5-base", "google/mt5-large", "google/mt5-xl"}
BUILT = [p[0] for p in PUBLISHED if p[0] not in MT5] + [
    "Qwen/Qwen3-Embedding-8B", "bigscience/bloom-1b7", "bigscience/bloom-7b1", "bigcode/starcoder2-15b", "Salesforce/codegen-350M-mono",
    "ibm-granite/granite-3.3-2b-instruct", "zai-org/GLM-4-9B-0414", "zai-org/GLM-4.6", "microsoft/Phi-4-reasoning-plus",
    "facebook/bart-large-cnn", "BAAI/bge-m3", "BAAI/bge-large-en-v1.5", "BAAI/bge-base-en-v1.5", "BAAI/bge-small-en-v1.5",
    "sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-mpnet-base-v2", "intfloat/e5-large-v2",
    "intfloat/multilingual-e5-large"]


@pytest.mark.parametrize(("hub", "total", "rel"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_totals_match_what_the_publisher_states(hub: str, total: float, rel: float) -> None:
    spec = ModelSpec.from_any(hub)
    assert spec.source == "catalog"
    assert spec.total_params == (total if rel == 0 else pytest.approx(total, rel=rel))


@pytest.mark.parametrize("hub", BUILT)
def test_counts_equal_the_module_transformers_builds(hub: str) -> None:
    assert ModelSpec.from_any(hub).total_params == meta_total(hub)


def test_mt5_counts_the_separate_head_its_checkpoints_load(tmp_path) -> None:
    """MT5Config forces tie_word_embeddings=True, so a bare build shares lm_head with the embedding; mT5's checkpoints
    store a separate head, and from_pretrained keeps both when they differ. A tiny checkpoint saved that way, loaded by
    transformers, has the untied count perfguide gives google/mt5-base (one vocab x d_model matrix above the build)."""
    from safetensors.torch import save_file

    cfg = transformers.MT5Config(vocab_size=96, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2)
    weights = {k: v.clone() for k, v in transformers.MT5ForConditionalGeneration(cfg).state_dict().items()}
    weights["lm_head.weight"] = torch.randn_like(weights["lm_head.weight"])
    cfg.save_pretrained(tmp_path)
    save_file(weights, str(tmp_path / "model.safetensors"))
    loaded = transformers.MT5ForConditionalGeneration.from_pretrained(tmp_path)
    built = transformers.MT5ForConditionalGeneration(cfg)
    assert sum(p.numel() for p in loaded.parameters()) - sum(p.numel() for p in built.parameters()) == 96 * 16
    config = config_of("google/mt5-base")
    assert ModelSpec.from_any("google/mt5-base").total_params == meta_total("google/mt5-base") + config["vocab_size"] * config["d_model"]


def test_embedding_checkpoints_price_the_module_automodel_loads() -> None:
    """Qwen3-Embedding's config.json names Qwen3ForCausalLM, but its card encodes with AutoModel (Qwen3Model, the last
    token's hidden state pooled): the entries price that module, a forward with no LM head (all-mpnet-base-v2 likewise). For the 8B, whose head is
    untied, the causal-LM class transformers builds from the same config holds one vocab x hidden matrix more."""
    for hub in ("Qwen/Qwen3-Embedding-0.6B", "Qwen/Qwen3-Embedding-4B", "Qwen/Qwen3-Embedding-8B"):
        spec = ModelSpec.from_any(hub)
        assert config_of(hub)["architectures"] == ["Qwen3Model"] and not spec.generates, hub
    # all-mpnet-base-v2's file names MPNetForMaskedLM; sentence-transformers loads it with AutoModel (MPNetModel)
    assert config_of("sentence-transformers/all-mpnet-base-v2")["architectures"] == ["MPNetModel"]
    config = {k: v for k, v in config_of("Qwen/Qwen3-Embedding-8B").items() if k not in ("architectures", "_name_or_path")}
    with torch.device("meta"):
        causal = transformers.Qwen3ForCausalLM._from_config(transformers.AutoConfig.for_model(**config))
    head = config["vocab_size"] * config["hidden_size"]
    assert not config["tie_word_embeddings"] and head == 621_219_840
    assert sum(p.numel() for p in causal.parameters()) - ModelSpec.from_any("Qwen/Qwen3-Embedding-8B").total_params == head


def test_lfm2_width_is_read_from_block_ff_dim() -> None:
    """LiquidAI's config.json writes the MLP width only as block_ff_dim, which Lfm2Config pops into intermediate_size
    (and LFM2's MLP then shrinks to 2/3, rounded to block_multiple_of); without it the class would build its default."""
    config = {k: v for k, v in config_of("LiquidAI/LFM2-1.2B").items() if k != "_name_or_path"}
    assert "intermediate_size" not in config and config["block_ff_dim"] == 12288
    assert ModelSpec.from_any(config).total_params == 1_170_340_608
    with pytest.raises(InvalidModelError, match="intermediate_size"):
        ModelSpec.from_any({k: v for k, v in config.items() if k != "block_ff_dim"})


@pytest.mark.parametrize(("name", "hub"), [
    ("deepseek-ai/DeepSeek-R1-0528", "deepseek-ai/DeepSeek-R1"),   # the same config.json (tt-metal's vendored copy)
    ("microsoft/Phi-4-reasoning", "microsoft/Phi-4-reasoning-plus"),
    ("bigscience/bloomz-7b1", "bigscience/bloom-7b1"),            # BLOOM-7b1 fine-tuned on xP3, the same config.json shape
    ("Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-1.5B"),
    ("ibm-granite/granite-3.3-8b-base", "ibm-granite/granite-3.3-8b-instruct"),
    ("bge-m3", "BAAI/bge-m3"), ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"),
])
def test_releases_and_short_names_resolve_to_their_entry(name: str, hub: str) -> None:
    assert lookup(name) == hub


def test_moe_entries_count_their_active_experts() -> None:
    """OLMoE routes 8 of 64 experts per token ("1B active", its name); DeepSeek-V2-Lite 6 of 64 plus 2 shared."""
    olmoe, lite = ModelSpec.from_any("allenai/OLMoE-1B-7B-0924"), ModelSpec.from_any("deepseek-ai/DeepSeek-V2-Lite")
    assert olmoe.is_moe and 1.0e9 < olmoe.active_params < 1.4e9
    assert lite.is_moe and lite.active_params < 0.2 * lite.total_params
