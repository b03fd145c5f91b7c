"""Probe this machine through NVML, never through CUDA, and never raise.

Initialising CUDA here would pin the device list of the user's process (and break fork-based
workers), so GPUs are read from NVML (``nvidia-ml-py``) and mapped to CUDA ordinals by
:mod:`perfguide.hardware.visible`. Every NVML call goes through the module :func:`_nvml` returns:
that is the single boundary tests replace with a fake. Anything NVML cannot answer degrades to
what is known (spec-sheet numbers, fewer GPUs, or CPU-only) with a :class:`ProbeWarning` whose
text is also kept in ``Hardware.warnings``.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .._text import clean
from . import specs
from .cpu import probe_cpu
from .types import CPU, GPU, Hardware, Interconnect
from .visible import Candidate, parse_visible_devices, select

log = logging.getLogger("perfguide.hardware")
#: NVML 'used' on an idle board stays below this (driver reserve); more means other processes hold memory
BUSY_BYTES = 512 * 2**20


class ProbeWarning(UserWarning):
    """The probe saw less than the machine has (no driver, a GPU that did not answer, ...)."""


def _nvml() -> ModuleType | None:
    """The NVML binding, or None. The one place NVML enters perfguide (tests swap it for a fake)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the deprecated 'pynvml' dist warns on import
            import pynvml
    except Exception:  # noqa: BLE001 - a broken install must not stop planning
        return None
    return pynvml


@dataclass
class _Device:
    """What NVML said about one device; None where it could not say."""

    name: str
    uuid: str | None
    memory_total: int
    memory_free: int
    compute_capability: tuple[int, int]
    multiprocessors: int | None
    key: str | None
    handle: Any = None
    mig_of: int | None = None  # NVML index of the parent GPU for a MIG slice
    reserved: int = 0  # what the driver holds back from CUDA (0: unknown)
    usable_source: str | None = None


def probe() -> Hardware:
    """This machine as a CUDA process started now would see it."""
    notes: list[str] = []
    degraded: list[str] = []
    cpu = _probe_cpu(degraded)
    try:
        gpus, link, bandwidth = _probe_gpus(os.environ, notes, degraded)
    except Exception as exc:  # noqa: BLE001 - never raise from a probe
        gpus, link, bandwidth = (), "none", None
        degraded.append(f"GPU probe failed unexpectedly ({type(exc).__name__}: {exc}); planning CPU-only")
    for message in degraded:
        warnings.warn(message, ProbeWarning, stacklevel=3)  # the caller of perfguide.probe()
    return Hardware(
        gpus=gpus,
        cpu=cpu,
        interconnect=link,
        intra_node_bandwidth_gbps=bandwidth,
        source="probe",
        warnings=tuple(dict.fromkeys([*notes, *degraded])),
    )


def _probe_cpu(degraded: list[str]) -> CPU:
    try:
        return probe_cpu()
    except Exception as exc:  # noqa: BLE001
        degraded.append(f"CPU probe failed ({type(exc).__name__}: {exc}); assuming os.cpu_count() cores and no RAM figure")
        cores = os.cpu_count() or 1
        return CPU(physical_cores=cores, logical_cores=cores, ram_total=0, ram_available=0)


def _probe_gpus(env: Mapping[str, str], notes: list[str], degraded: list[str]) -> tuple[tuple[GPU, ...], Interconnect, float | None]:
    none: tuple[tuple[GPU, ...], Interconnect, float | None] = ((), "none", None)
    raw_visible = env.get("CUDA_VISIBLE_DEVICES")
    visible = parse_visible_devices(raw_visible)
    if visible == []:
        notes.append(f"CUDA_VISIBLE_DEVICES={raw_visible!r} hides every GPU; planning CPU-only")
        return none
    nvml = _nvml()
    if nvml is None:
        degraded.append("cannot probe GPUs: 'import pynvml' failed (pip install nvidia-ml-py); planning CPU-only")
        return none
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        degraded.append(_init_failure(exc))
        return none
    try:
        return _enumerate(nvml, visible, env.get("CUDA_DEVICE_ORDER", "").strip().upper() == "PCI_BUS_ID", notes, degraded)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            log.debug("nvmlShutdown failed", exc_info=True)


def _init_failure(exc: Exception) -> str:
    kind = type(exc).__name__
    if "LibraryNotFound" in kind or "Library Not Found" in str(exc):
        return "no NVIDIA driver found (NVML library libnvidia-ml.so.1 is missing); planning CPU-only"
    if "DriverNotLoaded" in kind:
        return "the NVIDIA driver is not loaded (NVML: Driver Not Loaded); planning CPU-only"
    return f"NVML failed to initialise ({kind}: {exc}); planning CPU-only"


