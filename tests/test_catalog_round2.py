"""Checkpoints users name that the offline catalog lacked until stop 68, found by trying 100 popular Hub ids offline (74
were refused): Qwen1.5 / Qwen2-72B / Qwen2-57B-A14B, Qwen3's 2507 releases and quantized repos, Llama-3.2-Vision,
DeepSeek-V2 / V2.5 and the coder models, Phi-3.5-MoE, Kimi-K2's later releases, Moonlight, BLOOM-176B, OPT-66B,
Falcon-180B, Falcon3, Falcon-H1, Granite 3.0 / 4.0-H-Tiny, OLMo and Olmo 3, Yi-1.5-34B, GPT-Neo, StableLM-3B,
CodeLlama-70B, MedGemma, Cerebras-GPT, and the aliases whose config.json equals an entry's. Each
resolves offline, counts what transformers builds from its config, and matches the total its publisher states."""

from __future__ import annotations

import pytest
from helpers import meta_total

from perfguide import ModelSpec
from perfguide.model.catalog import config_of, lookup
from perfguide.model.quantized import checkpoint_format

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# (hub id, published total, how close, published active or None): model cards, papers and the publishers' tables
PUBLISHED = [
    ("Qwen/Qwen2-72B", 72.71e9, 0.001, None),                   # Qwen2 blog's table: "72.71 B total"
    ("Qwen/Qwen2-57B-A14B", 57.41e9, 0.001, 14e9),             # same table: "57.41 B total"; the name: 14B active
    ("Qwen/Qwen1.5-110B", 111.21e9, 0.001, None),               # the Open LLM Leaderboard's request file: 111.21
    ("Qwen/Qwen1.5-14B", 14.167e9, 0.001, None),                # the leaderboard's request file: 14.167
    ("Qwen/Qwen3-235B-A22B-Instruct-2507", 235e9, 0.03, 22e9),  # card: "235B in total and 22B activated"
    ("meta-llama/Llama-3.2-11B-Vision-Instruct", 10.6e9, 0.03, None),   # card's table: "11B (10.6)"
    ("meta-llama/Llama-3.2-90B-Vision-Instruct", 88.8e9, 0.03, None),   # card's table: "90B (88.8)"
    ("mistralai/Mistral-Small-Instruct-2409", 22e9, 0.03, None),        # card: "22B parameters"
    ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", 24e9, 0.005, None),   # card: "24B parameters" (untied, as loaded)
    ("deepseek-ai/DeepSeek-V2", 236e9, 0.03, 21e9),            # card: "236B total parameters, of which 21B are activated"
    ("microsoft/Phi-3.5-MoE-instruct", 41.9e9, 0.03, 6.6e9),   # card: 41.9B; "6.6B active parameters"
    ("moonshotai/Moonlight-16B-A3B-Instruct", 16e9, 0.03, None),   # NeMo's page: "16B total parameters"
    ("moonshotai/Kimi-K2-Instruct-0905", 1e12, 0.03, 32e9),    # card: "1 trillion parameters", 32B activated
    ("bigscience/bloom", 176_247_271_424, 0, None),            # card: "176,247,271,424 parameters"
    ("stabilityai/stablelm-3b-4e1t", 2_795_443_200, 0, None),  # card's table: "2,795,443,200"
    ("microsoft/Phi-3-mini-128k-instruct", 3_821_079_552, 0, None),  # keras-hub's preset: 3821079552
    ("tiiuae/falcon-180B", 180e9, 0.03, None),                 # card: "a 180B parameters causal decoder-only model"
    ("facebook/opt-66b", 66e9, 0.03, None),                    # the OPT paper's Table 1
    ("deepseek-ai/deepseek-llm-67b-base", 67e9, 0.03, None),   # the DeepSeek LLM paper's 67B
    ("deepseek-ai/deepseek-coder-33b-instruct", 33e9, 0.03, None),   # DeepSeek-Coder README: 33B
    ("cerebras/Cerebras-GPT-1.3B", 1.316e9, 0.001, None),      # a model table: "1,316 M params"
    ("EleutherAI/gpt-neo-2.7B", 2_651_307_520, 0, None),       # a derived checkpoint's safetensors count, same tensors
    ("codellama/CodeLlama-70b-hf", 70e9, 0.03, None),          # Meta's "Code Llama 70B"
    ("google/medgemma-27b-text-it", 27e9, 0.03, None),         # card: "27B text-only"
]
BUILT = [p[0] for p in PUBLISHED] + [
    "Qwen/Qwen1.5-0.5B", "Qwen/Qwen1.5-1.8B", "Qwen/Qwen1.5-4B", "Qwen/Qwen1.5-7B", "Qwen/Qwen1.5-32B", "Qwen/Qwen1.5-72B",
    "Qwen/Qwen2.5-VL-72B-Instruct", "Qwen/Qwen3-30B-A3B-FP8", "nvidia/Mistral-NeMo-Minitron-8B-Base", "deepseek-ai/DeepSeek-V2.5",
    "deepseek-ai/deepseek-coder-1.3b-instruct", "EleutherAI/gpt-neo-125m", "EleutherAI/gpt-neo-1.3B", "allenai/OLMo-1B-hf",
    "allenai/OLMo-7B-hf", "01-ai/Yi-1.5-34B", "microsoft/Phi-3-medium-128k-instruct", "tiiuae/Falcon-H1-7B-Base",
    "tiiuae/Falcon-H1-1.5B-Base", "ibm-granite/granite-4.0-h-tiny", "allenai/Olmo-3-1025-7B", "tiiuae/Falcon3-1B-Base",
    "tiiuae/Falcon3-3B-Base", "tiiuae/Falcon3-7B-Base", "tiiuae/Falcon3-10B-Base", "ibm-granite/granite-3.0-8b-instruct",
    "ibm-granite/granite-3.0-2b-instruct", "ibm-granite/granite-3.1-2b-instruct"]
