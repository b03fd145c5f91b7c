"""Fit the Mamba-2 terms of perfguide/data/activations.json (``linear_attention.mamba2``): what a hybrid model's Mamba-2
block keeps for backward beyond a full-attention block of the same model.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_mamba.py [--dry-run]``.

IBM's Granite-4.0-H and Bamba run Mamba-2 mixers in most layers and attention in a few; each layer is a mixer and the
same FFN. transformers 5 resolves the mixer's kernels at import (``use_kernel_func_from_hub_with_fallback``): in training
it calls mamba_ssm's fused ``mamba_split_conv1d_scan_combined`` when mamba_ssm imports, else its own PyTorch code
(``causal_conv1d_fn`` and the chunked ``mamba2_chunk_scan``), which works in fp32 and keeps, per chunk, the
chunk-by-chunk score matrices of every head (``[b, chunks, chunk, chunk, heads]``) and every chunk's state. The two keep
very different bytes, so both are fitted:

* ``torch``: the reference code as the installed transformers runs it, traced on fake tensors (scripts/fit_activations.py
  ``block_bytes``: a two-block model minus a one-block model).
* ``mamba_ssm``: the same trace with the fused function replaced by a stand-in that saves for backward what
  ``MambaSplitConv1dScanCombinedFn.forward`` saves (state-spaces/mamba ``mamba_ssm/ops/triton/ssd_combined.py``:
  ``ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, initial_states, seq_idx,
  rmsnorm_weight, rstd, outproj_weight, outproj_bias)``: the in-projection's output, the scan's output ``out_x`` in its
  dtype and the gated RMSNorm's fp32 ``rstd`` per group; the convolution, the chunk states and the normed output are
  recomputed in backward). The fused function also runs the out-projection, so that Linear's input is not kept apart.

The difference (Mamba block minus attention block, same hidden, FFN and attention sizes) is fitted per token as a linear
form over the attention dims ``h``, ``kv``, ``ah`` (its heads; Granite's query width is ``h``) and the mixer's (``memory/linear_attention.py`` ``mamba2_dims``), from
the slope between two and four of the largest chunk (512 and 1,024 tokens) at batch 2. The reference code pads a
sequence to a whole number of chunks (a shorter last chunk costs a whole one) and keeps a ``[chunks + 1, chunks + 1]``
decay per head, which grows with the square of the length; neither is priced (at 4,096 tokens the latter is under 0.1%).
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
BATCH, LENGTHS = 2, (512, 1024)
#: fit points: hidden, attention heads and K/V heads (Granite's attention heads are hidden / heads wide), Mamba expand (inner width = expand x hidden), Mamba
#: heads (head dim = inner / heads), state, groups, chunk. Near the released widths' ratios, not toy ones: the reference
#: code's per-chunk scalars would otherwise read as per-width bytes
BASE = {"h": 256, "heads": 2, "kv_heads": 1, "expand": 2, "mh": 8, "n": 64, "g": 1, "chunk": 64}
STEPS = (
    BASE, {**BASE, "h": 512}, {**BASE, "heads": 4}, {**BASE, "kv_heads": 2}, {**BASE, "mh": 16},
    {**BASE, "n": 128}, {**BASE, "g": 2}, {**BASE, "chunk": 128}, {**BASE, "expand": 4},
    {**BASE, "n": 128, "chunk": 128}, {**BASE, "mh": 16, "n": 128}, {**BASE, "g": 2, "n": 128},
    {**BASE, "mh": 16, "chunk": 128}, {**BASE, "expand": 4, "n": 128},
)
TERMS = ("h", "kv", "ah", "md", "mh", "mgn", "mhn", "mhl", "mdnl", "1")


def dims(p: dict[str, int]) -> dict[str, int]:
    """The linear form's dims at a fit point (memory/linear_attention.py mamba2_dims names them)."""
    d = p["expand"] * p["h"]
    return {"h": p["h"], "kv": p["kv_heads"] * p["h"] // p["heads"], "ah": p["heads"], "md": d, "mh": p["mh"],
            "mgn": p["g"] * p["n"], "mhn": p["mh"] * p["n"], "mhl": p["mh"] * p["chunk"],
            "mdnl": d * p["n"] // p["chunk"], "1": 1}


def config(p: dict[str, int], kind: str) -> dict[str, Any]:
    return dict(model_type="granitemoehybrid", hidden_size=p["h"], intermediate_size=512, shared_intermediate_size=512,
                num_local_experts=0, num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"],
                num_hidden_layers=2, layer_types=[kind, kind], vocab_size=512, tie_word_embeddings=False,
                mamba_expand=p["expand"], mamba_n_heads=p["mh"], mamba_d_head=p["expand"] * p["h"] // p["mh"],
                mamba_d_state=p["n"], mamba_n_groups=p["g"], mamba_chunk_size=p["chunk"], mamba_d_conv=4,
                position_embedding_type="rope", use_cache=False, pad_token_id=0, eos_token_id=1, bos_token_id=2)


def _standin() -> Any:
    """A ``mamba2_split_conv1d_scan_combined`` stand-in that saves what mamba_ssm's fused Function saves."""
    import torch

    class Fused(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, zxbcdt: Any, conv_w: Any, conv_b: Any, dt_bias: Any, a: Any, d: Any, norm_w: Any,
                    out_w: Any, dim: int, groups: int) -> Any:
            b, s, _ = zxbcdt.shape
            out_x = zxbcdt.new_empty((b, s, dim))                                  # the scan's output, x's dtype
            # _layer_norm_fwd's rstd; without the grouped RMSNorm (Falcon-H1's mamba_rms_norm false) rstd is None
            rstd = None if norm_w is None else zxbcdt.new_empty((b * s * groups,), dtype=torch.float32)
            ctx.save_for_backward(zxbcdt, conv_w, conv_b, out_x, a, d, dt_bias, norm_w, rstd, out_w)
            ctx.shapes = (zxbcdt.shape, conv_w.shape, None if conv_b is None else conv_b.shape, dt_bias.shape,
                          a.shape, d.shape, None if norm_w is None else norm_w.shape, out_w.shape)
            return zxbcdt.new_empty((b, s, out_w.shape[0]))

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            return (*(None if s is None else dout.new_zeros(s) for s in ctx.shapes), None, None)

    def fused(zxbcdt: Any, conv1d_weight: Any, conv1d_bias: Any, dt_bias: Any, A: Any, D: Any, *,  # noqa: N803
              rmsnorm_weight: Any, outproj_weight: Any, headdim: int, ngroups: int, **_: Any) -> Any:
        dim = D.shape[0] * headdim
        return Fused.apply(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, rmsnorm_weight, outproj_weight, dim, ngroups)

    return fused


@contextmanager
def kernels(path: str, model: str = "granitemoehybrid") -> Iterator[None]:
    """Run ``model``'s Mamba-2 mixer with mamba-ssm's fused kernel (``mamba_ssm``) or transformers' reference code
    (``torch``): the module-level function its mixer calls, swapped for the stand-in (Granite-4.0-H, Bamba, Nemotron-H
    and Falcon-H1 each carry their own copy)."""
    import importlib

    m = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    saved = m.mamba2_split_conv1d_scan_combined
    if path == "mamba_ssm":
        m.mamba2_split_conv1d_scan_combined = _standin()
    try:
        yield
    finally:
        m.mamba2_split_conv1d_scan_combined = saved


def difference(p: dict[str, int], regime: dict[str, Any], seq: int, path: str) -> int:
    setup = Setup(micro_batch_size=BATCH, seq_len=seq, optimizer="sgd", **regime)
    with kernels(path):
        mamba = block_bytes(config(p, "mamba"), setup)
    return mamba - block_bytes(config(p, "attention"), setup)


def fit_path(path: str) -> dict[str, Any]:
    def measure(p: dict[str, int], regime: dict[str, Any], seq: int) -> float:
        return difference(p, regime, seq, path)

    return difference_fit(path, STEPS, dims, TERMS, measure, REGIMES, LENGTHS, BATCH * (LENGTHS[1] - LENGTHS[0]))


def main(argv: list[str] | None = None) -> int:
    import torch
    import transformers

    dry = "--dry-run" in (argv if argv is not None else sys.argv[1:])
    data = json.loads(DATA.read_text(encoding="utf-8"))
    paths = {path: fit_path(path) for path in ("torch", "mamba_ssm")}
    data["linear_attention"]["mamba2"] = {"paths": paths, "source": (
        f"scripts/fit_mamba.py: fake-tensor traces of transformers' Granite-4.0-H blocks (torch {torch.__version__}, "
        f"transformers {transformers.__version__}), a Mamba-2 block minus an attention block of the same model, batch "
        f"{BATCH} at {LENGTHS[0]} and {LENGTHS[1]} tokens, at {len(STEPS)} points around {BASE}; torch: transformers' "
        "reference code (no mamba_ssm / causal-conv1d); mamba_ssm: a stand-in saving what mamba_ssm's "
        "MambaSplitConv1dScanCombinedFn (mamba_ssm/ops/triton/ssd_combined.py) saves. Block code: "
        "transformers/models/granitemoehybrid/modeling_granitemoehybrid.py (GraniteMoeHybridMambaLayer).")}
    write_data(data, dry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
