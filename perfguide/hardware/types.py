"""What perfguide knows about a machine: the GPUs, how they are linked, and the CPU/RAM beside them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .._base import Model

Interconnect = Literal["nvlink", "infinity_fabric", "pcie", "none"]  # infinity_fabric: AMD xGMI between Instinct GPUs
#: Who makes the card ("nvidia", "amd", ...): a gpus.json column; what the cost model needs to know of a
#: vendor's cards is in the efficiency_class and attention_class columns, never in code keyed on the vendor.
Vendor = str


class Capabilities(Model):
    """What the software stack runs natively on a card, so rules ask the card rather than its CUDA generation.

    Each flag is a fact of (card, library) written in data/gpus.json with its source; an AMD card is then just a
    row with different flags. Cards the table does not know get the NVIDIA rule of :meth:`from_compute_capability`.
    """

    bf16: bool = Field(default=False, description="native bf16 matrix cores (emulation does not count)")
    fp16: bool = Field(default=False, description="fp16 tensor/matrix cores: half precision pays")
    tf32: bool = Field(default=False, description="TrainingArguments(tf32=True) is accepted (transformers is_torch_tf32_available)")
    fp8: bool = Field(default=False, description="fp8 matmuls in hardware")
    flash_attention: bool = Field(default=False, description="the flash-attn 2 package builds and runs on it")
    flash_attention_3: bool = Field(default=False, description="flash-attn's Hopper build (FlashAttention-3, flash_attn_interface: "
                                    "sm90 kernels) runs on it")
    bitsandbytes: bool = Field(default=False, description="bitsandbytes NF4/FP4 and 8-bit optimizers run on it")
    llm_int8: bool = Field(default=False, description="bitsandbytes LLM.int8() matmuls run on it")

    @classmethod
    def from_compute_capability(cls, cc: tuple[int, int]) -> Capabilities:
        """The NVIDIA rule for a card the table lacks: bf16/tf32/FA2 from Ampere (8.0), fp8 from Ada (8.9), fp16 tensor
        cores from Volta (7.0), bitsandbytes 4-bit/8-bit optimizers from 6.0 and LLM.int8() from 7.5 (bitsandbytes
        installation guide); FlashAttention-3 on Hopper (9.x) only (flash-attn's hopper/ README: 'H100 / H800 GPU';
        transformers requires compute capability >= 9 for it)."""
        return cls(bf16=cc >= (8, 0), fp16=cc >= (7, 0), tf32=cc >= (8, 0), fp8=cc >= (8, 9),
                   flash_attention=cc >= (8, 0), flash_attention_3=(9, 0) <= cc < (10, 0), bitsandbytes=cc >= (6, 0),
                   llm_int8=cc >= (7, 5))


class GPU(Model):
    """One visible GPU (or a MIG slice). Throughput numbers are dense peaks from the spec sheet."""

    name: str
    uuid: str | None = None
    index: int = 0
    memory_total: int = Field(ge=0, description="bytes")
    memory_free: int = Field(ge=0, description="bytes")
    memory_reserved: int = Field(default=0, ge=0, description="bytes of memory_total the driver holds back: no CUDA "
                                 "process can allocate them (cudaMemGetInfo's total is memory_total less this); 0: unknown")
    memory_usable_source: str | None = Field(default=None, description="where memory_reserved comes from (a gpus.json row, NVML), as the report names it")
    vendor: Vendor = "nvidia"
    compute_capability: tuple[int, int] = Field(default=(0, 0), description="CUDA compute capability; (0, 0) off NVIDIA")
    capabilities: Capabilities = Field(default_factory=Capabilities, description="from the spec row; else the NVIDIA rule on compute_capability")
    multiprocessors: int | None = None
    # spec-sheet peaks (dense, no sparsity); None when unknown
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    tf32_tflops: float | None = None
    fp32_tflops: float | None = None
    fp8_tflops: float | None = None
    memory_bandwidth_gbps: float | None = Field(default=None, description="GB/s (1e9 bytes)")
    matmul_tflops: float | None = Field(default=None, description="measured max achievable bf16 matmul TFLOP/s (MAMF)")
    l2_cache_mib: float | None = Field(default=None, description="L2 cache, MiB (the whitepaper's 'MB'); None: unknown")
    l2_bandwidth_gbps: float | None = Field(default=None, description="GB/s a kernel reads data resident in L2 at "
                                            "(measured); None: every byte priced at memory_bandwidth_gbps")
    efficiency_class: str | None = Field(default=None, description="the class whose share of peak its matmuls reach "
                                         "(efficiency.json peak_fraction_by_class); None on NVIDIA: from the compute capability")
    attention_class: str | None = Field(default=None, description="its fused-attention kernel class (efficiency.json "
                                        "attention_peak_fraction); None on NVIDIA: from the compute capability")
    mig: bool = False

    @model_validator(mode="before")
    @classmethod
    def _capabilities_from_cc(cls, data: Any) -> Any:
        """An NVIDIA card built without flags (a probe of an unknown board, a hand-made GPU) gets its generation's."""
        if isinstance(data, dict) and data.get("capabilities") is None:
            if data.get("vendor", "nvidia") != "nvidia":
                raise ValueError(f"GPU {data.get('name')!r} of vendor {data['vendor']!r} needs explicit capabilities")
            data = {**data, "capabilities": Capabilities.from_compute_capability(tuple(data.get("compute_capability", (0, 0))))}
        return data

    @model_validator(mode="after")
    def _classes_off_nvidia(self) -> GPU:
        """Only NVIDIA's classes follow from the compute capability; another vendor's card says which it is in."""
        if self.vendor != "nvidia" and (self.efficiency_class is None or self.attention_class is None):
            raise ValueError(f"GPU {self.name!r} of vendor {self.vendor!r} needs its efficiency_class and attention_class "
                             "(gpus.json columns: which efficiency.json constants its matmuls and attention kernels reach)")
        return self

    @property
    def allocatable(self) -> int:
        """The most one process can allocate (cudaMemGetInfo's total): the board total less the driver's reserve."""
        return max(0, self.memory_total - self.memory_reserved)

    @property
    def supports_bf16(self) -> bool:
        return self.capabilities.bf16

    @property
    def supports_tf32(self) -> bool:
        return self.capabilities.tf32

    @property
    def supports_fp8(self) -> bool:
        return self.capabilities.fp8

    @property
    def has_tensor_cores(self) -> bool:
        """Half precision only pays with fp16 matrix cores (Volta+ / CDNA); without them fp32 is as fast."""
        return self.capabilities.fp16

    @property
    def supports_flash_attention(self) -> bool:
        return self.capabilities.flash_attention

    @property
    def supports_flash_attention_3(self) -> bool:
        return self.capabilities.flash_attention_3

    @property
    def supports_bitsandbytes(self) -> bool:
        return self.capabilities.bitsandbytes

    @property
    def generation(self) -> str:
        """How reports name the card's generation: 'cc 8.0' on NVIDIA, the vendor elsewhere."""
        return f"cc {self.compute_capability[0]}.{self.compute_capability[1]}" if self.vendor == "nvidia" else self.vendor.upper()

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
    def fast_link(self) -> bool:
        """GPU-to-GPU links of their own (NVLink, AMD Infinity Fabric), not PCIe through the host."""
        return self.interconnect in ("nvlink", "infinity_fabric")

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
    def from_name(cls, name: str, host_ram: int | float | str | None = None) -> Hardware:
        """Named target for planning, e.g. ``"a100-80gb:8"``, ``"dgx-h100"``, ``"p5.48xlarge:8x2"``, ``"cpu"``.

        ``host_ram`` (GiB, or a size such as ``"1.5TB"``) replaces the RAM the target is assumed to have.
        """
        from .named import hardware_from_name

        return hardware_from_name(name, host_ram)

    @classmethod
    def probe(cls) -> Hardware:
        from .probe import probe

        return probe()
