"""bench/techniques.py: one reading per published figure, and torchtitan's chunked-loss bytes counted on real tensors.

The torchtune README rows appear in three benches; techniques_published.csv names the row that holds each figure
(``same_as``) instead of writing it again, and the throughput reading of the paged 4090 row is the one
bench/throughput_rows.py builds. The chunked-loss row's byte counts (TITAN_FULL_CE, TITAN_CHUNKED_CE) are measured
here with perfguide's live-bytes tracker on CPU tensors, running the loss the way torchtitan's train.py does
(model output, loss, ``del pred``, backward).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
from helpers import frozen_head_batch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))


def _rows() -> list[dict[str, str]]:
    with (BENCH / "data" / "techniques_published.csv").open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_rows_read_elsewhere_write_no_value_of_their_own() -> None:
    import techniques

    shared = [r for r in _rows() if r["same_as"]]
    assert {r["row_id"] for r in shared} >= {"1", "2", "3", "4", "5"}
    for r in shared:
        assert not (r["value_baseline"] or r["value_with"] or r["seq_len"] or r["micro_batch"]), r["row_id"]
        ref = techniques._referenced(r["same_as"])
        assert "torchtune" in ref["source"].lower()


def test_paged_4090_row_has_one_reading_in_both_benches() -> None:
    import techniques
    import throughput
    import throughput_rows as tr

    row = next(r for r in _rows() if r["row_id"] == "2")
    ref = techniques._referenced(row["same_as"])
    with pytest.raises(tr.Skip, match="compared in bench/results/techniques.md"):
        tr.case_of(ref)
    case = tr.case_of(ref, paged_overflow=True)
    out = techniques.same_as(row)
    assert not isinstance(out, str)
    assert out.predicted == f"{throughput.predict(case):.0f}" and out.published == f"{case.published:.0f}"


def test_a6000_rows_are_left_out_with_the_other_benches_reason() -> None:
    import techniques

    rows = {r["row_id"]: r for r in _rows()}
    assert "cannot have been the setup" in str(techniques.same_as(rows["4"]))
    assert "trust C" in str(techniques.same_as(rows["3"]))


def _titan_peak(chunks: int) -> float:
    """Peak live bytes per logit of torchtitan's loss step: 16-bit logits, CE on their fp32 upcast (whole, or per chunk
    of the sequence), ``del pred``, backward into the head."""
    import torch

    from perfguide.memory.tracing.tracker import make_tracker

    b, s, h, v = 1, 256, 32, 4096
    head, x, labels = frozen_head_batch(b, s, h, v)
    tracker = make_tracker(1)
    with tracker:
        pred = head(x)
        parts = zip(pred.chunk(chunks, dim=1), labels.chunk(chunks, dim=1))
        loss = sum(torch.nn.functional.cross_entropy(p.flatten(0, 1).float(), t.flatten(0, 1)) for p, t in parts) / chunks
        del pred, parts
        tracker.set_phase("backward")
        loss.backward()
    return max(total for total, _ in tracker.peaks.values()) / (b * s * v)


@pytest.mark.parametrize(("chunks", "name"), [(1, "TITAN_FULL_CE"), (8, "TITAN_CHUNKED_CE")])
def test_torchtitan_loss_bytes_per_logit_match_the_count(chunks: int, name: str) -> None:
    import techniques

    assert _titan_peak(chunks) == pytest.approx(getattr(techniques, name), abs=0.3)  # + x's gradient, labels, loss scalars
