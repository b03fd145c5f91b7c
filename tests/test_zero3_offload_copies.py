"""ZeRO-3 with the parameters offloaded: each all-gather first copies the rank's partitions to the GPU
(perfguide/memory/zero3_window.py ``offload_copy_shards``), checked against hand counts of what DeepSpeed's
``all_gather_coalesced`` allocates (runtime/zero/partition_parameters.py, read in the 0.8.0 and 0.9.0 sdists):

* one parameter: ``param_buffer = torch.empty(ceil(ds_numel / world) * world)`` and
  ``_dist_allgather_fn(param.ds_tensor.to(device), param_buffer, ...)``: the partition's GPU copy beside the buffer;
* several: ``flat_tensor = torch.empty(partition_sz * world)`` and
  ``torch.cat([p.ds_tensor.to(device) for p in params], out=partitions[rank])``: every partition's copy at once;
* 0.9.0 added ``if self.num_partitions == 1: return _no_gather_coalesced(params)`` (no buffer, no gather).
Why: the PEFT README's ZeRO-3 + offload rows ran on one GPU before 0.9.0, where every gather held two whole copies."""

from __future__ import annotations

import pytest

from perfguide import techniques
from perfguide.memory.zero3_window import Zero3Knobs, offload_copy_shards, zero3_live_elements
from perfguide.setup import Setup

BIG = 10**9


def _seq(*sizes: int) -> tuple[tuple[str, int], ...]:
    return tuple((f"p{i}", s) for i, s in enumerate(sizes))


def test_a_single_gather_holds_the_partition_copy_beside_its_buffer() -> None:
    # one 10-element parameter, no prefetch: the buffer (10) and the copy of the rank's partition, ceil(10 / world):
    # 10 on one GPU, 5 on two, 4 on three; no offload (0): the buffer alone
    trace = (("a", 10),)
    knobs = Zero3Knobs(0, 0, 0, BIG, 0)
    assert [zero3_live_elements(trace, 1, knobs, 0, shards)[0] for shards in (0, 1, 2, 3)] == [10, 20, 15, 14]


def test_a_coalesced_gather_copies_every_partition_at_once() -> None:
    # a(4) b(4) c(4) d(20), prefetch bucket 8 (tests/test_zero3_window.py counts 48 without offload):
    # p0's parent fetch gathers a and b (flat 8; copies 8 on one GPU: 16); p0's own fetch cats c and d's copies (24)
    # into a new flat buffer (24) while a and b (8) and their flat buffer (8, kept until b's wait) are alive:
    # 8 + 8 + 24 + 24 = 64 on one GPU; on two the copies are 2 + 10 = 12: 8 + 8 + 24 + 12 = 52
    trace, knobs = _seq(4, 4, 4, 20), Zero3Knobs(0, 8, 0, BIG, 0)
    assert zero3_live_elements(trace, 4, knobs, 0, 0) == (48, 0)
    assert zero3_live_elements(trace, 4, knobs, 0, 1) == (64, 0)
    assert zero3_live_elements(trace, 4, knobs, 0, 2) == (52, 0)


@pytest.mark.parametrize(("num_gpus", "offload", "release", "shards"), [
    (1, True, "0.7.2", 1), (1, True, "0.8.0", 1), (1, True, "0.8.3", 1),   # one GPU still all-gathers before 0.9.0
    (1, True, "0.9.0", 0), (1, True, "0.14.4", 0), (1, True, None, 0),     # _no_gather_coalesced; unknown: current
    (4, True, "0.8.0", 4), (4, True, "0.14.4", 4), (2, True, None, 2),     # several GPUs: a 1/world partition each
    (1, False, "0.8.0", 0), (4, False, "0.8.0", 0),                        # partitions on the GPU: .to() copies none
])
def test_copy_shards_by_release_and_world(num_gpus: int, offload: bool, release: str | None, shards: int) -> None:
    setup = Setup(task="train", strategy="zero3", num_gpus=num_gpus, offload_params=offload, offload_optimizer=offload)
    assert offload_copy_shards(setup, release, techniques.weights_on_host(setup)) == shards
