"""The tiled MLP (techniques/tiled_mlp.py) against DeepSpeed's own TiledMLP traced on real CPU tensors, and the
flash-attn 2 backward workspace (memory/block_backward.py flash_backward_bytes) against the shapes flash-attn's
``mha_bwd`` allocates, counted by hand.

The trace runs transformers' LlamaMLP once whole and once through ``deepspeed.runtime.sequence_parallel.ulysses_sp.
TiledMLP`` (the class ALST's and axolotl's patches call), bf16, every weight trained, with perfguide's live-bytes
tracker; what tiling takes off the backward's peak is compared with what perfguide prices off it: the FFN-wide
saved tensors (activations.ffn_layer_bytes) and the FFN-wide gradients in flight (block_backward_bytes with
``mlp_tokens``), for all but one shard of tokens."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import tiny_spec

from perfguide import Setup
from perfguide.memory.activations import attention_side_bytes, ffn_layer_bytes, layer_bytes
from perfguide.memory.block_backward import block_backward_bytes, flash_backward_bytes

S, H, I, SHARD = 2048, 64, 224, 256


def _backward_peak(tiled: bool) -> int:
    """Peak live bytes born during the MLP's forward and backward (weights and inputs made before are not counted)."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    from perfguide.memory.tracing.tracker import make_tracker

    pytest.importorskip("deepspeed")
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    torch.manual_seed(0)
    mlp = LlamaMLP(LlamaConfig(hidden_size=H, intermediate_size=I)).to(torch.bfloat16)
    x = torch.randn(1, S, H, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(1, S, H, dtype=torch.bfloat16)

    def forward(module: Any, t: Any) -> Any:   # the MLP's own forward, as ALST's patch hands it to TiledMLP
        return module.down_proj(module.act_fn(module.gate_proj(t)) * module.up_proj(t))

    tracker = make_tracker(1)
    with tracker:
        y = TiledMLP.apply(forward, mlp, x, S // SHARD, list(mlp.parameters())) if tiled else mlp(x)
        tracker.set_phase("backward")
        y.backward(grad)
    return int(max(peak for peak, _ in tracker.peaks.values()))


def _setup(**update: Any) -> Setup:
    fields: dict[str, Any] = dict(task="train", micro_batch_size=1, seq_len=S, weights_dtype="bf16", autocast=None,
                                  gradient_checkpointing=True, attn_implementation="flash_attention_2")
    return Setup(**{**fields, **update})


def test_tiling_takes_off_what_deepspeeds_tiled_mlp_does() -> None:
    measured = _backward_peak(tiled=False) - _backward_peak(tiled=True)
    spec, setup = tiny_spec(hidden_size=H, intermediate_size=I), _setup()
    saved = ffn_layer_bytes(spec, setup) * (S - SHARD) // S
    in_flight = block_backward_bytes(spec, setup, "5.0") - block_backward_bytes(spec, setup, "5.0", mlp_tokens=SHARD)
    # TiledMLP keeps its own hidden-wide extras (x's gradient, the shards' outputs and their concatenation): the FFN-wide
    # terms are what moves, 12 B per FFN unit per token (8 saved, 4 in flight) over the 1,792 tokens off the shard
    assert (saved + in_flight) == 12 * I * (S - SHARD)
    assert abs(measured - (saved + in_flight)) / measured < 0.10


def test_flash_backward_workspace_is_mha_bwds_shapes() -> None:
    """Llama-3.1-8B's attention (32 query heads, 8 K/V heads, head_dim 128), 2 rows of 1,000 tokens: dq, dk, dv
    and the output's gradient in bf16, dq_accum fp32 [2, 1024, 32, 128], softmax_d fp32 [2, 32, 1024], and the
    grouped heads' dk_expanded / dv_expanded [2, 1000, 32, 128] bf16."""
    spec = tiny_spec(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336)
    setup = _setup(micro_batch_size=2).replace(seq_len=1000)
    dout = dq = 2 * 2 * 1000 * 32 * 128
    dk = dv = 2 * 2 * 1000 * 8 * 128
    dq_accum, softmax_d = 4 * 2 * 1024 * 32 * 128, 4 * 2 * 32 * 1024
    expanded = 2 * (2 * 2 * 1000 * 32 * 128)
    assert flash_backward_bytes(spec, setup) == dout + dq + dk + dv + dq_accum + softmax_d + expanded
    # one K/V head per query head: no expanded copies; any other kernel: none of it
    mha = tiny_spec(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, head_dim=128)
    assert flash_backward_bytes(mha, setup) == 2 * 2 * 1000 * 4 * 32 * 128 + dq_accum + softmax_d
    assert flash_backward_bytes(spec, setup.replace(attn_implementation="sdpa")) == 0


def test_untiled_blocks_peak_at_the_mlp_tiled_ones_at_the_attention() -> None:
    """Llama-3.1-8B's shape, bf16 full fine-tuning: the MLP's moment (its saved tensors and gradients in flight,
    118 KB + 61 KB per token) is above the attention's (the block's attention half and flash-attn's workspace) until
    a tiled MLP leaves one shard of it."""
    spec = tiny_spec(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336)
    setup = _setup().replace(seq_len=131_072)
    mlp_moment = layer_bytes(spec, setup) + block_backward_bytes(spec, setup, "5.0")
    attention_moment = attention_side_bytes(spec, setup) + flash_backward_bytes(spec, setup)
    assert attention_moment < mlp_moment
    shard = 4096
    tiled = setup.replace(tiled_mlp_shard_tokens=shard)
    tiled_mlp_moment = (layer_bytes(spec, tiled) - ffn_layer_bytes(spec, tiled) * (131_072 - shard) // 131_072
                        + block_backward_bytes(spec, tiled, "5.0", mlp_tokens=shard))
    assert attention_moment > tiled_mlp_moment


def test_liger_saves_nothing_on_the_mlp_a_tiled_mlp_runs() -> None:
    """Under tiling HF's MLP runs in the shards (ALST passes swiglu=False to Liger; axolotl refuses Liger's GLU with it):
    Liger's SwiGLU saving leaves the block's saved bytes and its speed credit, its norms' saving stays."""
    from perfguide.techniques.fused import chain_seconds_saved
    from perfguide.techniques.liger_kernel import block_savings, norm_bytes

    spec = tiny_spec(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336)
    setup, tiled = _setup(liger_kernel=True), _setup(liger_kernel=True, tiled_mlp_shard_tokens=1024)
    assert block_savings(spec, tiled, recomputed=True) == 2 * norm_bytes(spec, tiled, recomputed=True)
    assert block_savings(spec, setup, recomputed=True) > block_savings(spec, tiled, recomputed=True)
    assert 0 < chain_seconds_saved(spec, tiled, 3e12) < chain_seconds_saved(spec, setup, 3e12)
