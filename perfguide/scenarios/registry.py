"""The scenarios as data: what each plans (task, device, one or many GPUs), its defaults, its plan function.

Code asks the entry (``get(name).task``, ``.multi_gpu``...) instead of reading meaning out of the name, so a
new scenario is one entry here plus its module with ``plan(request) -> Plan`` (torchtune's recipe registry
is the model: a name maps to a recipe and the facts needed to launch it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Literal

from ..errors import UnknownScenarioError, unknown_value

if TYPE_CHECKING:
    from .types import Plan, Request

DEFAULT_TRAIN_SEQ_LEN = 2048
DEFAULT_GLOBAL_BATCH = 32
DEFAULT_PROMPT_LEN = 1024


@dataclass(frozen=True)
class ScenarioInfo:
    name: str
    task: Literal["train", "infer"]
    device: Literal["cuda", "cpu"]
    multi_gpu: bool                   # plans several GPUs (num_gpus / nodes / strategy are its to read)
    summary: str
    module: str                       # perfguide.scenarios.<module> holds ``plan(request) -> Plan``
    processes: bool = False           # reads num_gpus as a number of processes (CPU training: one per socket)

    @property
    def training(self) -> bool:
        return self.task == "train"

    @property
    def plan(self) -> Callable[[Request], Plan]:
        """The plan function, imported on first use (planning modules pull in the cost model)."""
        fn: Callable[[Request], Plan] = import_module(f"{__package__}.{self.module}").plan
        return fn


SCENARIO_LIST: tuple[ScenarioInfo, ...] = (
    ScenarioInfo("train_gpu_one", "train", "cuda", False, "train on one GPU", "train_gpu_one"),
    ScenarioInfo("train_gpu_many", "train", "cuda", True, "train on several GPUs and nodes", "train_gpu_many"),
    ScenarioInfo("train_cpu", "train", "cpu", False, "train on the CPU (one process per socket)", "train_cpu", processes=True),
    ScenarioInfo("infer_gpu_one", "infer", "cuda", False, "serve with transformers on one GPU", "infer_gpu_one"),
    ScenarioInfo("infer_gpu_many", "infer", "cuda", True, "serve with transformers on several GPUs of one node", "infer_gpu_many"),
    ScenarioInfo("infer_cpu", "infer", "cpu", False, "serve with transformers on the CPU", "infer_cpu"),
)
_BY_NAME = {s.name: s for s in SCENARIO_LIST}


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def get(name: str) -> ScenarioInfo:
    """The entry for ``name``; an unknown name is one line listing the accepted ones."""
    if name not in _BY_NAME:
        raise unknown_value("scenario", name, tuple(_BY_NAME), UnknownScenarioError)
    return _BY_NAME[name]


def find(task: str, device: str, multi_gpu: bool) -> ScenarioInfo | None:
    """The scenario planning ``task`` on ``device`` (one or many GPUs): where an error points the user."""
    return next((s for s in SCENARIO_LIST if (s.task, s.device, s.multi_gpu) == (task, device, multi_gpu)), None)
