"""A one-GPU scenario planned on a machine with several: say which GPUs sit idle and what the many-GPU scenario
would run on them.

A user who names ``rtx4090:2`` and keeps the default ``train_gpu_one`` has two cards; when one cannot hold the run,
the first thing to offer is the same run on both (70B QLoRA on two 24 GB cards is the best-known consumer recipe),
before a bigger card or more of them. So a many-GPU plan that fits where the one-GPU plan does not leads the
suggestions; otherwise it is a warning, with its step time or per-token latency to compare.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import PerfGuideError
from .search import gib
from .types import Plan, Request

PlanFn = Callable[[Request], Plan]


def _ms(ms: float) -> str:
    return f"{ms:.3g} ms" if ms < 1000 else f"{ms / 1000:.3g} s"


def _speed(p: Plan) -> str:
    ms = p.throughput.time_per_output_token_ms
    return f"{_ms(ms)} per output token" if ms else f"{p.throughput.step_time_s:.3g} s/step"


def _compared(one: Plan, many: Plan) -> str:
    """The many-GPU plan against this one on the measure the scenario ranks by: training, step time for the same
    global batch; serving, the latency of each output token (the one-GPU plan may batch more, on quantized weights)."""
    if not one.fits:
        return ""
    here = one.throughput.time_per_output_token_ms
    if here is not None:
        return f" against {_ms(here)} here"
    return f", {one.throughput.step_time_s / many.throughput.step_time_s:.1f}x faster" if many.throughput.step_time_s > 0 else ""


def with_idle_gpus(request: Request, one: Plan, many_name: str, many_plan: PlanFn, verb: str) -> Plan:
    """``one`` with the idle GPUs named; the many-GPU plan first among the suggestions when only it fits.

    ``verb`` says what the one-GPU plan does ("trains", "serves"). Training needs the global batch to divide over the
    GPUs (the many-GPU planner keeps it fixed); the caller checks that before calling.
    """
    n = request.hardware.gpu_count * request.hardware.nodes
    if n <= 1:
        return one
    head = f"{n - 1} of the {n} GPUs sit idle: this plan {verb} on one; scenario='{many_name}'"
    try:
        many = many_plan(request.model_copy(update={"constraints": request.constraints.model_copy(update={"num_gpus": None})}))
    except PerfGuideError:
        return _warn(one, f"{head} uses them all")
    if not many.fits:
        return _warn(one, f"{head} finds nothing that fits either")
    used = f"{many.setup.label}: {_speed(many)}"
    if one.fits:
        return _warn(one, f"{head} uses all {n} ({used}{_compared(one, many)})")
    target = f", hardware={request.hardware.name!r}" if request.hardware.name else ""   # runnable as written
    lead = f"scenario='{many_name}'{target} fits on the {n} GPUs you have ({used}): {gib(many.memory.device_total)} per device"
    return one.model_copy(update={"suggestions": (lead, *one.suggestions)})


def _warn(p: Plan, text: str) -> Plan:
    return p.model_copy(update={"warnings": (*p.warnings, text)})
