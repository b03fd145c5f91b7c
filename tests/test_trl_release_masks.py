"""The attention masks a TRL step hands SDPA per layer kind, for the batches TRL's own collators build
(scripts/trace_trl_release_masks.py; validation.md section on TRL v1.15.0's full-attention mask).

Real CPU tensors, a tiny Gemma 3 (5 sliding + 1 full layer, window 16, bf16, SDPA, non-reentrant checkpointing), one
forward and backward per batch; every SDPA call's mask is recorded. The reference is the hand count: a sliding layer
gets one bool rows x 1 x s x s mask (1 byte per element) built before the decoder loop and shared by the five sliding
blocks and their recomputes; the full-attention layer gets none (SDPA's is_causal) unless the 2-D attention mask
carries zeros (a padded batch), and then a bool mask of the same size. perfguide prices the unpadded case
(memory/masks.py ``checkpointed_mask_bytes``). The installed trl and transformers run here; the script runs the
release's (TRL 1.15.0, transformers 5.19.0) on PYTHONPATH with the same result.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
S = 256
pytestmark = pytest.mark.slow


def _script() -> Any:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import trace_trl_release_masks as t
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return t


@pytest.mark.parametrize(("case", "rows", "padded"), [("sft", 1, False), ("sft_padded", 2, True), ("dpo", 2, False),
                                                      ("dpo_padded", 2, True)])
def test_full_layer_mask_only_when_the_batch_is_padded(case: str, rows: int, padded: bool) -> None:
    t = _script()
    batch = t.collated(case, S)
    assert tuple(batch["input_ids"].shape) == (rows, S)
    assert bool((batch["attention_mask"] == 0).any()) == padded   # the collator pads to the batch's longest only
    calls = t.sdpa_masks(case, S)
    bool_mask = ((rows, 1, S, S), "bool")
    sliding = [m for _p, kind, m in calls if kind == "sliding_attention"]
    full = [m for _p, kind, m in calls if kind == "full_attention"]
    assert len(sliding) == 2 * 5 and len(full) == 2   # forward and recompute of each checkpointed block
    assert {m[:2] for m in sliding} == {bool_mask}
    assert {m[:2] if m else None for m in full} == ({bool_mask} if padded else {None})
    kept = t.kept_mask_bytes(calls)
    assert kept == {"sliding_attention": rows * S * S, "full_attention": rows * S * S if padded else 0}


def test_unpadded_masks_are_what_perfguide_prices() -> None:
    from perfguide import ModelSpec, Setup
    from perfguide.memory.masks import checkpointed_mask_bytes

    t = _script()
    for case, rows in (("sft", 1), ("dpo", 2)):
        spec = ModelSpec.from_any({**_gemma3_shape(), "max_position_embeddings": S})
        setup = Setup(attn_implementation="sdpa", micro_batch_size=rows, seq_len=S, gradient_checkpointing=True,
                      weights_dtype="bf16")
        kept = t.kept_mask_bytes(t.sdpa_masks(case, S))
        assert checkpointed_mask_bytes(spec, setup) == sum(kept.values()) == rows * S * S


def _gemma3_shape() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from trace_trl_gemma import GEMMA3
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return dict(GEMMA3)
