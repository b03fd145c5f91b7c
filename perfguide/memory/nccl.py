"""Device memory NCCL's communicator holds in each process of multi-GPU training.

NCCL allocates its connection buffers with cudaMalloc (cuMem since 2.19), outside PyTorch's caching allocator, so
torch's allocated / reserved counters never show them; nvidia-smi does, and they count against the card. Each
channel holds one set of connections per peer; each connection a receive side (LL + LL128 + Simple buffers) and
a send side, both rounded to 2 MiB (calibration.json ``nccl_connection_bytes``). Ring collectives (FSDP's
all-gather / reduce-scatter, DDP's all-reduce) connect a rank to its ring neighbours; NCCL's tree for all-reduce
connects it to a parent and a child too, which on a ring of more than two ranks are other peers (a chain's middle
rank), while on two ranks they are the same peer and share the connection. The kernels NCCL loads are already in
the CUDA context term (calibration ``cuda_context_bytes``: measured with torch, which links NCCL).
"""

from __future__ import annotations

from .._data import fact_value
from ..hardware.types import Hardware
from ..setup import Setup


def channels(fast_link: bool) -> int:
    """Channels one communicator opens on a node: more over NVLink / Infinity Fabric (bandwidth) than over PCIe."""
    table = fact_value("calibration", "nccl_channels")
    return int(table["nvlink" if fast_link else "pcie"])


def connections_per_channel(ranks: int) -> int:
    """Peer connections (a send and a receive side each) the most loaded rank holds per channel: ring and tree reach
    the same single peer on two ranks; past two, the tree's other neighbour is a second peer. One rank: none."""
    if ranks <= 1:
        return 0
    return 1 if ranks == 2 else 2


def communicator_bytes(ranks: int, fast_link: bool) -> int:
    """Device bytes one NCCL communicator of ``ranks`` ranks holds on its most loaded GPU (NCCL's default buffer sizes)."""
    return channels(fast_link) * connections_per_channel(ranks) * int(fact_value("calibration", "nccl_connection_bytes"))


def training_comm_bytes(setup: Setup, hardware: Hardware | None) -> int:
    """NCCL bytes per process of a data-parallel GPU training run (DDP / FSDP / ZeRO: one world communicator);
    0 on one process, on CPU (gloo), and outside training (serving TP is left to the engines' own budgets)."""
    if setup.device == "cpu" or setup.task != "train" or not setup.facts.train or setup.strategy == "single" or setup.world_size <= 1:
        return 0
    fast = hardware.fast_link if hardware is not None else False
    return communicator_bytes(setup.world_size, fast)
