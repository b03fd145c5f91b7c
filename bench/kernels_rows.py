"""The rows of Liger-Kernel's own kernel benchmarks that bench/kernels.py prices, read and validated.

bench/data/liger_kernel_benchmarks.csv holds every row (speed and memory, every provider and mode) of the kernels
the bench prices -- cross_entropy, fused_linear_cross_entropy, geglu -- from linkedin/Liger-Kernel
benchmark/data/all_benchmark_data.csv at the commit in the row, each column as published, plus where it came from.
A damaged row is one line naming the row, the column and what is accepted, as perfguide's data files are
(perfguide._data.validated).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

CSV = Path(__file__).resolve().parent / "data" / "liger_kernel_benchmarks.csv"
REPO = "linkedin/Liger-Kernel"
PUBLISHED_PATH = "benchmark/data/all_benchmark_data.csv"
KERNELS = ("cross_entropy", "fused_linear_cross_entropy", "geglu")


class BenchRow(BaseModel):
    """One published row. ``y_value_50`` is the median over the script's iterations (``_test_memory`` runs ten,
    quantiles 0.5 / 0.2 / 0.8), in MB = MiB there (``max_memory_allocated() / 2**20``), or ms for speed rows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kernel_name: Literal["cross_entropy", "fused_linear_cross_entropy", "geglu"]
    kernel_provider: Literal["liger", "huggingface"]
    kernel_operation_mode: Literal["forward", "backward", "full"]
    metric_name: Literal["speed", "memory"]
    metric_unit: Literal["ms", "MB"]
    x_name: Literal["V", "BT", "T"]
    x_label: str = Field(min_length=1)
    x_value: int = Field(gt=0)
    y_value_50: float = Field(gt=0)
    y_value_20: float = Field(gt=0)
    y_value_80: float = Field(gt=0)
    extra_benchmark_config_str: str = Field(min_length=2)
    gpu_name: str = Field(min_length=4)
    timestamp: str = Field(pattern=r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")
    liger_version: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    source_repo: Literal["linkedin/Liger-Kernel"]
    source_path: Literal["benchmark/data/all_benchmark_data.csv"]
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")

    @field_validator("extra_benchmark_config_str")
    @classmethod
    def _json_object(cls, text: str) -> str:
        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"not JSON ({err.msg})") from None
        if not isinstance(cfg, dict):
            raise ValueError("not a JSON object")
        return text

    @model_validator(mode="after")
    def _consistent(self) -> BenchRow:
        unit = {"speed": "ms", "memory": "MB"}[self.metric_name]
        if self.metric_unit != unit:
            raise ValueError(f"metric_unit: a {self.metric_name} row is in {unit}, not {self.metric_unit}")
        x = {"cross_entropy": "V", "fused_linear_cross_entropy": "BT", "geglu": "T"}[self.kernel_name]
        if self.x_name != x:
            raise ValueError(f"x_name: {self.kernel_name} rows sweep {x}, not {self.x_name}")
        cfg = self.config
        needs = {"cross_entropy": ("B", "T"), "fused_linear_cross_entropy": ("H", "V", "dtype"),
                 "geglu": ("bsz", "hidden_size", "intermediate_size", "hidden_act", "dtype")}[self.kernel_name]
        missing = [k for k in needs if k not in cfg]
        if missing:
            raise ValueError(f"extra_benchmark_config_str lacks {', '.join(missing)} (a {self.kernel_name} row needs {', '.join(needs)})")
        if "dtype" in cfg and cfg["dtype"] not in ("torch.bfloat16", "torch.float16", "torch.float32"):
            raise ValueError(f"extra_benchmark_config_str: dtype {cfg['dtype']!r} is not torch.bfloat16, torch.float16 or torch.float32")
        return self

    @property
    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = json.loads(self.extra_benchmark_config_str)
        return cfg

    @property
    def label(self) -> str:
        return f"{self.kernel_name} {self.kernel_provider} {self.kernel_operation_mode} {self.x_name}={self.x_value}"


def load(path: Path = CSV) -> list[BenchRow]:
    """Every row of ``path``, validated; the first bad row raises one line (file, row, column, what is accepted)."""
    rows: list[BenchRow] = []
    with path.open(newline="", encoding="utf-8") as fh:
        for n, raw in enumerate(csv.DictReader(fh), start=2):
            try:
                rows.append(BenchRow.model_validate(raw))
            except ValidationError as err:
                raise ValueError(f"{path.name} line {n}: {_first_problem(err)}") from None
    if not rows:
        raise ValueError(f"{path.name}: no rows")
    return rows


def _first_problem(err: ValidationError) -> str:
    first = err.errors()[0]
    first["msg"] = str(first["msg"]).removeprefix("Value error, ")
    if not first["loc"]:   # a rule across columns: the message names them
        return " ".join(str(first["msg"]).split())
    return " ".join(f"{first['loc'][0]}: {first['msg']} (got {first.get('input')!r})".split())
