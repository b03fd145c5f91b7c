"""Pure bf16 under DeepSpeed ZeRO (issue 11 item 10): DeepSpeed 0.19's bf16 master weights, gradients and optimizer
states (``bf16.bf16_master_weights_and_grads`` / ``bf16_optimizer_states``), priced per GPU by hand and emitted in a
config DeepSpeed's own parser accepts; ZeRO-Offload, which then needs a CPU Adam the Trainer does not build, is not offered."""

from __future__ import annotations

import pytest

import perfguide as pg

MODEL = "meta-llama/Llama-3.1-8B"


def _plan(strategy: str):
    return pg.recommend(MODEL, scenario="train_gpu_many", hardware="a100-80gb:8", master_weights="bf16", strategy=strategy,
                        optimizer="adamw_torch_fused")


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_states_per_gpu_hand_formula(strategy):
    """bf16 weights (2 B, sharded only by ZeRO-3), bf16 grads (2 B / 8), AdamW's two bf16 moments (4 B / 8) and, for
    ZeRO-1/2, the bf16 flat master partition the optimizer steps (2 B / 8)."""
    rec = _plan(strategy)
    p, m = rec.model.total_params, rec.memory
    assert rec.setup.weights_dtype == "bf16" and rec.setup.strategy == strategy
    assert m.weights == pytest.approx(2 * p / (8 if strategy == "zero3" else 1), rel=1e-6)
    assert m.gradients == pytest.approx(2 * p / 8, rel=1e-6)
    assert m.optimizer_states == pytest.approx((4 + (0 if strategy == "zero3" else 2)) * p / 8, rel=0.01)


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_config_carries_deepspeeds_bf16_master_switches_and_parses(strategy):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    from perfguide.integrations.deepspeed import resolved_deepspeed_config

    rec = _plan(strategy).model_copy()
    cfg = rec.deepspeed_config()
    assert cfg["bf16"] == {"enabled": "auto", "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    resolved = resolved_deepspeed_config(rec)
    # one process here: DeepSpeedConfig checks the batch against this process's world size
    resolved.update(train_batch_size=resolved["train_micro_batch_size_per_gpu"] * resolved["gradient_accumulation_steps"])
    ds = DeepSpeedConfig(resolved)   # runs DeepSpeed's own checks (bf16 masters need ZeRO stage 1-3)
    assert ds.bfloat16_config.enabled and ds.bfloat16_config.bf16_master_weights_and_grads
    assert ds.bfloat16_config.bf16_optimizer_states and ds.zero_optimization_stage == int(strategy[-1])


def test_fp32_master_plans_keep_the_plain_bf16_block():
    rec = pg.recommend(MODEL, scenario="train_gpu_many", hardware="a100-80gb:8", strategy="zero3", master_weights="fp32")
    assert rec.deepspeed_config()["bf16"] == {"enabled": "auto"}


def test_pure_bf16_zero3_on_one_gpu_keeps_zero3_and_says_why_offload_is_not_offered():
    """ZeRO-3 on one GPU also runs without offload, so pure bf16 is planned there (here it does not fit a 4090) instead
    of refused; the offloaded layouts, which would need the CPU Adam the Trainer does not build, are named with why."""
    rec = pg.recommend("meta-llama/Llama-3.1-8B", scenario="train_gpu_one", hardware="rtx4090", master_weights="bf16", strategy="zero3")
    assert rec.setup.strategy == "zero3" and rec.setup.weights_dtype == "bf16" and not rec.setup.offload_optimizer
    assert not rec.fits
    strategy = next(d for d in rec.decisions if d.setting == "strategy")
    offloaded = [a for a in strategy.alternatives if str(a.value).startswith("zero3 + offload")]
    assert len(offloaded) == 2 and all("fp32_optimizer_states=False" in a.why_not for a in offloaded)
