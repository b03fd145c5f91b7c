"""Regenerate the coefficients in perfguide/data/activations.json by tracing real HF blocks on fake tensors.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_activations.py [--dry-run]``. For every family and precision
regime it traces one- and two-block models (the difference is one block) at several small shapes, varying one
dimension at a time (hidden, intermediate, q heads, kv heads) and two token counts (the slope in tokens removes
per-block constants such as autocast's cached 16-bit weight copies), then solves the per-token linear form that
``perfguide.memory.activations`` documents. Only numbers and sources are rewritten; families and aliases stay.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from perfguide.memory.tracing.build import with_depth  # noqa: E402
from perfguide.memory.tracing.step import run_step  # noqa: E402
from perfguide.setup import Setup  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "perfguide" / "data" / "activations.json"
REGIMES = {"fp32": {}, "amp": {"autocast": "bf16"}, "half": {"weights_dtype": "bf16"}}
SEQ, BATCHES, VOCAB = 64, (2, 4), 4096
Dims = dict[str, int]


def _llama(d: Dims) -> dict[str, Any]:
    hd = 16
    return dict(model_type="llama", hidden_size=d["h"], intermediate_size=d["i"], num_attention_heads=d["q"] // hd,
                num_key_value_heads=d["kv"] // hd, head_dim=hd, num_hidden_layers=2, vocab_size=VOCAB,
                tie_word_embeddings=False, max_position_embeddings=1024)


def _gpt2(d: Dims) -> dict[str, Any]:
    return dict(model_type="gpt2", n_embd=d["h"], n_inner=d["i"], n_head=d["h"] // 16, n_layer=2, vocab_size=VOCAB, n_positions=1024)


def _bert(d: Dims) -> dict[str, Any]:
    return dict(model_type="bert", hidden_size=d["h"], intermediate_size=d["i"], num_attention_heads=d["h"] // 16,
                num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024, architectures=["BertForMaskedLM"])


#: family -> (config builder, dimensions that vary independently; q and kv follow h where the family ties them)
FAMILIES: dict[str, tuple[Callable[[Dims], dict[str, Any]], tuple[str, ...]]] = {
    "llama": (_llama, ("h", "i", "q", "kv")),
    "gpt2": (_gpt2, ("h", "i")),
    "bert": (_bert, ("h", "i")),
}
#: kv stays below q at every point: GQA and MHA models differ in which K/V copies SDPA keeps (fp32 expands them),
#: and for MHA (q == kv) the GQA form gives the same total, so fitting on GQA shapes is exact for both.
FAMILIES_FREE = {build: free for build, free in FAMILIES.values()}
BASE: Dims = {"h": 64, "i": 128, "q": 128, "kv": 32}


def block_bytes(config: dict[str, Any], setup: Setup, phase: str = "head", part: str = "activations") -> int:
    """Bytes one block adds to ``part`` at the ``phase`` peak: two-block trace minus one-block trace."""
    two = run_step(with_depth(config, 2), setup).phases[phase].parts.get(part, 0)
    one = run_step(with_depth(config, 1), setup).phases[phase].parts.get(part, 0)
    return two - one


def token_slope(config: dict[str, Any], regime: dict[str, Any], **extra: Any) -> float:
    """Bytes per token per block: the block's bytes at two batch sizes, so per-block constants cancel."""
    a, b = (block_bytes(config, Setup(micro_batch_size=bs, seq_len=SEQ, optimizer="sgd", **regime, **extra)) for bs in BATCHES)
    return (b - a) / ((BATCHES[1] - BATCHES[0]) * SEQ)


