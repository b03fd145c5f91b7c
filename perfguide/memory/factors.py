"""Calibration factors as the cost model takes them: plain numbers, passed in by the caller.

The cost model never reads the calibration store itself (that would make every estimate depend on a file
somewhere on disk); the API boundary reads the store once, for one machine and one model family / size
band, and hands the resulting ``Factors`` down. ``None`` means "uncalibrated" and changes nothing.
"""

from __future__ import annotations

from pydantic import Field

from .._base import Model
from ..setup import Setup
from .types import MemoryEstimate

#: Ratios outside this band are broken measurements (a fixed per-step overhead dominating a tiny model, a
#: run that swapped), not calibration; they are neither used nor allowed to scale an estimate further.
SANE_RATIO = (0.33, 3.0)


class Factors(Model):
    """What verified runs of similar models on this machine change: multiply predictions by these."""

    memory: float = Field(default=1.0, gt=0)
    step_time: float = Field(default=1.0, gt=0)
    cuda_context_bytes: int | None = Field(default=None, ge=0)
    samples: int = Field(default=0, ge=0)
    scope: str = ""          # which machine / model family / size band the runs came from, for the note


def clamp(x: float) -> float:
    return min(max(x, SANE_RATIO[0]), SANE_RATIO[1])


def applies(factors: Factors | None, setup: Setup) -> bool:
    """Only training runs are calibrated (verify() trains); serving estimates are left as modelled."""
    return factors is not None and factors.samples > 0 and setup.task == "train"


def apply_memory(est: MemoryEstimate, setup: Setup, factors: Factors | None) -> MemoryEstimate:
    """Scale what the verified runs measured: the whole peak on CUDA (max_memory_allocated), the part above
    the resident weights on CPU (RSS growth); use the measured CUDA context when one was measured idle."""
    if factors is None or not applies(factors, setup):
        return est
    from .overhead import allocator_bytes

    k = clamp(factors.memory)
    if setup.device == "cpu":
        alloc = est.weights + int((est.peak_allocated - est.weights) * k)
        reserved = footprint = alloc
        context = est.cuda_context
    else:
        alloc = int(est.peak_allocated * k)
        context = factors.cuda_context_bytes or est.cuda_context
        reserved, footprint, _ = allocator_bytes(alloc, setup.task, context + est.nccl_buffers, est.capacity)
    # NCCL's buffers live outside the allocator: no calibration of torch's bytes scales them
    total, fit_total = reserved + context + est.nccl_buffers, footprint + context + est.nccl_buffers
    where = f" [{factors.scope}]" if factors.scope else ""
    note = f"calibrated on this machine ({factors.samples} verified run(s){where}): memory x{k:.2f}"
    return est.model_copy(update={"peak_allocated": alloc, "peak_reserved": reserved, "cuda_context": context,
                                  "device_total": total, "fit_total": fit_total,
                                  "fits": est.capacity is None or fit_total <= est.capacity,
                                  "notes": (*est.notes, note)})
