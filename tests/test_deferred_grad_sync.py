"""FSDP under gradient accumulation: HF Trainer enters accelerate's no_sync on every micro-step but the last, so the
gradient reduce-scatter runs once per optimizer step; accelerate's sync_each_batch (``sync_grads_each_micro_step``)
runs it on every micro-step. The speed model prices the difference, the memory model the unsharded gradients.

The hand count: a ring reduce-scatter sends (n - 1) / n of the payload per rank, here 2 bytes per trained parameter
(bf16 gradients under autocast) over the node's link at the bus fraction (data/calibration.json comm_bus_fraction),
so the collectives no_sync skips per optimizer step are (GA - 1) of them."""

from __future__ import annotations

import pytest

import perfguide
from perfguide.hardware.named import hardware_from_name
from perfguide.memory import estimate_memory
from perfguide.memory.sharding import defers_grad_sync
from perfguide.speed.rates import constant, pcie_gbps
from perfguide.speed.training import training_speed

GA = 4


@pytest.fixture(scope="module")
def case():
    spec = perfguide.ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    hw = hardware_from_name("rtx4090:4")
    setup = perfguide.Setup(micro_batch_size=1, seq_len=1024, gradient_accumulation_steps=GA, autocast="bf16",
                            weights_dtype="bf16", optimizer="adamw_torch", gradient_checkpointing=True, strategy="fsdp",
                            num_gpus=4, offload_optimizer=True, offload_params=True)
    return spec, hw, setup


def test_the_skipped_reduce_scatters_are_ga_minus_one_of_them_by_hand(case) -> None:
    spec, hw, setup = case
    synced = setup.replace(sync_grads_each_micro_step=True)
    assert defers_grad_sync(setup)   # the loop's no_sync; the switch turns it off through its technique's hooks
    deferred, each = training_speed(spec, setup, hw), training_speed(spec, synced, hw)
    gpu = hw.smallest_gpu
    bw = (hw.intra_node_bandwidth_gbps or pcie_gbps(gpu)) * 1e9 * constant("comm_bus_fraction")
    one_rs = (4 - 1) / 4 * 2 * spec.total_params / bw
    assert each.comm_total_s - deferred.comm_total_s == pytest.approx((GA - 1) * one_rs, rel=1e-6)
    # what no_sync saves in time is at most those collectives (overlap hides part of each), and it costs memory:
    # the whole unsharded bf16 gradient set instead of the 1/4 shard
    saved = each.step_time_s - deferred.step_time_s
    assert 0 < saved <= (GA - 1) * one_rs + 1e-9
    held = estimate_memory(spec, setup, hw).gradients - estimate_memory(spec, synced, hw).gradients
    assert held >= 2 * spec.total_params * (1 - 1 / 4) * 0.99


def test_no_accumulation_or_an_old_fsdp2_accelerate_changes_nothing(case) -> None:
    spec, hw, setup = case
    one = setup.replace(gradient_accumulation_steps=1)
    assert not defers_grad_sync(one)
    assert training_speed(spec, one, hw).comm_total_s == training_speed(spec, one.replace(sync_grads_each_micro_step=True), hw).comm_total_s
    assert not defers_grad_sync(setup, "1.10.0") and defers_grad_sync(setup, "1.11.0")


def test_a_plan_that_only_fits_synced_each_micro_step_picks_it_and_emits_what_transformers_reads(tmp_path) -> None:
    """Llama-3.1-8B full fine-tune on 4 x RTX 4090 at 4,096 tokens: with no_sync the unsharded bf16 gradient set
    (16 GB) does not fit beside the rest, synced each micro-step it does; the plan says so and the TrainingArguments
    key it emits is the one transformers hands to accelerate."""
    transformers = pytest.importorskip("transformers")
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="rtx4090:4", seq_len=4096, global_batch_size=64)
    assert rec.fits and rec.setup.sync_grads_each_micro_step and rec.setup.gradient_accumulation_steps > 1
    d = rec.decision("sync_grads_each_micro_step")
    assert d.number > 2 * rec.model.total_params * (1 - 1 / 4) * 0.9   # what no_sync would hold more, by hand
    kwargs = rec.training_args_dict(output_dir=str(tmp_path))["accelerator_config"]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), accelerator_config=kwargs)
    assert args.accelerator_config.gradient_accumulation_kwargs == {"sync_each_batch": True}
    # read back by perfguide check as the same switch
    import json
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps(rec.training_args_dict(output_dir=str(tmp_path))), encoding="utf-8")
    c = perfguide.check("meta-llama/Llama-3.1-8B", [str(path)], hardware="rtx4090:4", seq_len=4096)
    assert c.setup.sync_grads_each_micro_step


