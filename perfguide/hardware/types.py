"""What perfguide knows about a machine: the GPUs, how they are linked, and the CPU/RAM beside them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._base import Model

Interconnect = Literal["nvlink", "pcie", "none"]


class GPU(Model):
    """One visible GPU (or a MIG slice). Throughput numbers are dense peaks from the spec sheet."""

    name: str
    uuid: str | None = None
    index: int = 0
    memory_total: int = Field(ge=0, description="bytes")
    memory_free: int = Field(ge=0, description="bytes")
    compute_capability: tuple[int, int] = (0, 0)
    multiprocessors: int | None = None
    # spec-sheet peaks (dense, no sparsity); None when unknown
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    tf32_tflops: float | None = None
    fp32_tflops: float | None = None
    fp8_tflops: float | None = None
    memory_bandwidth_gbps: float | None = Field(default=None, description="GB/s (1e9 bytes)")
    mig: bool = False

    @property
    def supports_bf16(self) -> bool:
        """Native bf16 tensor cores only from Ampere (cc 8.0); emulation does not count."""
        return self.compute_capability >= (8, 0)

    @property
    def supports_tf32(self) -> bool:
        return self.compute_capability >= (8, 0)

    @property
    def supports_fp8(self) -> bool:
        return self.compute_capability >= (8, 9)

    def half_tflops(self, dtype: str) -> float | None:
        """Peak dense TFLOP/s for a compute dtype ('bf16', 'fp16', 'tf32', 'fp32', 'fp8')."""
        return {
            "bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "tf32": self.tf32_tflops,
            "fp32": self.fp32_tflops, "fp8": self.fp8_tflops,
        }.get(dtype)


class CPU(Model):
    """Host CPU and RAM; used for train_cpu/infer_cpu, dataloader workers, and offload capacity."""

    model_name: str = "unknown"
    physical_cores: int = Field(ge=1)
    logical_cores: int = Field(ge=1)
    sockets: int = Field(default=1, ge=1)
    ram_total: int = Field(ge=0, description="bytes")
    ram_available: int = Field(ge=0, description="bytes")
    flags: tuple[str, ...] = ()
    # estimated peak fp32 / bf16 GFLOP/s of all cores, for CPU step-time prediction
    fp32_gflops: float | None = None
    bf16_gflops: float | None = None

    @property
    def avx512_bf16(self) -> bool:
        return "avx512_bf16" in self.flags

    @property
    def amx(self) -> bool:
        return "amx_bf16" in self.flags or "amx_tile" in self.flags

    @property
    def native_bf16(self) -> bool:
        """bf16 autocast only pays on CPUs with AVX512-BF16 or AMX; elsewhere it is emulated and slow."""
        return self.avx512_bf16 or self.amx


class Hardware(Model):
    """A whole machine (or ``nodes`` identical machines) as the planner sees it."""

    gpus: tuple[GPU, ...] = ()
    cpu: CPU
    interconnect: Interconnect = "none"
    intra_node_bandwidth_gbps: float | None = Field(default=None, description="per-GPU GB/s between GPUs of one node, one direction (datasheet both-ways figure / 2)")
    inter_node_bandwidth_gbps: float | None = Field(default=None, description="per-node GB/s of the network")
    nodes: int = Field(default=1, ge=1)
    source: Literal["probe", "named"] = "probe"
    name: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def world_size(self) -> int:
        return max(1, self.gpu_count) * self.nodes

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def smallest_gpu(self) -> GPU | None:
        """Plans target the smallest GPU in a mixed box: every rank must fit."""
        return min(self.gpus, key=lambda g: g.memory_total) if self.gpus else None

    @classmethod
    def from_name(cls, name: str) -> Hardware:
        """Named target for planning, e.g. ``"a100-80gb:8"``, ``"h100-80gb"``, ``"cpu"``."""
        from .named import hardware_from_name

        return hardware_from_name(name)

    @classmethod
    def probe(cls) -> Hardware:
        from .probe import probe

        return probe()
