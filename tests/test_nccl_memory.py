"""NCCL's communicator buffers: hand-derived from NCCL's defaults, checked against public measurements, and added
to what a multi-GPU training process needs on the device (device_total and the OOM footprint)."""

from __future__ import annotations

import pytest

from perfguide import Hardware, MemoryEstimate, Setup
from perfguide.memory.nccl import communicator_bytes, training_comm_bytes
from perfguide.memory.overhead import cuda_context_bytes, oom_footprint, reserved_from_allocated, to_estimate

MiB, GiB = 2**20, 2**30

# NCCL's defaults (NVIDIA/nccl src/include/device.h, src/init.cc), written out here independently of calibration.json
NCCL_STEPS = 8
LL = 8 * 512 * NCCL_STEPS * 16            # NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x steps x sizeof(ncclLLFifoLine)
LL128 = 120 * 640 * NCCL_STEPS * 8        # NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x steps x sizeof(uint64_t)
SIMPLE = 1 << 22                          # NCCL_BUFFSIZE, 4 MiB
CUDA_IPC_MIN = 2 * MiB                    # src/transport/p2p.cc rounds each side up to it
HEADER = 4096                             # ncclSendMem / ncclRecvMem: a few KiB of head/tail counters, under one granule


def _up(n: int) -> int:
    return -(-n // CUDA_IPC_MIN) * CUDA_IPC_MIN


def _connection(read: bool) -> int:
    """One peer connection on one GPU: a send side and a receive side (src/transport/p2p.cc p2pSendSetup/RecvSetup)."""
    send = _up(HEADER + (SIMPLE if read else 0))
    recv = _up(HEADER + LL + LL128 + (0 if read else SIMPLE))
    return send + recv


def test_one_connection_is_12_mib_by_hand_in_either_p2p_mode() -> None:
    """LL 512 KiB + LL128 4.69 MiB + Simple 4 MiB = 9.19 MiB of buffers; rounded per side to 2 MiB: 10 + 2 MiB
    (write mode) or 6 + 6 MiB (read mode, Simple on the sender): 12 MiB either way."""
    assert (LL, LL128, SIMPLE) == (524_288, 4_915_200, 4_194_304)
    assert _connection(read=False) == _connection(read=True) == 12 * MiB
    assert communicator_bytes(2, fast_link=False) == 2 * 1 * 12 * MiB   # PCIe: 2 channels, one peer


def test_the_two_allocation_sizes_nccl_logs() -> None:
    """NVIDIA/nccl issue #1685 (8x H100, NCCL_DEBUG_SUBSYS=ALLOC) sees exactly two allocation sizes, 10,485,760 and
    2,097,152 B: the receive and the send side of a write-mode connection as derived above."""
    assert _up(HEADER + LL + LL128 + SIMPLE) == 10_485_760
    assert _up(HEADER) == 2_097_152


def test_ring_and_tree_share_the_peer_on_two_ranks_only() -> None:
    """Two ranks: ring and tree reach the same peer (one connection per channel); more ranks: the tree's other
    neighbour is a second peer for a chain's middle rank (two per channel), at any larger size."""
    assert communicator_bytes(1, fast_link=True) == 0
    assert communicator_bytes(2, fast_link=True) == 24 * 12 * MiB
    assert communicator_bytes(4, fast_link=True) == communicator_bytes(64, fast_link=True) == 24 * 2 * 12 * MiB


@pytest.mark.parametrize(("ranks", "measured_mb"), [(2, 544), (3, 688)])
def test_against_nccl_issue_964(ranks: int, measured_mb: int) -> None:
    """NVIDIA/nccl issue #964: per process group on 4x A100 with NVLink, all-reduce of 4 MB through PyTorch, a group
    of 2 costs 544 MB and one of more than 2 costs 688 MB on a GPU. That is everything the group adds (the buffers,
    NCCL's per-communicator structures, PyTorch's per-group streams and tensors), so the buffers priced here must be
    below it and the larger part of it: 302 MB (56%) and 604 MB (88%). Groups of more than 2 cost more, as measured."""
    priced = communicator_bytes(ranks, fast_link=True) / 1e6
    assert 0.5 * measured_mb <= priced <= measured_mb
    assert communicator_bytes(3, fast_link=True) > communicator_bytes(2, fast_link=True)


def _estimate(setup: Setup, hw: Hardware, allocated: int) -> MemoryEstimate:
    return to_estimate(setup=setup, hardware=hw, weights=0, gradients=0, optimizer_states=0, activations=0,
                       peak_allocated=allocated)


def test_multi_gpu_training_adds_the_buffers_to_both_totals() -> None:
    """DDP on 2 NVLinked A100s, 10 GiB allocated: device_total = 10 x 1.116 + context + 288 MiB and the OOM
    footprint = 10 x 1.011 + context + 288 MiB; one GPU, inference and CPU runs carry none."""
    hw = Hardware.from_name("a100-80gb:2")
    est = _estimate(Setup(task="train", strategy="ddp", num_gpus=2), hw, 10 * GiB)
    context = cuda_context_bytes(hw)
    assert est.nccl_buffers == 288 * MiB
    assert est.device_total == reserved_from_allocated(10 * GiB, "train") + context + 288 * MiB
    assert est.needed == oom_footprint(10 * GiB) + context + 288 * MiB
    assert _estimate(Setup(task="train"), Hardware.from_name("a100-80gb"), 10 * GiB).nccl_buffers == 0
    assert training_comm_bytes(Setup(task="infer", strategy="tp", num_gpus=2), hw) == 0


def test_pcie_machines_open_fewer_channels() -> None:
    """FSDP on 2 PCIe GPUs (no NVLink): 2 channels x 12 MiB = 24 MiB, a twelfth of the NVLink figure."""
    fsdp = Setup(task="train", strategy="fsdp", num_gpus=2)
    assert training_comm_bytes(fsdp, Hardware.from_name("l40s:2")) == 24 * MiB
    assert training_comm_bytes(fsdp, Hardware.from_name("a100-80gb:2")) == 12 * training_comm_bytes(fsdp, Hardware.from_name("l40s:2"))