def test_an_accelerate_loop_gets_the_same_switch() -> None:
    """A plain accelerate loop: Accelerator takes the count and sync_each_batch through one GradientAccumulationPlugin
    (it refuses gradient_accumulation_steps beside a plugin), and accumulate() honours the flag."""
    accelerate = pytest.importorskip("accelerate")
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="rtx4090:4", seq_len=4096, global_batch_size=64)
    kw = rec.accelerator_kwargs()
    plugin = kw["gradient_accumulation_plugin"]
    assert isinstance(plugin, accelerate.utils.GradientAccumulationPlugin) and "gradient_accumulation_steps" not in kw
    assert plugin.sync_each_batch is True and plugin.num_steps == rec.setup.gradient_accumulation_steps


@pytest.mark.parametrize("version, gathers_per_step", [(1, 1), (2, GA)])
def test_fsdp1_shard_grad_op_keeps_its_gathered_units_through_no_sync(case, version, gathers_per_step) -> None:
    """FSDP1 SHARD_GRAD_OP under no_sync frees nothing in backward (torch ``_should_free_in_backward``), so only the
    first micro-step all-gathers: per optimizer step one all-gather and one reduce-scatter, by hand. FSDP2 reshards
    after every backward (``reshard_after_backward`` stays True under accelerate) and gathers on every micro-step."""
    spec, hw, setup = case
    sgo = setup.replace(strategy="fsdp_shard_grad_op", fsdp_version=version, offload_optimizer=False, offload_params=False)
    gpu = hw.smallest_gpu
    bw = (hw.intra_node_bandwidth_gbps or pcie_gbps(gpu)) * 1e9 * constant("comm_bus_fraction")
    one = (4 - 1) / 4 * 2 * spec.total_params / bw   # an all-gather of the bf16 weights, or a reduce-scatter of their grads
    assert training_speed(spec, sgo, hw).comm_total_s == pytest.approx((gathers_per_step + 1) * one, rel=1e-6)
    synced = sgo.replace(sync_grads_each_micro_step=True)
    assert training_speed(spec, synced, hw).comm_total_s == pytest.approx(2 * GA * one, rel=1e-6)


def test_hsdp_is_priced_synced_too_and_wins_where_no_sync_does_not_fit() -> None:
    """Qwen2.5-14B full fine-tuning on 4 nodes x 8 H100 at 4,096 tokens, 512 sequences a step: HSDP under no_sync holds
    the whole bf16 gradient set (2 B x P) where synced HSDP holds its node's fp32 shard (4 B x P / 8), 1.5 B x P more by
    hand, which does not fit; synced each micro-step it fits and beats FULL_SHARD over all 32 ranks, whose every
    gather crosses the network. Before HSDP had a synced twin, the plan was FULL_SHARD at mb=16 (14.6 s/step)."""
    rec = perfguide.recommend("Qwen/Qwen2.5-14B", "train_gpu_many", hardware="h100-80gb:8x4", seq_len=4096, global_batch_size=512)
    s, p = rec.setup, rec.model.total_params
    assert s.hybrid_shard and s.sync_grads_each_micro_step and s.gradient_accumulation_steps > 1
    assert rec.decision("hybrid_shard").value is True
    no_sync = estimate_memory(rec.model, s.replace(sync_grads_each_micro_step=False), rec.hardware)
    assert no_sync.gradients - rec.memory.gradients == pytest.approx(2 * p - 4 * p / 8, rel=1e-6)
    assert not no_sync.fits and rec.memory.fits


def test_no_plan_names_sync_each_micro_step_without_accumulation() -> None:
    """Without accumulation FSDP holds no unsharded gradients either way, so the whole per-device batch can fit where
    a smaller micro-batch under no_sync does not: the search prices it for the no_sync layout too, and the plan
    carries no sync switch that changes nothing (Llama-3.1-8B on 4 x 8 A100 40GB: mb=16 ga=1)."""
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="a100-40gb:8x4", seq_len=4096, global_batch_size=512)
    assert rec.setup.is_fsdp and rec.setup.gradient_accumulation_steps == 1
    assert not rec.setup.sync_grads_each_micro_step
