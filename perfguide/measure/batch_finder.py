"""Find the largest safe micro-batch by measuring, while the global batch stays exactly what the user asked.

Unlike ``auto_find_batch_size`` (which shrinks the batch and silently changes the effective batch), this probes
a few micro-batch sizes, fits memory = a + b * micro_batch (activations are linear in the batch), picks the
largest size that divides the per-rank batch and stays under the limit with headroom, and recomputes the
gradient accumulation. In a multi-process run every rank takes the minimum, so all ranks agree.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import Field

from .._base import Model
from ..errors import PerfGuideError

if TYPE_CHECKING:
    from ..recommendation import Recommendation

logger = logging.getLogger("perfguide.batch_finder")

TryStep = Callable[[int], int]  # micro_batch -> peak bytes; raises an OOM error when it does not fit


class Probe(Model):
    micro_batch_size: int
    peak_bytes: int | None = None   # None: out of memory


class BatchChoice(Model):
    micro_batch_size: int = Field(ge=1)
    gradient_accumulation_steps: int = Field(ge=1)
    world_size: int = Field(ge=1)
    global_batch_size: int = Field(ge=1)
    limit_bytes: int
    slope_bytes_per_sample: float
    intercept_bytes: float
    probes: tuple[Probe, ...]
    reason: str


def _is_oom(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def _peak(value: Any, micro_batch: int) -> int:
    """``try_step``'s answer as bytes; anything but a finite non-negative number is the step function's bug."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PerfGuideError(f"try_step({micro_batch}) returned {str(value)[:60]!r} ({type(value).__name__}); it must return "
                             "the step's peak memory in bytes as a finite number >= 0 (e.g. torch.cuda.max_memory_allocated())")
    return int(value)


def _fit(points: list[tuple[int, int]], fallback_slope: float) -> tuple[float, float]:
    """Least-squares line through (micro_batch, bytes); one point borrows the predicted slope."""
    if len(points) == 1:
        (x, y), = points
        return y - fallback_slope * x, fallback_slope
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else fallback_slope
    return my - slope * mx, max(slope, 0.0)


