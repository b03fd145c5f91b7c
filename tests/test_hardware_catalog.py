"""Named GPUs and node types as their datasheets print them, the host_ram override, and an AMD target as plain data.

Expected numbers are read off the vendors' sheets here (and halved where the sheet prints the 2:4-sparse rate), not
from perfguide's table; nvidia-smi totals are the ones public logs of each board show.
"""

from __future__ import annotations

import pytest

import perfguide
from perfguide import Hardware
from perfguide.errors import UnknownHardwareError

MIB, GIB = 2**20, 2**30


@pytest.mark.parametrize(("name", "smi_mib", "bf16", "fp8", "gbps", "cc"), [
    ("b200", 183359, 36_000 / 8 / 2, 72_000 / 8 / 2, 64_000 / 8, (10, 0)),    # HGX B200: 8-GPU sparse PF, 64 TB/s
    ("b300", 275040, 36_000 / 8 / 2, 72_000 / 8 / 2, 8000, (10, 3)),         # HGX B300: the same PF; 288 GB, 8 TB/s per GPU
    ("gb200", 189471, 360_000 / 72 / 2, 720_000 / 72 / 2, 576_000 / 72, (10, 0)),  # GB200 NVL72 rack figures
    ("h20", 97871, 148, 296, 4000, (9, 0)),
    ("h100-nvl", 95830, 1671 / 2, 3341 / 2, 3900, (9, 0)),
    ("rtx5090", 32607, 209.5, 419, 1792, (12, 0)),
    ("rtx-pro-6000", 97887, 4000 / 8, 4000 / 4, 1792, (12, 0)),               # 4,000 AI TOPS = sparse FP4
    ("l40", 46068, 362.1 / 2, 724 / 2, 864, (8, 9)),
    ("a40", 46068, 299.4 / 2, None, 696, (8, 6)),
    ("rtx4070tisuper", 16376, 706 / 8, 706 / 4, 256 * 21 / 8, (8, 9)),        # 706 AI TOPS = sparse FP8, FP16 acc.
])
def test_new_nvidia_cards_match_their_sheets(name: str, smi_mib: int, bf16: float, fp8: float | None, gbps: float,
                                             cc: tuple[int, int]) -> None:
    gpu = Hardware.from_name(name).gpus[0]
    assert gpu.memory_total == smi_mib * MIB and gpu.compute_capability == cc
    assert gpu.bf16_tflops == pytest.approx(bf16, rel=0.01) and gpu.memory_bandwidth_gbps == pytest.approx(gbps, rel=0.01)
    assert (gpu.fp8_tflops is None) == (fp8 is None) and (fp8 is None or gpu.fp8_tflops == pytest.approx(fp8, rel=0.01))
    assert gpu.supports_fp8 == (cc >= (8, 9)) and gpu.vendor == "nvidia"


@pytest.mark.parametrize(("name", "gib", "tbps"), [("mi300x", 205_822_885_888 / GIB, 5.3), ("mi325x", 255.6, 6.0)])
def test_amd_instinct_is_data_with_its_own_link(name: str, gib: float, tbps: float) -> None:
    hw = Hardware.from_name(f"{name}:8")
    gpu = hw.gpus[0]
    # AMD data sheet: 1,307.4 dense BF16 TFLOP/s, 2,614.9 FP8, 896 GB/s Infinity Fabric aggregate per GPU
    assert (gpu.vendor, gpu.bf16_tflops, gpu.fp8_tflops) == ("amd", 1307.4, 2614.9)
    assert gpu.memory_total / GIB == pytest.approx(gib, rel=0.002)  # MI325X: 256 GB HBM3E, MI300X: 192 GB HBM3
    assert gpu.memory_bandwidth_gbps == tbps * 1000  # data sheets: 6 TB/s (MI325X), 5.3 TB/s (MI300X) peak
    assert hw.interconnect == "infinity_fabric" and hw.fast_link and hw.intra_node_bandwidth_gbps == 896 / 2
    assert gpu.supports_bf16 and not gpu.supports_tf32 and gpu.generation == "AMD"


def test_an_amd_plan_trains_bf16_without_tf32() -> None:
    rec = perfguide.recommend("gpt2", "train_gpu_one", hardware="mi300x", seq_len=512, global_batch_size=8, fp8=False)
    assert rec.setup.autocast == "bf16" and rec.setup.tf32 is False
    assert "tf32" not in rec.training_args_dict() or rec.training_args_dict()["tf32"] is not True


