"""Moved to :mod:`perfguide.measure.callback` (measuring lives in perfguide.measure); this path keeps working."""

from ..measure.callback import PerfGuideCallback

__all__ = ["PerfGuideCallback"]
