"""Loss-path bytes by transformers release and training loop (perfguide/memory/loss_path.py).

Hand-derived units are bytes per (batch x position x logit): held output + upcast copy + shift copy + fp32
log-softmax in forward, and (output still held) + log-softmax output + its gradient + the input gradient in backward.
The last test measures the installed transformers' ForCausalLMLoss on real CPU tensors.
"""

from __future__ import annotations

import pytest
from helpers import frozen_head_batch

from perfguide.memory.loss_path import era_at, hf_loss_bytes, loss_era, loss_path_units
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup


def _bf16(batch: int) -> Setup:
    return Setup(task="train", micro_batch_size=batch, seq_len=256, weights_dtype="bf16", optimizer=None)


@pytest.mark.parametrize(("version", "batch", "keeps", "units"), [
    # <= 4.45: the output holds the fp32 upcast (4); batch 1: no shift copy -> fwd 4 + 4, bwd 12 (+4 when held)
    ("4.38.2", 1, False, 12), ("4.38.2", 1, True, 16),
    # batch 2: + the fp32 shift copy in forward -> 4 + 4 + 4 = 12
    ("4.44.2", 2, False, 12), ("4.44.2", 2, True, 16),
    # 4.46-4.48: the output holds the bf16 logits (2), the loss its fp32 copy (4) and the shifted copy (4): 2+4+4+4
    ("4.47.1", 2, False, 14), ("4.47.1", 2, True, 14), ("4.47.1", 1, False, 12),
    # >= 4.49: labels are shifted, not the logits: fwd 2 + 4 + 4 = 10, bwd 12 (+2 when the bf16 output is held)
    ("4.49.0", 2, False, 12), ("4.50.0", 2, True, 14),
])
def test_units_hand_derived(version: str, batch: int, keeps: bool, units: int) -> None:
    assert loss_path_units(_bf16(batch), version, keeps) == units


def test_fp32_head_has_no_separate_upcast() -> None:
    fp32 = Setup(task="train", micro_batch_size=2, seq_len=256, weights_dtype="fp32", optimizer=None)
    assert loss_path_units(fp32, "4.47.1", False) == 4 + 0 + 4 + 4  # the loss's .float() returns the same tensor


def test_eras_switch_at_the_releases_that_changed_the_code() -> None:
    assert [loss_era(v).output_keeps for v in ("4.45.2", "4.46.0")] == ["fp32", "head"]
    assert [loss_era(v).shift_copy for v in ("4.48.0", "4.49.0")] == [True, False]


def test_era_at_picks_the_last_era_begun_by_the_release() -> None:
    """The shared rule (loss, TRL and bitsandbytes-kernel eras): a release at an era's first version is in it, one
    before it is in the previous, none installed is the newest, and one older than every era is the first."""
    eras = [("a", "0.39.0"), ("b", "0.48.0"), ("c", "1.2")]
    pick = [era_at(eras, r, lambda e: e[1])[0] for r in ("0.48.0", "0.47.2", "1.10.0", "1.2.0+cu121", None, "0.30")]
    assert pick == ["b", "a", "c", "c", "c", "a"]


def test_bytes_scale_with_batch_positions_and_vocab() -> None:
    spec = ModelSpec.from_any("gpt2")
    setup = _bf16(2)
    assert hf_loss_bytes(spec, setup, "4.47.1", False) == 2 * 256 * spec.vocab_size * 14


@pytest.mark.parametrize("keeps", [False, True])
def test_installed_transformers_matches_on_real_tensors(keeps: bool) -> None:
    """Peak live bytes of head + ForCausalLMLoss + backward, measured with perfguide's live-bytes tracker."""
    import transformers
    from transformers.loss.loss_utils import ForCausalLMLoss

    from perfguide.memory.tracing.tracker import make_tracker

    b, s, h, v = 2, 128, 32, 4096
    head, x, labels = frozen_head_batch(b, s, h, v)
    tracker = make_tracker(1)
    with tracker:
        logits = head(x)
        loss = ForCausalLMLoss(logits, labels, v)
        if not keeps:
            del logits
        tracker.set_phase("backward")
        loss.backward()
    peak = max(total for total, _ in tracker.peaks.values())
    expected = loss_path_units(_bf16(b), transformers.__version__, keeps)
    assert peak / (b * s * v) == pytest.approx(expected, abs=0.5)   # + x's gradient and the labels' small tensors
