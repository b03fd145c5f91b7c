"""Gemma-4's layers differ along depth (transformers 5.24 Gemma4TextConfig / Gemma4TextDecoderLayer): full-attention
layers take ``global_head_dim`` and, where keys double as values, ``num_global_key_value_heads``; a MoE release runs its
dense MLP beside the experts. Checked on the catalog's released configs against hand counts from those configs."""

from __future__ import annotations

from perfguide.memory.inference import grown_kv_bytes
from perfguide.model import spec_from_any
from perfguide.model.attention_widths import kv_elements, layer_widths, mean_widths


def test_26b_a4b_reads_its_wide_full_layers_and_dense_mlp() -> None:
    spec = spec_from_any("google/gemma-4-26B-A4B")
    # config: 30 layers, every sixth full; 16 heads; sliding 8 KV heads of 256, full 2 of 512; dense MLP 2112, 8 of 128
    # experts of 704 per token
    widths = layer_widths(spec)
    assert widths[0] == (16 * 256, 8 * 256) and widths[5] == (16 * 512, 2 * 512)
    assert mean_widths(spec) == (round((25 * 16 * 256 + 5 * 16 * 512) / 30), round((25 * 8 * 256 + 5 * 2 * 512) / 30))
    assert spec.active_intermediate_size == 2112 + 8 * 704


def test_31b_cache_holds_each_layer_at_its_own_width() -> None:
    spec = spec_from_any("google/gemma-4-31B-it")
    # 60 layers, 10 full with 4 KV heads of 512, 50 sliding (window 1024) with 16 of 256; K and V, bf16, 100,000 tokens
    assert set(kv_elements(spec)) == {2 * 16 * 256, 2 * 4 * 512}
    full = 10 * 2 * 4 * 512 * 100_000
    sliding = 50 * 2 * 16 * 256 * (1024 - 1)   # the dynamic cache keeps window - 1 positions
    assert grown_kv_bytes(spec, 1, 100_000, 2) == 2 * (full + sliding)


def test_shared_kv_layers_store_nothing() -> None:
    """The small releases' last ``num_kv_shared_layers`` reuse earlier layers' K/V: "dummy" cache layers."""
    spec = spec_from_any({"model_type": "gemma4_text", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6,
                          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "global_head_dim": 128,
                          "vocab_size": 1000, "num_kv_shared_layers": 2, "sliding_window": 512,
                          "layer_types": ["sliding_attention", "full_attention"] * 3})
    assert spec.cache_layer_types()[-2:] == ("dummy", "dummy")
    assert [kv for _, kv in layer_widths(spec)] == [64, 128, 64, 128, 0, 0]
    assert grown_kv_bytes(spec, 1, 10, 2) == 2 * 10 * 2 * (64 + 128 + 64 + 128)
