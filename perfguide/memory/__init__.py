"""Memory cost model: analytic (fast, default) and traced (exact, on fake tensors).

``estimate_memory`` is the entry every caller uses: the analytic model, scaled by calibration ``factors``
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


def estimate_memory(spec: ModelSpec, setup: Setup, hardware: Hardware | None = None, factors: Factors | None = None) -> MemoryEstimate:
    from .analytic import estimate_memory as analytic
    from .factors import apply_memory

    return apply_memory(analytic(spec, setup, hardware), setup, factors)


__all__ = ["Factors", "MemoryEstimate", "estimate_memory"]
