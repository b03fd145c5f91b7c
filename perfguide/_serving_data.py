"""data/serving.json as typed models, validated once at load: a malformed row fails at import of the
serving model, naming the field, instead of surfacing as a wrong number in a plan."""

from __future__ import annotations

from functools import cache
from typing import Literal, get_args

from pydantic import Field, model_validator

from ._base import Model
from ._data import load

EngineName = Literal["vllm", "sglang"]
FormatName = Literal["bf16", "fp16", "fp8", "awq", "gptq", "bitsandbytes"]


class EngineFacts(Model):
    version: str
    default_gpu_memory_utilization: float = Field(gt=0, le=1)
    block_size: int = Field(ge=1)
    non_torch_bytes: int = Field(ge=0)
    non_torch_bytes_per_tp_rank: int = Field(ge=0)
    cuda_graph_bytes_per_size: int = Field(ge=0)
    max_cuda_graph_size: int = Field(ge=1)
    step_overhead_s: float = Field(ge=0)
    source: str = Field(min_length=10)


class FormatFacts(Model):
    """A weight format as the engines run it: bytes, kernel efficiency, the GPUs it needs, its quality cost."""

    bits: int = Field(ge=1, le=16)
    group_size: int = Field(ge=0)
    vllm: str | None          # the engine's ``quantization`` value; None = unquantized
    sglang: str | None
    checkpoint: bool          # True: needs a checkpoint quantized in this format (AWQ/GPTQ repos)
    engines: tuple[EngineName, ...] = ("vllm", "sglang")   # the engines of the pinned versions that run it
    decode_efficiency: float = Field(gt=0, le=1)
    compute: Literal["bf16", "fp16", "fp8"]
    min_cc: tuple[int, int]
    quality_cost_pct: float = Field(ge=0)
    source: str = Field(min_length=10)


class Link(Model):
    latency_s: float = Field(ge=0)
    bus_gbps: float = Field(gt=0)


class Sourced(Model):
    value: float
    source: str = Field(min_length=10)


class LinkTable(Model):
    value: dict[str, Link]
    source: str = Field(min_length=10)


class ServingFacts(Model):
    engines: dict[str, EngineFacts]
    formats: dict[str, FormatFacts]
    driver_reserved_bytes: Sourced
    acceptable_quality_cost_pct: Sourced
    quality_trade_speedup: Sourced
    decode_bandwidth_efficiency: Sourced
    compute_efficiency: Sourced
    tp_allreduce: LinkTable


    @model_validator(mode="after")
    def _known_names(self) -> ServingFacts:
        """Keys are looked up by Setup values: every engine and format Setup can name must have its row."""
        for kind, rows, names in (("engine", self.engines, get_args(EngineName)), ("format", self.formats, get_args(FormatName))):
            if set(rows) != set(names):
                raise ValueError(f"serving.json {kind}s {sorted(rows)} must be exactly {sorted(names)}")
        return self


@cache
def serving_facts() -> ServingFacts:
    raw = {k: v for k, v in load("serving").items() if not k.startswith("_")}
    return ServingFacts.model_validate(raw)
