"""The GeForce cards added for users who plan on them (rtx3060, rtx3080, rtx4080): each rate re-derived by hand from
the part's published configuration, not read back from gpus.json's own arithmetic.

GeForce Ampere and Ada tensor cores run 512 dense FP16/BF16 FLOP per clock per SM with FP32 accumulate: the GA102
whitepaper's RTX 3090 column (71 TFLOPS / (82 SMs x 1.695 GHz)) and the Ada whitepaper's RTX 4090 column (165.2 /
(128 x 2.52)). FP32 is 128 lanes x 2 FLOP per clock per SM on both.
"""

from __future__ import annotations

import pytest

import perfguide
from perfguide import Hardware
from perfguide.hardware.specs import usable_bytes

#: name: (SMs, boost GHz, bus bits, Gbps per pin, published CUDA total GiB or None, has fp8)
PARTS = {"rtx3060": (28, 1.777, 192, 15.0, 11.75, False), "rtx3080": (68, 1.71, 320, 19.0, 9.78, False),
         "rtx4080": (76, 2.505, 256, 22.4, None, True)}


@pytest.mark.parametrize("name", sorted(PARTS))
def test_rates_follow_the_parts_configuration(name: str) -> None:
    sms, ghz, bus, gbps, cuda_total, fp8 = PARTS[name]
    gpu = Hardware.from_name(name).gpus[0]
    assert gpu.multiprocessors == sms
    assert gpu.fp32_tflops == pytest.approx(sms * 128 * 2 * ghz / 1000, abs=0.06)
    assert gpu.bf16_tflops == pytest.approx(sms * 512 * ghz / 1000, abs=0.06) == gpu.fp16_tflops
    assert gpu.tf32_tflops == pytest.approx(gpu.bf16_tflops / 2, abs=0.06)
    assert gpu.memory_bandwidth_gbps == pytest.approx(bus * gbps / 8, abs=0.5)
    assert gpu.supports_fp8 == fp8 and gpu.supports_bf16
    if cuda_total is not None:
        assert usable_bytes(name) == round(cuda_total * 2**30)   # what plans judge 'fits' against


def test_names_users_type_resolve_and_plan() -> None:
    for alias, name in (("3060", "rtx3060"), ("geforce-rtx-3080", "rtx3080"), ("4080", "rtx4080")):
        assert Hardware.from_name(alias).gpus[0].name == name
    # Qwen3-8B: 8.2B parameters are 16.4 GB in bf16 alone, more than a 12 GB card; its nf4 weights (~5.5 GB) fit
    assert not perfguide.recommend("Qwen/Qwen3-8B", "infer_gpu_one", hardware="rtx3060", quantization="none",
                                   allow_offload=False).fits
    assert perfguide.recommend("Qwen/Qwen3-8B", "train_gpu_one", hardware="rtx3060", finetune="qlora").fits


def test_consumer_cards_are_planned_on_the_consumer_desktop_host() -> None:
    """A bare consumer card is planned on the desktop hosts.json names for gaming cards (64 GiB, 16 cores), not on the
    generic 256 GiB server a card no host row covers gets."""
    for name in PARTS:
        cpu = Hardware.from_name(name).cpu
        assert cpu.ram_total == 64 * 2**30 and cpu.physical_cores == 16, name
