"""Typical hosts per GPU class (data/hosts.json): the RAM and cores a bare GPU name is planned with.

A named target says nothing about its host, and the host decides real things: whether CPU offload fits, how many
dataloader workers a rank gets. One generic 256 GiB / 32-core server for every card made a pair of RTX 4090s look
like a data-centre node, so a bare name now gets the host its cards typically ship in (a consumer desktop, the cloud
instance that carries that many of them), each row with its source. Where no row covers the GPU or the count, the
generic server of gpus.json stays and ``HostGuess.sourced`` is False, so the report can say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from pydantic import Field, field_validator, model_validator

from .._base import GiB
from .._data import DataModel, validated
from ..errors import DataFileError, UnknownHardwareError
from . import specs
from .types import CPU


class HostEntry(DataModel):
    """One typical host: the GPUs it carries, its cores and RAM as its source writes them, and the source."""

    name: str = Field(min_length=3)
    gpus: tuple[str, ...] = Field(min_length=1)
    gpu_count: int = Field(ge=1, le=16)
    vcpus: int = Field(ge=1)
    physical_cores: int | None = Field(default=None, ge=1)
    ram: str
    source: str = Field(min_length=20)
    inferred: str = ""
    sliced: bool = True   # a cloud host rents per-GPU shares of itself; a desktop is the machine whatever its GPU count

    @field_validator("source")
    @classmethod
    def _has_url(cls, v: str) -> str:
        if "https://" not in v:
            raise ValueError("a typical host needs its public source's URL")
        return v

    @field_validator("ram")
    @classmethod
    def _ram_parses(cls, v: str) -> str:
        from .named import parse_host_ram

        try:
            parse_host_ram(v)
        except UnknownHardwareError as exc:
            raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _cores(self) -> HostEntry:
        if self.physical_cores is not None and self.physical_cores > self.vcpus:
            raise ValueError("physical_cores cannot exceed vcpus")
        return self

    @property
    def ram_bytes(self) -> int:
        from .named import parse_host_ram

        return parse_host_ram(self.ram)

    @property
    def cores(self) -> int:
        """Physical cores: cloud vCPUs are hyperthreads (two per core) unless the row says otherwise."""
        return self.physical_cores or max(1, self.vcpus // 2)


class HostsFile(DataModel):
    hosts: tuple[HostEntry, ...] = Field(min_length=1)


@cache
def _rows() -> tuple[HostEntry, ...]:
    rows = validated("hosts", HostsFile).hosts
    unknown = sorted({g for r in rows for g in r.gpus if g not in specs.canonical_names()})
    if unknown:
        raise DataFileError(f"perfguide/data/hosts.json names GPUs gpus.json does not have: {', '.join(unknown)}; "
                            "the bundled data is damaged, reinstall perfguide")
    return rows


@dataclass(frozen=True)
class HostGuess:
    """The host a named target is planned with and where that comes from."""

    cpu: CPU
    label: str            # "consumer desktop (...)", "GCP a2-ultragpu-8g", or the generic server
    source: str
    inferred: str
    sourced: bool         # False: no typical-host row covers this GPU and count; the generic server stands in

    def describe(self) -> str:
        return (f"{self.cpu.physical_cores} cores, {self.cpu.ram_total / GiB:.0f} GiB RAM: "
                + (f"a typical {self.label} (data/hosts.json; {self.source})" if self.sourced else
                   f"no sourced typical host for this GPU and count, so {self.label} (data/gpus.json 'cpu', an assumption)"))


#: a row with at least this many times the GPUs asked for is sliced per GPU: clouds rent 1-GPU shares of their
#: 8-GPU hosts in proportion (GCP a2-highgpu-1g: 12 vCPUs / 85 GB = 1/8 of a2-highgpu-8g's 96 / 680; data rows)
SLICE_FROM = 2


def typical_host(gpu_key: str, gpus_per_node: int) -> HostGuess:
    """The host ``gpus_per_node`` cards of ``gpu_key`` typically ship in: the row with the fewest GPUs >= the count,
    the least RAM on a tie (a plan must not out-promise the machine), its per-GPU share when it has SLICE_FROM x
    the GPUs or more (one H200 is not planned with an 8-GPU server's 2 TB); else the generic server."""
    rows = [r for r in _rows() if gpu_key in r.gpus and r.gpu_count >= gpus_per_node]
    if not rows:
        cpu = specs.default_cpu()
        return HostGuess(cpu, f"generic {cpu.physical_cores}-core, {cpu.ram_total / GiB:.0f} GiB server", "data/gpus.json 'cpu'",
                         "", sourced=False)
    row = min(rows, key=lambda r: (r.gpu_count, r.ram_bytes, r.name))
    generic = specs.default_cpu()
    share = gpus_per_node / row.gpu_count if row.sliced and row.gpu_count >= SLICE_FROM * gpus_per_node else 1.0
    ram, cores, vcpus = int(row.ram_bytes * share), max(1, int(row.cores * share)), max(1, int(row.vcpus * share))
    label = row.name if share == 1.0 else f"{gpus_per_node}/{row.gpu_count} share of an {row.name}"
    cpu = generic.model_copy(update={
        "model_name": f"typical host: {label}", "physical_cores": cores, "logical_cores": max(vcpus, cores),
        "ram_total": ram, "ram_available": ram,
        # peak FLOPs scale with the cores (same clock and vector flags as the generic row: no AVX-512 is promised)
        "fp32_gflops": generic.fp32_gflops * cores / generic.physical_cores if generic.fp32_gflops else None,
        "bf16_gflops": generic.bf16_gflops * cores / generic.physical_cores if generic.bf16_gflops else None,
    })
    inferred = row.inferred if share == 1.0 else "; ".join(filter(None, (
        row.inferred, f"per-GPU share of the {row.gpu_count}-GPU host, as clouds slice them (GCP a2-highgpu-1g = 1/8 of -8g)")))
    return HostGuess(cpu, label, row.source, inferred, sourced=True)