def _enumerate(
    nvml: ModuleType, visible: list[int] | list[str] | None, pci_order: bool, notes: list[str], degraded: list[str]
) -> tuple[tuple[GPU, ...], Interconnect, float | None]:
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:  # noqa: BLE001
        degraded.append(f"NVML could not count GPUs ({type(exc).__name__}: {exc}); planning CPU-only")
        return (), "none", None
    wholes: list[_Device | None] = [_query_gpu_alone(nvml, index, degraded) for index in range(count)]
    slices: list[_Device] = []
    for index, device in enumerate(wholes):
        if device is not None and _mig_enabled(nvml, device.handle):
            found = _query_migs(nvml, device, index, degraded)
            slices.extend(found)
            if not found:  # MIG on but no instances: CUDA cannot use the GPU at all
                wholes[index] = None
    pool = [*wholes, *slices]  # Candidate.ref indexes this list
    chosen, dropped = select(
        [_candidate(d, i, ref=i) for i, d in enumerate(wholes)],
        [_candidate(m, m.mig_of, ref=count + j) for j, m in enumerate(slices)],  # type: ignore[arg-type]
        visible,
        pci_order,
    )
    notes.extend(dropped)
    if isinstance(visible, list) and visible and isinstance(visible[0], int) and not pci_order:
        _warn_if_order_guessed(wholes, degraded)
    picked = [pool[c.ref] for c in chosen]
    usable = [d for d in picked if d is not None]
    if len(usable) < len(picked):
        notes.append(f"{len(picked) - len(usable)} visible GPU(s) could not be read and are left out of the plan")
    if not usable and not dropped:
        degraded.append("NVML reported no usable GPU; planning CPU-only")
    gpus = tuple(_to_gpu(d, ordinal, wholes) for ordinal, d in enumerate(usable))
    notes.extend(n for n in (_busy_note(nvml, d, ordinal) for ordinal, d in enumerate(usable)) if n)
    link = _interconnect(nvml, usable)
    return gpus, link, _link_bandwidth(usable, link)


def _candidate(device: _Device | None, nvml_index: int, ref: int) -> Candidate:
    """What visibility needs to know: UUID, FASTEST_FIRST rank (spec FP32 peak), parent for slices."""
    key = device.key if device is not None else None
    return Candidate(
        nvml_index=nvml_index,
        uuid=device.uuid if device is not None else None,
        rank_key=float(specs.entry(key).fp32_tflops or 0.0) if key else 0.0,
        mig_of=device.mig_of if device is not None else None,
        ref=ref,
    )


