"""Host CPU and RAM as a container sees them, and a peak-FLOP/s estimate for CPU step times.

Peak GFLOP/s = cores x clock (GHz) x FLOPs per cycle per core, where FLOPs/cycle comes from the
widest vector unit the flags advertise (see :func:`flops_per_cycle`). It is a ceiling, like a GPU
spec sheet: real matmuls reach roughly half of it, and all-core vector clocks run below the
advertised one. Containers matter: cgroup CPU quotas and memory limits cap what the job may use,
while psutil reports the whole host, so both are applied here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .types import CPU

log = logging.getLogger("perfguide.hardware")

FALLBACK_CLOCK_MHZ = 2500.0
# flags that change what CPU training/inference can do; the rest of /proc/cpuinfo is noise here
RELEVANT_FLAGS = frozenset({
    "sse4_2", "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_bf16", "amx_tile", "amx_int8", "amx_fp16", "avx_vnni",
    "asimd", "sve", "bf16", "i8mm",  # aarch64 spellings
})


def flops_per_cycle(flags: frozenset[str], vendor: str = "") -> tuple[float, float]:
    """(fp32, bf16) FLOPs per cycle per core for the widest unit the flags advertise.

    fp32: two FMA pipes x lanes x 2 (multiply+add): AVX-512 16 lanes -> 64, AVX2+FMA 8 lanes -> 32,
    AVX without FMA 16, SSE 8. AMD Zen 4 advertises AVX-512 but runs it on 256-bit pipes, so
    AuthenticAMD counts as 32. bf16: AMX tiles do 1024 FLOPs/cycle/core (Intel Sapphire Rapids
    figure); AVX512-BF16 dot products pair two bf16 per fp32 lane, doubling the fp32 rate;
    without either, bf16 is converted to fp32 and can at best match the fp32 rate.
    """
    if "avx512f" in flags:
        fp32 = 32.0 if vendor == "AuthenticAMD" else 64.0
    elif "avx2" in flags and "fma" in flags:
        fp32 = 32.0
    elif "avx" in flags:
        fp32 = 16.0
    elif "asimd" in flags:
        fp32 = 16.0  # two 128-bit NEON FMA pipes (Neoverse N1 class)
    else:
        fp32 = 8.0
    if "amx_bf16" in flags:
        bf16 = 1024.0
    elif "avx512_bf16" in flags:
        bf16 = 2 * fp32
    else:
        bf16 = fp32
    return fp32, bf16


def peak_gflops(cores: int, clock_mhz: float, flags: frozenset[str], vendor: str = "") -> tuple[float, float]:
    """(fp32, bf16) peak GFLOP/s of ``cores`` cores at ``clock_mhz``; see the module docstring."""
    fp32, bf16 = flops_per_cycle(flags, vendor)
    ghz = clock_mhz / 1e3
    return round(cores * ghz * fp32, 1), round(cores * ghz * bf16, 1)


def parse_cpuinfo(text: str) -> dict[str, object]:
    """model name, vendor, flags, socket count and MHz from /proc/cpuinfo text (x86 and aarch64)."""
    model = vendor = ""
    flags: set[str] = set()
    sockets: set[str] = set()
    mhz: list[float] = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key in ("model name", "hardware") and not model:
            model = value
        elif key == "vendor_id" and not vendor:
            vendor = value
        elif key in ("flags", "features"):
            flags.update(value.split())
        elif key == "physical id":
            sockets.add(value)
        elif key == "cpu mhz":
            try:
                mhz.append(float(value))
            except ValueError:
                pass
    return {
        "model_name": model or "unknown",
        "vendor": vendor,
        "flags": frozenset(flags & RELEVANT_FLAGS),
        "sockets": max(1, len(sockets)),
        "mhz": max(mhz) if mhz else None,
    }


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")  # a stray non-UTF-8 byte must not cost the RAM figure
    except OSError:
        return None


def cgroup_cpu_limit() -> float | None:
    """CPUs the cgroup quota allows (v2 cpu.max, else v1 cfs quota/period), or None if unlimited."""
    v2 = _read("/sys/fs/cgroup/cpu.max")
    if v2:
        quota, period = ([*v2.split(), "100000"])[:2]
        return int(quota) / int(period) if quota.isdigit() and period.isdigit() and int(period) else None
    quota_s = (_read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") or "").strip()
    period_s = (_read("/sys/fs/cgroup/cpu/cpu.cfs_period_us") or "").strip()
    if quota_s.isdigit() and period_s.isdigit() and int(period_s):  # quota -1 = unlimited, not a digit string
        return int(quota_s) / int(period_s)
    return None


def cgroup_memory_limit() -> int | None:
    """Bytes the cgroup may use (v2 memory.max, else v1 limit_in_bytes); None when unlimited."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        text = _read(path)
        if text is None:
            continue
        text = text.strip()
        # v1 writes 'unlimited' as a page-rounded 2**63
        if text.isdigit() and int(text) < 2**60:
            return int(text)
        return None
    return None


def _cgroup_memory_used() -> int | None:
    for path in ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes"):
        text = _read(path)
        if text and text.strip().isdigit():
            return int(text.strip())
    return None


def _usable_logical() -> int:
    """Logical CPUs this process may run on: affinity mask, then the cgroup quota."""
    try:
        logical = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        logical = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        logical = min(logical, max(1, int(quota)))
    return max(1, logical)


def _clock_mhz(psutil_module: Any, info_mhz: float | None) -> float:
    """Max advertised clock if psutil knows it, else the current one, else cpuinfo, else 2.5 GHz."""
    try:
        freq = psutil_module.cpu_freq()
    except Exception:  # noqa: BLE001 - psutil raises odd errors in containers (missing sysfs)
        freq = None
    if freq is not None:
        for value in (freq.max, freq.current):
            if value and value > 0:
                return float(value)
    return info_mhz or FALLBACK_CLOCK_MHZ


def probe_cpu() -> CPU:
    """This host's CPU/RAM, limited to what the process's affinity and cgroup allow."""
    import psutil

    info = parse_cpuinfo(_read("/proc/cpuinfo") or "")
    host_logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    host_physical = psutil.cpu_count(logical=False) or host_logical
    logical = min(host_logical, _usable_logical())
    # keep the host's threads-per-core ratio when a container gets a share of it
    physical = max(1, min(host_physical, round(logical * host_physical / host_logical)))
    vm = psutil.virtual_memory()
    ram_total, ram_available = int(vm.total), int(vm.available)
    limit = cgroup_memory_limit()
    if limit is not None and limit < ram_total:
        used = _cgroup_memory_used() or 0
        ram_total, ram_available = limit, max(0, min(ram_available, limit - used))
    flags: frozenset[str] = info["flags"]  # type: ignore[assignment]
    fp32, bf16 = peak_gflops(physical, _clock_mhz(psutil, info["mhz"]), flags, str(info["vendor"]))  # type: ignore[arg-type]
    log.debug("cpu: %d physical / %d logical usable, %.1f GiB RAM", physical, logical, ram_total / 2**30)
    return CPU(
        model_name=str(info["model_name"]),
        physical_cores=physical,
        logical_cores=logical,
        sockets=int(info["sockets"]),  # type: ignore[call-overload]
        ram_total=ram_total,
        ram_available=ram_available,
        flags=tuple(sorted(flags)),
        fp32_gflops=fp32,
        bf16_gflops=bf16,
    )
