"""scripts/trace_swift_replay.py, behind docs/validation.md section 31: the length sampler against the published token
statistics of cls-fudan-news-zh (bench/data/swift_dataset_lengths.csv), the traced step's loss-path requests against
bytes counted by hand from Qwen-1's loss lines, the affine reading of a step's requests in the length, and a run's
replay against an allocator sequence worked by hand."""

from __future__ import annotations

import importlib.util
import math
import random
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

MiB = 2**20
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def sw() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("trace_swift_replay", SCRIPTS / "trace_swift_replay.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_sampler_matches_the_published_statistics(sw: ModuleType) -> None:
    stats = sw.read_lengths("cls-fudan-news-zh")
    assert (stats["mean"], stats["std"], stats["min"], stats["max"], stats["size"]) == (3234.4, 2547.5, 91, 19548, 4959)
    draw = sw.draw_lengths(stats, 200_000, random.Random(7))
    assert statistics.fmean(draw) == pytest.approx(3234.4, rel=0.02)
    assert statistics.pstdev(draw) == pytest.approx(2547.5, rel=0.04)
    assert min(draw) >= 91 and max(draw) <= 19548
    assert min(draw) < 300 and max(draw) > 15000          # the published range is reached, not a narrow core


def test_a_run_drops_long_samples_and_pads_each_batch_to_its_longest(sw: ModuleType) -> None:
    stats = sw.read_lengths("cls-fudan-news-zh")
    steps = sw.run_lengths(stats, 2048, None, 1, 1, random.Random(0))
    # truncation_strategy 'delete' keeps the samples up to 2048 tokens: the restricted log-normal's share of 4959
    mu, sigma = sw.fitted_params(stats)
    cdf = statistics.NormalDist(mu, sigma).cdf
    share = (cdf(math.log(2048.5)) - cdf(math.log(90.5))) / (cdf(math.log(19548.5)) - cdf(math.log(90.5)))
    assert len(steps) == pytest.approx(4959 * share, rel=0.05) and max(steps) <= 2048
    pairs = sw.run_lengths(stats, 2048, 1000, 2, 1, random.Random(0))
    singles = sw.run_lengths(stats, 2048, 1000, 1, 1, random.Random(0))
    assert len(pairs) == -(-len(singles) // 2)


def test_the_loss_path_requests_are_qwen1s_lines_counted_by_hand(sw: ModuleType) -> None:
    """At s tokens and vocabulary V: the head's bf16 logits (2 sV), CrossEntropyLoss's fp32 cast of the shifted
    logits (4 (s-1)V, a view at batch 1) and its saved log-softmax (4 (s-1)V), accelerate's fp32 logits (4 sV); in
    backward the nll gradient and the log-softmax gradient (4 (s-1)V each), the cast back to bf16 (2 (s-1)V) and the
    slice's bf16 gradient (2 sV). One block on the 1.8B's shape: every other request is far smaller."""
    s, v = 64, 151936
    events, _ = sw.events_of_step("Qwen/Qwen-1_8B-Chat", s, layers=1)
    big = sorted(n for kind, _, n in events if kind == "a" and n >= 2 * (s - 1) * v)
    assert big == sorted([2 * s * v, 4 * (s - 1) * v, 4 * (s - 1) * v, 4 * s * v,
                          4 * (s - 1) * v, 4 * (s - 1) * v, 2 * (s - 1) * v, 2 * s * v])


def test_a_steps_requests_are_affine_in_the_length(sw: ModuleType) -> None:
    affine, _ = sw.affine_events("Qwen/Qwen-1_8B-Chat", 32, 64, layers=1)
    events, _ = sw.events_of_step("Qwen/Qwen-1_8B-Chat", 48, layers=1)
    assert sw.at_length(affine, 48) == events


def test_a_run_keeps_every_segment_its_longest_steps_reserved(sw: ModuleType) -> None:
    """One 20 MiB-per-token request a step, lengths 1, 2, 1, 2, 3: 20 MiB, then 40 (the 20 MiB block cannot serve it),
    1 and 2 served from the cache, then 60: 120 MiB reserved, 60 allocated at the peak."""
    affine = [("a", 1, 0, 20 * MiB), ("f", 1, 0, 0)]
    alloc, trail = sw.replay_run(affine, [], [1, 2, 1, 2, 3])
    assert [t // MiB for t in trail] == [20, 60, 60, 60, 120]
    assert alloc.peak_allocated == 60 * MiB and alloc.segments == 3
