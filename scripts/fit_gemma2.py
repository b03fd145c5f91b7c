"""Gemma 2's own activation coefficients in perfguide/data/activations.json (family ``gemma2``).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_gemma2.py [--dry-run]``. transformers 5.x refuses SDPA for
Gemma2 (``_supports_sdpa = False``: it cannot soft-cap), so scripts/fit_activations.py, which fits the flash/SDPA
per-token terms from SDPA traces, cannot trace it. The attention code of the two families is the same (q/k/v
projections, rope, repeat_kv, eager scores, fp32 softmax); the blocks differ outside it: Gemma 2 norms four times
(input, post-attention, pre- and post-feedforward RMSNorm, each upcasting to fp32) and gates with gelu_pytorch_tanh.
So Gemma 2's terms are Llama's plus what both keep differently under eager attention at equal dimensions, traced
with the same fake-tensor tracer: per token per block from two batch sizes (per-block constants cancel) at two
lengths (the s^2 part separates), at one-at-a-time h/i/q/kv steps, soft-caps off (memory/softcap.py prices them).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_activations import BASE, BATCHES, DATA, LORA_R, REGIMES, _llama, block_bytes, family_args

from perfguide.setup import LoraSpec, Setup

FREE = ("h", "i", "q", "kv")
LENGTHS = (64, 128)


def _gemma2(d: dict[str, int]) -> dict[str, Any]:
    cfg = _llama(d)
    cfg.update(model_type="gemma2", query_pre_attn_scalar=16, sliding_window=4096, attn_logit_softcapping=None,
               final_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh")
    return cfg


def _slope(config: dict[str, Any], kw: dict[str, Any], seq: int, lora: LoraSpec | None = None) -> float:
    """Bytes per token per block at ``seq`` (eager): two batch sizes, so per-block constants cancel."""
    a, b = (block_bytes(config, Setup(micro_batch_size=bs, seq_len=seq, optimizer="sgd", attn_implementation="eager",
                                      lora=lora, **kw)) for bs in BATCHES)
    return (b - a) / ((BATCHES[1] - BATCHES[0]) * seq)


def _per_token_and_s2(config: dict[str, Any], kw: dict[str, Any], lora: LoraSpec | None = None) -> tuple[float, float]:
    """(bytes per token per block without the s^2 part, bytes per b x heads x s^2) from the slopes at two lengths."""
    (s1, y1), (s2, y2) = ((s, _slope(config, kw, s, lora)) for s in LENGTHS)
    per_head_s = (y2 - y1) / (s2 - s1)   # heads x s x alpha per token
    return y1 - per_head_s * s1, per_head_s / (config["num_attention_heads"])


def _solve(ys: list[float], points: list[dict[str, int]]) -> dict[str, float]:
    import numpy as np

    rows = [[p[d] for d in FREE] + [1] for p in points]
    coef = np.linalg.lstsq(np.array(rows, dtype=float), np.array(ys), rcond=None)[0]
    return {d: round(float(c), 3) for d, c in zip((*FREE, "1"), coef)}


def fit(llama: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    points = [dict(BASE)] + [{**BASE, d: BASE[d] * 2} for d in FREE]
    lora = LoraSpec(r=LORA_R, alpha=2 * LORA_R, target_modules="all-linear")
    out, notes = {}, []
    for regime, kw in REGIMES.items():
        delta, delta_lora, alphas = [], [], []
        for d in points:
            (pg, ag), (pl, _) = _per_token_and_s2(_gemma2(d), kw), _per_token_and_s2(_llama(d), kw)
            (pgl, _), (pll, _) = _per_token_and_s2(_gemma2(d), kw, lora), _per_token_and_s2(_llama(d), kw, lora)
            delta.append(pg - pl)
            delta_lora.append(pgl - pll)
            alphas.append(ag)
        base = llama[regime]
        d_full, d_lora = _solve(delta, points), _solve(delta_lora, points)
        entry = json.loads(json.dumps(base))
        entry["per_token"] = _add(base["per_token"], d_full)
        # frozen inputs = full - LoRA (+ adapters, equal in both families): Llama's plus the families' difference
        entry["frozen_linear_inputs_per_token"] = _add(base["frozen_linear_inputs_per_token"], _sub(d_full, d_lora))
        entry["eager_per_head_s2"] = round(sorted(alphas)[len(alphas) // 2], 3)
        out[regime] = entry
        notes.append(f"{regime}: per-token delta {d_full}, LoRA delta {d_lora}, eager s^2 {alphas}")
        print(f"  gemma2/{regime}: {json.dumps(entry)}", flush=True)
    return out, notes


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    keys = sorted(set(a) | set(b), key=("h", "i", "q", "kv", "1").index)
    summed = {k: round(a.get(k, 0.0) + b.get(k, 0.0), 3) for k in keys}
    return {k: v for k, v in summed.items() if abs(v) > 1e-6}


def _sub(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return _add(a, {k: -v for k, v in b.items()})


def main(argv: list[str] | None = None) -> int:
    args = family_args(__doc__ or "", ("gemma2",), argv)
    import torch
    import transformers

    data = json.loads(DATA.read_text(encoding="utf-8"))
    regimes, notes = fit(data["families"]["llama"]["regimes"])
    if args.dry_run:
        print("\n".join(notes))
        return 0
    data["aliases"].pop("gemma2", None)
    data["families"]["gemma2"] = {
        "source": (f"scripts/fit_gemma2.py: llama's coefficients plus Gemma2-minus-Llama per-token bytes of eager blocks at equal "
                   f"dimensions (fake-tensor traces, torch {torch.__version__}, transformers {transformers.__version__}; steps around "
                   f"{BASE}, batches {list(BATCHES)} x lengths {list(LENGTHS)}, soft-caps off); frozen_linear_inputs the same with "
                   f"PEFT LoRA all-linear r={LORA_R}; eager_per_head_s2 Gemma2's own (median over the steps). " + "; ".join(notes)),
        "regimes": regimes,
    }
    DATA.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
