"""The slowest rank's padded length (bench/throughput_padding.py): order statistics against closed forms and
tables, the logged token counts against the rows' independently read mean lengths, and the load-time checks."""

from __future__ import annotations

import csv
import math
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from throughput_padding import (  # noqa: E402
    DATA,
    RankPadding,
    effective_lengths,
    load,
    pooled_rank_sigma,
    slowest_rank_length,
)


def test_expected_maximum_of_two_normals_is_the_closed_form() -> None:
    # E[max(X1, X2)] = mu + sigma / sqrt(pi) for two independent N(mu, sigma)
    assert slowest_rank_length(300.0, 50.0, 2, 10_000) == pytest.approx(300 + 50 / math.sqrt(math.pi), rel=1e-6)


def test_expected_maximum_of_four_normals_matches_the_tables() -> None:
    # tabulated expected largest of 4 standard normals (Teichroew 1956; Harter 1961): 1.02937537
    assert slowest_rank_length(0.0, 1.0, 4, 1e9) == pytest.approx(1.02937537, abs=1e-6)
    assert slowest_rank_length(0.0, 1.0, 8, 1e9) == pytest.approx(1.42360030, abs=1e-6)


def test_the_cut_off_bounds_the_slowest_rank() -> None:
    # far below the mean the cap is the length; a zero spread is the mean itself
    assert slowest_rank_length(400.0, 80.0, 4, 100) == pytest.approx(100.0, abs=1e-9)
    assert slowest_rank_length(250.0, 0.0, 4, 512) == 250.0
    # with the cap at the mean: E[min(M, mu)] = mu - E[(mu - M)+], and P(M < mu) = 1/16 keeps it just under mu
    capped = slowest_rank_length(250.0, 60.0, 4, 250)
    assert 250 - 60 * 0.1 < capped < 250


def test_pooled_spread_is_the_within_run_variance_times_the_ranks() -> None:
    runs = [RankPadding("a", "m", 4, 32, 512, (1.0, 3.0)), RankPadding("b", "m", 4, 32, 512, (10.0, 14.0))]
    # deviations from each run's mean: -1, 1, -2, 2 -> 10 over 2 degrees of freedom = 5 for a mean of 4 ranks
    assert pooled_rank_sigma(runs) == pytest.approx(math.sqrt(5 * 4))


def test_logged_counts_give_the_rows_mean_lengths() -> None:
    """The CSV's seq_len was read from the same logs in stop 42 (num_input_tokens_seen over the timed steps / steps
    x ranks x micro-batch, rounded): the counts stored here must give the same mean, and the same batch and ranks."""
    published = {r["row_id"]: r for r in csv.DictReader((ROOT / "bench/data/published_throughput.csv").open())}
    lengths = effective_lengths()
    assert len(lengths) == 27
    for rid, entry in load().items():
        row = published[rid]
        assert (row["model"], int(row["micro_batch"]), int(row["num_gpus"])) == (entry.model, entry.micro_batch,
                                                                                 entry.ranks)
        stated = int(row["seq_len"].split()[0])
        assert abs(lengths[rid][0] - stated) <= 1, rid
        m = re.search(r"num_input_tokens_seen (\d+) -> (\d+) over steps 2-(\d+)", row["seq_len"])
        assert m, rid
        seen = [int(x) for x in next(r for r in csv.DictReader(DATA.open()) if r["row_id"] == rid)["tokens_seen"].split()]
        assert (seen[0], seen[-1], len(seen)) == tuple(map(int, m.groups())), rid
        assert stated < lengths[rid][1] <= entry.max_len


def test_a_step_that_is_not_whole_padded_batches_is_refused(tmp_path: Path) -> None:
    text = DATA.read_text().splitlines()
    header, first = text[0], text[1].split(",")
    first[-1] = "38912 77824 119800"   # 40,888 - ... not a multiple of 32 rows x 16
    bad = tmp_path / "rank_padding.csv"
    bad.write_text("\n".join([header, ",".join(first)]) + "\n")
    with pytest.raises(ValueError, match="row 563: a step of 41976 tokens is not 4 ranks of 32 rows"):
        load(bad)


def test_rows_read_at_the_slowest_rank_and_rescaled_to_the_logged_tokens() -> None:
    import throughput_rows as tr

    rows = {r["row_id"]: r for r in csv.DictReader(tr.CSV.open())}
    case = tr.case_of(rows["571"])
    mean_len, slow = effective_lengths()["571"]
    assert case.setup.seq_len == round(slow) > int(rows["571"]["seq_len"].split()[0])
    assert case.rank_share == pytest.approx(mean_len / round(slow))
    # a fixed-length row is untouched
    fixed = next(tr.case_of(r) for r in rows.values() if r["source"] == "pytorch/torchtune" and r["row_id"] == "404")
    assert fixed.rank_share == 1.0 and fixed.setup.seq_len == 4096
