"""Popular fine-tuning checkpoints in the offline catalog (CodeLlama, Vicuna, Mistral-Nemo, Phi-3.5 / Phi-3-medium,
StarCoder2, SmolLM, ModernBERT, BLOOM, Qwen2.5-Coder, Qwen1.5-MoE, DeepSeek-R1's Qwen distills): each resolves offline,
counts what transformers builds from its config on the meta device, and matches the total its publisher states."""

from __future__ import annotations

import pytest
from helpers import damaged_data, meta_total

from perfguide import ModelSpec
from perfguide.errors import InvalidModelError
from perfguide.model.catalog import config_of, lookup

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# (hub id, published total, published active or None): model cards, or the checkpoint's name (the publisher's rounding)
PUBLISHED = [
    ("codellama/CodeLlama-13b-hf", 13e9, None), ("lmsys/vicuna-13b-v1.5", 13e9, None),
    ("mistralai/Mistral-Nemo-Base-2407", 12e9, None),            # card: "a 12B model trained jointly by Mistral AI and NVIDIA"
    ("microsoft/Phi-3.5-mini-instruct", 3.8e9, None),            # card: "3.8B parameters"
    ("microsoft/Phi-3-medium-4k-instruct", 14e9, None),          # card: "14B parameters"
    ("bigcode/starcoder2-3b", 3e9, None), ("bigcode/starcoder2-7b", 7e9, None),
    ("HuggingFaceTB/SmolLM-135M", 135e6, None), ("HuggingFaceTB/SmolLM-360M", 360e6, None),
    ("HuggingFaceTB/SmolLM-1.7B", 1.7e9, None),
    ("answerdotai/ModernBERT-base", 149e6, None),                # card: "22 layers, 149 million parameters"
    ("bigscience/bloom-560m", 560e6, None),
    ("Qwen/Qwen2.5-Coder-7B", 7.61e9, None),                     # card: "Number of Parameters: 7.61B"
    ("Qwen/Qwen2.5-Coder-32B", 32.5e9, None),                    # card: "Number of Parameters: 32.5B"
    ("Qwen/Qwen1.5-MoE-A2.7B", 14.3e9, 2.7e9),                   # 14.3B total (NeMo's Qwen1.5-MoE page), A2.7B active
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", 32e9, None),
    # checkpoints whose names state their size (the publisher's rounding)
    ("mistralai/Ministral-8B-Instruct-2410", 8e9, None),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", 8e9, None), ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", 70e9, None),
    ("huggyllama/llama-13b", 13e9, None), ("01-ai/Yi-1.5-9B", 9e9, None), ("upstage/SOLAR-10.7B-v1.0", 10.7e9, None),
    ("ibm-granite/granite-3.1-8b-instruct", 8e9, None), ("google/gemma-3-270m", 270e6, None),
    ("zai-org/GLM-4.5-Air", 106e9, None),                       # transformers' GLM-4.5 page: 106B total
    ("zai-org/GLM-4.7-Flash", 30e9, None),                      # transformers' GLM-4.7-Flash page: 30B
    ("Qwen/Qwen2.5-VL-7B-Instruct", 8.29e9, None),              # the Hub's safetensors size shown on the model page
    ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", 24e9, None),
    # Devstral Small and Magistral Small: text-only fine-tunes of Mistral Small 3.1, 24B (their model cards)
    ("mistralai/Devstral-Small-2505", 24e9, None), ("mistralai/Magistral-Small-2506", 24e9, None),
    ("mistralai/Magistral-Small-2507", 24e9, None),
]
NEW = [p[0] for p in PUBLISHED] + ["codellama/CodeLlama-7b-hf", "lmsys/vicuna-7b-v1.5",
                                   *(f"deepseek-ai/DeepSeek-R1-Distill-Qwen-{s}" for s in ("1.5B", "7B", "14B")),
                                   "Qwen/Qwen3.5-0.8B", "Qwen/Qwen3.5-9B", "Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2-VL-2B-Instruct",
                                   "Qwen/Qwen2-VL-7B-Instruct", "TinyLlama/TinyLlama_v1.1", "google/codegemma-7b",
                                   "huggyllama/llama-7b", "microsoft/Phi-4-mini-instruct", "allenai/OLMo-2-0425-1B",
                                   "deepseek-ai/deepseek-llm-7b-base", "deepseek-ai/deepseek-coder-6.7b-base",
                                   "microsoft/deberta-v3-base", "microsoft/deberta-v3-large", "FacebookAI/xlm-roberta-base",
                                   "FacebookAI/xlm-roberta-large", "answerdotai/ModernBERT-large"]


