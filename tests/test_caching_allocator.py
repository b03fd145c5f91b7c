"""scripts/caching_allocator.py, the replay of PyTorch's CUDA caching allocator behind docs/validation.md section 25,
checked on request sequences whose reserved bytes follow by hand from the allocator's rules (c10/cuda/
CUDACachingAllocator.cpp: 512 B rounding, the 1 MiB small/large split, 2 MiB / 20 MiB / 2 MiB-rounded segments,
best fit, splitting, merging), and on the cross-entropy path of transformers 4.39.3 at batch 1, counted by hand."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

MiB = 2**20


@pytest.fixture(scope="module")
def ca() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "scripts" / "caching_allocator.py"
    spec = importlib.util.spec_from_file_location("caching_allocator", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses resolve the module by name
    spec.loader.exec_module(module)
    return module


def test_request_and_segment_sizes(ca: ModuleType) -> None:
    assert [ca.round_size(n) for n in (1, 512, 513, 1000)] == [512, 512, 1024, 1024]
    assert ca.allocation_size(1000) == 2 * MiB             # small pool: a 2 MiB segment
    assert ca.allocation_size(MiB + 512) == 20 * MiB       # large, under 10 MiB: a 20 MiB segment
    assert ca.allocation_size(10 * MiB) == 10 * MiB        # from 10 MiB: rounded up to 2 MiB
    assert ca.allocation_size(11 * MiB) == 12 * MiB


def test_small_requests_share_one_segment_and_large_ones_split(ca: ModuleType) -> None:
    a = ca.Allocator()
    a.replay([("a", i, 1000) for i in range(4)])           # 4 x 1 KiB in one 2 MiB segment
    assert (a.reserved, a.allocated, a.segments) == (2 * MiB, 4 * 1024, 1)
    a.replay([("a", 10, 3 * MiB), ("a", 11, 3 * MiB)])     # both carved from one 20 MiB segment
    assert (a.reserved, a.segments) == (22 * MiB, 2)
    a.replay([("a", 12, 15 * MiB)])                        # 14 MiB left there: too small, a new 16 MiB segment
    assert (a.reserved, a.segments) == (38 * MiB, 3)


def test_best_fit_and_merge(ca: ModuleType) -> None:
    a = ca.Allocator()
    a.replay([("a", 1, 100 * MiB), ("a", 2, 40 * MiB), ("f", 1, 0)])
    a.replay([("a", 3, 30 * MiB)])                         # the 40 MiB segment is busy: the freed 100 MiB is the only fit
    assert a.reserved == 140 * MiB and a.live[3].ptr == a.live[2].ptr - (1 << 40) - 100 * MiB
    a.replay([("a", 4, 70 * MiB)])                         # the 70 MiB rest of that segment, exactly
    assert a.reserved == 140 * MiB
    a.replay([("f", 3, 0), ("f", 4, 0), ("a", 5, 100 * MiB)])   # the two halves merged back into 100 MiB
    assert (a.reserved, a.segments) == (140 * MiB, 2)


def test_freed_fp16_logits_stay_cached_through_the_loss(ca: ModuleType) -> None:
    """transformers 4.39.3 at batch 1 (s tokens, vocabulary V): the head's fp16 logits (2 B per logit), their fp32
    upcast (4), the fp16 block freed; log-softmax's output (4); the fp32 logits freed when the output is dropped; in
    backward nll_loss's gradient (4) and log-softmax's input gradient (4), both live with the saved output (12 B per
    logit: the allocated peak), then slice_backward's full-size gradient (4) and its fp16 cast (2). No 4 B request
    fits the freed 2 B block, so reserved peaks at 2 + 4 + 4 + 4 = 14 B per logit."""
    s, v = 32768, 32000
    n = s * v
    events = [("a", 1, 2 * n), ("a", 2, 4 * n), ("f", 1, 0), ("a", 3, 4 * (n - v)), ("f", 2, 0),
              ("a", 4, 4 * (n - v)), ("a", 5, 4 * (n - v)), ("f", 3, 0), ("f", 4, 0),
              ("a", 6, 4 * n), ("f", 5, 0), ("a", 7, 2 * n), ("f", 6, 0), ("f", 7, 0)]
    a = ca.Allocator()
    a.replay(events)
    rounded = ca.allocation_size
    # a (s - 1)-row request leaves 4 x V B of its 2 MiB-rounded segment, under the 1 MiB a split needs: it takes it whole
    assert a.peak_allocated == 3 * rounded(4 * (n - v)) == 12 * n
    assert a.peak_reserved == rounded(2 * n) + rounded(4 * n) + 2 * rounded(4 * (n - v))
    assert a.peak_reserved == 14 * n                       # 2,000 and 4,000 MiB segments: whole multiples of 2 MiB
    a.replay([(k, key + 100, b) for k, key, b in events])  # the next micro-step reuses every segment
    assert a.peak_reserved == 14 * n


L, H, V, HEAD_DIM = 32, 4096, 32000, 128   # meta-llama/Llama-2-7b-hf config.json
MEASURED = {str(1000 + k): 1024 << k for k in range(6)}


def test_replayed_allocated_peak_by_hand() -> None:
    """bench/data/allocator_replays.csv's allocated peaks (the step's own tensors; weights, LoRA gradients and AdamW
    state come before it) at the cross-entropy backward, counted by hand: the 32 checkpointed blocks' fp16 inputs,
    the final norm's saved fp32 input, log-softmax's output and two gradients (4 B per logit each, each (s - 1)-row
    request taking its whole 2 MiB-rounded s-row segment), and the rotary cos / sin pair (fp16, head_dim wide) the
    checkpointed blocks are handed; within 1 MiB (token ids, labels, positions: int64)."""
    with (Path(__file__).resolve().parents[1] / "bench" / "data" / "allocator_replays.csv").open() as f:
        table = {int(r["seq_len"]): r for r in csv.DictReader(f)}
    assert sorted(table) == sorted(MEASURED.values())
    for s in (4096, 8192, 16384, 32768):
        hand = L * s * H * 2 + s * H * 4 + 3 * 4 * s * V + 2 * s * HEAD_DIM * 2
        assert 0 <= int(table[s]["step_allocated_bytes"]) - hand < MiB
        assert 1.3 < int(table[s]["step_reserved_bytes"]) / int(table[s]["step_allocated_bytes"]) < 1.45


def test_measured_rows_take_the_replayed_cache(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """Rows 1000-1005 keep perfguide's allocated peak and take the replay's cached bytes in place of the training
    ratio; the OOM rows of the same table and other sources' rows are priced as before."""
    from accuracy_replay import replayed_cache, with_replayed_reserve

    spec = acc._spec("meta-llama/Llama-2-7b-hf")
    for rid, s in MEASURED.items():
        setup = acc._train_setup(rows[rid], spec)
        assert setup.seq_len == s
        est = acc._verdict_estimate(rows[rid], spec, setup, acc._hardware(rows[rid]["gpu_type"], 1))
        cached = replayed_cache(rows[rid], setup)
        assert cached is not None and cached > 0
        out = with_replayed_reserve(rows[rid], setup, est)
        assert out.peak_allocated == est.peak_allocated and out.peak_reserved == est.peak_allocated + cached
        assert out.device_total - out.peak_reserved == est.device_total - est.peak_reserved   # the CUDA context as was
    for rid in ("1006", "1007"):
        assert replayed_cache(rows[rid], acc._train_setup(rows[rid], spec)) is None
    other = dict(rows["1005"], source_group="another_source")
    assert replayed_cache(other, acc._train_setup(other, spec)) is None


