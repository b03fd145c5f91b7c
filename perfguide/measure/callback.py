"""PerfGuideCallback: a pre-flight before the first step, then predicted vs measured memory and speed, inside a real
``Trainer.train()`` (or TRL's ``SFTTrainer``).

The pre-flight prices the run the Trainer is about to start (its TrainingArguments, world size and model, on the
probed machine) and stops it before step 1 when it will not fit, naming the change that does. Estimates are only
trusted once checked; with a plan (``rec``) the callback also checks them on the user's own run, warns when they
differ by more than a threshold, and can feed the measurement to the calibration store.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from .compare import compare, tokens_per_step
from .meter import RssSampler, StepTimer, cuda_device_processes, cuda_device_used
from .types import Measurement, Verification

if TYPE_CHECKING:
    from ..recommendation import Recommendation

logger = logging.getLogger("perfguide.callback")


class PerfGuideCallback(TrainerCallback):
    """Pre-flight at ``on_train_begin`` (``preflight=False`` turns it off; ``memory_limit`` in bytes replaces the
    device's memory, e.g. to keep room for something else); with ``rec``, measure after ``measure_after_steps``
    optimizer steps (the first one is warm-up) and compare with the plan."""

    def __init__(self, rec: Recommendation | None = None, *, measure_after_steps: int = 2, threshold: float = 0.25, record: bool = False,
                 preflight: bool = True, memory_limit: int | None = None, hardware: Any = None, seq_len: int | None = None) -> None:
        self.rec = rec
        self.preflight = preflight
        self.memory_limit = memory_limit
        self.hardware = hardware
        self.seq_len = seq_len
        self.preflight_check: Any = None
        self.measure_after_steps = max(1, measure_after_steps)
        self.threshold = threshold
        self.record = record
        self.verification: Verification | None = None
        self._timer = StepTimer(warmup=1)
        self._sampler: RssSampler | None = None
        self._device = "cpu"
        self._processes: int | None = None
        self.recorded: Path | None = None

    # --- Trainer events ----------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.preflight:
            self._preflight(args, kwargs.get("model"), kwargs.get("train_dataloader"))
        self._device = "cuda" if args.device.type == "cuda" else "cpu"
        if self._device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
            self._processes = cuda_device_processes()
        else:
            self._sampler = RssSampler().start()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timer.end()
        if self.rec is not None and self.verification is None and state.global_step >= self.measure_after_steps:
            self._finish(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.rec is not None and self.verification is None and state.global_step > 0:
            self._finish(state.global_step)
        if self._sampler is not None:
            self._sampler.stop()

    def _preflight(self, args: Any, model: Any, dataloader: Any) -> None:
        """Price the Trainer's own run; raise before the first step when it does not fit (one line, with the change)."""
        from ..integrations.readers.trainer import WillNotFitError, refusal, trainer_check

        hardware = self.hardware if self.hardware is not None else (self.rec.hardware if self.rec is not None and self.rec.hardware.source == "probe" else None)
        from ..errors import PerfGuideError

        try:
            self.preflight_check = trainer_check(args, model, hardware=hardware, memory_limit=self.memory_limit, seq_len=self.seq_len,
                                                 train_dataloader=dataloader)
        except PerfGuideError as exc:  # a run perfguide cannot read is the user's to start: say so, never block it
            warnings.warn(f"perfguide pre-flight skipped: {exc}", stacklevel=2)
            return
        if not self.preflight_check.fits:
            raise WillNotFitError(refusal(self.preflight_check))
        logger.info("perfguide pre-flight: fits (%.2f GiB per device)", self.preflight_check.memory.device_total / 2**30)

    # --- measuring ---------------------------------------------------------------------------
    def measurement(self, steps: int) -> Measurement:
        assert self.rec is not None, "measuring compares with a plan: PerfGuideCallback(rec)"
        step = self._timer.mean
        tokens = tokens_per_step(self.rec) * self.rec.setup.world_size
        common = {"device": self._device, "steps": steps, "step_time_s": step, "step_times_s": tuple(self._timer.steady),
                  "tokens_per_s": tokens / step if step else None}
        if self._device == "cuda":
            import torch

            now = cuda_device_processes()
            seen = None if now is None or self._processes is None else max(now, self._processes)
            return Measurement(**common, peak_allocated=torch.cuda.max_memory_allocated(),
                               peak_reserved=torch.cuda.max_memory_reserved(), device_total=cuda_device_used(),
                               device_processes=seen)
        peak = self._sampler.stop() if self._sampler else None
        base = self._sampler.baseline if self._sampler else None
        return Measurement(**common, rss_baseline=base, rss_peak=peak, rss_growth=(peak - base) if peak and base else None)

    def _finish(self, steps: int) -> None:
        assert self.rec is not None
        self.verification = compare(self.rec, self.measurement(steps), self.threshold)
        for c in self.verification.comparisons:
            logger.info("perfguide %s: predicted %.4g %s, measured %.4g %s (x%.2f)", c.quantity, c.predicted, c.unit, c.measured, c.unit, c.ratio)
            if abs(c.ratio - 1) > self.threshold:
                warnings.warn(
                    f"perfguide: measured {c.quantity} differs from the prediction by {c.error_pct:.0f}% "
                    f"(predicted {c.predicted:.4g} {c.unit}, measured {c.measured:.4g} {c.unit}); "
                    "PerfGuideCallback(record=True) or `perfguide calibrate` feeds such runs to later estimates on this machine",
                    stacklevel=2,
                )
        if self.record:  # an unwritable store warns; the run and its verification are never lost to it
            from .calibration import record

            self.recorded = record(self.rec, self.verification)
