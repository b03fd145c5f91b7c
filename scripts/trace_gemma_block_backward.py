"""Where a recomputed Gemma 2 / Gemma 3 block's backward peaks (memory/block_backward.py, data ``gemma_norm_moment``).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_gemma_block_backward.py [--arch=gemma3|gemma2] [--real] [CASE ...]``
(the cases: trace_models.CASES' three priced LoRA ones and FULL_CASES; default all seven).
The models of scripts/trace_models.py (three blocks, the middle one traced, SDPA, LoRA r 8 on all seven Linears or
every weight trainable, both checkpoint variants) and scripts/trace_block_backward.py's live-bytes marks. Gemma's
block has four RMSNorms that compute in fp32 (``x.float()``, ``* (1 + weight.float())``, ``.type_as(x)``), one after
the MLP, so its backward starts with an fp32 norm backward while every tensor the recompute saved is alive; Llama's
starts with down_proj's. Each autograd node's highest live bytes, less the storages the recompute saves for
backward (reentrant's ``saved_tensors_hooks`` count, the reference activations.layer_bytes prices), is differenced
over two lengths per node, so the block's weight gradients (length-free, and larger than a short sequence's
activations in these small models) cannot move the peak between nodes as the length changes; the block's in-flight
bytes per token are the highest node's. Non-reentrant values are above the live bytes as the recompute starts, which
already hold the gradients made before it (printed: start non-reentrant minus reentrant).

The peak is the larger of two moments: the post-feedforward norm's fp32 backward (its ``pow`` backward: ``h`` only)
and the gated product's backward in the MLP (``i`` and ``h``). Fitted per case on shapes where one moment is clearly
the larger (norm: i = 2 h; MLP: i = 10-12 h), then checked at shapes not fitted: h 96 / i 576, other head counts,
kv heads and head_dim, a local (sliding) middle block, and with ``--real`` Gemma 3 1B's block (h 1152, FFN 6912,
4 heads of 256, 1 kv head) at s 32 / 64.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import trace_block_backward as trace
from trace_models import CASES, FULL_CASES, traced

NORM_SHAPES: tuple[tuple[int, int], ...] = ((64, 128), (128, 256))
MLP_SHAPES: tuple[tuple[int, int], ...] = ((64, 640), (64, 768), (128, 1024))
CHECKS: tuple[tuple[int, int, dict[str, Any]], ...] = (
    (96, 576, {}), (128, 768, {"heads": 8, "kv": 4, "head_dim": 32}), (128, 512, {"heads": 2, "kv": 1, "head_dim": 128}),
    (128, 768, {"middle": "sliding_attention"}), (160, 480, {"heads": 5, "kv": 5, "head_dim": 32}))
REAL = (1152, 6912, {"heads": 4, "kv": 1, "head_dim": 256})   # google/gemma-3-1b-pt's config.json


def node_peaks(case: str, arch: str, h: int, i: int, reentrant: bool, dims: dict[str, Any],
               lengths: tuple[int, int]) -> tuple[list[tuple[str, float]], float, float]:
    """Per autograd node of the middle block's backward (in order), its highest live bytes per token above the live
    bytes as the recompute starts (two lengths differenced, node by node); the start itself per token; and the
    storages the recompute saves for backward per token (this variant's count)."""
    s1, s2 = lengths
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        model, autocast = traced(case, h, i, reentrant, tmp, arch=arch, dims=dims)
        for s in lengths:
            trace.PROFILE = []
            start, _, _, saved = trace.block_marks(model, s, autocast)
            groups: list[list[Any]] = []
            for name, total in trace.PROFILE:
                if groups and groups[-1][0] == name:
                    groups[-1][1] = max(groups[-1][1], total)
                else:
                    groups.append([name, total])
            runs.append((start, saved, groups))
    trace.PROFILE = None
    (a1, k1, g1), (a2, k2, g2) = runs
    if [g[0] for g in g1] != [g[0] for g in g2]:
        raise RuntimeError(f"{arch} {case} h {h} i {i}: the backward ran other nodes at length {s2} than at {s1}")
    ds = s2 - s1
    nodes = [(name, ((x2 - a2) - (x1 - a1)) / ds) for (name, x1), (_, x2) in zip(g1, g2)]
    return nodes, (a2 - a1) / ds, (k2 - k1) / ds


def in_flight(case: str, arch: str, h: int, i: int, dims: dict[str, Any] | None = None,
              lengths: tuple[int, int] = (128, 256)) -> dict[str, Any]:
    """Per checkpoint variant: the block backward's bytes per token above the recompute's saved storages (the
    reentrant count: non-reentrant's early stop may save fewer) and the node where they peak; and the gradients made
    before a non-reentrant recompute starts (its start minus reentrant's), per token."""
    dims = dims or {}
    out: dict[str, Any] = {}
    re_nodes, re_start, saved = node_peaks(case, arch, h, i, True, dims, lengths)
    nr_nodes, nr_start, _ = node_peaks(case, arch, h, i, False, dims, lengths)
    for mode, nodes in (("reentrant", re_nodes), ("non_reentrant", nr_nodes)):
        name, value = max(nodes, key=lambda node: node[1])
        out[mode] = (round(value - saved, 2), name or "(recompute)")
    out["before"] = round(nr_start - re_start, 2)
    return out


def fit(case: str, arch: str) -> dict[str, dict[str, dict[str, float]]]:
    """Per checkpoint variant, the two moments' forms: norm (per hidden unit, + per token) and MLP (per FFN unit, per
    hidden unit, + per token), from NORM_SHAPES and MLP_SHAPES."""
    norm = [in_flight(case, arch, h, i) for h, i in NORM_SHAPES]
    mlp = [in_flight(case, arch, h, i) for h, i in MLP_SHAPES]
    forms = {}
    for mode in ("reentrant", "non_reentrant"):
        (n1, n2), (m1, m2, m3) = ([r[mode][0] for r in rows] for rows in (norm, mlp))
        (h1, _), (h2, _) = NORM_SHAPES
        nh = (n2 - n1) / (h2 - h1)
        (mh1, mi1), (_, mi2), (mh3, mi3) = MLP_SHAPES
        per_i = (m2 - m1) / (mi2 - mi1)
        per_h = ((m3 - per_i * mi3) - (m1 - per_i * mi1)) / (mh3 - mh1)
        forms[mode] = {"norm": {"h": round(nh, 2), "t": round(n1 - nh * h1, 2)},
                       "mlp": {"i": round(per_i, 2), "h": round(per_h, 2), "t": round(m1 - per_i * mi1 - per_h * mh1, 2)}}
        print(f"{arch} {case} {mode}: norm {forms[mode]['norm']} (at {norm[0][mode][1]}), mlp {forms[mode]['mlp']} "
              f"(at {mlp[0][mode][1]}); before the recompute {norm[1]['before'] / NORM_SHAPES[1][0]:.2f} B per hidden unit")
        sys.stdout.flush()
    return forms


def predicted(forms: dict[str, dict[str, float]], h: int, i: int) -> float:
    norm, mlp = forms["norm"], forms["mlp"]
    return max(norm["h"] * h + norm["t"], mlp["i"] * i + mlp["h"] * h + mlp["t"])


def check(case: str, arch: str, forms: dict[str, dict[str, dict[str, float]]], h: int, i: int, dims: dict[str, Any],
          lengths: tuple[int, int] = (128, 256)) -> None:
    """Print the traced in-flight bytes at a shape beside the larger of the fitted forms, per checkpoint variant."""
    got = in_flight(case, arch, h, i, dims, lengths)
    lines = [f"  check {arch} {case} {mode} h {h} i {i} {dims}: measured {got[mode][0]:.0f} B per token (at {got[mode][1]}), "
             f"the larger form gives {predicted(forms[mode], h, i):.0f} ({got[mode][0] / predicted(forms[mode], h, i) - 1:+.2%}); "
             f"before the recompute {got['before'] / h:.2f} h" for mode in ("reentrant", "non_reentrant")]
    print("\n".join(lines), flush=True)


def main() -> int:
    arch = next((a.removeprefix("--arch=") for a in sys.argv if a.startswith("--arch=")), "gemma3")
    cases = tuple(a for a in sys.argv[1:] if not a.startswith("--")) or (*tuple(c for c in CASES if c != "nf4_half_stream"), *FULL_CASES)
    for case in cases:
        forms = fit(case, arch)
        for h, i, dims in CHECKS:
            check(case, arch, forms, h, i, dims)
        if "--real" in sys.argv:
            check(case, arch, forms, *REAL, lengths=(32, 64))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
