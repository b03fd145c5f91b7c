"""Predicted speed of a Setup."""

from __future__ import annotations

from pydantic import Field

from .._base import Model
from ..memory.types import MemoryEstimate


class Throughput(Model):
    """Step time and its parts. For inference, prefill/decode fields are filled instead of the step."""

    step_time_s: float = Field(ge=0, description="one optimizer step (all micro-batches) or one generate() call")
    tokens_per_s: float = Field(ge=0, description="whole job (all ranks)")
    flops_per_step: float = Field(default=0, ge=0)
    compute_time_s: float = Field(default=0, ge=0)
    comm_time_s: float = Field(default=0, ge=0, description="collectives left exposed: the part compute does not hide")
    comm_total_s: float = Field(default=0, ge=0, description="every collective of the step, hidden or not (before overlap)")
    offload_time_s: float = Field(default=0, ge=0)
    achievable_tflops: float = Field(default=0, ge=0, description="per device, after efficiency")
    mfu: float = Field(default=0, ge=0, le=1)
    prefill_time_s: float | None = None
    decode_tokens_per_s: float | None = Field(default=None, description="per sequence")
    time_per_output_token_ms: float | None = None
    bound: str | None = Field(default=None, description="'compute', 'memory-bandwidth', 'communication', 'offload'")


class SetupEstimate(Model):
    """What ``perfguide estimate --json`` prints: one Setup's memory and, given hardware, its speed - the same two
    things the text report shows, so a script reads step time, tokens/s and MFU next to the bytes."""

    memory: MemoryEstimate
    speed: Throughput | None = Field(default=None, description="None when no hardware was named: speed needs a device")