@pytest.mark.parametrize(("hub", "total", "active"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_totals_match_what_the_publisher_states(hub: str, total: float, active: float | None) -> None:
    spec = ModelSpec.from_any(hub)
    assert spec.source == "catalog"
    assert spec.total_params == pytest.approx(total, rel=0.03)
    if active is not None:
        assert spec.is_moe and spec.active_params == pytest.approx(active, rel=0.03)


@pytest.mark.parametrize("hub", NEW)
def test_counts_equal_the_module_transformers_builds(hub: str) -> None:
    """perfguide's counters (Llama, Mistral, Qwen2, Phi-3 are counted by hand) against transformers' own module."""
    assert ModelSpec.from_any(hub).total_params == meta_total(hub)


@pytest.mark.parametrize(("distill", "base"), [("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "Qwen/Qwen2.5-Math-7B"),
                                               ("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "Qwen/Qwen2.5-14B"),
                                               ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "Qwen/Qwen2.5-32B")])
def test_distills_keep_their_base_models_shape(distill: str, base: str) -> None:
    """DeepSeek-R1's model card lists each distill's base model; the distill's config.json keeps its shape."""
    a, b = ModelSpec.from_any(distill), ModelSpec.from_any(base)
    assert (a.total_params, a.hidden_size, a.num_layers, a.num_key_value_heads) == (b.total_params, b.hidden_size, b.num_layers,
                                                                             b.num_key_value_heads)


@pytest.mark.parametrize(("name", "hub"), [
    ("mistralai/Mistral-Nemo-Instruct-2407", "mistralai/Mistral-Nemo-Base-2407"),
    ("codellama/CodeLlama-7b-Instruct-hf", "codellama/CodeLlama-7b-hf"),
    ("Qwen/Qwen2.5-Coder-7B-Instruct", "Qwen/Qwen2.5-Coder-7B"),
    ("Qwen/Qwen1.5-MoE-A2.7B-Chat", "Qwen/Qwen1.5-MoE-A2.7B"),
    ("HuggingFaceTB/SmolLM-1.7B-Instruct", "HuggingFaceTB/SmolLM-1.7B"),
    ("phi-3.5-mini", "microsoft/Phi-3.5-mini-instruct"),
])
def test_chat_releases_resolve_to_their_entry(name: str, hub: str) -> None:
    assert lookup(name) == hub


def test_bloom_config_with_its_legacy_width_key_is_read() -> None:
    """bigscience/bloom-560m's config.json writes its width as 'n_embed' and its heads as 'num_attention_heads';
    BloomConfig reads both (a backward-compatible kwarg and its attribute_map). A dict without a width is still refused."""
    config = {k: v for k, v in config_of("bigscience/bloom-560m").items() if k != "_name_or_path"}
    assert "n_embed" in config and "hidden_size" not in config
    assert ModelSpec.from_any(config).hidden_size == 1024
    with pytest.raises(InvalidModelError, match="hidden_size"):
        ModelSpec.from_any({k: v for k, v in config.items() if k != "n_embed"})


@pytest.mark.parametrize(("size", "hub"), [("7b", "Llama-2-7b-hf"), ("13b", "Llama-2-13b-hf"), ("135m", "SmolLM2-135M"),
                                           ("8b", "Llama-3.1-8B"), ("70b", "Llama-3.1-70B")])
def test_a_bare_size_still_means_the_base_model(size: str, hub: str) -> None:
    """CodeLlama-7b (vocab 32016) is 131,072 parameters closer to 7e9 than Llama-2-7b, and SmolLM-135M ties
    SmolLM2-135M, DeepSeek-R1-Distill-Llama-8B ties Llama-3.1-8B (and sorts first); the size rule's skip list keeps
    each bare size on the model it named before these entries."""
    from perfguide.model.catalog import catalog_file

    assert ModelSpec.from_any(size).name == f"{size} ({hub} shape)"
    assert {"codellama/CodeLlama-7b-hf", "HuggingFaceTB/SmolLM-135M",
            "deepseek-ai/DeepSeek-R1-Distill-Llama-8B"} <= set(catalog_file().size_rule.skip)


def test_a_skip_entry_the_catalog_lacks_fails_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    from perfguide import _data
    from perfguide.errors import DataFileError
    from perfguide.model.catalog import CatalogFile

    edit = lambda raw: raw["size_rule"]["skip"].append("codellama/CodeLlama-9b-hf")  # noqa: E731
    with damaged_data(monkeypatch, "architectures", edit), pytest.raises(DataFileError, match="CodeLlama-9b-hf"):
        _data.validated("architectures", CatalogFile)


def test_a_flat_vision_language_config_is_read_where_its_class_reads_it() -> None:
    """Qwen2-VL's hub config.json is flat (the text model's keys at the top level, no text_config); its config class
    moves them into text_config ("Hub configs are saved as flat dicts"). A class that does not read them there would
    build its defaults, so such a config is refused instead of priced as another model."""
    flat = {k: v for k, v in config_of("Qwen/Qwen2-VL-2B-Instruct").items() if k != "_name_or_path"}
    assert "text_config" not in flat and flat["hidden_size"] == 1536
    assert ModelSpec.from_any(flat).hidden_size == 1536
    text = config_of("Qwen/Qwen3.5-0.8B")["text_config"]
    qwen35_flat = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                   **{k: v for k, v in text.items() if k != "model_type"}}
    with pytest.raises(InvalidModelError, match="under 'text_config'"):
        ModelSpec.from_any(qwen35_flat)
