"""Memory cost model: analytic (fast, default) and traced (exact, on fake tensors).

``estimate_memory`` is the entry every caller uses (training and inference): the analytic model, scaled by calibration ``factors``
when the caller passes them (the API reads them from this machine's store; the cost model never does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .factors import Factors
from .types import MemoryEstimate

if TYPE_CHECKING:
    from ..hardware.types import Hardware
    from ..model.types import ModelSpec
    from ..setup import Setup


def estimate_memory(spec: ModelSpec, setup: Setup, hardware: Hardware | None = None, factors: Factors | None = None,
                    headroom: float | None = None) -> MemoryEstimate:
    """The one way into the memory model, for training and for inference (``setup.task``). ``headroom``: the
    fraction of each device an offloaded inference plan keeps free when it splits weights (its fit check's)."""
    from ..model.code import every_expert_note
    from .factors import apply_memory
    from .index_limits import with_index_limit

    if setup.task == "infer":
        from .inference import OFFLOAD_HEADROOM, estimate_inference

        est = estimate_inference(spec, setup, hardware, OFFLOAD_HEADROOM if headroom is None else headroom)
    else:
        from .analytic import training_memory

        est = training_memory(spec, setup, hardware)
    if note := every_expert_note(spec, setup.model_code):
        est = est.model_copy(update={"notes": (*est.notes, note)})
    return with_index_limit(spec, setup, apply_memory(est, setup, factors))


__all__ = ["Factors", "MemoryEstimate", "estimate_memory"]
