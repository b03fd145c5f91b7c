"""DeepSeek-V3.2 (and V3.2-Exp): DeepSeek-V3's latent attention with a lightning indexer per layer (DeepSeek Sparse
Attention). Its config.json resolves (transformers' DeepseekV32Config derives head_dim from the rope slice), its
indexer weights are counted, the serving engines' cache holds each position's indexer key beside the latent, and a
decode step attends to the indexer's top 2,048 positions. Checked against hand counts and SGLang's 8 x B200 log."""

from __future__ import annotations

import math

import pytest
from helpers import meta_total

from perfguide import ModelSpec
from perfguide.memory.serving import attention_read_bytes, kv_bytes_per_token
from perfguide.model.catalog import config_of, lookup
from perfguide.setup import ServingSetup

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

GiB = 1024**3
LAYERS = 61
#: one layer's indexer weights (transformers' DeepseekV32Indexer): wq_b 1536 x 64 heads x 128, wk 7168 x 128, its
#: LayerNorm's weight and bias (2 x 128), weights_proj 7168 x 64
INDEXER = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64


def _serving(**kw: object) -> ServingSetup:
    return ServingSetup(engine="sglang", weight_format="fp8_block", tensor_parallel_size=8, **kw)


def test_the_config_resolves_and_counts_the_indexer() -> None:
    v32, v3 = ModelSpec.from_any("deepseek-ai/DeepSeek-V3.2"), ModelSpec.from_any("deepseek-ai/DeepSeek-V3")
    assert v32.model_type == "deepseek_v32" and v32.is_mla and v32.is_moe
    assert v32.total_params == meta_total("deepseek-ai/DeepSeek-V3.2")
    assert v32.total_params - v3.total_params == LAYERS * INDEXER == 851_524_864
    assert lookup("deepseek-ai/DeepSeek-V3.2-Exp") == "deepseek-ai/DeepSeek-V3.2"


def test_a_config_without_head_dim_is_read() -> None:
    """The published config.json writes no head_dim (DeepseekV32Config sets it to qk_rope_head_dim); perfguide had
    refused it as missing."""
    config = config_of("deepseek-ai/DeepSeek-V3.2")
    assert "head_dim" not in config
    assert ModelSpec.from_any(config).total_params == ModelSpec.from_any("deepseek-ai/DeepSeek-V3.2").total_params


def test_cache_bytes_per_position() -> None:
    """bf16: the 512-wide latent and 64-wide rope key in 16 bits (1,152 B) plus the indexer key (128 fp8 values and one
    fp32 scale, 132 B); fp8: the latent in fp8 with a scale per 128 and the rope key in 16 bits (656 B) plus the same
    indexer key. DeepSeek-V3, with no indexer, keeps the latent alone."""
    spec = ModelSpec.from_any("deepseek-ai/DeepSeek-V3.2")
    assert kv_bytes_per_token(spec, _serving()) == LAYERS * ((512 + 64) * 2 + 128 + 4) == 78_324
    assert kv_bytes_per_token(spec, _serving(kv_cache_dtype="fp8")) == LAYERS * (512 + 4 * 4 + 64 * 2 + 132) == 48_068
    assert kv_bytes_per_token(ModelSpec.from_any("deepseek-ai/DeepSeek-V3"), _serving()) == LAYERS * 576 * 2


def test_sglang_b200_log() -> None:
    """sgl-project/sglang#11309 on 8 x B200 (fp8 cache): "#tokens: 975424, KV size: 43.67 GB" (2^30-byte GB)."""
    per_token = kv_bytes_per_token(ModelSpec.from_any("deepseek-ai/DeepSeek-V3.2-Exp"), _serving(kv_cache_dtype="fp8"))
    assert 975_424 * per_token / GiB == pytest.approx(43.67, abs=0.01)


def test_a_decode_step_reads_the_top_2048_latents_and_every_indexer_key() -> None:
    spec = ModelSpec.from_any("deepseek-ai/DeepSeek-V3.2")
    context = 100_000
    assert attention_read_bytes(spec, _serving(), context) == LAYERS * (2048 * 1152 + context * 132)
    assert attention_read_bytes(spec, _serving(), 1000) == 1000 * LAYERS * (1152 + 132)   # under top-k: every position
    v3 = ModelSpec.from_any("deepseek-ai/DeepSeek-V3")
    assert attention_read_bytes(v3, _serving(), context) == context * LAYERS * 1152


def test_long_context_decode_is_faster_than_v3() -> None:
    """At 128K tokens of context a V3 decode step reads every latent; V3.2 reads 2,048 and the 132-byte keys."""
    from perfguide import Hardware
    from perfguide.speed.serving import decode_step_s

    hw = Hardware.from_name("h200:8")
    v3, v32 = ModelSpec.from_any("deepseek-ai/DeepSeek-V3"), ModelSpec.from_any("deepseek-ai/DeepSeek-V3.2")
    t3, t32 = (decode_step_s(s, _serving(), hw, 64, 131_072, 0.0)[0] for s in (v3, v32))
    assert t32 < t3 and math.isfinite(t32)


def test_transformers_caches_the_indexer_key_too() -> None:
    """transformers' DeepseekV32 keeps the latent, the rope key and the indexer's key per layer and position
    (cache.update / cache.update_indexer), in the model dtype: 512 + 64 + 128 elements."""
    assert ModelSpec.from_any("deepseek-ai/DeepSeek-V3.2").kv_elements_per_token() == 512 + 64 + 128
    assert ModelSpec.from_any("deepseek-ai/DeepSeek-V3").kv_elements_per_token() == 512 + 64


def test_the_transformers_plan_names_the_indexer_key() -> None:
    import perfguide

    rec = perfguide.recommend("deepseek-ai/DeepSeek-V3.2", "infer_gpu_many", hardware="h200:8")
    [line] = [line for line in rec.report().splitlines() if "KV cache =" in line]
    assert "latent 512 + rope key 64 + sparse-attention indexer key 128" in line


def test_a_class_with_a_head_dim_of_its_own_still_needs_it() -> None:
    """DeepSeek-V4's config class keeps head_dim 512 as a shape of its own (not the rope slice): a config that leaves it
    out is still refused, not priced at the class default."""
    from perfguide.model.from_module import missing_shape_keys

    config = {**config_of("deepseek-ai/DeepSeek-V3.2"), "model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"]}
    assert "head_dim" in missing_shape_keys(config, transformers.CONFIG_MAPPING["deepseek_v4"])
    assert "head_dim" not in missing_shape_keys(config_of("deepseek-ai/DeepSeek-V3.2"), transformers.CONFIG_MAPPING["deepseek_v32"])
