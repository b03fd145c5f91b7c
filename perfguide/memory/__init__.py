"""Memory cost model: analytic (fast, default) and traced (exact, on fake tensors).

``estimate_memory`` is the entry every caller uses: the analytic model, refined by this machine's
calibration (perfguide.calibrate) when the hardware was probed and verified runs were recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .types import MemoryEstimate

if TYPE_CHECKING:
    from ..hardware.types import Hardware
    from ..model.types import ModelSpec
    from ..setup import Setup


def estimate_memory(spec: ModelSpec, setup: Setup, hardware: Hardware | None = None) -> MemoryEstimate:
    from ..calibrate import apply_memory
    from .analytic import estimate_memory as analytic

    return apply_memory(analytic(spec, setup, hardware), setup, hardware)


__all__ = ["MemoryEstimate", "estimate_memory"]
