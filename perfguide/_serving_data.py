"""data/serving.json as typed models, validated once at load: a malformed row fails at import of the
serving model, naming the field, instead of surfacing as a wrong number in a plan.

Engine rows are keyed by the engine modules' names (perfguide/engines/); nothing here knows which engines
exist. A weight format's own facts (bits, kernel efficiency, quality cost) sit in ``formats``; how an engine
runs it (its option value, at load or from a pre-quantized checkpoint, on which GPUs) sits in the engine's row.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import Field, model_validator

from ._base import Model
from ._data import load


class EngineFormat(Model):
    """One weight format as one engine runs it."""

    choice: str | None = Field(description="the engine's quantization option value; None = unquantized")
    at_load: bool = Field(description="True: the engine converts a 16-bit checkpoint at load; False: needs a pre-quantized one")
    min_cc: tuple[int, int] = Field(description="lowest NVIDIA compute capability its kernels run on")
    vendors: tuple[str, ...] = Field(min_length=1, description="GPU vendors the engine runs it on")


class HybridSwaFacts(Model):
    """An engine's separate KV pool for sliding-window layers: which models get it and how it is sized."""

    model_types: list[str] = Field(min_length=1, description="config model_type values the engine pools this way")
    swa_full_tokens_ratio: float = Field(gt=0, le=1, description="sliding-window pool tokens per full-attention pool token")
    source: str = Field(min_length=10)


class EngineFacts(Model):
    version: str
    default_gpu_memory_utilization: float = Field(gt=0, le=1)
    block_size: int = Field(ge=1)
    non_torch_bytes: int = Field(ge=0)
    non_torch_bytes_per_tp_rank: int = Field(ge=0)
    cuda_graph_bytes_per_size: int = Field(ge=0)
    max_cuda_graph_size: int = Field(ge=1)
    sampler_bytes_per_logit: float = Field(default=0.0, ge=0, description="profile-run sampler bytes per (sequence x vocab) entry")
    step_overhead_s: float = Field(ge=0)
    source: str = Field(min_length=10)
    formats: dict[str, EngineFormat] = Field(min_length=1)
    formats_source: str = Field(min_length=10)
    hybrid_swa: HybridSwaFacts | None = Field(default=None, description="a separate sliding-window KV pool (None: every "
                                              "layer in one pool, or the engine's own allocator rule)")
    dropped_choices: dict[str, str] = Field(default_factory=dict, description="quantization values earlier releases took that "
                                            "this one refuses at start (value -> what changed, with its source): named when a command passes one")


class FormatFacts(Model):
    """A weight format: bytes, kernel efficiency, the precision its matmuls run in, its quality cost."""

    bits: int = Field(ge=1, le=16)
    group_size: int = Field(ge=0)
    decode_efficiency: float = Field(gt=0, le=1)
    compute: Literal["bf16", "fp16", "fp8"]
    quality_cost_pct: float = Field(ge=0)
    source: str = Field(min_length=10)
    native_min_cc: tuple[int, int] | None = Field(
        default=None, description="NVIDIA compute capability from which the engines' kernels run the format natively; below it "
                                  "they dequantize it in software (their fused-MoE path then pays moe_layer_decode_latency_s)")


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
    moe_layer_decode_latency_s: Sourced
    moe_expert_read_efficiency: Sourced
    compute_efficiency: Sourced
    tp_allreduce: LinkTable

    @model_validator(mode="after")
    def _known_formats(self) -> ServingFacts:
        """Every format an engine row names must have its row of facts."""
        for name, engine in self.engines.items():
            unknown = set(engine.formats) - set(self.formats)
            if unknown:
                raise ValueError(f"serving.json engine {name!r} runs formats {sorted(unknown)} with no row in 'formats' ({sorted(self.formats)})")
        return self


@cache
def serving_facts() -> ServingFacts:
    raw = {k: v for k, v in load("serving").items() if not k.startswith("_")}
    return ServingFacts.model_validate(raw)
