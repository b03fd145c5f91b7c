"""Today's checkpoints in the offline catalog: totals and active parameters against what their model cards publish,
and, where perfguide counts by hand (Phi-4 is phi3, Mistral-Small-3 is mistral), exactly against the module
transformers builds on the meta device."""

from __future__ import annotations

import pytest
from helpers import meta_total

from perfguide import ModelSpec
from perfguide.model.catalog import config_of, lookup

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# (hub id, published total, published active or None); model cards on the Hugging Face Hub
PUBLISHED = [
    ("Qwen/Qwen3-0.6B", 0.6e9, None), ("Qwen/Qwen3-1.7B", 1.7e9, None), ("Qwen/Qwen3-4B", 4.0e9, None),
    ("Qwen/Qwen3-8B", 8.2e9, None), ("Qwen/Qwen3-14B", 14.8e9, None), ("Qwen/Qwen3-32B", 32.8e9, None),
    ("Qwen/Qwen3-30B-A3B", 30.5e9, 3.3e9), ("Qwen/Qwen3-235B-A22B", 235e9, 22e9),
    ("deepseek-ai/DeepSeek-V3", 671e9, 37e9), ("deepseek-ai/DeepSeek-R1", 671e9, 37e9),
    ("google/gemma-3-1b-pt", 1.0e9, None), ("microsoft/phi-4", 14.7e9, None),
    ("allenai/OLMo-2-1124-7B", 7.3e9, None), ("allenai/OLMo-2-1124-13B", 13.7e9, None), ("allenai/OLMo-2-0325-32B", 32.2e9, None),
    ("HuggingFaceTB/SmolLM3-3B", 3.08e9, None), ("mistralai/Mistral-Small-24B-Base-2501", 23.6e9, None),
    # Llama-4 cards: 17B active / 109B and 400B total; Gemma-3 cards (hub file sizes): 4.3B, 12.2B, 27.4B
    ("meta-llama/Llama-4-Scout-17B-16E", 109e9, 17e9), ("meta-llama/Llama-4-Maverick-17B-128E", 400e9, 17e9),
    ("google/gemma-3-4b-pt", 4.3e9, None), ("google/gemma-3-12b-pt", 12.2e9, None), ("google/gemma-3-27b-pt", 27.4e9, None),
    # Kimi-K2's card: 1T total, 32B activated; Qwen3-Coder-30B-A3B's: 30.5B / 3.3B; Yi's cards: 6B and 34B
    ("moonshotai/Kimi-K2-Instruct", 1.0e12, 32e9), ("Qwen/Qwen3-Coder-30B-A3B-Instruct", 30.5e9, 3.3e9),
    ("01-ai/Yi-6B-Chat", 6.0e9, None), ("01-ai/Yi-34B-Chat", 34e9, None),
    # checkpoints whose names state their totals (and active counts): the publisher's own rounding
    ("Qwen/Qwen3.5-397B-A17B", 397e9, 17e9), ("Qwen/Qwen3.5-122B-A10B", 122e9, 10e9), ("Qwen/Qwen3.5-35B-A3B", 35e9, None),
    ("Qwen/Qwen3.5-27B", 27e9, None), ("Qwen/Qwen3.6-27B", 27e9, None), ("Qwen/Qwen3.6-35B-A3B", 35e9, None),
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", 80e9, None), ("Qwen/Qwen3-Coder-480B-A35B-Instruct", 480e9, 35e9),
    ("Qwen/Qwen3-VL-235B-A22B-Instruct", 235e9, 22e9), ("Qwen/Qwen3-VL-30B-A3B-Instruct", 30.5e9, None),
    ("Qwen/Qwen3-VL-32B-Instruct", 33e9, None), ("Qwen/Qwen3-VL-8B-Instruct", 8.8e9, None),
    ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", 120e9, None), ("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", 550e9, 55e9),
    ("mistralai/Mixtral-8x22B-v0.1", 141e9, 39e9),
    ("google/gemma-4-26B-A4B", 26e9, 4e9), ("google/gemma-4-31B-it", 31e9, None),
]


