"""``sync_grads_each_micro_step`` (accelerate's ``sync_each_batch``): FSDP reduce-scatters on every accumulation
micro-step, so the unsharded gradient set HF Trainer's no_sync would hold (sharding.no_sync_grads) is not there.
Read from TrainingArguments' ``accelerator_config`` and written back the same way, which the real TrainingArguments accepts."""

from __future__ import annotations

import pytest

import perfguide

PARAMS = 8_030_261_248   # Llama-3.1-8B, every parameter trained
SETUP = {"weights_dtype": "bf16", "autocast": "bf16", "strategy": "fsdp", "num_gpus": 8, "gradient_accumulation_steps": 4,
         "micro_batch_size": 1, "seq_len": 4096}


def test_no_unsharded_gradients_between_micro_steps() -> None:
    """By hand: under no_sync every rank holds the whole bf16 gradient set (2 B x 8.03 B params) where the sharded
    step holds 1/8 of it; with sync_each_batch the peak drops by the difference, 7/8 of the set."""
    assert perfguide.ModelSpec.from_any("meta-llama/Llama-3.1-8B").total_params == PARAMS
    held = perfguide.estimate("meta-llama/Llama-3.1-8B", SETUP, hardware="a100-80gb:8")
    synced = perfguide.estimate("meta-llama/Llama-3.1-8B", {**SETUP, "sync_grads_each_micro_step": True}, hardware="a100-80gb:8")
    assert held.peak_allocated - synced.peak_allocated == PARAMS * 2 - PARAMS * 2 // 8
    one = {**SETUP, "gradient_accumulation_steps": 1}
    assert (perfguide.estimate("meta-llama/Llama-3.1-8B", one, hardware="a100-80gb:8").peak_allocated
            == perfguide.estimate("meta-llama/Llama-3.1-8B", {**one, "sync_grads_each_micro_step": True}, hardware="a100-80gb:8").peak_allocated)


def test_refused_without_fsdp() -> None:
    with pytest.raises(ValueError, match="sync_grads_each_micro_step runs under strategy"):
        perfguide.Setup(strategy="ddp", num_gpus=2, sync_grads_each_micro_step=True)


def test_read_from_training_arguments_and_written_back() -> None:
    from transformers import TrainingArguments

    config = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "bf16": True, "fsdp": "full_shard",
              "fsdp_config": {"version": 2}, "accelerator_config": {"gradient_accumulation_kwargs": {"sync_each_batch": True}}}
    c = perfguide.check("meta-llama/Llama-3.1-8B", config, hardware="a100-80gb:8", num_gpus=8)
    assert c.setup.sync_grads_each_micro_step and not [i for i in c.ignored if i.endswith("accelerator_config")]
    plain = perfguide.check("meta-llama/Llama-3.1-8B", {k: v for k, v in config.items() if k != "accelerator_config"},
                            hardware="a100-80gb:8", num_gpus=8)
    assert not plain.setup.sync_grads_each_micro_step and plain.memory.peak_allocated > c.memory.peak_allocated
    args = TrainingArguments(output_dir="out", use_cpu=True, report_to=[], accelerator_config=config["accelerator_config"])
    assert args.accelerator_config.gradient_accumulation_kwargs == {"sync_each_batch": True}


def test_written_back_as_the_accelerator_config_key() -> None:
    from perfguide.integrations.readers.training_args import write

    setup = perfguide.Setup(**{**SETUP, "sync_grads_each_micro_step": True})
    keys, rest = write({"sync_grads_each_micro_step": True}, setup)
    assert keys == {"accelerator_config.gradient_accumulation_kwargs.sync_each_batch": True} and rest == {}
