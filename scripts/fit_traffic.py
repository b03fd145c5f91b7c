"""Regenerate perfguide/data/traffic.json: the bytes a block's memory-bound kernels move, traced on fake tensors.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_traffic.py [--dry-run]``. The speed model prices the kernels
around the matmuls (norms, activations, rotary embeddings, residual adds, dropout, casts, the loss) as bytes at
memory bandwidth; how many bytes depends on the model's code (transformers' Llama upcasts RMSNorm to fp32 and
runs rotary embeddings as a dozen small ops; an MPT block is one LayerNorm, one GELU and two adds), so the bytes
are counted, not assumed: the tracer of perfguide.memory (one real training step of the HF modules on fake
tensors, CUDA autocast lists and SDPA kernels emulated) sums every non-GEMM, non-view op's input and output bytes
by phase. As in scripts/fit_activations.py, one block = two-block minus one-block trace, per token = the slope
between two batch sizes, and the per-token linear form over (h, i, q, kv) is solved from one-at-a-time steps.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_activations import BASE, BATCHES, DROP, FAMILIES, REGIMES, SEQ, VOCAB, Dims, family_args, per_token

from perfguide.memory.tracing.build import with_depth
from perfguide.memory.tracing.step import run_step
from perfguide.setup import Setup

DATA = Path(__file__).resolve().parents[1] / "perfguide" / "data" / "traffic.json"
#: phases whose traffic belongs to the blocks and the head (the optimizer step is priced per parameter)
STEP_PHASES = ("forward", "head", "backward_head", "backward")


def _mpt(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    return dict(model_type="mpt", d_model=d["h"], n_heads=d["h"] // 16, n_layers=2, expansion_ratio=d["i"] // d["h"],
                vocab_size=VOCAB, max_seq_len=1024, no_bias=True)


#: family -> (config builder, free dims, attention the HF class runs): transformers' MPT port is eager-only, so its
#: s^2 chain is separated by tracing two lengths (the per-token form is the zero-length intercept)
TRAFFIC_FAMILIES: dict[str, tuple[Callable[..., dict[str, Any]], tuple[str, ...], str]] = {
    **{name: (build, free, "sdpa") for name, (build, free) in FAMILIES.items()},
    "mpt": (_mpt, ("h", "i"), "eager"),
}


def traffic(config: dict[str, Any], setup: Setup, phases: tuple[str, ...]) -> int:
    """Bytes memory-bound ops read and write in ``phases`` (the tracker's traffic count)."""
    step = run_step(config, setup)
    return sum(step.traffic.get(ph, 0) for ph in phases)


def slope(config: dict[str, Any], regime: dict[str, Any], seq: int, phases: tuple[str, ...], attn: str) -> float:
    """Traffic bytes per token per block: two-minus-one-block traffic at two batch sizes (per-block constants,
    such as the weights' gradient reductions and autocast's weight casts, cancel)."""
    def block(bs: int) -> int:
        setup = Setup(micro_batch_size=bs, seq_len=seq, optimizer="sgd", attn_implementation=attn, **regime)
        return traffic(with_depth(config, 2), setup, phases) - traffic(with_depth(config, 1), setup, phases)

    return (block(BATCHES[1]) - block(BATCHES[0])) / ((BATCHES[1] - BATCHES[0]) * seq)


def block_form(name: str, regime: dict[str, Any], phases: tuple[str, ...] = STEP_PHASES) -> tuple[dict[str, float], float]:
    """(per-token linear form, bytes per batch*head*s^2) of one block's traffic in ``phases``."""
    build, free, attn = TRAFFIC_FAMILIES[name]
    if attn == "sdpa":
        return per_token(build, free, regime, slope=lambda cfg: slope(cfg, regime, SEQ, phases, attn)), 0.0
    short = per_token(build, free, regime, slope=lambda cfg: slope(cfg, regime, SEQ, phases, attn))
    long = per_token(build, free, regime, slope=lambda cfg: slope(cfg, regime, 2 * SEQ, phases, attn))
    intercept = {k: round(2 * short.get(k, 0.0) - long.get(k, 0.0), 3) for k in sorted({*short, *long})}
    s2 = (long.get("h", 0.0) - short.get("h", 0.0)) / (SEQ / 16)      # the builders use 16-wide heads
    return {k: v for k, v in intercept.items() if abs(v) > 1e-6}, round(s2, 3)


def eager_s2(name: str, regime: dict[str, Any], drop: float = 0.0) -> float:
    """Bytes per batch*head*s^2 eager attention's score chain moves (QK^T output, scale, mask, softmax, dropout,
    their backward) over the fused kernel, from the eager-minus-SDPA traffic at two lengths (per-token terms cancel)."""
    build, free, _ = TRAFFIC_FAMILIES[name]
    dims = BASE if "q" in free else {**BASE, "q": BASE["h"], "kv": BASE["h"]}
    cfg = build(dims, drop)
    heads = dims["q"] // 16
    diff = [slope(cfg, regime, seq, STEP_PHASES, "eager") - slope(cfg, regime, seq, STEP_PHASES, "sdpa") for seq in (SEQ, 2 * SEQ)]
    return round((diff[1] - diff[0]) / (heads * SEQ), 3)


def logits_form(name: str, regime: dict[str, Any]) -> float:
    """Traffic bytes per token and vocabulary entry of the head and the loss (forward and backward)."""
    build, free, attn = TRAFFIC_FAMILIES[name]
    dims = BASE if "q" in free else {**BASE, "q": BASE["h"], "kv": BASE["h"]}
    small = build(dims)
    big = {**small, "vocab_size": 2 * VOCAB}

    def per_tok(config: dict[str, Any]) -> float:
        def at(bs: int) -> int:
            setup = Setup(micro_batch_size=bs, seq_len=SEQ, optimizer="sgd", attn_implementation=attn, **regime)
            return traffic(with_depth(config, 1), setup, ("head", "backward_head"))
        return (at(BATCHES[1]) - at(BATCHES[0])) / ((BATCHES[1] - BATCHES[0]) * SEQ)

    return round((per_tok(big) - per_tok(small)) / VOCAB, 3)


def _component_traffic(fn: Callable[..., Any], shapes: list[tuple[int, ...]], regime: dict[str, Any]) -> float:
    """Bytes one call of ``fn`` on fresh inputs moves forward + backward (the tracker's count), under the regime's
    dtypes: 16-bit activations and weights ('half'), fp32 activations under CUDA autocast ('amp'), fp32 ('fp32')."""
    import torch

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation
    from perfguide.memory.tracing.tracker import make_tracker

    dtype = torch.bfloat16 if regime.get("weights_dtype") == "bf16" else torch.float32
    inputs = [torch.randn(shape, dtype=dtype, requires_grad=True) for shape in shapes]
    emulation = make_cuda_emulation(torch.bfloat16 if regime.get("autocast") else None, emulate_sdpa=True)
    tracker = make_tracker(1)
    with tracker, emulation:
        out = fn(*inputs)
        grad = torch.ones_like(out)
        tracker.traffic.clear()                     # the gradient seed is not part of the op
        tracker.set_phase("forward")
        out = fn(*inputs)
        out.backward(grad)
    return float(sum(tracker.traffic.values()))


def llama_components(regime: dict[str, Any]) -> dict[str, float]:
    """Bytes per element, forward + backward, of transformers' Llama RMSNorm (per hidden element), rotary
    embedding (per element of q and k) and SwiGLU product ``act(gate) * up`` (per intermediate element): the
    eager chains Liger's fused kernels replace (perfguide/techniques/liger_kernel.py)."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama as llama

    tokens, h, heads, hd, i = 256, 64, 4, 16, 128
    norm = llama.LlamaRMSNorm(h)
    if regime.get("weights_dtype") == "bf16":
        norm = norm.to(torch.bfloat16)
    rope = llama.LlamaRotaryEmbedding(LlamaConfig(hidden_size=heads * hd, num_attention_heads=heads, head_dim=hd))
    position_ids = torch.arange(tokens)[None]
    act = torch.nn.SiLU()

    def rotary(q: Any, k: Any) -> Any:
        cos, sin = rope(q, position_ids)
        q2, k2 = llama.apply_rotary_pos_emb(q, k, cos.to(q.dtype), sin.to(q.dtype))
        return torch.cat([q2.flatten(), k2.flatten()])

    # under autocast the residual stream (the norms' input) stays fp32, while q, k, gate and up leave 16-bit Linears
    sixteen = {"weights_dtype": "bf16"} if regime.get("autocast") else regime
    per_norm = _component_traffic(norm, [(tokens, h)], regime) / (tokens * h)
    per_rope = _component_traffic(rotary, [(1, heads, tokens, hd)] * 2, sixteen) / (2 * tokens * heads * hd)
    per_glu = _component_traffic(lambda g, u: act(g) * u, [(tokens, i)] * 2, sixteen) / (tokens * i)
    return {"rmsnorm_per_h": round(per_norm, 3), "rope_per_qk": round(per_rope, 3), "swiglu_per_i": round(per_glu, 3)}


def fit_family(name: str) -> dict[str, Any]:
    regimes = {}
    for regime, kw in REGIMES.items():
        t0 = time.perf_counter()
        step, s2 = block_form(name, kw)
        forward, _ = block_form(name, kw, ("forward",))
        drop_s2 = 0.0
        if TRAFFIC_FAMILIES[name][2] == "sdpa":
            s2 = eager_s2(name, kw)
            drop_s2 = round(eager_s2(name, kw, DROP) - s2, 3)
        regimes[regime] = {"per_token": step, "forward_per_token": forward, "eager_per_head_s2": s2,
                           "eager_dropout_per_head_s2": drop_s2, "logits_per_token_vocab": logits_form(name, kw)}
        if name == "llama":
            regimes[regime]["components"] = llama_components(kw)
        print(f"  {name}/{regime}: {json.dumps(regimes[regime])} ({time.perf_counter() - t0:.1f}s)", flush=True)
    return regimes


def main(argv: list[str] | None = None) -> int:
    args = family_args(__doc__, TRAFFIC_FAMILIES, argv)
    import torch
    import transformers

    data = json.loads(DATA.read_text(encoding="utf-8"))
    for name in args.family or sorted(TRAFFIC_FAMILIES):
        print(f"tracing {name} ...", flush=True)
        data["families"][name] = {
            "source": f"scripts/fit_traffic.py: fake-tensor traces of transformers' {name} blocks (torch {torch.__version__}, "
                      f"transformers {transformers.__version__}), memory-bound ops' input + output bytes (GEMMs, fused "
                      f"attention, views and allocations excluded), one-minus-two-block differences at h/i/q/kv steps "
                      f"around {BASE}, slope between b*s = {[b * SEQ for b in BATCHES]}, CUDA autocast lists and SDPA "
                      "kernels emulated" + ("; eager-only class: zero-length intercept of traces at s = "
                                             f"{SEQ} and {2 * SEQ}" if TRAFFIC_FAMILIES[name][2] == "eager" else ""),
            "regimes": fit_family(name),
        }
    if not args.dry_run:
        DATA.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {DATA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
