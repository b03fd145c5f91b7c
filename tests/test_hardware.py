"""Named hardware: spec-sheet numbers, aliases, counts, and the errors users see.

Expected numbers are typed in from the vendors' datasheets (dense, no sparsity) and from the
memory totals nvidia-smi prints on each board, not read back from perfguide/data/gpus.json.
"""

from __future__ import annotations

import pytest

import perfguide
from perfguide.errors import PerfGuideError, UnknownHardwareError
from perfguide.hardware.cpu import flops_per_cycle, parse_cpuinfo, peak_gflops
from perfguide.hardware.named import hardware_from_name, known_names
from perfguide.hardware.specs import resolve_nvml

MIB = 2**20

# name: (nvidia-smi MiB, compute capability, SMs, bf16, fp16, tf32, fp32, fp8 TFLOP/s, GB/s)
DATASHEET = {
    "a100-80gb": (81920, (8, 0), 108, 312, 312, 156, 19.5, None, 2039),
    "a100-40gb": (40960, (8, 0), 108, 312, 312, 156, 19.5, None, 1555),
    "h100-80gb": (81559, (9, 0), 132, 989.5, 989.5, 494.5, 67, 1979, 3350),
    "h100-pcie": (81559, (9, 0), 114, 756.5, 756.5, 378, 51, 1513, 2000),
    "h200": (143771, (9, 0), 132, 989.5, 989.5, 494.5, 67, 1979, 4800),
    "l4": (23034, (8, 9), 58, 121, 121, 60, 30.3, 242.5, 300),
    "t4": (15360, (7, 5), 40, None, 65, None, 8.1, None, 320),
    "v100-16gb": (16160, (7, 0), 80, None, 125, None, 15.7, None, 900),
    "v100-32gb": (32510, (7, 0), 80, None, 125, None, 15.7, None, 900),
    "a10g": (23028, (8, 6), 72, 70, 70, 35, 31.52, None, 600),
    "a10": (23028, (8, 6), 72, 125, 125, 62.5, 31.2, None, 600),
    "rtx4090": (24564, (8, 9), 128, 165.2, 165.2, 82.6, 82.6, 330.3, 1008),
    "rtx3090": (24576, (8, 6), 82, 71, 71, 35.6, 35.6, None, 936),
    # 84 SMs x 1.86 GHz: 512 tensor FLOP/clk/SM (bf16/fp16, fp32 accumulate) = 80.0, 256 FP32 FLOP/clk/SM = 40.0;
    # 21 Gbps x 384 bits / 8 = 1,008 GB/s
    "rtx3090ti": (24576, (8, 6), 84, 80.0, 80.0, 40.0, 40.0, None, 1008),
    "l40s": (46068, (8, 9), 142, 362.05, 362.05, 183, 91.6, 733, 864),
    "a6000": (49140, (8, 6), 84, 154.8, 154.8, 77.4, 38.7, None, 768),
}


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_named_gpu_matches_datasheet(name: str) -> None:
    mib, cc, sms, bf16, fp16, tf32, fp32, fp8, bandwidth = DATASHEET[name]
    hw = perfguide.Hardware.from_name(name)
    (gpu,) = hw.gpus
    assert (hw.source, hw.name, hw.nodes, hw.interconnect) == ("named", name, 1, "none")
    assert gpu.memory_total == mib * MIB
    # idle, a named card offers what CUDA can allocate: its published torch total (tests/test_usable_capacity.py)
    assert gpu.memory_free == gpu.allocatable == round(perfguide.hardware.specs.entry(name).cuda_total_gib * 2**30) < mib * MIB
    assert gpu.compute_capability == cc and gpu.multiprocessors == sms
    assert (gpu.bf16_tflops, gpu.fp16_tflops, gpu.tf32_tflops, gpu.fp32_tflops, gpu.fp8_tflops) == (bf16, fp16, tf32, fp32, fp8)
    assert gpu.memory_bandwidth_gbps == bandwidth
    assert gpu.half_tflops("bf16") == bf16 and gpu.half_tflops("fp8") == fp8


def test_a100_80gb_is_85899345920_bytes() -> None:
    # nvidia-smi prints 81920MiB on an A100-SXM4-80GB: 81920 * 1024 * 1024
    assert hardware_from_name("a100-80gb").gpus[0].memory_total == 85_899_345_920


@pytest.mark.parametrize(("name", "bf16"), [("a100-80gb", True), ("h100", True), ("l4", True), ("rtx3090", True),
                                            ("t4", False), ("v100-16gb", False), ("v100-32gb", False)])
def test_supports_bf16(name: str, bf16: bool) -> None:
    assert hardware_from_name(name).gpus[0].supports_bf16 is bf16


@pytest.mark.parametrize(("name", "fp8"), [("h100", True), ("l4", True), ("rtx4090", True), ("a100-80gb", False),
                                           ("a100-40gb", False), ("t4", False), ("v100-16gb", False), ("rtx3090", False),
                                           ("a10g", False), ("a6000", False)])
def test_supports_fp8_only_from_ada_and_hopper(name: str, fp8: bool) -> None:
    gpu = hardware_from_name(name).gpus[0]
    assert gpu.supports_fp8 is fp8
    assert (gpu.fp8_tflops is not None) is fp8


def test_count_gives_that_many_gpus_with_the_box_link() -> None:
    hw = hardware_from_name("a100-80gb:8")
    assert hw.gpu_count == 8 == hw.world_size and [g.index for g in hw.gpus] == list(range(8))
    assert hw.name == "a100-80gb:8" and hw.interconnect == "nvlink"
    # A100 SXM datasheet: NVLink 600 GB/s per GPU both ways -> 300 one way
    assert hw.intra_node_bandwidth_gbps == 300
    assert hw.inter_node_bandwidth_gbps is None
    assert hw.smallest_gpu is not None and hw.smallest_gpu.memory_total == 81920 * MIB


