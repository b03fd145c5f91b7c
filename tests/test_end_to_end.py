"""The whole path a user runs first, and the TrainingArguments it hands over for named GPUs.

Expected values are derived by hand here (bytes per parameter, compute capabilities, activation bounds),
not read back from perfguide.
"""

from __future__ import annotations

import math
import warnings

import pytest
from helpers import tiny_model, token_dataset

import perfguide

GB = 1e9
GiB = 2**30


def test_recommend_prepare_and_train_two_steps_on_this_machine(tmp_path):
    """recommend(tiny model) on the probed hardware -> prepare_model -> training_args -> a real Trainer."""
    from transformers import Trainer

    model = tiny_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no NVIDIA driver here: the probe warns and plans CPU-only
        rec = perfguide.recommend(model, scenario="train_cpu", seq_len=16, global_batch_size=8)
    assert rec.hardware.source == "probe" and rec.setup.device == "cpu"
    assert rec.model.total_params == sum(p.numel() for p in model.parameters())
    s = rec.setup
    assert s.micro_batch_size * s.gradient_accumulation_steps * s.world_size == 8
    prepared = rec.prepare_model(model)
    args = rec.training_args(output_dir=str(tmp_path), max_steps=2, report_to="none", save_strategy="no", disable_tqdm=True)
    assert args.use_cpu and not args.fp16  # fp16 on CPU would silently train in fp32
    before = [p.detach().clone() for p in prepared.parameters() if p.requires_grad]
    trainer = Trainer(model=prepared, args=args, train_dataset=token_dataset(n=16))
    result = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(result.training_loss)
    after = [p.detach() for p in prepared.parameters() if p.requires_grad]
    assert any((a != b).any() for a, b in zip(after, before))  # the optimizer really stepped
    assert "Decisions" in rec.report() and rec.to_json()


def _args(model: str, gpu: str, **kw):
    rec = perfguide.recommend(model, scenario="train_gpu_one", hardware=gpu, **kw)
    return rec, rec.training_args_dict(output_dir="out")


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-80gb"])
def test_bf16_and_tf32_on_ampere_and_hopper(gpu):
    # gpt2: 124.4M params x 16 B (AMP AdamW) = 2.0 GB, far below 80 GB: no memory saving is needed
    rec, args = _args("gpt2", gpu, seq_len=1024, global_batch_size=32)
    assert args["bf16"] is True and args["tf32"] is True and not args.get("fp16")
    assert args["optim"] in ("adamw_torch_fused", "adamw_torch") and not args.get("activation_checkpointing")
    assert rec.model_kwargs()["dtype"].__repr__() == "torch.float32"  # true AMP: fp32 master weights


@pytest.mark.parametrize("gpu", ["t4", "v100-16gb"])
def test_fp16_below_compute_capability_8(gpu):
    # T4 is cc 7.5 and V100 cc 7.0: no bf16 tensor cores, no TF32 (TrainingArguments(tf32=True) would raise)
    _, args = _args("gpt2", gpu, seq_len=512, global_batch_size=16)
    assert args["fp16"] is True and not args.get("bf16") and "tf32" not in args


@pytest.mark.parametrize("gpu", ["t4", "v100-16gb"])
def test_bf16_native_model_gets_fp16_only_where_its_family_takes_it(gpu):
    # Llama-3.2 checkpoints are bf16 (config torch_dtype), yet Llama fine-tunes in fp16 AMP: fp16 with a warning
    rec, args = _args("meta-llama/Llama-3.2-1B", gpu, seq_len=512, global_batch_size=16, finetune="lora")
    assert args.get("fp16") is True
    assert any("bf16" in w and "inf/NaN" in w for w in rec.warnings)
    # Gemma's activations overflow fp16's 65504: fp32, never fp16
    rec, args = _args("google/gemma-2-2b", gpu, seq_len=512, global_batch_size=16, finetune="lora")
    assert not args.get("fp16")
    assert any("overflows" in w for w in rec.warnings)


def test_8b_full_finetune_on_a100_needs_the_memory_ladder():
    s, h, L, V, P = 2048, 4096, 32, 128256, 8_030_261_248
    usable = 0.9 * 80 * GiB
    # exact AMP with AdamW: 16 B/param of states alone
    assert 16 * P > usable
    rec, args = _args("meta-llama/Llama-3.1-8B", "a100-80gb", seq_len=s, global_batch_size=64)
    fp32_masters = str(rec.model_kwargs()["dtype"]) == "torch.float32"
    assert not (fp32_masters and args["optim"] in ("adamw_torch", "adamw_torch_fused"))
    if fp32_masters and args["optim"] == "adafactor":
        # fp32 weights + grads = 8 B/param; activations of one 2048-token sample are at least 1.7 x 34 s h bytes per
        # layer (HF Llama, bf16; Korthikanti's GPT bound x 1.7), and the loss keeps 12 B per token x vocab: more than
        # what is left, so checkpointing must be on
        left = usable - 8 * P
        assert 1.7 * 34 * s * h * L + 12 * s * V > left
        assert args["activation_checkpointing"] is True
    assert args["per_device_train_batch_size"] * args["gradient_accumulation_steps"] == 64
