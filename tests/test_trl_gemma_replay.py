"""scripts/trace_trl_gemma_replay.py: TRL's SFT step on gemma-3-1b's shape (fused LM head, bf16, SDPA, non-reentrant
checkpointing) as allocation events on fake tensors. Checked against bytes counted by hand: the s x s storages are the
bool sliding mask the checkpointed blocks keep (1 B per s^2, made once in the forward) and the bf16 bias SDPA makes of
it at a sliding block (2 B), so at most 3 B per s^2 is alive at once and both are alive at the step's peak at a length
where they dominate (the forward builds the mask from bool pieces of the same size, at most 3 B at once); the
full-attention layer builds no mask (an unpadded batch takes SDPA's is_causal). Six layers
(five sliding, one full: Gemma 3's pattern) keep the trace short; the s x s terms do not depend on the depth."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
S = 65536
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def traced() -> tuple[Any, list[tuple[str, int, int]]]:
    pytest.importorskip("trl")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import trace_trl_gemma_replay as t
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return t, t.events_of_run(S, fused=True, steps=1, layers=6)


def _square(t: Any, keys: Any) -> list[tuple[str, str, int]]:
    return sorted((t.OPS[k][0], t.OPS[k][2], k) for k in keys if t.OPS[k][1][-2:] == (S, S))


def test_square_storages_are_the_mask_and_one_bias_at_a_time(traced: tuple[Any, list[tuple[str, int, int]]]) -> None:
    t, events = traced
    sizes = {k: b for kind, k, b in events if kind == "a"}
    square = _square(t, sizes)
    masks = [k for op, dtype, k in square if dtype == "bool"]
    biases = [k for op, dtype, k in square if dtype == "bfloat16"]
    # the sliding mask, 1 B per s^2, built in the forward from bool pieces (causal, window, their conjunction)
    assert masks and all(sizes[k] == S * S and t.OPS[k][3] == "step 1 forward" for k in masks)
    assert len(biases) == 2 * 5 and all(sizes[k] == 2 * S * S for k in biases)   # forward + recompute, 5 sliding blocks
    assert len(square) == len(masks) + len(biases)                      # nothing else s x s (no full-layer mask)
    live = most = 0
    for kind, k, _ in events:
        if k in sizes and t.OPS[k][1][-2:] == (S, S):
            live += sizes[k] if kind == "a" else -sizes[k]
            most = max(most, live)
    assert most == 3 * S * S


def test_peak_holds_the_mask_and_a_bias(traced: tuple[Any, list[tuple[str, int, int]]]) -> None:
    t, events = traced
    peak, at = t.live_peak(events)
    square = _square(t, at)
    assert sorted((op, dtype) for op, dtype, _ in square) == [("aten.bitwise_and.Tensor", "bool"),
                                                               ("aten.where.self", "bfloat16")]
    assert sum(at[k] for _, _, k in square) == 3 * S * S
    assert peak > 3 * S * S
