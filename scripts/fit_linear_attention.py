"""Fit the gated-DeltaNet terms of perfguide/data/activations.json (``linear_attention``): what a hybrid model's
linear-attention block keeps for backward beyond a full-attention block of the same model.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_linear_attention.py [--dry-run]``.

Qwen3.5 and Qwen3-Next run three gated-DeltaNet layers to one full-attention layer. transformers 5 resolves the
layer's two kernels at import (``integrations/hub_kernels.use_kernel_func_from_hub_with_fallback``): the
flash-linear-attention package's ``chunk_gated_delta_rule`` and causal-conv1d's ``causal_conv1d_fn`` when they import,
else its own PyTorch reference code, which loops over 64-token chunks and keeps fp32 copies of q, k, v and every
chunk's recurrent state for backward. The two kernels keep very different bytes, so both are fitted:

* ``torch``: the reference code as the installed transformers runs it, traced on fake tensors (scripts/fit_activations.py
  ``block_bytes``: a two-block model minus a one-block model).
* ``fla``: the same trace with the two functions replaced by stand-ins that save for backward exactly what the
  packages' autograd Functions save: ``ChunkGatedDeltaRuleFunction.forward`` (fla-org/flash-linear-attention
  fla/ops/gated_delta_rule/chunk.py @0315a70e: ``ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g, beta, A,
  initial_state, cu_seqlens)``: q and k L2-normalised in their dtype with fp32 inverse norms per head, the
  ``input_guard``'s contiguous copy of v, g after ``chunk_local_cumsum`` in fp32, beta, and A, the solved 64-wide
  chunk-local matrix ``[B, T, H_v, 64]`` in k's dtype; the chunk states are recomputed in backward, not kept) and
  causal-conv1d's ``CausalConv1dFn`` (saves its input x, the weight and bias; the fused SiLU output is recomputed).
  fla refuses fp32 inputs (``assert q.dtype != torch.float32``), so the fp32 regime has no fla entry.

The difference (linear block minus full block, same hidden, FFN and attention sizes) is fitted per token, as a linear
form over the block dims ``h``, ``q``, ``kv`` (the attention it replaces) and the DeltaNet's own
(``memory/linear_attention.py`` ``deltanet_dims``), from the slope between 128 and 256 tokens (two and four chunks) at
batch 2. Between 64 and 128 tokens the reference code's slope is 8 B per key-width unit higher (its first chunk keeps
less), so one-chunk sequences would mislead the fit; the rest at 128 tokens (per sequence: under 2 KB per block in
16-bit; under autocast, the cached 16-bit casts of the DeltaNet's weights, a per-block constant priced with them) is
not priced.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fit_activations import DATA, block_bytes, difference_fit, write_data

from perfguide.setup import Setup

REGIMES = {"fp32": {}, "amp": {"autocast": "bf16"}, "half": {"weights_dtype": "bf16"}}
BATCH, LENGTHS = 2, (128, 256)
#: block dims of the fit points: hidden, attention heads and K/V heads (of HEAD_DIM), DeltaNet key heads, value heads,
#: key head dim, value head dim. Near the released models' widths (attention heads of 256, DeltaNet heads of 128), not
#: at toy ones: the reference code's per-chunk scalars (the decay's exp per batch and head) are tensors of a few bytes
#: that the allocator rounds to 512, which toy widths would read as per-width bytes
HEAD_DIM = 128
BASE = {"h": 256, "heads": 2, "kv_heads": 1, "hk": 2, "hv": 4, "dk": 64, "dv": 64}
STEPS = (
    BASE, {**BASE, "h": 512}, {**BASE, "heads": 4}, {**BASE, "kv_heads": 2}, {**BASE, "hk": 4},
    {**BASE, "hv": 8}, {**BASE, "dk": 128}, {**BASE, "dv": 128}, {**BASE, "dk": 128, "dv": 128},
    {**BASE, "hv": 8, "dk": 128}, {**BASE, "hv": 8, "hk": 4, "dv": 128}, {**BASE, "h": 512, "hv": 8},
)
TERMS = ("h", "q", "kv", "lk", "lkr", "lv", "lh", "lkh", "ls", "1")


def dims(p: dict[str, int]) -> dict[str, int]:
    """The linear form's dims at a fit point (memory/linear_attention.py deltanet_dims names them)."""
    return {"h": p["h"], "q": HEAD_DIM * p["heads"], "kv": HEAD_DIM * p["kv_heads"], "lk": p["hk"] * p["dk"], "lkr": p["hv"] * p["dk"],
            "lv": p["hv"] * p["dv"], "lh": p["hv"], "lkh": p["hk"], "ls": p["hv"] * p["dk"] * p["dv"], "1": 1}


