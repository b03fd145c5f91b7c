"""Line up a Measurement with a Recommendation's predictions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .types import Comparison, Measurement, Verification

if TYPE_CHECKING:
    from ..recommendation import Recommendation


def _pair(quantity: str, predicted: float | None, measured: float | None, unit: str) -> Comparison | None:
    if not predicted or not measured:
        return None
    return Comparison(quantity=quantity, predicted=float(predicted), measured=float(measured), ratio=measured / predicted, unit=unit)


def tokens_per_step(rec: Recommendation) -> int:
    """Tokens one optimizer step consumes on this process (micro x accumulation x seq)."""
    s = rec.setup
    return s.micro_batch_size * s.gradient_accumulation_steps * s.seq_len


def compare(rec: Recommendation, measured: Measurement, tolerance: float = 0.2) -> Verification:
    """Predicted vs measured for every quantity both sides have.

    On CPU the model is already resident before training starts, so the RSS growth is compared with the
    predicted peak minus the weights (gradients + optimizer state + activations + temporaries).
    """
    mem = rec.memory
    per_process_step = rec.throughput.step_time_s
    pairs = [
        _pair("peak_allocated", mem.peak_allocated, measured.peak_allocated, "bytes"),
        _pair("peak_reserved", mem.peak_reserved, measured.peak_reserved, "bytes"),
        _pair("device_total", mem.device_total, measured.device_total, "bytes"),
        _pair("rss_growth", mem.peak_allocated - mem.weights, measured.rss_growth, "bytes"),
        _pair("step_time_s", per_process_step, measured.step_time_s, "s"),
    ]
    comparisons = tuple(p for p in pairs if p is not None)
    ok = all(abs(c.ratio - 1) <= tolerance for c in comparisons)
    return Verification(measured=measured, comparisons=comparisons, ok=ok)