def _ask(fn: Callable[..., Any] | None, *args: Any, failures: list[str] | None = None, what: str = "") -> Any:
    """Call one NVML function; on any error record ``what`` in ``failures`` (if given) and return None."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001
        if failures is not None:
            failures.append(f"{what} ({type(exc).__name__})")
        return None


def _text(value: Any) -> str | None:
    """An NVML string as text: undecodable bytes replaced, escapes and controls dropped, at most 200 characters;
    None when nothing printable is left (the caller names the device by its index then)."""
    if value is None:
        return None
    text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
    return clean(text).strip()[:200] or None


def _query_gpu_alone(nvml: ModuleType, index: int, degraded: list[str]) -> _Device | None:
    """One GPU that NVML answers oddly is left out with a warning; it never takes the other GPUs down with it."""
    try:
        return _query_gpu(nvml, index, degraded)
    except Exception as exc:  # noqa: BLE001 - a probe never raises, and one device's oddity stays that device's
        degraded.append(f"GPU {index}: probing it failed unexpectedly ({type(exc).__name__}: {str(exc)[:120]}); left out")
        return None


def _query_gpu(nvml: ModuleType, index: int, degraded: list[str]) -> _Device | None:
    failures: list[str] = []
    handle = _ask(nvml.nvmlDeviceGetHandleByIndex, index, failures=failures, what="handle")
    if handle is None:
        degraded.append(f"GPU {index}: NVML could not open it ({', '.join(failures)}); left out")
        return None
    name = _text(_ask(nvml.nvmlDeviceGetName, handle, failures=failures, what="name")) or f"GPU {index}"
    key = specs.resolve_nvml(name)
    device = _fill(nvml, handle, name, key, None, failures)
    if device is None:
        degraded.append(f"GPU {index} ({name}): NVML failed on {', '.join(failures)} and its size is unknown; left out")
        return None
    if failures:
        degraded.append(f"GPU {index} ({name}): NVML failed on {', '.join(failures)}; using spec-sheet values there")
    if key is None:
        degraded.append(f"GPU {index}: no spec-sheet entry for {name!r}; speed predictions for it are unavailable")
    return device


def _fill(nvml: ModuleType, handle: Any, name: str, key: str | None, parent: _Device | None, failures: list[str]) -> _Device | None:
    """Memory, UUID, compute capability and SM count of one handle, falling back to the spec row."""
    uuid = _text(_ask(nvml.nvmlDeviceGetUUID, handle, failures=failures, what="UUID"))
    memory, reserved = _memory_info(nvml, handle, failures)
    if memory is not None:
        total, free = int(memory.total), int(memory.free)
    elif key is not None and parent is None:
        total, free = specs.memory_bytes(key), specs.usable_bytes(key)  # assume idle: better than dropping a GPU we know
    else:
        return None
    reserved, usable_source = _reserve(total, reserved, key if parent is None else None)
    if parent is not None:
        cc = parent.compute_capability
    else:
        cc = _ask(nvml.nvmlDeviceGetCudaComputeCapability, handle, failures=failures, what="compute capability")
        cc = tuple(cc) if cc else (specs.entry(key).compute_capability if key else (0, 0))
    attributes = _ask(getattr(nvml, "nvmlDeviceGetAttributes", None), handle)  # absent or NotSupported before Ampere
    sms = int(getattr(attributes, "multiprocessorCount", 0) or 0) or None
    if sms is None and key is not None and parent is None:
        sms = specs.entry(key).multiprocessors
    return _Device(name, uuid, total, free, cc, sms, key, handle=handle, reserved=reserved, usable_source=usable_source)


def _memory_info(nvml: ModuleType, handle: Any, failures: list[str]) -> tuple[Any, int | None]:
    """NVML's memory info and the driver's reserve in bytes. The v2 struct (nvmlDeviceGetMemoryInfo_v2, R510+) says
    how much of ``total`` is "reserved for system use (driver or firmware)": memory no CUDA process can allocate.
    A driver or binding without v2 answers v1 (total, free, used), and the reserve is then unknown (None)."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        info = _ask(nvml.nvmlDeviceGetMemoryInfo, handle, version)
        reserved = getattr(info, "reserved", None)
        if info is not None and reserved is not None:
            return info, int(reserved)
    return _ask(nvml.nvmlDeviceGetMemoryInfo, handle, failures=failures, what="memory"), None


def _reserve(total: int, reserved: int | None, key: str | None) -> tuple[int, str | None]:
    """What the driver holds back from CUDA: NVML v2's reserve; without v2, what the card's gpus.json row holds back
    (its nvidia-smi total less its published CUDA total); 0 (unknown) for an unknown card or a MIG slice."""
    if reserved is not None and 0 <= reserved < total:
        return reserved, f"{(total - reserved) / 2**30:.2f} GiB usable of {total / 2**30:.2f} GiB (NVML: {reserved / 2**20:.0f} MiB reserved by the driver)"
    if key is None:
        return 0, None
    held = specs.memory_bytes(key) - specs.usable_bytes(key)
    return held, f"NVML total less the {held / 2**20:.0f} MiB this card's driver holds back (NVML v2 unavailable; {specs.usable_source(key)})"


def _busy_note(nvml: ModuleType, device: _Device, ordinal: int) -> str | None:
    """A GPU other processes already use is planned on what is free (capacity_bytes); say so, naming them."""
    ceiling = device.memory_total - device.reserved  # the driver's reserve is nobody's use
    used = ceiling - min(device.memory_free, ceiling)
    if used < BUSY_BYTES:
        return None
    procs = _ask(getattr(nvml, "nvmlDeviceGetComputeRunningProcesses", None), device.handle) or []
    listed = [f"pid {p.pid}: {p.usedGpuMemory / 2**30:.1f} GiB" for p in procs if getattr(p, "usedGpuMemory", None)]
    who = ", ".join(listed) if listed else "processes NVML does not list (another container, or graphics)"
    free = device.memory_free / 2**30
    tail = (f"planning on the {free:.1f} GiB free" if device.memory_free > 0
            else "no memory is free, so nothing fits until they exit")
    return (f"GPU {ordinal} ({device.name}) is in use: {used / 2**30:.1f} GiB of {device.memory_total / 2**30:.1f} GiB held by "
            f"other processes ({who}); {tail}")


def _mig_enabled(nvml: ModuleType, handle: Any) -> bool:
    mode = _ask(getattr(nvml, "nvmlDeviceGetMigMode", None), handle)  # NotSupported on non-MIG GPUs
    return bool(mode) and mode[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)


