"""Trace the s x s bytes one eager attention block's backward holds beyond what its forward saved
(data/activations.json ``eager_backward``).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_eager_backward.py``. perfguide's fake-tensor tracer on one-block
models of each family (scripts/fit_activations.py builders at h 64, 4 heads; Gemma2 as scripts/trace_softcap.py),
eager attention, b 2 x s 128 / 256 / 512: the s^2 coefficient (quadratic fit) of the backward-phase peak minus that of
the forward/loss peak, per b x heads x s^2, with attention dropout 0 and 0.1.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_activations import REGIMES, _bert, _gpt2, _gpt_neox, _llama, _opt
from fit_t5 import _whisper
from trace_softcap import gemma2

from perfguide.memory.tracing.build import with_depth
from perfguide.memory.tracing.step import run_step
from perfguide.setup import Setup

B, LENGTHS = 2, (128, 256, 512)
BUILDS: dict[str, Callable[[float], dict[str, Any]]] = {
    "llama": lambda p: _llama({"h": 64, "i": 128, "q": 64, "kv": 32}, p),
    "gemma2": lambda p: {**gemma2(None, None), "attention_dropout": p},
    "bert": lambda p: _bert({"h": 64, "i": 128}, p), "gpt2": lambda p: _gpt2({"h": 64, "i": 128}, p),
    "opt": lambda p: _opt({"h": 64, "i": 128}, p), "gpt_neox": lambda p: _gpt_neox({"h": 64, "i": 128}, p),
    "whisper": lambda p: {**_whisper({"h": 64, "i": 128, "q": 64}), "attention_dropout": p},
}
#: an encoder-decoder's decoder length, held fixed so that the s^2 terms are its encoder block's (Whisper's labels are
#: short beside its 1500 encoder positions; the decoder's own maps are T^2 and T x S)
TARGET = {"whisper": 16}
#: lengths where the s^2 terms dominate every traced peak (at Whisper's h 64 and 128-512 tokens the peak moves between
#: operations from one length to the next, and the quadratic fit read 16 B per head-s^2 where Whisper-small's own
#: width at 1000-2000 tokens traces 12)
FAMILY_LENGTHS = {"whisper": (1024, 1536, 2048)}


def s2_coefficients(config: dict[str, Any], kw: dict[str, Any], target: int | None = None) -> tuple[float, float]:
    """(forward/loss peak, backward peak) bytes per b x heads x s^2 of a one-block model."""
    import numpy as np

    heads = int(config.get("num_attention_heads") or config.get("n_head") or config.get("encoder_attention_heads") or 1)
    peaks: dict[str, list[int]] = {"head": [], "backward": []}
    lengths = FAMILY_LENGTHS.get(str(config.get("model_type")), LENGTHS)
    for s in lengths:
        phases = run_step(config, Setup(attn_implementation="eager", micro_batch_size=B, seq_len=s, target_len=target,
                                        optimizer=None, **kw)).phases
        for name, values in peaks.items():
            values.append(phases[name].total)
    fit = {name: np.polyfit(np.array(lengths, float), np.array(v, float), 2)[0] / (B * heads) for name, v in peaks.items()}
    return fit["head"], fit["backward"]


def main() -> int:
    only = sys.argv[1:]
    for family, build in BUILDS.items():
        if only and family not in only:
            continue
        for p in (0.0, 0.1):
            for regime, kw in REGIMES.items():
                saved, backward = s2_coefficients(with_depth(build(p), 1), kw, TARGET.get(family))
                print(f"{family} dropout {p} {regime}: saved {saved:.3f}, backward {backward:.3f}, beyond {backward - saved:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
