"""What ``perfguide probe`` shows: the machine as the planner sees it, with what each GPU can do."""

from __future__ import annotations

from ..hardware.types import GPU, Hardware
from .document import Bullets, Document, Fields, Section, Table, render_document
from .units import fmt_bytes, fmt_decimal_gb


def gpu_summary(hw: Hardware) -> str:
    """'8x NVIDIA A100-SXM4-80GB (80.0 GiB, nvlink)': identical GPUs collapse into a count."""
    names = sorted({g.name for g in hw.gpus})
    smallest = hw.smallest_gpu
    if smallest is None:
        return "no GPU"
    link = f", {hw.interconnect}" if hw.gpu_count > 1 and hw.interconnect != "none" else ""
    name = names[0] if len(names) == 1 else f"mixed ({' / '.join(names)}), smallest"
    return f"{hw.gpu_count}x {name} ({fmt_bytes(smallest.memory_total)}{link})"


def describe_hardware(hw: Hardware) -> str:
    """One line for report headers: the name users typed (or 'probed'), GPUs, nodes, and the CPU side."""
    origin = hw.name or ("this machine" if hw.source == "probe" else "named")
    nodes = f" x {hw.nodes} nodes" if hw.nodes > 1 else ""
    cpu = f"{hw.cpu.physical_cores} cores, {fmt_bytes(hw.cpu.ram_total)} RAM"
    return f"{origin}: {gpu_summary(hw)}{nodes}; CPU {cpu}{_assumed(hw)}"


def _assumed(hw: Hardware) -> str:
    """Which part of a bare GPU name's host is assumed: cores and RAM, or only the cores once host_ram= set the RAM."""
    from ..hardware.named import assumed_host

    guess = assumed_host(hw)
    if guess is None:
        return ""
    where = f"a typical {guess.label}, data/hosts.json" if guess.sourced else f"no sourced typical host, a {guess.label}"
    if guess.cpu.ram_total != hw.cpu.ram_total:
        return f" (cores assumed: {where}; RAM from --host-ram)"
    return f" (assumed: {where}; --host-ram sets the RAM)"


def _tflops(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _gpu_row(gpu: GPU) -> tuple[str, ...]:
    cc = ".".join(map(str, gpu.compute_capability)) if gpu.vendor == "nvidia" else gpu.vendor.upper()
    flags = [f for f, on in (("bf16", gpu.supports_bf16), ("tf32", gpu.supports_tf32), ("fp8", gpu.supports_fp8), ("MIG", gpu.mig)) if on]
    bandwidth = "-" if gpu.memory_bandwidth_gbps is None else f"{gpu.memory_bandwidth_gbps:g}"
    return (
        str(gpu.index), gpu.name, cc, f"{fmt_bytes(gpu.memory_total)} ({fmt_decimal_gb(gpu.memory_total)})",
        fmt_bytes(gpu.memory_free), _tflops(gpu.bf16_tflops), bandwidth, " ".join(flags) or "-",
    )


def _gpu_table(hw: Hardware) -> Table:
    headers = ("#", "name", "cc", "memory", "free", "bf16 TFLOP/s", "GB/s", "native")
    return Table(headers=headers, rows=tuple(_gpu_row(g) for g in hw.gpus))


def _machine_fields(hw: Hardware) -> Fields:
    cpu = hw.cpu
    rows = [
        ("source", hw.source + (f" ({hw.name})" if hw.name else "")),
        ("GPUs", gpu_summary(hw)),
        ("nodes", str(hw.nodes)),
        ("interconnect", hw.interconnect),
    ]
    if hw.intra_node_bandwidth_gbps is not None:
        rows.append(("GPU-to-GPU bandwidth", f"{hw.intra_node_bandwidth_gbps:g} GB/s per GPU"))
    if hw.inter_node_bandwidth_gbps is not None:
        rows.append(("network bandwidth", f"{hw.inter_node_bandwidth_gbps:g} GB/s per node"))
    rows += [
        ("CPU", f"{cpu.model_name} ({cpu.physical_cores} physical / {cpu.logical_cores} logical cores, {cpu.sockets} socket(s))"),
        ("RAM", f"{fmt_bytes(cpu.ram_total)} total, {fmt_bytes(cpu.ram_available)} available"),
        ("native CPU bf16", "yes" if cpu.native_bf16 else "no (bf16 autocast would be emulated)"),
    ]
    return Fields(rows=tuple(rows))


def hardware_document(hw: Hardware) -> Document:
    sections = [Section("Machine", (_machine_fields(hw),))]
    if hw.gpus:
        sections.append(Section("GPUs", (_gpu_table(hw),)))
    if hw.warnings:
        sections.append(Section("Warnings", (Bullets(tuple((0, w) for w in hw.warnings)),)))
    return Document(title="perfguide probe", sections=tuple(sections))


def render_hardware(hw: Hardware, fmt: str = "text") -> str:
    return render_document(hardware_document(hw), fmt)
