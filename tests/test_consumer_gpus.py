"""The GeForce and RTX workstation cards added for users who plan on them: each rate re-derived by hand from the
part's published configuration, not read back from gpus.json's own arithmetic.

GeForce Turing, Ampere, Ada and Blackwell tensor cores run 512 dense FP16/BF16 FLOP per clock per SM with FP32
accumulate: the Turing whitepaper's RTX 2080 Ti column (53.8 TFLOPS = 68 SMs x 1.545 GHz x 512), the GA102
whitepaper's RTX 3090 column (71 / (82 x 1.695)), the Ada whitepaper's RTX 4090 column (165.2 / (128 x 2.52)) and the
Blackwell RTX whitepaper's RTX 5090 (209.5 / (170 x 2.407)). Workstation Ampere (RTX A4000 / A5000 / A6000) runs FP32
accumulate at the full 1,024 (A6000: 154.8 / (84 x 1.8); the A4000 datasheet's 153.4 sparse = 48 x 1.56 x 1024 x 2).
FP32 is 128 lanes x 2 FLOP per clock per SM from Ampere on, 64 on Turing.
"""

from __future__ import annotations

import pytest

import perfguide
from perfguide import Hardware
from perfguide.hardware.specs import usable_bytes

#: name: (SMs, boost GHz, bus bits, Gbps per pin, published CUDA total GiB or None, has fp8, tensor FLOP/clk/SM,
#: FP32 lanes per SM, bf16 tensor cores, sold as a gaming card)
PARTS = {"rtx3060": (28, 1.777, 192, 15.0, 11.75, False, 512, 128, True, True),
         "rtx3080": (68, 1.71, 320, 19.0, 9.78, False, 512, 128, True, True),
         "rtx4080": (76, 2.505, 256, 22.4, None, True, 512, 128, True, True),
         "rtx4060ti": (34, 2.535, 128, 18.0, None, True, 512, 128, True, True),
         "rtx4070": (46, 2.475, 192, 21.0, None, True, 512, 128, True, True),
         "rtx4070super": (56, 2.475, 192, 21.0, None, True, 512, 128, True, True),
         "rtx4070ti": (60, 2.61, 192, 21.0, 11.70, True, 512, 128, True, True),      # Kwai-Kolors/Kolors#11
         "rtx3070": (46, 1.725, 256, 14.0, 7.76, False, 512, 128, True, True),       # sshan-zhao/GASDA#19
         "rtx3080ti": (80, 1.665, 384, 19.0, None, False, 512, 128, True, True),
         "rtx2080ti": (68, 1.545, 352, 14.0, 10.76, False, 512, 64, False, True),    # JDAI-CV/image-captioning#11
         "rtx-a4000": (48, 1.56, 256, 14.0, 15.61, False, 1024, 128, True, False),   # DengKaiCQ/VGGT-Long#6
         "rtx-a5000": (64, 1.695, 384, 16.0, None, False, 1024, 128, True, False),
         "rtx5080": (84, 2.617, 256, 30.0, None, True, 512, 128, True, True),
         "rtx5070ti": (70, 2.452, 256, 28.0, None, True, 512, 128, True, True),
         "rtx5060ti": (36, 2.572, 128, 28.0, None, True, 512, 128, True, True)}


@pytest.mark.parametrize("name", sorted(PARTS))
def test_rates_follow_the_parts_configuration(name: str) -> None:
    sms, ghz, bus, gbps, cuda_total, fp8, per_sm, lanes, bf16, _ = PARTS[name]
    gpu = Hardware.from_name(name).gpus[0]
    assert gpu.multiprocessors == sms
    assert gpu.fp32_tflops == pytest.approx(sms * lanes * 2 * ghz / 1000, abs=0.06)
    assert gpu.fp16_tflops == pytest.approx(sms * per_sm * ghz / 1000, abs=0.06)
    assert gpu.supports_bf16 == bf16 and (gpu.bf16_tflops == gpu.fp16_tflops if bf16 else gpu.bf16_tflops is None)
    if bf16:
        assert gpu.tf32_tflops == pytest.approx(gpu.fp16_tflops / 2, abs=0.06)
    assert gpu.memory_bandwidth_gbps == pytest.approx(bus * gbps / 8, abs=0.5)
    assert gpu.supports_fp8 == fp8
    if cuda_total is not None:
        assert usable_bytes(name) == round(cuda_total * 2**30)   # what plans judge 'fits' against


def test_published_whitepaper_and_datasheet_rates() -> None:
    """The few tensor rates NVIDIA prints for these parts, as printed: RTX 2080 Ti 53.8 (Turing whitepaper, FP16 with
    FP32 accumulate), RTX A4000 153.4 sparse (datasheet) = 76.7 dense."""
    assert Hardware.from_name("rtx2080ti").gpus[0].fp16_tflops == pytest.approx(53.8, abs=0.05)
    assert Hardware.from_name("a4000").gpus[0].bf16_tflops == pytest.approx(153.4 / 2, abs=0.05)


def test_names_users_type_resolve_and_plan() -> None:
    for alias, name in (("3060", "rtx3060"), ("geforce-rtx-3080", "rtx3080"), ("4080", "rtx4080")):
        assert Hardware.from_name(alias).gpus[0].name == name
    # Qwen3-8B: 8.2B parameters are 16.4 GB in bf16 alone, more than a 12 GB card; its nf4 weights (~5.5 GB) fit
    assert not perfguide.recommend("Qwen/Qwen3-8B", "infer_gpu_one", hardware="rtx3060", quantization="none",
                                   allow_offload=False).fits
    assert perfguide.recommend("Qwen/Qwen3-8B", "train_gpu_one", hardware="rtx3060", finetune="qlora").fits


def test_consumer_cards_are_planned_on_the_consumer_desktop_host() -> None:
    """A bare gaming card is planned on the desktop hosts.json names for gaming cards (64 GiB, 16 cores), not on the
    generic 256 GiB server a card no host row covers gets (the RTX workstation cards, as the A6000)."""
    for name, part in PARTS.items():
        cpu = Hardware.from_name(name).cpu
        desktop = cpu.ram_total == 64 * 2**30 and cpu.physical_cores == 16
        assert desktop == part[-1], name


def test_a_turing_card_trains_in_fp16_without_flash_attention() -> None:
    """The RTX 2080 Ti (cc 7.5) has no bf16 tensor cores and flash-attn 2 does not build for it: a plan there uses fp16
    autocast and SDPA, as on the T4."""
    rec = perfguide.recommend("Qwen/Qwen2.5-0.5B", "train_gpu_one", hardware="2080ti")
    assert rec.fits and rec.setup.autocast == "fp16" and rec.setup.attn_implementation != "flash_attention_2"