#: ids whose config.json equals an entry's (the entry's source or the model card says so): resolved to that entry
ALIASES = [
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen/Qwen3-Next-80B-A3B-Thinking"),
    ("nvidia/Llama-3.1-Nemotron-70B-Instruct-HF", "meta-llama/Llama-3.1-70B"),
    ("NousResearch/Hermes-3-Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("meta-llama/Llama-Guard-3-8B", "meta-llama/Llama-3.1-8B"),
    ("mistralai/Mistral-Small-3.2-24B-Instruct-2506", "mistralai/Mistral-Small-3.1-24B-Instruct-2503"),
    ("mistralai/Devstral-Small-2507", "mistralai/Devstral-Small-2505"),
    ("mistralai/Codestral-22B-v0.1", "mistralai/Mistral-Small-Instruct-2409"),
    ("deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-V3"), ("deepseek-ai/DeepSeek-V3.1", "deepseek-ai/DeepSeek-V3"),
    ("deepseek-ai/DeepSeek-Coder-V2-Instruct", "deepseek-ai/DeepSeek-V2"),
    ("deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct", "deepseek-ai/DeepSeek-V2-Lite"),
    ("moonshotai/Moonlight-16B-A3B", "moonshotai/Moonlight-16B-A3B-Instruct"),
    ("stabilityai/stablelm-zephyr-3b", "stabilityai/stablelm-3b-4e1t"),
    ("google/medgemma-4b-it", "google/gemma-3-4b-pt"), ("google/medgemma-27b-it", "google/gemma-3-27b-pt"),
    ("microsoft/Phi-4-mini-reasoning", "microsoft/Phi-4-mini-instruct"), ("allenai/Olmo-3-7B-Instruct", "allenai/Olmo-3-1025-7B"),
]


@pytest.mark.parametrize(("hub", "total", "rel", "active"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_totals_match_what_the_publisher_states(hub: str, total: float, rel: float, active: float | None) -> None:
    spec = ModelSpec.from_any(hub)
    assert spec.source == "catalog"
    assert spec.total_params == (total if rel == 0 else pytest.approx(total, rel=rel))
    if active is not None:
        assert spec.is_moe and spec.active_params == pytest.approx(active, rel=0.05)


@pytest.mark.parametrize("hub", BUILT)
def test_counts_equal_the_module_transformers_builds(hub: str) -> None:
    assert ModelSpec.from_any(hub).total_params == meta_total(hub)


@pytest.mark.parametrize(("alias", "entry"), ALIASES, ids=[a for a, _ in ALIASES])
def test_aliases_resolve_to_the_entry_whose_config_they_share(alias: str, entry: str) -> None:
    assert lookup(alias) == entry
    assert ModelSpec.from_any(alias).total_params == ModelSpec.from_any(entry).total_params


def test_the_2507_releases_keep_their_longer_context() -> None:
    """Qwen3-235B-A22B's 2507 cards: "262,144 natively", where the April release's config.json gives 40,960."""
    base = ModelSpec.from_any("Qwen/Qwen3-235B-A22B")
    for hub in ("Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen/Qwen3-235B-A22B-Thinking-2507"):
        spec = ModelSpec.from_any(hub)
        assert (spec.max_position_embeddings, base.max_position_embeddings) == (262_144, 40_960)
        assert spec.total_params == base.total_params
    assert ModelSpec.from_any("moonshotai/Kimi-K2-Instruct-0905").max_position_embeddings == 262_144   # card: 256K


def test_quantized_repos_keep_their_format() -> None:
    """The quantized repos price the weights they ship: Kimi-K2-Thinking's int4 routed experts (W4A16, group 32)
    where K2-Instruct ships fp8 blocks; Qwen's AWQ 72B pads its MLP to 29,696 (the base: 29,568)."""
    assert checkpoint_format(config_of("moonshotai/Kimi-K2-Thinking")) == "w4a16"
    assert checkpoint_format(config_of("moonshotai/Kimi-K2-Instruct")) == "fp8_block"
    awq = ModelSpec.from_any("Qwen/Qwen2.5-72B-Instruct-AWQ")
    assert checkpoint_format(awq.config) == "awq" and awq.intermediate_size == 29_696
    assert ModelSpec.from_any("Qwen/Qwen2.5-72B").intermediate_size == 29_568
    assert checkpoint_format(config_of("Qwen/Qwen3-30B-A3B-FP8")) == "fp8_block"


def test_mistral_small_3_1_prices_its_own_head() -> None:
    """The checkpoint holds a head of its own, which transformers 5.x's from_pretrained keeps (its config class would
    tie it in a bare build): 131,072 x 5,120 more parameters than the tied build."""
    spec = ModelSpec.from_any("mistralai/Mistral-Small-3.1-24B-Instruct-2503")
    assert not spec.tie_word_embeddings and spec.lm_head_params == 131_072 * 5_120


#: official and widely used quantized repos (extends of their base entry, with the quantization_config they publish)
QUANTIZED = [
    ("Qwen/Qwen3-4B-FP8", "Qwen/Qwen3-4B", "fp8_block"), ("Qwen/Qwen3-8B-FP8", "Qwen/Qwen3-8B", "fp8_block"),
    ("Qwen/Qwen3-14B-FP8", "Qwen/Qwen3-14B", "fp8_block"), ("Qwen/Qwen3-32B-FP8", "Qwen/Qwen3-32B", "fp8_block"),
    ("Qwen/Qwen3-4B-AWQ", "Qwen/Qwen3-4B", "awq"), ("Qwen/Qwen3-8B-AWQ", "Qwen/Qwen3-8B", "awq"),
    ("Qwen/Qwen3-14B-AWQ", "Qwen/Qwen3-14B", "awq"), ("Qwen/Qwen3-32B-AWQ", "Qwen/Qwen3-32B", "awq"),
    ("TheBloke/Llama-2-7B-GPTQ", "meta-llama/Llama-2-7b-hf", "gptq"), ("TheBloke/Llama-2-70B-GPTQ", "meta-llama/Llama-2-70b-hf", "gptq"),
    ("TheBloke/Llama-2-13B-chat-GPTQ", "meta-llama/Llama-2-13b-hf", "gptq"),
    ("hugging-quants/Meta-Llama-3.1-8B-Instruct-GPTQ-INT4", "meta-llama/Llama-3.1-8B", "gptq"),
    ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "meta-llama/Llama-3.1-70B", "awq"),
]


@pytest.mark.parametrize(("hub", "base", "fmt"), QUANTIZED, ids=[q[0] for q in QUANTIZED])
def test_quantized_repos_are_their_base_stored_quantized(hub: str, base: str, fmt: str) -> None:
    """The same shape as the base (a quantizer keeps the logical parameter count), in the format the repo ships,
    so a serving plan prices its weights at that format's bytes."""
    spec, plain = ModelSpec.from_any(hub), ModelSpec.from_any(base)
    assert spec.total_params == plain.total_params
    assert checkpoint_format(spec.config) == fmt and checkpoint_format(plain.config) is None