def test_cap_releases_whole_cached_segments_then_retries(ca: ModuleType) -> None:
    """Capped at 40 MiB: a freed 20 MiB segment stays cached; a 30 MiB request finds no fitting block, a new 30 MiB
    segment would make 50 MiB, so the allocator returns the whole cached segment (20 -> 0) and retries: 30 MiB."""
    a = ca.Allocator(limit=40 * MiB)
    a.replay([("a", 1, 20 * MiB), ("f", 1, 0)])
    assert (a.reserved, a.segments) == (20 * MiB, 1)
    a.replay([("a", 2, 30 * MiB)])
    assert (a.reserved, a.allocated, a.segments) == (30 * MiB, 30 * MiB, 1)


def test_cap_cannot_release_a_split_segment(ca: ModuleType) -> None:
    """Capped at 64 MiB: a 40 MiB segment freed, then a 12 MiB request split out of it (28 MiB stay free in it); a
    30 MiB request fits no free block, a new 30 MiB segment would make 70 MiB, and the 40 MiB segment is not whole
    (the 12 MiB block lives in it), so nothing is released: out of memory with 42 MiB live under a 64 MiB cap."""
    a = ca.Allocator(limit=64 * MiB)
    a.replay([("a", 1, 40 * MiB), ("f", 1, 0), ("a", 2, 12 * MiB)])
    assert (a.reserved, a.allocated) == (40 * MiB, 12 * MiB)
    with pytest.raises(ca.OutOfMemory) as err:
        a.replay([("a", 3, 30 * MiB)])
    assert (err.value.size, err.value.key, a.reserved) == (30 * MiB, 3, 40 * MiB)
    b = ca.Allocator(limit=64 * MiB)                       # the same requests with the 12 MiB block freed first
    b.replay([("a", 1, 40 * MiB), ("f", 1, 0), ("a", 2, 12 * MiB), ("f", 2, 0), ("a", 3, 30 * MiB)])
    assert b.reserved == 40 * MiB                          # the merged 40 MiB block serves it: no new segment


def test_a_freed_block_serves_only_its_own_streams_requests(ca: ModuleType) -> None:
    """The pools are ordered by stream first (``BlockComparator``) and ``get_free_block`` gives up on another stream's
    block: a 100 MiB block freed on stream 1 does not serve a default-stream request of 50 MiB, which reserves a
    segment of its own; a later stream-1 request of 60 MiB splits the cached block (more than 1 MiB left); at a cap
    the default stream's request gets the other stream's whole cached segment back (``release_cached_blocks`` frees
    every stream's), but not a split one."""
    a = ca.Allocator()
    a.replay([("a", 1, 100 * MiB), ("f", 1, 0), ("a", 2, 50 * MiB)], {1: 1})
    assert (a.reserved, a.segments) == (150 * MiB, 2)
    a.replay([("a", 3, 60 * MiB)], {3: 1})
    assert a.reserved == 150 * MiB and a.live[3].stream == 1
    capped = ca.Allocator(limit=160 * MiB)
    capped.replay([("a", 1, 100 * MiB), ("f", 1, 0), ("a", 2, 50 * MiB), ("a", 4, 100 * MiB)], {1: 1})
    assert (capped.reserved, capped.segments) == (150 * MiB, 2)   # the stream-1 segment released, then reserved again
    split = ca.Allocator(limit=160 * MiB)
    split.replay([("a", 1, 100 * MiB), ("f", 1, 0), ("a", 5, 30 * MiB), ("a", 2, 50 * MiB)], {1: 1, 5: 1})
    assert split.reserved == 150 * MiB
    with pytest.raises(ca.OutOfMemory):
        split.malloc(6, 20 * MiB)   # stream 1's 70 MiB free block is part of a split segment: nothing to release
