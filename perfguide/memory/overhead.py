"""From tensor bytes to what users see: allocated -> reserved (allocator) -> device total (CUDA context).

The caching allocator gives two different numbers. While a run goes well it keeps every freed block cached:
``max_memory_reserved`` (and nvidia-smi) show that steady state, larger in training than in inference. When a
cudaMalloc fails it first frees its cached unsplit blocks and retries, so what decides an OOM is only the
allocated bytes plus the free space inside live (split) segments: the footprint the fit verdict uses.

Constants live in data/calibration.json with their sources; bench/accuracy.py is where they are checked.
"""

from __future__ import annotations

from typing import Any

from .._data import fact_extra, fact_value
from .._packages import installed_release
from ..hardware.types import Hardware
from ..setup import Setup
from .loss_path import version_tuple
from .nccl import training_comm_bytes
from .types import MemoryEstimate


def _const(name: str) -> Any:
    return fact_value("calibration", name)


#: the first PyTorch release that sets CUDA_MODULE_LOADING=LAZY when the user has not (pytorch PR 85692, cherry-picked
#: to 1.13 as PR 86509), and the first CUDA runtime that honours it (NVIDIA's lazy loading guide: "Lazy loading is
#: available starting in CUDA runtime version 11.7"; libraries built with an older runtime load every module eagerly)
LAZY_LOADING_SINCE_TORCH = "1.13.0"
LAZY_LOADING_SINCE_CUDA = 117


def installed_torch() -> str | None:
    """The torch release installed next to perfguide (the one a plan made here runs), read without importing torch."""
    return installed_release("torch")


def module_loading(torch_release: str | None = None) -> str:
    """"eager" or "lazy": whether ``torch_release`` (default: the installed one) loads every kernel of its fat binary
    at CUDA init or each on first use. A wheel's local tag names its CUDA runtime (``+cu116``: 11.6, eager even under
    torch 1.13); no torch installed: a fresh install, lazy."""
    release = torch_release or installed_torch()
    if release is None:
        return "lazy"
    if version_tuple(release)[:2] < version_tuple(LAZY_LOADING_SINCE_TORCH)[:2]:   # "1.13" is 1.13.0, not older
        return "eager"
    local = release.partition("+")[2]
    cuda = int(local[2:]) if local.startswith("cu") and local[2:].isdigit() else None
    return "eager" if cuda is not None and cuda < LAZY_LOADING_SINCE_CUDA else "lazy"


def cuda_context_bytes(hardware: Hardware | None, torch_release: str | None = None) -> int:
    """Per-process CUDA context + loaded kernels, by module-loading era (``module_loading``) and compute-capability
    major: eager loading holds every kernel of torch's fat binary for the arch (~1 GB), lazy only those a run uses.
    A cc the era's figures lack (or no GPU) takes the era's median over all its figures (calibration.json by_era)."""
    table = fact_extra("calibration", "cuda_context_bytes", "by_era")[module_loading(torch_release)]
    gpu = hardware.smallest_gpu if hardware is not None else None
    if gpu is None:
        return int(table["any"])
    return int(table.get(str(gpu.compute_capability[0]), table["any"]))


def reserved_from_allocated(peak_allocated: int, task: str = "infer") -> int:
    """Steady-state reserved: the allocator keeps freed blocks, by a ratio plus a floor. Training frees and
    re-requests activations of many sizes in backward, so its ratio is its own (calibration.json). A ratio over the
    non-resident bytes only (weights and optimizer states taken out) was measured and left out: fewer verdicts right
    (bench/allocator_resident.py, docs/validation.md section 7b)."""
    ratio = _const("reserved_over_allocated_training" if task == "train" else "reserved_over_allocated")
    floor = _const("reserved_min_extra_bytes")
    return int(max(peak_allocated * ratio, peak_allocated + floor)) if peak_allocated else 0


def oom_footprint(peak_allocated: int) -> int:
    """Bytes the allocator needs for the peak not to OOM: before it raises, it releases every cached block that
    is not split and retries, so only the free space inside live segments adds to the allocated bytes."""
    return int(peak_allocated * _const("reserved_at_oom_over_allocated"))


