"""The memory ledger of one device for one Setup."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._base import GiB, Model


class MemoryEstimate(Model):
    """Bytes on the most loaded device, per component, and the three numbers users compare with.

    ``peak_allocated`` is what ``torch.cuda.max_memory_allocated()`` reports, ``peak_reserved`` what
    ``max_memory_reserved()`` reports (caching allocator), ``device_total`` what nvidia-smi shows
    (adds the CUDA context) while the run goes well. ``fit_total`` is what decides an OOM: the allocator releases
    its cached unsplit blocks and retries before it raises, so the footprint that must fit is smaller than the
    steady state (overhead.oom_footprint). Components are the state at the peak, so they need not sum to it exactly.
    """

    weights: int = Field(ge=0)
    gradients: int = Field(ge=0)
    optimizer_states: int = Field(ge=0)
    activations: int = Field(ge=0)
    logits: int = Field(default=0, ge=0, description="logits + loss buffers (b*s*vocab); included in peak")
    kv_cache: int = Field(default=0, ge=0)
    other: int = Field(default=0, ge=0, description="temporaries, workspaces, comm buckets")
    cuda_context: int = Field(default=0, ge=0)
    nccl_buffers: int = Field(default=0, ge=0, description="NCCL communicator buffers (cudaMalloc, outside torch's allocator); in device_total and fit_total")
    peak_allocated: int = Field(ge=0)
    peak_reserved: int = Field(ge=0)
    device_total: int = Field(ge=0)
    fit_total: int | None = Field(default=None, ge=0, description="bytes the device needs for the step not to OOM "
                                  "(allocated + fragmentation in live segments + context); None: device_total")
    capacity: int | None = Field(default=None, description="device memory the plan may use (bytes), None if no hardware")
    cpu_ram: int = Field(default=0, ge=0, description="host RAM the setup needs (offload, CPU runs)")
    fits: bool = True
    kernel_limit: str | None = Field(default=None, description="why a kernel of the setup cannot run it at any free memory "
                                     "(memory/index_limits.py); the setup does not fit then")
    start_limit: str | None = Field(default=None, description="why a serving engine refuses to start at this setup whatever the "
                                    "cache holds (vLLM's recurrent-state slots); the setup does not fit then")
    method: Literal["analytic", "trace", "measured"] = "analytic"
    notes: tuple[str, ...] = ()
    kv_cache_tokens: int | None = Field(default=None, ge=0, description="a serving engine's KV cache in tokens, as it logs it (None: no engine)")
    max_concurrency: float | None = Field(default=None, ge=0, description="sequences of max_model_len the engine's cache holds at once")

    @property
    def needed(self) -> int:
        """The bytes the fit verdict compares with the capacity: ``fit_total``, else the steady-state total."""
        return self.device_total if self.fit_total is None else self.fit_total

    @property
    def headroom(self) -> int | None:
        """What is left (negative: missing) against the bytes the fit verdict judges, so it never disagrees with ``fits``."""
        return None if self.capacity is None else self.capacity - self.needed

    def gib(self, field: str) -> float:
        return getattr(self, field) / GiB
