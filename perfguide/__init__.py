"""perfguide: how to train or serve a transformer fast on your hardware, without OOM, and why.

    >>> import perfguide
    >>> rec = perfguide.recommend("gpt2", scenario="train_gpu_one", hardware="a100-80gb")  # doctest: +SKIP
    >>> print(rec.report())                                                                # doctest: +SKIP

Heavy libraries (torch, transformers, accelerate, bitsandbytes) are imported only where used.
"""

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .api import estimate, estimate_speed, recommend
from .decisions import Alternative, Decision
from .errors import PerfGuideError
from .hardware import probe
from .hardware.types import CPU, GPU, Hardware
from .memory.types import MemoryEstimate
from .model.types import ModelSpec
from .recommendation import Recommendation
from .scenarios.types import SCENARIOS, Constraints
from .setup import LoraSpec, Setup
from .speed.types import Throughput

if TYPE_CHECKING:
    from .measure.types import Verification

__all__ = [
    "CPU",
    "GPU",
    "SCENARIOS",
    "Alternative",
    "Constraints",
    "Decision",
    "Hardware",
    "LoraSpec",
    "MemoryEstimate",
    "ModelSpec",
    "PerfGuideError",
    "Recommendation",
    "Setup",
    "Throughput",
    "__version__",
    "estimate",
    "estimate_speed",
    "probe",
    "recommend",
    "verify",
]


def verify(model: Any, rec: Recommendation, steps: int = 3, dataset: Any = None, **kwargs: Any) -> "Verification":
    """Run a few real steps of ``rec`` and return measured vs predicted (see perfguide.measure.verify).

    A wrapper, so that ``import perfguide`` stays light: the Trainer is imported only when a run is asked for.
    """
    from .measure.verify import verify as _verify

    return _verify(model, rec, steps=steps, dataset=dataset, **kwargs)
