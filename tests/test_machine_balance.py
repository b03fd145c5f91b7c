"""The tensor-core GEMM width scales with the GPU's machine balance (achievable matmul FLOP/s per HBM byte/s).

Expected values are hand divisions of published figures, not perfguide's output:
- measured bf16 matmul rates (MAMF): A100 SXM 267.9, H100 SXM 792.1 TFLOP/s, the 'Stats' table of
  https://github.com/mag-/gpu_benchmark (README, mamf-finder method of stas00/ml-engineering
  compute/accelerator/benchmarks/mamf-finder.py);
- datasheet: A100 SXM 80GB bf16 dense 312 TFLOP/s, HBM2e 2,039 GB/s (NVIDIA A100 datasheet); H100 SXM bf16 dense
  989.5 TFLOP/s (1,979 with sparsity / 2), HBM3 3,350 GB/s (NVIDIA H100 datasheet).
"""

from __future__ import annotations

import pytest

from perfguide.hardware.types import GPU, Hardware
from perfguide.setup import Setup
from perfguide.speed import rates

BF16 = Setup(autocast="bf16")


def _gpu(name: str) -> GPU:
    gpu = Hardware.from_name(name).smallest_gpu
    assert gpu is not None
    return gpu


def test_h100_matmul_fraction_is_the_measured_one() -> None:
    # 792.1 / 989.5 = 0.8005: the H100's achievable tensor-core fraction is its own MAMF, not the A100's
    assert rates.asymptote(_gpu("h100-80gb"), BF16) == pytest.approx(792.1 / 989.5, rel=1e-3)
    assert rates.asymptote(_gpu("a100-80gb"), BF16) == pytest.approx(267.9 / 312, rel=1e-3)


def test_h100_needs_wider_gemms_than_a100_by_its_balance() -> None:
    # (792.1 / 3350) / (267.9 / 2039) = 0.23645 / 0.13139 = 1.7996
    assert rates.machine_balance(_gpu("h100-80gb"), BF16) == pytest.approx(1.7996, rel=1e-3)
    base = rates.half_saturation(BF16)
    assert rates.half_saturation(BF16, _gpu("h100-80gb")) == pytest.approx(base * 1.7996, rel=1e-3)


def test_reference_gpu_and_fp32_keep_the_fitted_width() -> None:
    assert rates.half_saturation(BF16, _gpu("a100-80gb")) == pytest.approx(rates.half_saturation(BF16))
    fp32 = Setup()
    assert fp32.compute_dtype == "fp32"
    assert rates.half_saturation(fp32, _gpu("h100-80gb")) == rates.half_saturation(fp32)
