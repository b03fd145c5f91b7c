"""Gemma-4's layers differ along depth (transformers 5.24 Gemma4TextConfig / Gemma4TextDecoderLayer): full-attention
layers take ``global_head_dim`` and, where keys double as values, ``num_global_key_value_heads``; a MoE release runs its
dense MLP beside the experts. Checked on the catalog's released configs against hand counts from those configs."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import block_saved_bytes, model_saved_bytes, priced_layer_bytes

from perfguide.memory.activations import block_dims, spec_family
from perfguide.memory.inference import grown_kv_bytes
from perfguide.model import spec_from_any
from perfguide.model.layer_widths import kv_elements, layer_widths, mean_widths
from perfguide.setup import Setup

B, S = 2, 32
#: widths none of the fits used; full-attention layers 6 heads of 32 with one K/V head that doubles as values
TINY: dict[str, Any] = {"model_type": "gemma4_text", "hidden_size": 96, "intermediate_size": 320, "num_attention_heads": 6,
                        "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
                        "attention_k_eq_v": True, "num_hidden_layers": 2, "vocab_size": 512,
                        "vocab_size_per_layer_input": 512, "hidden_size_per_layer_input": 0, "sliding_window": 4096,
                        "max_position_embeddings": 1024, "tie_word_embeddings": False, "pad_token_id": 0,
                        "eos_token_id": 1, "bos_token_id": 2}
#: three layers whose full one is as wide as the sliding ones: the block the tracer differences is a sliding one
SLIDING = {**TINY, "num_hidden_layers": 3, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
           "global_head_dim": 16, "attention_k_eq_v": False}
FULL = {**TINY, "layer_types": ["full_attention"] * 2}
MOE = {**FULL, "enable_moe_block": True, "num_experts": 6, "top_k_experts": 3, "moe_intermediate_size": 48}


@pytest.mark.parametrize(("config", "family"), [(FULL, "gemma4_text"), (MOE, "gemma4_moe")], ids=["full", "moe"])
def test_priced_block_is_what_the_real_block_saves(config: dict[str, Any], family: str) -> None:
    """Block 1 of the real bf16 model on CPU (``saved_tensors_hooks``, no tracer): a full-attention block whose one
    K/V head doubles as values, and the MoE block (dense MLP beside 3 of 6 experts), at their own widths. Within 1.5%:
    the table's per-head terms (fp32 logsumexp and kin) are fitted at head width 16 and priced per query unit, so heads
    of 32 carry them twice (88 B of 8,952 per token here); Gemma 3's table, which Gemma 4 had, priced the block at the
    config's head_dim 16 and without the MoE block."""
    assert spec_family(spec_from_any(config)) == family
    priced = (priced_layer_bytes(config, 2 * B, S) - priced_layer_bytes(config, B, S)) / (B * S)
    saved = (block_saved_bytes(config, 2 * B, S) - block_saved_bytes(config, B, S)) / (B * S)
    assert priced == pytest.approx(saved, rel=0.015)


def test_priced_sliding_block_is_what_the_tracer_finds() -> None:
    """The sliding block, by the tracer (CUDA's kernel choice emulated: CPU SDPA takes its mask down the math path), at
    3 minus 2 blocks: both depths already hold both layer kinds (the config class makes the last layer full), so only
    the block differs."""
    from perfguide.memory.tracing.build import with_depth
    from perfguide.memory.tracing.step import run_step

    def traced(batch: int) -> int:
        setup = Setup(micro_batch_size=batch, seq_len=64, optimizer="sgd", weights_dtype="bf16")
        return sum(run_step(with_depth(SLIDING, d), setup).phases["head"].parts["activations"] * sign
                   for d, sign in ((3, 1), (2, -1)))

    # within 0.5%: the table's linear form off its fit points (the tracer rounds each block to 512 B)
    assert priced_layer_bytes(SLIDING, 2, 64) - priced_layer_bytes(SLIDING, 1, 64) == pytest.approx(traced(2) - traced(1), rel=0.005)


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


def test_per_layer_embeddings_take_their_table() -> None:
    """The E2B / E4B's per-layer embeddings (256 wide, the class default): each layer gates its hidden state down to
    them, multiplies in its slice of the per-layer inputs and projects back. What one more layer adds to a real bf16
    model on CPU (two layers minus one, two batch sizes: the layer's share of the inputs computed before the first block
    included), full-attention layers at widths no fit used."""
    config = {**FULL, "hidden_size_per_layer_input": 256}
    assert spec_family(spec_from_any(config)) == "gemma4_ple"
    priced = (priced_layer_bytes(config, 2 * B, S) - priced_layer_bytes(config, B, S)) / (B * S)
    saved = [model_saved_bytes(config, 2, b, S) - model_saved_bytes(config, 1, b, S) for b in (B, 2 * B)]
    assert priced == pytest.approx((saved[1] - saved[0]) / (B * S), rel=0.015)


def test_double_wide_mlp_in_shared_kv_layers() -> None:
    """``use_double_wide_mlp``: the layers that reuse K/V run an MLP twice as wide (Gemma4TextMLP); 2 of 6 here, so
    the mean layer's FFN is (4 x 512 + 2 x 1024) / 6 wide."""
    config = {"model_type": "gemma4_text", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6,
              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "global_head_dim": 128,
              "vocab_size": 1000, "num_kv_shared_layers": 2, "use_double_wide_mlp": True, "sliding_window": 512,
              "hidden_size_per_layer_input": 0, "layer_types": ["sliding_attention", "full_attention"] * 3}
    assert block_dims(spec_from_any(config))["i"] == round((4 * 512 + 2 * 1024) / 6)


def test_vllm_pages_each_layer_kind_at_one_size() -> None:
    """vLLM's hybrid allocator gives Gemma-4-31B's sliding and full layers pages of one size
    (kv_cache_utils.unify_kv_cache_spec_page_size): 16 positions of a sliding layer (2 x 16 K/V heads x 256, bf16) make
    the page, so a full layer's block (2 x 4 x 512) holds 32. Layers fall in groups of 10 (the full layers' count): a
    262,144-token request takes 262,144 / 32 blocks in the full group and cdiv(1,023 + 2,048, 16) + 1 in each of the 5
    sliding groups. Field: vllm-project/vllm#43308 (bench/results/serving.md)."""
    from perfguide.engines import get
    from perfguide.setup import ServingSetup

    serving = ServingSetup(engine="vllm", max_model_len=262_144, max_num_batched_tokens=2048)
    pool = get("vllm").pool_layout(spec_from_any("google/gemma-4-31B-it"), serving)
    assert (pool.page_bytes, pool.group) == (16 * 2 * 16 * 256 * 2, 10)
    assert pool.per_request == 262_144 // 32 + 5 * (-(-3071 // 16) + 1)


def test_gemma4_12b_takes_gemma4s_table() -> None:
    """Gemma-4-12B (transformers' gemma4_unified: Gemma 4's block without per-layer embeddings or MoE) was priced by the
    generic table at 0.19 of its traced block (bench/family_audit.py, stop 73); it shares gemma4_text and its layer
    widths (FULL's, as gemma4_unified_text)."""
    spec = spec_from_any({**FULL, "model_type": "gemma4_unified_text"})
    assert spec_family(spec) == "gemma4_text" and spec.global_head_dim == 32
