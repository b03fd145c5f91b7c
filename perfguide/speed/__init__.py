"""Speed cost model: FLOPs, achievable TFLOP/s, communication and offload time (refined by calibration)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .types import Throughput

if TYPE_CHECKING:
    from ..hardware.types import Hardware
    from ..model.types import ModelSpec
    from ..setup import Setup


def estimate_speed(spec: ModelSpec, setup: Setup, hardware: Hardware) -> Throughput:
    from ..calibrate import apply_speed
    from .model import estimate_speed as model

    return apply_speed(model(spec, setup, hardware), setup, hardware)


__all__ = ["Throughput", "estimate_speed"]
