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
