"""What a CPU plan that fits nowhere says about a GPU: the one-GPU scenario's own plan on a named card, priced.

'Plan for a GPU with hardware=a100-80gb' read as a promise; for a 32B full fine-tune or DeepSeek-V3 it was a dead
end. The hint now says what that plan found."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import PerfGuideError
from ..hardware.types import Hardware
from .search import broken_limit, gib
from .types import Plan, Request

#: the card the hint prices: the most common rented 80 GB GPU, and the one perfguide's docs plan for
REFERENCE_GPU = "a100-80gb"


def gpu_hint(request: Request, plan: Callable[[Request], Plan]) -> str:
    """The one-GPU scenario of the request's task (``plan``: its plan function, without its own suggestions) for the
    same model and workload on one REFERENCE_GPU."""
    from . import registry

    info = registry.find(request.info.task, "cuda", False)
    assert info is not None, "every task has a one-GPU scenario"
    scenario = info.name
    cons = request.constraints.model_copy(update={"num_gpus": None})
    asked = request.model_copy(update={"scenario": scenario, "hardware": Hardware.from_name(REFERENCE_GPU), "constraints": cons,
                                       "calibration": None})
    try:
        p = plan(asked)
    except PerfGuideError as exc:
        return f"a GPU plan: scenario={scenario!r} with hardware= your GPU (on one {REFERENCE_GPU}: {exc})"
    if p.fits:
        return (f"a GPU plan: scenario={scenario!r} with hardware={REFERENCE_GPU!r} fits ({p.setup.label}: "
                f"{gib(p.memory.device_total)} per GPU), or your GPU")
    why, _ = broken_limit(p.memory, asked.hardware, cons.headroom)
    return f"a GPU plan: scenario={scenario!r} with hardware= your GPU; one {REFERENCE_GPU} does not hold it either ({p.setup.label}: {why})"
