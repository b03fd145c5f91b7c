"""Trace what one decoder block keeps for backward without checkpointing, HF's modules against Liger's kernels
(techniques/liger_kernel.py ``norm_savings``, the blocks that are not recomputed).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_liger_unchecked.py``. The models and cases are
scripts/trace_models.py's (a random-init Mistral-shaped Llama, three blocks; LoRA r 8 on a bf16 base under
bf16 autocast, and the ``--full`` cases: every weight trainable), with checkpointing switched off, and the Liger
stand-ins of scripts/liger_standins.py. perfguide's live-bytes tracker notes the live bytes as the middle block's
forward starts and as the next block's starts: what the middle block added is what it keeps for backward plus its
output, less its input where nothing kept it (HF frees it there; Liger's input norm keeps it), so HF's less Liger's
is what the block keeps less under Liger. Two lengths differenced (s 256 / 512), two FFN widths (224 / 448 at h 64) split per FFN unit
from per hidden unit; printed per token.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import trace_models as trace


def block_kept(case: str, h: int, i: int, liger: bool, seq: int) -> int:
    """Live bytes the middle block's forward adds, up to the next block's start (no checkpointing)."""
    import torch

    from perfguide.memory.tracing.tracker import make_tracker

    with tempfile.TemporaryDirectory() as tmp:
        model, autocast = trace.traced(case, h, i, True, tmp, liger)
        (model.get_base_model() if hasattr(model, "get_base_model") else model).gradient_checkpointing_disable()
        layers = trace.decoder(model).layers
        tracker = make_tracker(1)
        marks: dict[str, int] = {}

        def start(module: Any, args: Any) -> None:
            marks["start"] = tracker.total

        def end(module: Any, args: Any) -> None:
            marks["end"] = tracker.total

        handles = [layers[1].register_forward_pre_hook(start), layers[2].register_forward_pre_hook(end)]
        ids = torch.randint(0, 256, (1, seq))
        try:
            with tracker, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                model(input_ids=ids, labels=ids)
        finally:
            for handle in handles:
                handle.remove()
    return marks["end"] - marks["start"]


def kept_per_token(case: str, liger: bool, h: int = 64, i1: int = 224, i2: int = 448) -> dict[str, float]:
    """Bytes per token the block keeps, per FFN unit ("i") and per hidden unit ("h", the rest at q = h, kv = h / 4)."""
    per = {i: (block_kept(case, h, i, liger, 512) - block_kept(case, h, i, liger, 256)) / 256 for i in (i1, i2)}
    per_i = (per[i2] - per[i1]) / (i2 - i1)
    return {"i": round(per_i, 2), "h": round((per[i1] - per_i * i1) / h, 2)}


def main() -> int:
    for case in ("half_autocast", "full_half_autocast", "full_half", "full_fp32_autocast", "full_fp32"):
        hf, lg = kept_per_token(case, False), kept_per_token(case, True)
        less = {k: round(hf[k] - lg[k], 2) for k in hf}
        print(f"{case}: HF keeps {hf}, Liger {lg}: Liger keeps less {less} per token")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