def per_token(build: Callable[[Dims], dict[str, Any]], free: tuple[str, ...], regime: dict[str, Any]) -> dict[str, float]:
    """Solve bytes/token/block = sum(coef[d] * dim[d]) + coef['1'] from one-at-a-time dimension steps."""
    import numpy as np

    points = [dict(BASE)] + [{**BASE, d: BASE[d] * 2} for d in free]
    rows, ys = [], []
    for dims in points:
        full = {**dims, **({} if "q" in free else {"q": dims["h"], "kv": dims["h"]})}
        ys.append(token_slope(build(full), regime))
        rows.append([full[d] for d in free] + [1])
    coef = np.linalg.lstsq(np.array(rows, dtype=float), np.array(ys), rcond=None)[0]
    out = {d: round(float(c), 3) for d, c in zip((*free, "1"), coef)}
    return {k: v for k, v in out.items() if abs(v) > 1e-6}


def eager_s2(build: Callable[[Dims], dict[str, Any]], regime: dict[str, Any]) -> tuple[float, float]:
    """(bytes per batch*head*s^2, leftover bytes per token) that eager attention adds over SDPA, from two lengths."""
    import numpy as np

    cfg = build(BASE if "q" in FAMILIES_FREE[build] else {**BASE, "q": BASE["h"], "kv": BASE["h"]})
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    rows, ys = [], []
    for seq in (64, 128):
        common = dict(micro_batch_size=2, seq_len=seq, optimizer="sgd", **regime)
        diff = block_bytes(cfg, Setup(attn_implementation="eager", **common)) - block_bytes(cfg, Setup(**common))
        rows.append([2 * heads * seq * seq, 2 * seq])
        ys.append(diff)
    alpha, beta = np.linalg.solve(np.array(rows, dtype=float), np.array(ys, dtype=float))
    return round(float(alpha), 3), round(float(beta), 3)


def fit_family(name: str) -> tuple[dict[str, Any], list[str]]:
    build, free = FAMILIES[name]
    regimes, remarks = {}, []
    for regime, kw in REGIMES.items():
        t0 = time.perf_counter()
        base = build({**BASE, **({} if "q" in free else {"q": BASE["h"], "kv": BASE["h"]})})
        tokens = BATCHES[1] * SEQ
        setup = Setup(micro_batch_size=BATCHES[1], seq_len=SEQ, optimizer="sgd", **kw)
        ckpt = token_slope(base, kw, gradient_checkpointing=True) / BASE["h"]
        logits = run_step(base, setup).phases["backward_head"].parts["logits"] / (tokens * VOCAB)
        alpha, beta = eager_s2(build, kw)
        regimes[regime] = {
            "per_token": per_token(build, free, kw),
            "eager_per_head_s2": alpha,
            "ckpt_per_token": {"h": round(ckpt, 3)},
            "logits_per_token_vocab": round(logits, 3),
        }
        if abs(beta) > 0.5:
            remarks.append(f"{name}/{regime}: eager also changes per-token bytes by {beta:+.1f} B/token/block "
                           "(not expressible in the format; folded out)")
        print(f"  {name}/{regime}: {json.dumps(regimes[regime])} ({time.perf_counter() - t0:.1f}s)", flush=True)
    return regimes, remarks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the coefficients without writing the data file")
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES), help="only these families")
    args = ap.parse_args(argv)
    import torch
    import transformers

    data = json.loads(DATA.read_text(encoding="utf-8"))
    remarks: list[str] = []
    for name in args.family or sorted(FAMILIES):
        print(f"tracing {name} ...", flush=True)
        regimes, notes = fit_family(name)
        remarks += notes
        data["families"][name]["regimes"] = regimes
        data["families"][name]["source"] = (
            f"scripts/fit_activations.py: fake-tensor traces of HF {name} blocks (torch {torch.__version__}, transformers "
            f"{transformers.__version__}), one-minus-two-block differences at h/i/q/kv steps around {BASE} and "
            f"b*s in {[b * SEQ for b in BATCHES]}, CUDA SDPA kernel choice and autocast lists emulated, 512 B allocator rounding. "
            "amp per-token terms exclude autocast's cached 16-bit weight copies (a per-block constant of 2 bytes per Linear weight)."
        )
    for r in remarks:
        print("note:", r)
    if not args.dry_run:
        DATA.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {DATA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
