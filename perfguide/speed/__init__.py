"""Speed cost model: FLOPs, achievable TFLOP/s, communication and offload time (scaled by calibration
factors when the caller passes them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .types import Throughput

if TYPE_CHECKING:
    from ..hardware.types import Hardware
    from ..memory.factors import Factors
    from ..model.types import ModelSpec
    from ..setup import Setup


def apply_speed(tp: Throughput, setup: Setup, factors: Factors | None) -> Throughput:
    """Scale step time by the measured/predicted ratio of similar verified runs on this machine."""
    from ..memory.factors import applies, clamp

    if factors is None or not applies(factors, setup) or factors.step_time == 1.0:
        return tp
    k = clamp(factors.step_time)
    return tp.model_copy(update={"step_time_s": tp.step_time_s * k, "tokens_per_s": tp.tokens_per_s / k,
                                 "achievable_tflops": tp.achievable_tflops / k, "mfu": tp.mfu / k})


def estimate_speed(spec: ModelSpec, setup: Setup, hardware: Hardware, factors: Factors | None = None,
                   headroom: float | None = None) -> Throughput:
    """The one way into the speed model, for training and for inference (``setup.task``); ``headroom`` as in
    perfguide.memory.estimate_memory (an offloaded inference plan's GPU/CPU split)."""
    if setup.task == "infer":
        from .inference import estimate_inference_speed

        return apply_speed(estimate_inference_speed(spec, setup, hardware, headroom), setup, factors)
    from .training import training_speed

    return apply_speed(training_speed(spec, setup, hardware), setup, factors)


__all__ = ["Throughput", "apply_speed", "estimate_speed"]
