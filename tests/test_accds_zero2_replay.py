"""DeepSpeed 0.7.2's ZeRO-2 engine as replayed for the 2022 accelerate + DeepSpeed blog's rows 1160 / 1163
(scripts/trace_accds_zero2_replay.py), checked against bytes counted by hand from stage_1_and_2.py on a two-Linear
model: Linear(8, 15), Linear(15, 4) in fp16 on two ranks; param groups [w1 (120), w2 (60)] and [b1 (15), b2 (4)]; flats
180 and 19 -> 20 elements (padded to a multiple of 2 x world), partitions of 90 and 10. Rank 0 owns w1 (it starts in
its range) and b1; rank 1 owns w1 and b1 too (they straddle its start) and w2, b2. Real CPU tensors, so the sizes are
the engine's own. The full-size replays need the 4.22 wheel (docs/validation.md 37); their results are in
bench/data/allocator_max_batch.csv."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

import trace_accds_zero2_replay as z  # noqa: E402
from allocation_log import AllocationLog, live_at  # noqa: E402

from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation  # noqa: E402

BUCKET = 150   # reduce_bucket_size in elements: w1 (120) fits, the four gradients (199) do not


def _run(rank: int, overlap: bool) -> tuple[list[tuple[str, int, int]], dict[int, Any], list[int], list[int]]:
    """One step of the engine on rank ``rank``: the events, what made each, the backward's end and the side-stream keys."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 15), torch.nn.ReLU(), torch.nn.Linear(15, 4))
    groups = z.param_groups(model)
    assert [[p.numel() for p in g] for g in groups] == [[120, 60], [15, 4]]
    for p in model.parameters():
        p.data = p.data.half()
    host = {id(p): torch.empty_like(p) for g in groups for p in g}
    ops: dict[int, Any] = {}
    phase = ["weights"]
    log = AllocationLog.noting(ops, phase)
    for p in model.parameters():
        log.charge(p, "to(cuda)")
    end_of_backward: list[int] = []
    with log.mode():
        engine = z.Zero2Engine(groups, host, rank, BUCKET, overlap, phase, side_stream=lambda: log.on_stream(1))
        phase[0] = "forward"
        loss = model(torch.ones(3, 8, dtype=torch.float16)).float().sum()
        phase[0] = "backward"
        engine.backward(loss, make_cuda_emulation(None, emulate_sdpa=False))
        del loss
        end_of_backward.append(len(log.events))
        phase[0] = "step"
        engine.step()
    return log.events, ops, end_of_backward, sorted(log.streams)


def _made(events: list[tuple[str, int, int]], ops: dict[int, Any], phase: str, op: str = "") -> list[int]:
    return [n for kind, key, n in events if kind == "a" and ops[key][3] == phase and ops[key][0].startswith(op)]


@pytest.mark.parametrize("rank", [0, 1])
def test_construction_flats_fp32_partitions_and_moments(rank: int) -> None:
    """``__init__``: each group's parameters leave the GPU (move_to_cpu) and come back as one fp16 flat; this rank's
    partition cloned in fp16, then its fp32 copy; ``initialize_optimizer_states``: a zero fp32 gradient per partition,
    then AdamW per group (exp_avg, exp_avg_sq, sqrt, its quotient)."""
    events, ops, _, _ = _run(rank, overlap=False)
    assert _made(events, ops, "zero init") == [360, 180, 360, 40, 20, 40]   # flat, clone, fp32 of 180 / 90, 20 / 10
    assert _made(events, ops, "zero optimizer states") == [360, 40] + [360] * 4 + [40] * 4
    weights = [key for kind, key, _ in events if kind == "a" and ops[key][3] == "weights"]
    freed = {key for kind, key, _ in events if kind == "f"}
    assert set(weights) <= freed   # the per-parameter blocks of module.to(device) are gone


@pytest.mark.parametrize(("rank", "owned"), [(0, 120 + 15), (1, 120 + 60 + 15 + 4)])
def test_backward_ipg_buffer_and_grads_in_partition(rank: int, owned: int) -> None:
    """``backward()``: the ipg buffer of reduce_bucket_size fp16 elements; ``copy_grads_in_partition``: one fp16 buffer
    of every owned parameter's full size (the straddling ones whole). At the end of the epilogue only it is left of the
    step's gradients: the ipg buffer released, every autograd-made gradient freed."""
    events, ops, end, _ = _run(rank, overlap=False)
    assert _made(events, ops, "backward", "aten.empty") == [2 * BUCKET, 2 * owned]
    alive = live_at(events, end[0])
    made_in_backward = {k: n for k, n in alive.items() if ops[k][3] == "backward"}
    padding = [2] if rank == 1 else []   # rank 1's group-1 views cover 9 of its 10: get_flat_partition pads one zero
    assert sorted(made_in_backward.values()) == sorted([2 * owned, *padding])


def test_overlap_comm_two_buffers_and_grads_on_the_reduction_stream() -> None:
    events, ops, _, side = _run(1, overlap=True)
    made = _made(events, ops, "backward", "aten.empty")
    assert made == [2 * BUCKET, 2 * BUCKET, 2 * (120 + 60 + 15 + 4)]
    assert len(side) == 1 and ops[side[0]][1] == (199,)


@pytest.mark.parametrize("rank", [0, 1])
def test_step_overflow_norm_flat_fp32_and_adam_temporaries(rank: int) -> None:
    """``step()``: ``x.float().sum()`` and ``g.double().norm(2)`` per averaged gradient (views: 90 of w1 on rank 0;
    30 of w1 and 60 of w2 on rank 1), then per group the flat fp16 gradient, its fp32 copy, AdamW's sqrt and quotient;
    grads_in_partition is freed when the last group's views are dropped."""
    events, ops, _, _ = _run(rank, overlap=False)
    views = {0: [[90], [10]], 1: [[30, 60], [5, 4, 1]]}[rank]
    floats = [4 * n for g in views for n in g]
    doubles = [8 * n for g in views for n in g[:2]]   # get_grad_norm_direct zips with the owned parameters: no pad
    assert _made(events, ops, "step", "aten._to_copy") == floats + doubles + [360, 40]
    assert _made(events, ops, "step", "aten.cat") == [180, 20]
    assert _made(events, ops, "step", "aten.sqrt") == [360, 40] and _made(events, ops, "step", "aten.div") == [360, 40]
    grads = next(k for k, v in ops.items() if v[3] == "backward" and v[0].startswith("aten.empty") and v[1] != (BUCKET,))
    at = {(kind, key): i for i, (kind, key, _) in enumerate(events)}
    step = [key for kind, key, _ in events if kind == "a" and ops[key][3] == "step"]
    fp32_grad_1 = [k for k in step if ops[k][:3] == ("aten._to_copy.default", (10,), "float32")][-1]
    sqrt_1 = [k for k in step if ops[k][0] == "aten.sqrt.default"][-1]
    # group 1's fp32 gradient is made from the views, then the shared fp16 buffer is freed, then Adam runs
    assert at[("a", fp32_grad_1)] < at[("f", grads)] < at[("a", sqrt_1)]