def test_pcie_box_and_multi_node() -> None:
    l4 = hardware_from_name("l4:4")
    assert l4.interconnect == "pcie" and l4.intra_node_bandwidth_gbps == 32  # PCIe Gen4 x16: 64 GB/s both ways
    h100 = hardware_from_name("h100:8x4")
    assert (h100.gpu_count, h100.nodes, h100.world_size) == (8, 4, 32)
    assert h100.intra_node_bandwidth_gbps == 450  # 900 GB/s NVLink 4 both ways
    assert h100.inter_node_bandwidth_gbps == 50  # 400 Gb/s InfiniBand NDR = 50 GB/s


@pytest.mark.parametrize(("spelling", "key"), [
    ("A100_80GB", "a100-80gb"), ("a100-80g", "a100-80gb"), ("A100 80GB", "a100-80gb"), ("a100-sxm4-80gb", "a100-80gb"),
    ("a100", "a100-40gb"), ("h100", "h100-80gb"), ("H100-SXM", "h100-80gb"), ("v100", "v100-16gb"),
    ("RTX 4090", "rtx4090"), ("rtx-3090", "rtx3090"), ("rtx-a6000", "a6000"), ("A10G", "a10g"), ("T4", "t4"),
])
def test_aliases_and_spellings(spelling: str, key: str) -> None:
    assert hardware_from_name(spelling).name == key
    assert hardware_from_name(f"{spelling}:2").name == f"{key}:2"


def test_cpu_target() -> None:
    hw = hardware_from_name("CPU")
    assert hw.gpus == () and not hw.has_gpu and hw.world_size == 1 and hw.source == "named"
    assert hw.cpu.physical_cores == 32 and hw.cpu.ram_total == 256 * 2**30 == hw.cpu.ram_available
    assert not hw.cpu.native_bf16
    # 32 cores x 2.5 GHz x 32 fp32 FLOPs/cycle (AVX2: 2 FMA pipes x 8 lanes x 2)
    assert hw.cpu.fp32_gflops == 2560


def test_known_names_cover_the_required_targets() -> None:
    assert set(DATASHEET) | {"cpu"} <= set(known_names())


@pytest.mark.parametrize(("bad", "fragment"), [
    ("a100:0", "must be >= 1"), ("a100-80gb:-1", "must be >= 1"), ("a100:x", "not a whole number"),
    ("", "empty hardware name"), ("   ", "empty hardware name"), (":8", "no GPU name"), ("a100:8x0", "node count"),
    ("cpu:2", "takes no count"), ("a100:64", "8x8"),
])
def test_malformed_names_raise_one_line(bad: str, fragment: str) -> None:
    with pytest.raises(UnknownHardwareError) as info:
        hardware_from_name(bad)
    message = str(info.value)
    assert fragment in message and "\n" not in message


def test_unknown_name_suggests_close_matches() -> None:
    with pytest.raises(PerfGuideError) as info:
        perfguide.Hardware.from_name("a100-8gb:2")
    message = str(info.value)
    assert "unknown hardware 'a100-8gb'" in message and "Did you mean" in message and "a100-80gb" in message
    assert "h200" in message.split("Accepted:")[1]


@pytest.mark.parametrize(("nvml_name", "key"), [
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
    ("NVIDIA H100 80GB HBM3", "h100-80gb"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"),
    ("Tesla T4", "t4"), ("Tesla V100-SXM2-16GB", "v100-16gb"), ("Tesla V100-SXM2-32GB", "v100-32gb"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA GeForce RTX 3090", "rtx3090"), ("NVIDIA L4", "l4"),
    ("NVIDIA A10G", "a10g"), ("NVIDIA A10", "a10"), ("NVIDIA L40S", "l40s"), ("NVIDIA RTX A6000", "a6000"),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "a100-40gb"), ("NVIDIA B9000 Imaginary", None),
])
def test_nvml_names_map_to_spec_rows(nvml_name: str, key: str | None) -> None:
    assert resolve_nvml(nvml_name) == key


def test_cpu_peak_formula() -> None:
    # Sapphire Rapids-like: AVX-512 (64 fp32 FLOPs/cycle) and AMX (1024 bf16 FLOPs/cycle)
    assert flops_per_cycle(frozenset({"avx512f", "amx_bf16", "avx2", "fma"}), "GenuineIntel") == (64, 1024)
    # Zen 4 runs AVX-512 on 256-bit pipes; AVX512-BF16 doubles the fp32 rate
    assert flops_per_cycle(frozenset({"avx512f", "avx512_bf16"}), "AuthenticAMD") == (32, 64)
    assert flops_per_cycle(frozenset({"avx"})) == (16, 16)
    assert peak_gflops(4, 3000.0, frozenset({"avx2", "fma"})) == (4 * 3.0 * 32, 4 * 3.0 * 32)


def test_parse_cpuinfo_sockets_flags_clock() -> None:
    text = "\n".join(
        f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon X\nphysical id\t: {i // 2}\n"
        f"cpu MHz\t\t: {2000 + i}.5\nflags\t\t: fpu avx avx2 fma avx512f amx_tile amx_bf16 sse4_2\n"
        for i in range(4)
    )
    info = parse_cpuinfo(text)
    assert info["sockets"] == 2 and info["model_name"] == "Xeon X" and info["vendor"] == "GenuineIntel"
    assert info["mhz"] == 2003.5
    assert info["flags"] == frozenset({"avx", "avx2", "fma", "avx512f", "amx_tile", "amx_bf16", "sse4_2"})