@pytest.mark.parametrize(("hub", "total", "active"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_catalog_matches_model_cards(hub: str, total: float, active: float | None) -> None:
    spec = ModelSpec.from_any(hub)
    assert spec.total_params == pytest.approx(total, rel=0.03)
    if active is not None:
        assert spec.is_moe and spec.active_params == pytest.approx(active, rel=0.05)


def test_gemma4_experts_sit_beside_the_dense_mlp_in_every_layer() -> None:
    """Gemma-4's config names its top-k ``top_k_experts`` and its module keeps each layer's experts at
    ``layers.N.experts`` beside a dense MLP: 30 MoE layers of 128 experts, 8 per token, as the config says."""
    config = config_of("google/gemma-4-26B-A4B")["text_config"]
    spec = ModelSpec.from_any("google/gemma-4-26B-A4B")
    assert (spec.num_experts, spec.num_experts_per_tok, spec.num_moe_layers) == (
        config["num_experts"], config["top_k_experts"], config["num_hidden_layers"]) == (128, 8, 30)


@pytest.mark.parametrize("hub", ["openai/gpt-oss-20b", "openai/gpt-oss-120b"])
def test_gpt_oss_active_as_openai_counts_it(hub: str) -> None:
    """OpenAI's card: 20b 20.9B total / 3.6B active, 120b 116.8B / 5.1B, active counting the unembedding, not the embedding."""
    total, active = {"openai/gpt-oss-20b": (20.9e9, 3.6e9), "openai/gpt-oss-120b": (116.8e9, 5.1e9)}[hub]
    spec = ModelSpec.from_any(hub)
    assert spec.total_params == pytest.approx(total, rel=0.01)
    assert spec.active_params - spec.embedding_params == pytest.approx(active, rel=0.02)
    assert not spec.supports_sdpa and set(spec.cache_layer_types()) == {"sliding_attention", "full_attention"}


@pytest.mark.parametrize("hub", ["microsoft/phi-4", "mistralai/Mistral-Small-24B-Base-2501", "Qwen/Qwen3-30B-A3B",
                                 "deepseek-ai/DeepSeek-V3", "google/gemma-3-1b-pt", "meta-llama/Llama-4-Scout-17B-16E",
                                 "meta-llama/Llama-4-Maverick-17B-128E", "google/gemma-3-27b-pt", "moonshotai/Kimi-K2-Instruct"])
def test_catalog_counts_equal_the_meta_module(hub: str) -> None:
    assert ModelSpec.from_any(hub).total_params == meta_total(hub)


def test_short_names_resolve() -> None:
    assert lookup("qwen3-30b-a3b") == "Qwen/Qwen3-30B-A3B" and lookup("deepseek-r1") == "deepseek-ai/DeepSeek-R1"
    assert lookup("google/gemma-3-27b-it") == "google/gemma-3-27b-pt" and lookup("llama-4-scout") == "meta-llama/Llama-4-Scout-17B-16E"
    assert lookup("meta-llama/Llama-4-Maverick-17B-128E-Instruct") == "meta-llama/Llama-4-Maverick-17B-128E"
    assert lookup("gpt-oss-120b") == "openai/gpt-oss-120b" and lookup("mistral-small-3") == "mistralai/Mistral-Small-24B-Base-2501"


def test_deepseek_kv_cache_is_the_latent() -> None:
    spec = ModelSpec.from_any("deepseek-ai/DeepSeek-V3")
    # 61 layers x (512 latent + 64 rope) x 2 bytes = 70,272 B per token, vs 61 x 2 x 128 heads x 192 for expanded K/V
    assert spec.kv_elements_per_token() * 2 * spec.num_layers == 61 * 576 * 2
