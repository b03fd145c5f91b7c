"""Spec-sheet lookups over data/gpus.json: by perfguide name, alias, or the name NVML reports.

The table is the only place GPU numbers live; named targets and the probe both build their
:class:`GPU` objects here, so a probed A100 and ``"a100-80gb"`` carry the same peaks.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from pydantic import Field, field_validator, model_validator

from .._base import MiB, Model
from .._data import DataModel, validated
from .types import CPU, GPU, Capabilities, Interconnect, Vendor

#: the most of nvidia-smi's total any published card's driver holds back is under 3% (T4: 451 of 15,360 MiB)
_MAX_HELD_BACK = 0.05
_SPEC_FIELDS = ("bf16_tflops", "fp16_tflops", "tf32_tflops", "fp32_tflops", "fp8_tflops", "memory_bandwidth_gbps",
                "matmul_tflops", "l2_cache_mib", "l2_bandwidth_gbps")


class GpuRow(Model):
    """One datasheet row of data/gpus.json, checked at load so a typo fails at import, not mid-plan."""

    aliases: tuple[str, ...] = ()
    nvml_names: tuple[str, ...] = ()
    memory_mib: int = Field(gt=0)
    vendor: Vendor
    compute_capability: tuple[int, int]
    capabilities: Capabilities
    multiprocessors: int | None = Field(default=None, gt=0)
    bf16_tflops: float | None = Field(default=None, gt=0)
    fp16_tflops: float | None = Field(default=None, gt=0)
    tf32_tflops: float | None = Field(default=None, gt=0)
    fp32_tflops: float | None = Field(default=None, gt=0)
    fp8_tflops: float | None = Field(default=None, gt=0)
    memory_bandwidth_gbps: float = Field(gt=0)
    link: Interconnect
    nvlink_gbps: float | None = Field(default=None, gt=0)
    infinity_fabric_gbps: float | None = Field(default=None, gt=0)
    pcie_gbps: float | None = Field(default=None, gt=0)
    source: str = Field(min_length=1)
    memory_source: str = Field(min_length=1)
    #: what one CUDA process can allocate at most (cudaMemGetInfo total, torch's "total capacity"), GiB as printed
    cuda_total_gib: float = Field(gt=0)
    cuda_total_source: str = Field(min_length=10)
    #: measured maximum achievable bf16 matmul TFLOP/s (MAMF), where a public measurement exists
    matmul_tflops: float | None = Field(default=None, gt=0)
    matmul_source: str | None = Field(default=None, min_length=10)
    #: the whitepaper's L2 size and a measured rate of reads it serves (speed/terms.py l2_bytes), with their source
    l2_cache_mib: float | None = Field(default=None, gt=0)
    l2_bandwidth_gbps: float | None = Field(default=None, gt=0)
    l2_source: str | None = Field(default=None, min_length=10)
    #: efficiency.json classes its kernels reach (required off NVIDIA; NVIDIA's follow from the compute capability)
    efficiency_class: str | None = None
    attention_class: str | None = None

    @model_validator(mode="after")
    def _measured_has_source(self) -> GpuRow:
        if (self.matmul_tflops is None) != (self.matmul_source is None):
            raise ValueError("matmul_tflops and matmul_source come together")
        if (self.l2_cache_mib is None) != (self.l2_source is None) or (self.l2_bandwidth_gbps is not None and self.l2_cache_mib is None):
            raise ValueError("l2_cache_mib and l2_source come together, and l2_bandwidth_gbps needs the L2's size")
        if self.l2_bandwidth_gbps is not None and self.l2_bandwidth_gbps <= self.memory_bandwidth_gbps:
            raise ValueError(f"l2_bandwidth_gbps {self.l2_bandwidth_gbps} is not above memory_bandwidth_gbps "
                             f"{self.memory_bandwidth_gbps}: an L2 serves reads faster than the DRAM behind it")
        if self.vendor != "nvidia" and (self.efficiency_class is None or self.attention_class is None):
            raise ValueError(f"a {self.vendor} row needs efficiency_class and attention_class (NVIDIA's follow from compute_capability)")
        return self

    @model_validator(mode="after")
    def _cuda_total_plausible(self) -> GpuRow:
        """The driver only ever takes memory away (never more than nvidia-smi's total), and a few percent at most;
        the figure is a published print (a URL) or says the rule that derived it ([I])."""
        board = self.memory_mib / 1024
        if not board * (1 - _MAX_HELD_BACK) <= self.cuda_total_gib <= board + 0.005:  # printed to 0.01 GiB
            raise ValueError(f"cuda_total_gib {self.cuda_total_gib} is not within {_MAX_HELD_BACK:.0%} below the "
                             f"nvidia-smi total {board:.2f} GiB (memory_mib {self.memory_mib})")
        if not (self.cuda_total_source.startswith("[I]") or "https://" in self.cuda_total_source):
            raise ValueError("cuda_total_source needs the URL of the published print, or '[I]' and the rule that derived it")
        return self


class HostRow(Model):
    """The CPU side of a named target: what offload and dataloader rules plan against."""

    model_name: str
    physical_cores: int = Field(ge=1)
    logical_cores: int = Field(ge=1)
    sockets: int = Field(default=1, ge=1)
    ram_gib: float = Field(gt=0)
    flags: tuple[str, ...] = ()
    clock_ghz: float = Field(gt=0)
    vendor: str
    source: str | None = None


class NodeRow(Model):
    """A named node type: ``gpus`` cards of one gpus.json row on the host those machines ship with."""

    gpu: str
    gpus: int = Field(ge=1)
    cpu: HostRow
    inter_node_bandwidth_gbps: float = Field(gt=0)
    source: str = Field(min_length=1)


class NetworkRow(Model):
    """The default inter-node link when a named multi-node target says none."""

    inter_node_bandwidth_gbps: float = Field(gt=0)
    source: str = Field(min_length=10)


class GpusFile(DataModel):
    """data/gpus.json, validated once at first use: the datasheet rows, the default host and network, the named
    node types (whose GPUs must be rows). Every reader of the file reads this object."""

    gpus: dict[str, GpuRow] = Field(min_length=1)
    cpu: HostRow
    network: NetworkRow
    nodes: dict[str, NodeRow] = Field(default_factory=dict)

    @field_validator("nodes", mode="before")
    @classmethod
    def _drop_docs(cls, value: Any) -> Any:
        """``_doc`` rows describe the table; they are not node types."""
        return {k: v for k, v in value.items() if not str(k).startswith("_")} if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _nodes_name_rows(self) -> GpusFile:
        unknown = [f"{k} -> {r.gpu}" for k, r in self.nodes.items() if r.gpu not in self.gpus]
        if unknown:
            raise ValueError(f"nodes name GPUs the table does not have: {', '.join(unknown)}")
        return self


def gpus_file() -> GpusFile:
    """The validated table (cached by ``validated``); a damaged file is one DataFileError naming the row and field."""
    return validated("gpus", GpusFile)


def _nodes() -> dict[str, NodeRow]:
    return gpus_file().nodes


def node_names() -> list[str]:
    return sorted(_nodes())


def resolve_node(name: str) -> str | None:
    """Canonical node type for a name ('DGX-H100', 'p5.48xlarge'), or None."""
    folded = normalize(name)
    return next((key for key in _nodes() if normalize(key) == folded), None)


def node(key: str) -> NodeRow:
    return _nodes()[key]


def _table() -> dict[str, GpuRow]:
    return gpus_file().gpus


def normalize(name: str) -> str:
    """Fold the spellings users type into one key: case, spaces/underscores, and '80g' for '80gb'.

    Separators are dropped last so 'A100_80GB', 'a100-80g' and 'a100 80gb' all meet at 'a10080gb',
    while 'a10g' (a product, not a size) stays itself because its 'g' does not follow a separator.
    """
    text = re.sub(r"[\s_]+", "-", name.strip().lower())
    text = re.sub(r"^(?:nvidia|amd|tesla|geforce)-(?=.)", "", text)   # 'NVIDIA A100 80GB' as consoles print it
    text = re.sub(r"-(\d+)g(?=-|$)", r"-\1gb", text)
    return re.sub(r"[^a-z0-9]", "", text)


@cache
def _alias_index() -> dict[str, str]:
    """normalized key/alias -> canonical key. Built once; collisions are data bugs, so fail loudly."""
    index: dict[str, str] = {}
    for key, entry in _table().items():
        for spelling in (key, *entry.aliases):
            folded = normalize(spelling)
            if index.get(folded, key) != key:
                raise ValueError(f"gpus.json: {spelling!r} names both {index[folded]!r} and {key!r}")
            index[folded] = key
    return index


@cache
def _nvml_index() -> dict[str, str]:
    return {_fold_nvml(n): key for key, entry in _table().items() for n in entry.nvml_names}


def _fold_nvml(name: str) -> str:
    """Vendor prefixes come and go between drivers ('Tesla T4' vs 'NVIDIA T4'); compare without them."""
    text = name.strip().lower()
    for prefix in ("nvidia ", "tesla ", "geforce "):
        text = text.removeprefix(prefix)
    return re.sub(r"[^a-z0-9]", "", text)


def canonical_names() -> list[str]:
    return sorted(_table())


def resolve(name: str) -> str | None:
    """Canonical key for a perfguide name or alias, or None."""
    return _alias_index().get(normalize(name))


def variants(name: str) -> list[str]:
    """The other rows a family name also fits (``a100`` -> a100-80gb, a100-80gb-pcie), when the name is an alias
    rather than a row's own key; [] for a name that means one card."""
    key = resolve(name)
    folded = normalize(name)
    if key is None or normalize(key) == folded:
        return []
    return [k for k in canonical_names() if k != key and normalize(k.split("-")[0]) == folded]


def resolve_nvml(nvml_name: str) -> str | None:
    """Canonical key for a device name as NVML reports it, e.g. 'NVIDIA A100-SXM4-80GB'.

    MIG slices report '<parent> MIG 1g.10gb'; they share the parent's spec row.
    """
    base = re.split(r"\s+MIG\s", nvml_name.strip(), maxsplit=1)[0]
    return _nvml_index().get(_fold_nvml(base))


def entry(key: str) -> GpuRow:
    return _table()[key]


def memory_bytes(key: str) -> int:
    return entry(key).memory_mib * MiB


def usable_bytes(key: str) -> int:
    """What a CUDA process can allocate on this card (cudaMemGetInfo's total): the figure plans judge "fits" against."""
    return round(entry(key).cuda_total_gib * 2**30)


def usable_source(key: str) -> str:
    """Where ``usable_bytes`` comes from, for reports: the figure against the board total, and its source row."""
    row = entry(key)
    url = re.search(r"https://\S+?(?=[\s,;)]|$)", row.cuda_total_source)
    where = url.group(0) if url and not row.cuda_total_source.startswith("[I]") else "derived, gpus.json cuda_total_source [I]"
    return f"{row.cuda_total_gib:.2f} GiB usable of the {row.memory_mib / 1024:.2f} GiB board ({where})"


def spec_numbers(key: str) -> dict[str, Any]:
    """The throughput/bandwidth fields of one row, ready to pass to :class:`GPU`."""
    row = entry(key)
    return {field: getattr(row, field) for field in _SPEC_FIELDS}


def identity(key: str) -> dict[str, Any]:
    """Vendor, compute capability and capability flags of one row: what a probed card of this model inherits."""
    row = entry(key)
    return {"vendor": row.vendor, "compute_capability": row.compute_capability, "capabilities": row.capabilities,
            "efficiency_class": row.efficiency_class, "attention_class": row.attention_class}


def gpu_from_spec(key: str, index: int = 0) -> GPU:
    """A whole, idle GPU of model ``key`` (free == what CUDA can allocate): what a named target plans against."""
    row = entry(key)
    usable = usable_bytes(key)
    return GPU(
        name=key,
        index=index,
        memory_total=memory_bytes(key),
        memory_free=usable,
        memory_reserved=memory_bytes(key) - usable,
        memory_usable_source=usable_source(key),
        multiprocessors=row.multiprocessors,
        **identity(key),
        **spec_numbers(key),
    )


def link_bandwidth_gbps(key: str, link: Interconnect) -> float | None:
    """One-direction GB/s per GPU over ``link``: the datasheet's both-directions figure halved."""
    if link == "none":
        return None
    row = entry(key)
    both = {"nvlink": row.nvlink_gbps, "infinity_fabric": row.infinity_fabric_gbps}.get(link, row.pcie_gbps)
    return None if both is None else both / 2


def default_link(key: str) -> Interconnect:
    return entry(key).link


def cpu_from_row(row: HostRow, ram_bytes: int | None = None) -> CPU:
    """A :class:`CPU` with the estimated peaks of ``row``; ``ram_bytes`` replaces its RAM (``host_ram=``)."""
    from .cpu import peak_gflops

    fp32, bf16 = peak_gflops(row.physical_cores, row.clock_ghz * 1e3, frozenset(row.flags), row.vendor)
    ram = int(row.ram_gib * 1024 * MiB) if ram_bytes is None else ram_bytes
    return CPU(
        model_name=row.model_name,
        physical_cores=row.physical_cores,
        logical_cores=row.logical_cores,
        sockets=row.sockets,
        ram_total=ram,
        ram_available=ram,
        flags=tuple(sorted(row.flags)),
        fp32_gflops=fp32,
        bf16_gflops=bf16,
    )


def default_cpu() -> CPU:
    """The host a bare GPU name is assumed to have (data/gpus.json 'cpu'), with its estimated peaks."""
    return cpu_from_row(gpus_file().cpu)


def inter_node_bandwidth_gbps() -> float:
    return gpus_file().network.inter_node_bandwidth_gbps
