"""Measuring real runs: the meter, the verify() loop, the Trainer callback, the calibration store and the
batch finder. ``record`` is the one entry point that stores a verified run for later plans on this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .types import Comparison, Measurement, Verification

if TYPE_CHECKING:
    from .calibration import factors_for, record

_LAZY = {"record": "calibration", "factors_for": "calibration", "verify": "verify", "PerfGuideCallback": "callback"}


def __getattr__(name: str) -> Any:
    """``record``/``verify``/the callback pull in transformers or the planner; import them only when used."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Comparison", "Measurement", "PerfGuideCallback", "Verification", "factors_for", "record", "verify"]