def _agree_across_ranks(micro: int) -> int:
    """All ranks must train with the same micro-batch: take the minimum over the process group."""
    try:
        import torch.distributed as dist
    except ImportError:
        return micro
    if not (dist.is_available() and dist.is_initialized()):
        return micro
    import torch

    t = torch.tensor([micro], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def _probe_sizes(start: int, per_rank: int) -> list[int]:
    """Start at the predicted size and its half (two points for the fit), both dividing the per-rank batch."""
    divisors = [d for d in range(1, per_rank + 1) if per_rank % d == 0]
    start = max(d for d in divisors if d <= max(1, start))
    lower = [d for d in divisors if d <= start // 2]
    return [start] + ([max(lower)] if lower else [])


def _next_smaller(mb: int, per_rank: int, probes: list[Probe]) -> list[int]:
    """After an OOM at ``mb``: the largest untried divisor of the per-rank batch at most half of it."""
    tried = {p.micro_batch_size for p in probes}
    smaller = [d for d in range(1, mb // 2 + 1) if per_rank % d == 0 and d not in tried]
    return [max(smaller)] if smaller else []


def find_micro_batch(rec: Recommendation, try_step: TryStep, *, headroom: float | None = None,
                     limit_bytes: int | None = None) -> BatchChoice:
    """Probe, fit, choose; ``try_step`` runs one forward/backward at a micro-batch and returns peak bytes."""
    world = rec.setup.world_size
    global_batch = rec.request.global_batch_size
    if global_batch % world:
        raise PerfGuideError(f"global batch {global_batch} is not divisible by the world size {world}")
    per_rank = global_batch // world
    headroom = rec.request.constraints.headroom if headroom is None else headroom
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise PerfGuideError(f"headroom must be a fraction of device memory in [0, 1), got {headroom!r}; e.g. headroom=0.1")
    if limit_bytes is not None and (isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 1):
        raise PerfGuideError(f"limit_bytes must be a positive number of bytes, got {limit_bytes!r}")
    if limit_bytes is None:
        if rec.memory.capacity is None:
            raise PerfGuideError("the recommendation has no device capacity; pass limit_bytes=")
        limit_bytes = int(rec.memory.capacity * (1 - headroom))
    probes: list[Probe] = []
    queue = _probe_sizes(rec.setup.micro_batch_size, per_rank)
    while queue:
        mb = queue.pop(0)
        try:
            probes.append(Probe(micro_batch_size=mb, peak_bytes=_peak(try_step(mb), mb)))
        except PerfGuideError:
            raise
        except Exception as exc:
            if not _is_oom(exc):
                raise
            logger.info("batch finder: micro-batch %d ran out of memory", mb)
            probes.append(Probe(micro_batch_size=mb, peak_bytes=None))
            if not queue:
                queue.extend(_next_smaller(mb, per_rank, probes))
            continue
        if not queue and sum(p.peak_bytes is not None for p in probes) < 2:
            queue.extend(_next_smaller(mb, per_rank, probes))  # a second point pins the slope
    ok = [(p.micro_batch_size, p.peak_bytes) for p in probes if p.peak_bytes is not None]
    if not ok:
        raise PerfGuideError(f"even micro-batch {min(p.micro_batch_size for p in probes)} ran out of memory; "
                             "enable gradient checkpointing or a smaller optimizer (see rec.report())")
    predicted_slope = max(1.0, (rec.memory.activations + rec.memory.logits) / rec.setup.micro_batch_size)
    a, b = _fit(ok, predicted_slope)
    # a size that ran out of memory, or that its probe measured over the limit, bounds the choice whatever the fit says
    over = [p.micro_batch_size for p in probes if p.peak_bytes is None or p.peak_bytes > limit_bytes]
    ceiling = min(over, default=per_rank + 1)
    measured = {mb: peak for mb, peak in ok}
    fitting = [d for d in range(1, per_rank + 1)
               if per_rank % d == 0 and d < ceiling and (measured[d] if d in measured else a + b * d) <= limit_bytes]
    if not fitting:
        smallest = min(ok)
        raise PerfGuideError(f"even micro-batch {smallest[0]} measured {smallest[1] / 2**30:.2f} GiB, over the limit "
                             f"{limit_bytes / 2**30:.2f} GiB; enable gradient checkpointing or a smaller optimizer "
                             "(see rec.report()), or pass a larger limit_bytes=")
    chosen = max(fitting)
    chosen = _agree_across_ranks(chosen)
    accum = per_rank // chosen
    reason = (f"memory ~= {a / 2**30:.2f} GiB + {b / 2**20:.1f} MiB per sample (fit of {len(ok)} probe(s)); "
              f"micro-batch {chosen} is the largest divisor of the per-rank batch {per_rank} under "
              f"{limit_bytes / 2**30:.2f} GiB, so accumulation = {accum} keeps the global batch {global_batch}")
    return BatchChoice(micro_batch_size=chosen, gradient_accumulation_steps=accum, world_size=world,
                       global_batch_size=chosen * accum * world, limit_bytes=limit_bytes, slope_bytes_per_sample=b,
                       intercept_bytes=a, probes=tuple(probes), reason=reason)


def torch_try_step(rec: Recommendation, model: Any) -> TryStep:
    """A real try_step: one forward/backward of random tokens, peak from CUDA counters or sampled RSS."""
    import torch

    from .meter import RssSampler

    device = next(model.parameters()).device

    def step(mb: int) -> int:
        ids = torch.randint(0, rec.model.vocab_size, (mb, rec.setup.seq_len), device=device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = 0
        else:
            sampler = RssSampler().start()
            base = sampler.baseline
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(rec.setup.autocast or "")
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            return torch.cuda.max_memory_allocated()
        return sampler.stop() - base

    return step