@pytest.mark.parametrize(("name", "gpu", "count", "cores", "ram_gib"), [
    ("dgx-a100", "a100-80gb", 8, 128, 2048),        # DGX A100 datasheet: 2x EPYC 7742, 2 TB
    ("DGX-H100", "h100-80gb", 8, 112, 2048),        # DGX H100: 2x Xeon 8480C, 2 TB
    ("p4d.24xlarge", "a100-40gb", 8, 48, 1152),     # AWS: 96 vCPUs, 1,152 GiB
    ("p5.48xlarge", "h100-80gb", 8, 96, 2048),      # AWS: 192 vCPUs, 2 TiB
    ("nd96isr-h100-v5", "h100-80gb", 8, 48, 1900),  # Azure: 96 vCPUs, 1,900 GiB
    ("nd96isr-mi300x-v5", "mi300x", 8, 48, 1850),
])
def test_node_types_carry_their_real_host(name: str, gpu: str, count: int, cores: int, ram_gib: int) -> None:
    hw = Hardware.from_name(name)
    assert (hw.gpus[0].name, hw.gpu_count, hw.cpu.physical_cores, hw.cpu.ram_total) == (gpu, count, cores, ram_gib * GIB)


def test_node_counts_and_nodes() -> None:
    two = Hardware.from_name("p5.48xlarge:8x2")
    assert (two.gpu_count, two.nodes, two.inter_node_bandwidth_gbps) == (8, 2, 400)  # 3,200 Gbps EFA
    assert Hardware.from_name("dgx-h100:4").gpu_count == 4
    with pytest.raises(UnknownHardwareError, match="has 8 GPUs"):
        Hardware.from_name("dgx-h100:16")


def test_offload_that_a_generic_host_refuses_fits_a_real_node() -> None:
    """Llama-3.1-70B full fine-tuning with ZeRO-3 offload needs ~1.1 TB of host RAM (16 B/param of fp32 Adam)."""
    # fp32 masters: pure bf16 + 8-bit AdamW under ZeRO-3 fits these GPUs without any offload (6 B/param)
    kw = {"seq_len": 1024, "global_batch_size": 8, "num_gpus": 8, "master_weights": "fp32"}
    generic = perfguide.recommend("meta-llama/Llama-3.1-70B", "train_gpu_many", hardware="h100-80gb:8", host_ram="256GiB", **kw)
    node = perfguide.recommend("meta-llama/Llama-3.1-70B", "train_gpu_many", hardware="dgx-h100", **kw)
    assert generic.hardware.cpu.ram_total == 256 * GIB and node.hardware.cpu.ram_total == 2048 * GIB
    # hand reference: 70.6e9 params x (4 B fp32 master + 8 B Adam) alone is 0.85 TB of host RAM
    assert node.memory.cpu_ram > 70.6e9 * 12 > generic.hardware.cpu.ram_total
    assert node.fits and not generic.fits


@pytest.mark.parametrize(("value", "gib"), [(512, 512), ("768GiB", 768), ("2TiB", 2048), ("1.5TB", 1.5e12 / GIB)])
def test_host_ram_override(value: object, gib: float) -> None:
    hw = Hardware.from_name("a100-80gb:8", host_ram=value)  # type: ignore[arg-type]
    assert hw.cpu.ram_total == hw.cpu.ram_available == pytest.approx(gib * GIB, rel=1e-9)
    rec = perfguide.recommend("gpt2", "train_gpu_one", hardware="a100-80gb", host_ram=value, seq_len=256, global_batch_size=8)
    assert rec.hardware.cpu.ram_total == pytest.approx(gib * GIB, rel=1e-9)


@pytest.mark.parametrize("bad", ["lots", "-4GB", 0, True])
def test_bad_host_ram_is_one_line(bad: object) -> None:
    with pytest.raises(UnknownHardwareError) as exc:
        Hardware.from_name("a100-80gb", host_ram=bad)  # type: ignore[arg-type]
    assert "\n" not in str(exc.value) and "host_ram" in str(exc.value)


def test_cli_host_ram(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from perfguide.cli import main

    assert main(["recommend", "gpt2", "--hardware", "dgx-a100", "--host-ram", "4TiB", "--json", "--seq-len", "256"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["request"]["hardware"]["cpu"]["ram_total"] == 4 * 1024 * GIB
