"""The master-weights reasons agree with the fp32-master plan they price."""

from __future__ import annotations

import perfguide
from perfguide.setup import Setup


def test_no_fp32_fits_claim_when_the_fp32_counterpart_fits() -> None:
    # Qwen3-30B-A3B full fine-tune on one MI300X (192 GB): pure bf16 is chosen, and the same plan with fp32 masters
    # (paged 8-bit AdamW stepped in backward, checkpointing, offloaded activations) is priced as fitting the GPU; so no
    # reason may say that no fp32-master setup fits
    rec = perfguide.recommend("Qwen/Qwen3-30B-A3B", scenario="train_gpu_one", hardware="mi300x")
    assert rec.setup.weights_dtype == "bf16" and rec.setup.lora is None
    fp32 = Setup.parse(rec.setup.model_dump()).replace(weights_dtype="fp32")
    mem = perfguide.estimate("Qwen/Qwen3-30B-A3B", fp32, hardware="mi300x")
    usable = 0.9 * mem.capacity
    assert mem.device_total <= usable                       # the fp32 counterpart does fit the GPU
    for setting in ("weights_dtype", "master_weights"):
        reason = rec.decision(setting).reason
        assert "no fp32-master setup fits" not in reason, (setting, reason)


def test_an_offloading_plan_states_the_trade_in_host_and_gpu_bytes() -> None:
    """Mixtral-8x7B on 8x A100 offloads its states to host RAM, where the GPU-side fields read ~0; the trade is fp32
    masters, fp32 gradients and two fp32 AdamW states (16 B per parameter) against pure bf16 AdamW (8 B):
    by hand, 16 x 46.7e9 vs 8 x 46.7e9 bytes, not '0.0 GiB less'."""
    import re

    rec = perfguide.recommend("mistralai/Mixtral-8x7B-v0.1", "train_gpu_many", hardware="a100-80gb:8")
    assert rec.setup.offload_params or rec.setup.offload_optimizer
    reason = rec.decision("master_weights").reason
    here, other = (float(x) for x in re.search(r"\(([\d.]+) GiB here vs ([\d.]+) GiB with", reason).groups())
    params = perfguide.ModelSpec.from_any("mistralai/Mixtral-8x7B-v0.1").total_params
    assert abs(here * 2**30 - 16 * params) / (16 * params) < 0.05
    assert abs(other * 2**30 - 8 * params) / (8 * params) < 0.05
