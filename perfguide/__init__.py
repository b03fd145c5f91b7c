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
from .errors import (
    ConflictingConstraintsError,
    DataFileError,
    InvalidModelError,
    InvalidSetupError,
    MissingDependencyError,
    OfflineError,
    OutputExistsError,
    PerfGuideError,
    UnknownHardwareError,
    UnknownScenarioError,
    WrongMachineError,
)
from .hardware import probe
from .hardware.types import CPU, GPU, Hardware
from .memory.types import MemoryEstimate
from .model.types import ModelSpec
from .preflight import Check, check
from .recommendation import Recommendation
from .scenarios.types import SCENARIOS, Constraints
from .setup import LoraSpec, Setup
from .speed.types import SetupEstimate, Throughput

if TYPE_CHECKING:
    from .measure.batch_finder import find_micro_batch, torch_try_step
    from .measure.calibration import record
    from .measure.callback import PerfGuideCallback
    from .measure.types import Verification

#: public names whose modules pull in torch / transformers or the calibration store: imported on first use
_LAZY = {
    "PerfGuideCallback": "measure.callback",
    "find_micro_batch": "measure.batch_finder",
    "torch_try_step": "measure.batch_finder",
    "record": "measure.calibration",
    "catalog_names": "model.catalog",
    "techniques": "techniques",
    "Verification": "measure.types",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return module if name == _LAZY[name] else getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "CPU",
    "GPU",
    "SCENARIOS",
    "Alternative",
    "Check",
    "ConflictingConstraintsError",
    "Constraints",
    "DataFileError",
    "Decision",
    "Hardware",
    "InvalidModelError",
    "InvalidSetupError",
    "LoraSpec",
    "MemoryEstimate",
    "MissingDependencyError",
    "ModelSpec",
    "OfflineError",
    "OutputExistsError",
    "PerfGuideCallback",
    "PerfGuideError",
    "Recommendation",
    "Setup",
    "SetupEstimate",
    "Throughput",
    "UnknownHardwareError",
    "UnknownScenarioError",
    "Verification",
    "WrongMachineError",
    "__version__",
    "catalog_names",
    "check",
    "estimate",
    "estimate_speed",
    "find_micro_batch",
    "probe",
    "recommend",
    "record",
    "techniques",
    "torch_try_step",
    "verify",
]


def verify(model: Any, rec: Recommendation, steps: int = 3, dataset: Any = None, **kwargs: Any) -> "Verification":
    """Run a few real steps of ``rec`` and return measured vs predicted (see perfguide.measure.verify).

    A wrapper, so that ``import perfguide`` stays light: the Trainer is imported only when a run is asked for.
    """
    from .measure.verify import verify as _verify

    return _verify(model, rec, steps=steps, dataset=dataset, **kwargs)