def _query_migs(nvml: ModuleType, parent: _Device, parent_index: int, degraded: list[str]) -> list[_Device]:
    """The MIG slices of one MIG-enabled GPU, each with its own memory and SM count."""
    slots = _ask(nvml.nvmlDeviceGetMaxMigDeviceCount, parent.handle) or 0
    found: list[_Device] = []
    for slot in range(int(slots)):
        handle = _ask(nvml.nvmlDeviceGetMigDeviceHandleByIndex, parent.handle, slot)  # NotFound = empty slot
        if handle is None:
            continue
        failures: list[str] = []
        name = _text(_ask(nvml.nvmlDeviceGetName, handle, failures=failures, what="name")) or f"{parent.name} MIG"
        device = _fill(nvml, handle, name, parent.key, parent, failures)
        if device is None or failures:
            degraded.append(f"MIG slice {slot} of {parent.name}: NVML failed on {', '.join(failures)}" + ("; left out" if device is None else ""))
        if device is not None:
            device.mig_of = parent_index
            found.append(device)
    if not found:
        degraded.append(f"{parent.name} is in MIG mode but has no MIG instances; it cannot run CUDA work")
    return found


def _warn_if_order_guessed(wholes: list[_Device | None], degraded: list[str]) -> None:
    models = {d.name for d in wholes if d is not None}
    if len(models) > 1:
        degraded.append(
            "CUDA_VISIBLE_DEVICES uses indices on a mixed-GPU machine without CUDA_DEVICE_ORDER=PCI_BUS_ID; "
            "perfguide guessed CUDA's fastest-first order from FP32 peaks. Set CUDA_DEVICE_ORDER=PCI_BUS_ID or use GPU UUIDs"
        )


def _to_gpu(device: _Device, ordinal: int, wholes: list[_Device | None]) -> GPU:
    numbers: dict[str, Any] = specs.spec_numbers(device.key) if device.key else {}
    if device.mig_of is not None and numbers:
        numbers = _scale_for_slice(numbers, device, wholes[device.mig_of])
    return GPU(
        name=device.name,
        uuid=device.uuid,
        index=ordinal,
        memory_total=device.memory_total,
        memory_free=min(device.memory_free, device.memory_total),
        memory_reserved=device.reserved,
        memory_usable_source=device.usable_source,
        compute_capability=device.compute_capability,
        multiprocessors=device.multiprocessors,
        mig=device.mig_of is not None,
        **({"capabilities": specs.entry(device.key).capabilities} if device.key else {}),  # else: the NVIDIA rule on cc
        **numbers,
    )


#: what a MIG slice gets by its memory share (its memory controllers and the L2 slices beside them), not its SMs
_MEMORY_SIDE = ("memory_bandwidth_gbps", "l2_cache_mib", "l2_bandwidth_gbps")


def _scale_for_slice(numbers: dict[str, Any], device: _Device, parent: _Device | None) -> dict[str, Any]:
    """A MIG slice gets its share of the parent's peaks: compute by SMs, bandwidth and L2 by memory share."""
    mem_share = device.memory_total / parent.memory_total if parent and parent.memory_total else 1.0
    sm_share = device.multiprocessors / parent.multiprocessors if parent and parent.multiprocessors and device.multiprocessors else mem_share
    return {
        field: None if value is None else round(value * (mem_share if field in _MEMORY_SIDE else sm_share), 2)
        for field, value in numbers.items()
    }


def _interconnect(nvml: ModuleType, devices: list[_Device]) -> Interconnect:
    if len(devices) < 2:
        return "none"
    if any(d.mig_of is not None for d in devices):
        return "pcie"  # MIG slices have no NVLink or peer-to-peer path
    return "nvlink" if any(_nvlink_active(nvml, d.handle) for d in devices) else "pcie"


def _nvlink_active(nvml: ModuleType, handle: Any) -> bool:
    """True if any NVLink of this GPU is up. The first error ends the scan (unsupported, or past the last link)."""
    get_state = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if get_state is None:
                return False
            if get_state(handle, link) == 1:  # NVML_FEATURE_ENABLED
                return True
        except Exception:  # noqa: BLE001
            return False
    return False


def _link_bandwidth(devices: list[_Device], link: Interconnect) -> float | None:
    """The slowest GPU's one-direction link bandwidth from the spec table; None if any is unknown."""
    if link == "none" or any(d.key is None for d in devices):
        return None
    values = [specs.link_bandwidth_gbps(d.key, link) for d in devices]  # type: ignore[arg-type]
    return None if any(v is None for v in values) else min(values)  # type: ignore[type-var]
