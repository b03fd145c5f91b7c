"""DeepSpeed 0.7.2's ZeRO-3 with parameter and optimizer offload as replayed for the 2022 accelerate + DeepSpeed blog's
row 1166 (scripts/trace_accds_zero3_replay.py), checked against bytes and parameter sets counted by hand from
partition_parameters.py, partitioned_param_coordinator.py, stage3.py and coalesced_collectives.py on a tiny model:
Linear(8, 16) -> ReLU -> Linear(16, 4) in fp16 on two ranks, parameters w1 (128), b1 (16), w2 (64), b2 (4) in that
ds_id order, persistence threshold 10 (b2 stays gathered; Linear(8, 16) gathers two parameters in one coalesced call,
Linear(16, 4) one). Real CPU tensors, so every size is the code's own. The full-size replay needs the transformers
4.22 wheel (docs/validation.md 49); its result is in bench/data/allocator_max_batch.csv."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

import trace_accds_zero3_replay as z  # noqa: E402
from allocation_log import AllocationLog  # noqa: E402

from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation  # noqa: E402

BUCKET, PERSIST = 100, 10   # reduce_bucket_size: w2 and b2 (68) fit in the flat buffer, w1 (128) does not


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def forward(self, x: Any) -> Any:
        return self.body(x)


def _run(prefetch: int, steps: int = 2, rank: int = 0) -> tuple[list[tuple[str, int, int]], dict[int, Any], Any, Any,
                                                                 dict[int, int]]:
    torch.manual_seed(0)
    model = Tiny()
    for p in model.parameters():
        p.data = p.data.half()
    ops: dict[int, Any] = {}
    phase = ["weights"]
    log = AllocationLog.noting(ops, phase)
    coord = z.run_zero3(model, lambda: {"x": torch.ones(3, 8, dtype=torch.float16)}, lambda o: o.float().sum(), steps,
                        log, phase, (BUCKET, prefetch, PERSIST), make_cuda_emulation(None, emulate_sdpa=False), [], rank)
    return log.events, ops, coord, model, log.streams


def _made(events: list[tuple[str, int, int]], ops: dict[int, Any], phase: str, op: str) -> list[int]:
    return [n for kind, key, n in events if kind == "a" and ops[key][3] == phase and ops[key][0].startswith(op)]


def test_gathers_single_and_coalesced() -> None:
    """Step 1 (the trace being recorded, no prefetch): Linear(8, 16)'s w1 and b1 in one coalesced all-gather - the
    flat buffer of both padded partitions times the world ((64 + 8) x 2 fp16 = 288 B), each partition copied to the
    GPU (128, 16 B), then at wait() each parameter's own buffer (256, 32 B); Linear(16, 4)'s w2 alone - its padded
    buffer (128 B) and its partition's copy (64 B). All on the all-gather stream; b2 (persistent) moved once."""
    events, ops, _, _, streams = _run(prefetch=1)
    assert _made(events, ops, "weights", "to(cuda)") == [8]
    assert _made(events, ops, "zero init", "aten.empty") == [2 * BUCKET]   # the ipg flat buffer
    gathers = _made(events, ops, "step 1 forward", "aten.empty")
    assert gathers == [288, 128, 16, 256, 32, 128, 64]
    keys = [key for kind, key, n in events if kind == "a" and ops[key][3] == "step 1 forward"
            and ops[key][0].startswith("aten.empty")]
    assert all(streams.get(k) == z.GATHER_STREAM for k in keys)


def test_step_one_releases_everything_after_use() -> None:
    """Without a complete trace every module's parameters are released after its forward: nothing gathered at the
    loss of step 1 but the persistent b2 (never in ``gathered``)."""
    _, _, coord, _, _ = _run(prefetch=1)
    assert coord.snapshots[0] == set()


def test_reuse_distance_keeps_what_comes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 2 without prefetch, trace [root, body, L1, ReLU, L2 | root, body, L2, ReLU, L1]: with the blog's
    1e9-element reuse distance L1's w1 and b1 come back within it and stay gathered through the loss, as does w2; with
    100 elements, L1's release at step 3 walks ReLU (0), L2 (68), root, body (0), L2 again (136: past 100) before L1
    reappears, so w1 and b1 go while w2 (reused at once) stays. With a prefetch bucket the prefetcher, passing over
    the gathered and persistent entries, gathers w1 (at ReLU's fetch) and b1 (at L2's) again for their backward use."""
    _, _, coord, model, _ = _run(prefetch=0)
    l1, l2 = model.body[0], model.body[2]
    assert coord.snapshots[1] == {id(l1.weight), id(l1.bias), id(l2.weight)}
    monkeypatch.setattr(z, "MAX_REUSE", 100)
    _, _, coord, model, _ = _run(prefetch=0)
    assert coord.snapshots[1] == {id(model.body[2].weight)}
    _, _, coord, model, _ = _run(prefetch=1)
    l1, l2 = model.body[0], model.body[2]
    assert coord.snapshots[1] == {id(l1.weight), id(l1.bias), id(l2.weight)}


def test_prefetch_gathers_ahead_one_call_per_fetch() -> None:
    """From step 2 each fetch (a module without parameters too) prefetches up to the bucket: with a 1-element bucket
    one parameter per call, each alone (single gathers: w1 256 + 128 B at the root's fetch, b1 32 + 16 B at body's, w2
    128 + 64 B at L1's); with no bucket, L1 gathers w1 and b1 coalesced as in step 1."""
    events, ops, _, _, _ = _run(prefetch=1)
    assert _made(events, ops, "step 2 forward", "aten.empty") == [256, 128, 32, 16, 128, 64]
    events, ops, _, _, _ = _run(prefetch=0)
    assert _made(events, ops, "step 2 forward", "aten.empty")[:5] == [288, 128, 16, 256, 32]


@pytest.mark.parametrize("rank", [0, 1])
def test_gradient_reduction(rank: int) -> None:
    """Backward of step 1, the gradients in autograd's order b2, w2, b1, w1 (a bias's AccumulateGrad hangs off addmm's
    backward, a weight's off the transpose's): b2, w2 and b1 (4 + 64 + 16 = 84 < 100) copied into the ipg flat buffer;
    w1 (128) overflows it, so the bucket, sorted by ds_id [b1, w2, b2], is reduce-scattered through one interleaved cat
    of 84 fp16 (168 B); w1 does not fit in the buffer and is reduced alone in the epilogue (one tensor of even size: no
    cat). Each of this rank's partitions (8, 32, 2, 64 elements, the same on both ranks) comes back to the GPU in fp16,
    as an fp64 copy for its norm and an fp32 copy for the host's fp32 gradient."""
    events, ops, _, _, streams = _run(prefetch=1, steps=1, rank=rank)
    assert _made(events, ops, "step 1 backward", "aten.cat") == [168]
    reduce_keys = {k for k, s in streams.items() if s == z.REDUCE_STREAM}
    backward = [(key, n) for kind, key, n in events if kind == "a" and ops[key][3] == "step 1 backward"]
    parts = [n for key, n in backward if key in reduce_keys and ops[key][0].startswith("aten.empty")]
    assert parts == [16, 64, 4, 128]
    assert [n for key, n in backward if ops[key][0].startswith("aten._to_copy") and ops[key][2] == "float64"] == \
        [64, 256, 16, 512]
    assert [n for key, n in backward if ops[key][0].startswith("aten._to_copy") and ops[key][2] == "float32"
            and key in reduce_keys] == [32, 128, 8, 256]
