"""The master-weights reasons agree with the fp32-master plan they price."""

from __future__ import annotations

import pytest

import perfguide
from perfguide.setup import Setup


@pytest.mark.parametrize(("model", "hw", "kw"), [
    ("Qwen/Qwen3-30B-A3B", "mi300x", {}),
    ("meta-llama/Llama-3.1-8B", "a100-80gb", {}),
    ("meta-llama/Llama-3.1-8B", "rtx4090", {"global_batch_size": 2}),
])
def test_the_fits_claim_about_the_other_master_weights_agrees_with_estimate(model: str, hw: str, kw: dict) -> None:
    """The master_weights reason says whether the same plan with the other choice fits; estimate() of that plan agrees
    (Qwen3-30B-A3B on one MI300X once read "no fp32-master setup fits" beside an fp32 counterpart that fit)."""
    rec = perfguide.recommend(model, scenario="train_gpu_one", hardware=hw, **kw)
    if rec.setup.lora is not None:
        pytest.skip("LoRA plans carry no master-weights decision")
    other = Setup.parse(rec.setup.model_dump()).replace(weights_dtype="fp32" if rec.setup.weights_dtype == "bf16" else "bf16")
    mem = perfguide.estimate(model, other, hardware=hw)
    fits = mem.device_total <= 0.9 * mem.capacity
    reason = rec.decision("master_weights").reason
    assert (", which fits at" in reason) == fits, (reason, mem.device_total / 2**30)
    if fits and rec.setup.weights_dtype == "bf16":
        assert "no fp32-master setup fits" not in reason


def test_an_offloading_plan_states_the_trade_in_host_and_gpu_bytes() -> None:
    """Mixtral-8x7B on 4x A100 offloads its states to host RAM, where the GPU-side fields read ~0; the trade is fp32
    masters, fp32 gradients and two fp32 AdamW states (16 B per parameter) against pure bf16 AdamW (8 B):
    by hand, 16 x 46.7e9 vs 8 x 46.7e9 bytes, not '0.0 GiB less'."""
    import re

    rec = perfguide.recommend("mistralai/Mixtral-8x7B-v0.1", "train_gpu_many", hardware="a100-80gb:4")
    assert rec.setup.offload_params or rec.setup.offload_optimizer
    reason = rec.decision("master_weights").reason
    here, other = (float(x) for x in re.search(r"\(([\d.]+) GiB here vs ([\d.]+) GiB with", reason).groups())
    params = perfguide.ModelSpec.from_any("mistralai/Mixtral-8x7B-v0.1").total_params
    fp32, bf16 = (here, other) if rec.setup.weights_dtype == "fp32" else (other, here)
    assert abs(fp32 * 2**30 - 16 * params) / (16 * params) < 0.05
    assert abs(bf16 * 2**30 - 8 * params) / (8 * params) < 0.05
