"""What a short real run measured, next to what perfguide predicted."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._base import Model
from ..setup import Setup


class Measurement(Model):
    """Numbers read from the device during real steps. CUDA fields are None on CPU and vice versa."""

    device: Literal["cuda", "cpu"]
    steps: int = Field(ge=0)
    step_time_s: float | None = None
    step_times_s: tuple[float, ...] = ()  # each steady (post-warm-up) step, for the spread of the mean
    tokens_per_s: float | None = None
    peak_allocated: int | None = None     # torch.cuda.max_memory_allocated
    peak_reserved: int | None = None      # torch.cuda.max_memory_reserved
    device_total: int | None = None       # NVML used memory at the peak
    device_processes: int | None = None   # processes NVML saw on the device (1 = this one alone); None = unknown
    rss_baseline: int | None = None       # CPU: RSS when training started (model already loaded)
    rss_peak: int | None = None
    rss_growth: int | None = None         # CPU: peak - baseline = grads + optimizer + activations


class Comparison(Model):
    """Measured vs predicted for one quantity; ``ratio`` > 1 means perfguide under-predicted."""

    quantity: str
    predicted: float
    measured: float
    ratio: float
    unit: str

    @property
    def error_pct(self) -> float:
        return abs(self.ratio - 1.0) * 100


class Verification(Model):
    measured: Measurement | None
    comparisons: tuple[Comparison, ...] = ()
    oom: bool = False
    error: str | None = None
    suggestion: Setup | None = None       # the next smaller setup after an OOM
    ok: bool = True                       # every comparison within the tolerance, no OOM

    def comparison(self, quantity: str) -> Comparison | None:
        return next((c for c in self.comparisons if c.quantity == quantity), None)
