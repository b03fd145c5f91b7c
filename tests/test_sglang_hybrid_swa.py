"""SGLang's hybrid sliding-window pool for gpt-oss (model_runner_kv_cache_mixin.set_num_token_hybrid, by hand): the
KV bytes hold full_tokens x (full layers + 0.8 x sliding layers) layer-tokens; the log's max_total_num_tokens is the
full pool; a request takes its length there and min(length, window) of the sliding pool's 0.8 x full tokens."""

from __future__ import annotations

import pytest

from perfguide import Hardware, engines
from perfguide.model.types import ModelSpec
from perfguide.setup import ServingSetup


def test_gpt_oss_full_pool_by_hand() -> None:
    spec = ModelSpec.from_any("openai/gpt-oss-20b")
    assert spec.cache_layer_types().count("sliding_attention") == 12 and spec.sliding_window == 128
    s = ServingSetup(engine="sglang", max_model_len=4096)
    mem = engines.server("sglang").memory(spec, s, Hardware.from_name("h100-80gb"))
    per_layer_token = 2 * 8 * 64 * 2              # K and V, 8 KV heads of 64, bf16
    full_pool = mem.kv_cache_bytes // (per_layer_token * (12 + 0.8 * 12))
    assert mem.kv_bytes_per_token == 24 * per_layer_token
    assert abs(mem.kv_cache_tokens - full_pool) <= 1
    assert mem.max_concurrency == pytest.approx(mem.kv_cache_tokens / 4096, rel=1e-6)


def test_a_short_request_is_bound_by_the_sliding_pool() -> None:
    """Below window / 0.8 tokens a request fills the sliding pool (0.8 x full) before the full one."""
    spec = ModelSpec.from_any("openai/gpt-oss-20b")
    s = ServingSetup(engine="sglang", max_model_len=100)
    mem = engines.server("sglang").memory(spec, s, Hardware.from_name("h100-80gb"))
    assert mem.max_concurrency == pytest.approx(mem.kv_cache_tokens / 125, rel=1e-6)   # ceil(100 / 0.8)


def test_models_sglang_does_not_pool_apart_keep_one_pool() -> None:
    """Gemma 3 has sliding layers but is not in SGLang's hybrid-SWA list: every layer in one pool."""
    spec = ModelSpec.from_any("google/gemma-3-27b-it")
    s = ServingSetup(engine="sglang", max_model_len=4096)
    mem = engines.server("sglang").memory(spec, s, Hardware.from_name("h100-80gb"))
    assert mem.kv_cache_tokens == mem.kv_cache_bytes // mem.kv_bytes_per_token