def config(p: dict[str, int], kind: str) -> dict[str, Any]:
    return dict(model_type="qwen3_5_text", hidden_size=p["h"], intermediate_size=512, num_attention_heads=p["heads"],
                num_key_value_heads=p["kv_heads"], head_dim=HEAD_DIM, num_hidden_layers=2, layer_types=[kind, kind],
                vocab_size=512, tie_word_embeddings=False, linear_num_key_heads=p["hk"], linear_num_value_heads=p["hv"],
                linear_key_head_dim=p["dk"], linear_value_head_dim=p["dv"], linear_conv_kernel_dim=4, use_cache=False,
                pad_token_id=0, eos_token_id=1, bos_token_id=2)


def _standins() -> tuple[Any, Any]:
    """(chunk_gated_delta_rule, causal_conv1d_fn) stand-ins that save what fla's and causal-conv1d's Functions save."""
    import torch

    class Chunk(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, g: Any, beta: Any) -> Any:
            b, t, hv, dv = v.shape
            q_n, k_n = q.contiguous() * 1, k.contiguous() * 1       # l2norm_fwd outputs, in q's and k's dtype
            rstd = [x.new_empty(x.shape[:-1], dtype=torch.float32) for x in (q, k)]
            g_cum = g.new_empty(g.shape, dtype=torch.float32)        # chunk_local_cumsum: fp32
            a = k.new_empty((b, t, hv, 64))                          # solve_tril(output_dtype=k.dtype)
            ctx.save_for_backward(q_n, rstd[0], k_n, rstd[1], v.contiguous(), g_cum, beta.contiguous(), a)
            ctx.shapes = (q.shape, k.shape, v.shape, g.shape, beta.shape)
            return q.new_empty((b, t, hv, dv))

        @staticmethod
        def backward(ctx: Any, do: Any) -> Any:
            return tuple(do.new_zeros(s) for s in ctx.shapes)

    def chunk(query: Any, key: Any, value: Any, g: Any, beta: Any, **_: Any) -> tuple[Any, None]:
        return Chunk.apply(query, key, value, g, beta), None

    class Conv(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, weight: Any, bias: Any) -> Any:
            ctx.save_for_backward(x, weight, bias)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            _x, weight, bias = ctx.saved_tensors
            return dout * 1, torch.zeros_like(weight), None if bias is None else torch.zeros_like(bias)

    def conv(hidden_states: Any, weight: Any, bias: Any = None, activation: Any = None, **_: Any) -> Any:
        return Conv.apply(hidden_states, weight, bias)

    return chunk, conv


@contextmanager
def kernels(path: str) -> Iterator[None]:
    """Run Qwen3.5's DeltaNet with the packages' kernels (``fla``) or transformers' reference code (``torch``)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    saved = m.torch_chunk_gated_delta_rule, m.causal_conv1d_fn
    if path == "fla":
        m.torch_chunk_gated_delta_rule, m.causal_conv1d_fn = _standins()
    try:
        yield
    finally:
        m.torch_chunk_gated_delta_rule, m.causal_conv1d_fn = saved


def difference(p: dict[str, int], regime: dict[str, Any], seq: int, path: str) -> int:
    setup = Setup(micro_batch_size=BATCH, seq_len=seq, optimizer="sgd", **regime)
    with kernels(path):
        linear = block_bytes(config(p, "linear_attention"), setup)
    return linear - block_bytes(config(p, "full_attention"), setup)


def fit_path(path: str) -> dict[str, Any]:
    regimes = {k: v for k, v in REGIMES.items() if not (path == "fla" and k == "fp32")}   # fla refuses fp32

    def measure(p: dict[str, int], regime: dict[str, Any], seq: int) -> float:
        return difference(p, regime, seq, path)

    return difference_fit(path, STEPS, dims, TERMS, measure, regimes, LENGTHS, BATCH * (LENGTHS[1] - LENGTHS[0]))


def main(argv: list[str] | None = None) -> int:
    import torch
    import transformers

    dry = "--dry-run" in (argv if argv is not None else sys.argv[1:])
    data = json.loads(DATA.read_text(encoding="utf-8"))
    paths = {path: fit_path(path) for path in ("torch", "fla")}
    data["linear_attention"] = {"gated_deltanet": {"paths": paths, "source": (
        f"scripts/fit_linear_attention.py: fake-tensor traces of transformers' Qwen3.5 text blocks (torch "
        f"{torch.__version__}, transformers {transformers.__version__}), a gated-DeltaNet block minus a full-attention "
        f"block of the same model, batch {BATCH} at {LENGTHS[0]} and {LENGTHS[1]} tokens, at {len(STEPS)} points around "
        f"{BASE}; torch: transformers' reference chunked code (no flash-linear-attention / causal-conv1d); fla: stand-ins "
        "saving what fla's ChunkGatedDeltaRuleFunction (fla/ops/gated_delta_rule/chunk.py @0315a70e) and causal-conv1d's "
        "CausalConv1dFn save. Block code: transformers/models/qwen3_5/modeling_qwen3_5.py (Qwen3_5GatedDeltaNet).")}}
    write_data(data, dry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