def allocator_bytes(peak_allocated: int, task: str, context: int, capacity: int | None,
                    side_stream_reserved: int = 0) -> tuple[int, int, str | None]:
    """(steady-state reserved, OOM footprint, note). A steady state that would pass the card while the footprint
    fits is what the allocator cannot keep: at the limit it frees its cache and retries cudaMalloc, so reserved
    stays at the card (counted in memory_stats num_alloc_retries; each retry synchronises, so steps slow down)."""
    reserved = reserved_from_allocated(peak_allocated, task) + side_stream_reserved
    footprint = min(oom_footprint(peak_allocated), reserved)
    if capacity is not None and footprint + context <= capacity < reserved + context:
        return capacity - context, footprint, (
            f"the allocator's cache would reach {(reserved + context) / 1e9:.1f} GB, over the card: it frees cached "
            "blocks and retries cudaMalloc at the limit (slower steps; fewer with a smaller micro-batch)")
    return reserved, footprint, None


def capacity_bytes(hardware: Hardware | None, setup: Setup) -> int | None:
    """Memory one process may use: what CUDA can allocate on the smallest GPU (cuda), or available RAM (cpu).

    A probed GPU that other processes already fill offers only what NVML saw free, for every scenario alike;
    free memory reading 0 means a full GPU, not an empty one. Of several GPUs, the one with the least free.
    """
    if hardware is None:
        return None
    if setup.device == "cpu" or not hardware.has_gpu:
        return hardware.cpu.ram_available // max(1, setup.num_gpus)
    gpu = hardware.smallest_gpu
    assert gpu is not None, "has_gpu was checked above"
    if hardware.source == "probe":
        return min(gpu.allocatable, *(g.memory_free for g in hardware.gpus))
    return gpu.allocatable  # what CUDA can allocate (gpus.json cuda_total_gib), not nvidia-smi's board total


def to_estimate(
    *,
    setup: Setup,
    hardware: Hardware | None,
    weights: int,
    gradients: int,
    optimizer_states: int,
    activations: int,
    peak_allocated: int,
    logits: int = 0,
    kv_cache: int = 0,
    other: int = 0,
    cpu_ram: int = 0,
    method: str = "analytic",
    notes: tuple[str, ...] = (),
    side_stream_reserved: int = 0,
    load_allocated: int = 0,
) -> MemoryEstimate:
    """Assemble a MemoryEstimate: add the allocator and context layers and judge ``fits``.

    On CPU there is no caching allocator or CUDA context: reserved == allocated and the device total adds
    the Python/torch process baseline, compared with available RAM. ``side_stream_reserved``: blocks a side
    stream's pool keeps cached apart from the compute stream's peak (sharding.offload_staging_bytes), reserved only:
    they are free cached blocks, which the allocator releases before an OOM, so the fit footprint leaves them out.
    ``load_allocated``: bytes allocated once while the model loads, before any step (a model not built under zero.Init under ZeRO-3):
    the allocator keeps their segments cached for the step to reuse, so they floor the peak, reserved and fit
    footprint, unscaled by the steady-state ratio (one-off whole-tensor allocations leave no transient slack).
    """
    capacity = capacity_bytes(hardware, setup)
    comm = training_comm_bytes(setup, hardware)  # NCCL's buffers: cudaMalloc'd outside torch's allocator (memory/nccl.py)
    if setup.device == "cpu":
        context = int(_const("cpu_process_base_bytes"))
        reserved = footprint = peak_allocated
    else:
        context = cuda_context_bytes(hardware)
        reserved, footprint, retry = allocator_bytes(peak_allocated, setup.task, context + comm, capacity, side_stream_reserved)
        notes = (*notes, retry) if retry else notes
        reserved, footprint = max(reserved, load_allocated), max(footprint, load_allocated)
    peak_allocated = max(peak_allocated, load_allocated)
    total, fit_total = reserved + context + comm, footprint + context + comm
    return MemoryEstimate(
        weights=int(weights), gradients=int(gradients), optimizer_states=int(optimizer_states),
        activations=int(activations), logits=int(logits), kv_cache=int(kv_cache), other=int(other),
        cuda_context=context, nccl_buffers=comm, peak_allocated=int(peak_allocated), peak_reserved=int(reserved), device_total=int(total),
        fit_total=int(fit_total), capacity=capacity, cpu_ram=int(cpu_ram), fits=capacity is None or fit_total <= capacity,
        method=method, notes=notes,
    )
