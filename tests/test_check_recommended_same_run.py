"""`perfguide check`'s "toward the recommended plan" keeps what the config states about the run itself.

The plan it compares with is recommend()'s for the same model, machine, length and global batch; it once dropped the
way of training and the data's shape: a DPO config was compared with an SFT plan, and a config that packs (axolotl
``sample_packing``) was told to stop packing, because with no ``avg_seq_len`` perfguide prices full rows, where packing
gains nothing. Packing on short samples is the user's reason to pack; only the user can say it does not pay.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import perfguide
from perfguide.integrations.readers.verdict import Change
from perfguide.techniques.effects import StepShape
from perfguide.techniques.padding_free import PaddingFree

DATA = Path(__file__).parent / "data" / "check"


def _recommended(check: perfguide.Check) -> Change:
    found = [c for c in check.changes if c.kind == "recommended"]
    assert len(found) == 1
    return found[0]


def test_a_packing_config_is_compared_with_a_packing_plan() -> None:
    name = "axolotl_qlora-1b.yml"
    assert yaml.safe_load((DATA / name).read_text())["sample_packing"] is True   # the premise: the example packs
    check = perfguide.check("meta-llama/Llama-3.2-1B", DATA / name, hardware="rtx4090")
    rec = _recommended(check)
    assert "padding_free" not in rec.setup   # the plan packs too: no change of it to write back
    assert all("sample_packing" not in edit.keys for edit in rec.edits)


def test_a_dpo_config_is_compared_with_a_dpo_plan() -> None:
    check = perfguide.check("gpt2", {"beta": 0.1, "per_device_train_batch_size": 4}, hardware="a100-80gb", device="cuda")
    assert check.setup.objective == "dpo"
    assert "objective" not in _recommended(check).setup


def test_padding_free_without_avg_seq_len_attends_over_full_rows() -> None:
    """Without avg_seq_len every sample fills seq_len (real_tokens, and the packed mask's bytes, already read it so):
    SDPA runs one flattened row of mb x seq_len tokens under a block mask, FlashAttention-2 each sample alone."""
    base = perfguide.Setup(task="train", micro_batch_size=4, seq_len=4096, padding_free=True)
    shape = StepShape(4 * 4096, (4, 4096), 4 * 4096)
    for impl, attention in (("sdpa", (1, 16384)), ("flash_attention_2", (4, 4096))):
        out = PaddingFree().step_shape(base.model_copy(update={"attn_implementation": impl}), shape)
        assert (out.matmul_tokens, out.attention) == (16384, attention)
    stated = base.model_copy(update={"attn_implementation": "sdpa", "avg_seq_len": 4096})
    assert PaddingFree().step_shape(stated, shape) == PaddingFree().step_shape(base.model_copy(update={"attn_implementation": "sdpa"}), shape)


def test_a_cut_cross_entropy_config_is_compared_with_a_cce_plan(tmp_path: Path) -> None:
    """CCE is never searched and its gradient filtering is not priced, so a plan without it would tell a CCE user to
    switch on a slow reading: the plan keeps it, and the edits leave the plugin alone. Where perfguide's plans cannot
    emit it (a model type apple/ml-cross-entropy's cce_patch lacks, which axolotl's fork patches), no plan is
    compared, and the note says why."""
    y = {**yaml.safe_load((DATA / "axolotl_qlora-1b.yml").read_text()),
         "plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]}
    path = tmp_path / "cce.yml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    rec = _recommended(perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="rtx4090"))
    assert "cut_cross_entropy" not in rec.setup
    assert all("cut_cross_entropy" not in edit.keys for edit in rec.edits)
    qwen3 = perfguide.check("Qwen/Qwen3-0.6B", path, hardware="rtx4090")
    assert qwen3.setup.cut_cross_entropy and not [c for c in qwen3.changes if c.kind == "recommended"]
    assert any("no recommended plan to compare with" in n and "'qwen3'" in n for n in qwen3.notes)


#: the memory-relevant keys of axolotl's examples/mistral/config.yml (full fine-tune, packing, FlashAttention-2)
_MISTRAL = {"base_model": "mistralai/Mistral-7B-v0.1", "sequence_len": 8192, "sample_packing": True, "pad_to_sequence_len": True,
            "micro_batch_size": 2, "gradient_accumulation_steps": 4, "optimizer": "adamw_bnb_8bit", "bf16": "auto",
            "gradient_checkpointing": True, "flash_attention": True}


def test_a_flash_attention_config_is_compared_with_a_flash_attention_plan(tmp_path: Path) -> None:
    """A config on FlashAttention-2 has the package installed, which perfguide's own attention rule cannot assume (it
    picks SDPA, where packed rows attend under a [T, T] block mask over the whole flattened row). The plan compared
    keeps the config's kernel, so the change writes no attention switch, and it is the plan recommend() gives with
    FlashAttention-2 asked for."""
    path = tmp_path / "mistral.yml"
    path.write_text(yaml.safe_dump(_MISTRAL), encoding="utf-8")
    check = perfguide.check(config=path, hardware="a100-80gb")
    assert check.setup.attn_implementation == "flash_attention_2" and check.setup.padding_free
    rec = _recommended(check)
    assert "attn_implementation" not in rec.setup and all("attn_implementation" not in e.keys for e in rec.edits)
    same = perfguide.recommend("mistralai/Mistral-7B-v0.1", "train_gpu_one", hardware="a100-80gb", seq_len=8192,
                               global_batch_size=8, padding_free=True, attn_implementation="flash_attention_2")
    assert rec.tokens_per_s == same.throughput.tokens_per_s


def _fp8_example(tmp_path: Path) -> Path:
    """The memory-relevant keys of axolotl's examples/llama-3/3b-fp8-fsdp2.yaml."""
    y = {"base_model": "meta-llama/Llama-3.2-3B", "sequence_len": 512, "sample_packing": True, "micro_batch_size": 16,
         "gradient_accumulation_steps": 1, "optimizer": "adamw_torch_fused", "torch_compile": True, "fp8": True,
         "fp8_enable_fsdp_float8_all_gather": True, "attn_implementation": "flex_attention", "fsdp_version": 2,
         "fsdp_config": {"offload_params": False, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                         "transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "sharding_strategy": "FULL_SHARD",
                         "reshard_after_forward": True, "activation_checkpointing": False}}
    path = tmp_path / "fp8.yml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    return path


def test_axolotl_fp8_is_read_and_refused_where_the_gpu_has_no_fp8(tmp_path: Path) -> None:
    """axolotl's ``fp8: true`` sets ACCELERATE_MIXED_PRECISION=fp8 (src/axolotl/utils/trainer.py): accelerate's torchao
    Float8Linear, priced as Setup.autocast 'fp8'. On an A100 (no fp8 tensor cores) that run does not start, so the
    check refuses it in one line instead of pricing it as bf16."""
    path = _fp8_example(tmp_path)
    assert perfguide.check(config=path, hardware="h100-80gb").setup.autocast == "fp8"
    with pytest.raises(perfguide.InvalidSetupError, match="fp8 needs fp8 on the GPU and a100-80gb lacks it"):
        perfguide.check(config=path, hardware="a100-80gb")


def test_a_plan_slower_than_the_config_is_not_offered_as_a_change(tmp_path: Path) -> None:
    """The fp8 example on an H100 (fp8, torch.compile, pure bf16 weights, micro-batch 16) prices faster than the plan
    recommend() picks for the same run (fp32 masters, no fp8 or compile chosen): the check says there is no speed to
    gain, names where the plan differs, and writes no edit."""
    check = perfguide.check(config=_fp8_example(tmp_path), hardware="h100-80gb")
    rec = _recommended(check)
    assert check.throughput is not None and rec.tokens_per_s is not None
    assert rec.tokens_per_s < check.throughput.tokens_per_s and rec.speedup is not None and rec.speedup < 1
    assert rec.setup == {} and rec.edits == () and rec.reason.startswith("no speed to gain")
    assert "autocast" in rec.reason and "torch_compile" in rec.reason


def test_llamafactory_fp8_is_read_and_written_as_its_own_switch(tmp_path: Path) -> None:
    """LLaMA-Factory's ``fp8: true`` (train/fp8_utils.py: ACCELERATE_MIXED_PRECISION=fp8, torchao's Float8Linear by
    default) is priced as autocast 'fp8' and refused on a GPU without fp8; written back, fp8 is its own key beside the
    bf16 / fp16 TrainingArguments keys."""
    from perfguide.integrations.readers import llamafactory

    path = tmp_path / "lf.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": "meta-llama/Llama-3.2-3B", "stage": "sft", "do_train": True, "finetuning_type": "full",
                                    "cutoff_len": 2048, "per_device_train_batch_size": 4, "bf16": True, "fp8": True}), encoding="utf-8")
    assert perfguide.check(config=path, hardware="h100-80gb").setup.autocast == "fp8"
    with pytest.raises(perfguide.InvalidSetupError, match="a100-80gb lacks it"):
        perfguide.check(config=path, hardware="a100-80gb")
    setup = perfguide.Setup(task="train", autocast="bf16")
    keys, _ = llamafactory.write({"autocast": "bf16"}, setup)
    assert keys["fp8"] is False and keys["bf16"] is True
    keys, _ = llamafactory.write({"autocast": "fp8"}, setup.model_copy(update={"autocast": "fp8"}))
    assert keys == {"fp8": True}


def test_a_gain_under_the_speed_models_resolution_is_not_offered(tmp_path: Path) -> None:
    """The alignment-handbook's SmolLM3 mid-training recipe (32K packed rows, Liger, checkpointing, ZeRO-3 on 8 x A100)
    was told to change six settings for x1.00 tokens/s. A gain under MIN_SPEEDUP is inside the speed model's own
    out-of-sample error: no edit, and the reason says so. The plan's rate is recommend()'s for the same run, priced apart."""
    from perfguide.preflight import MIN_SPEEDUP

    y = {"model_name_or_path": "HuggingFaceTB/SmolLM3-3B", "dtype": "bfloat16", "attn_implementation": "flash_attention_2",
         "bf16": True, "gradient_accumulation_steps": 16, "activation_checkpointing": True, "packing": True, "max_length": 32768,
         "per_device_train_batch_size": 1, "use_liger_kernel": True, "output_dir": "out",
         "deepspeed": {"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto"}}
    path = tmp_path / "mid.yaml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    check = perfguide.check(config=path, hardware="a100-80gb:8", num_gpus=8)
    rec = _recommended(check)
    s = check.setup
    plan = perfguide.recommend("HuggingFaceTB/SmolLM3-3B", "train_gpu_many", hardware="a100-80gb:8", seq_len=s.seq_len,
                               global_batch_size=s.global_batch_size, num_gpus=8, trainer=s.trainer, padding_free=True,
                               attn_implementation="flash_attention_2")
    assert check.throughput is not None
    gain = plan.throughput.tokens_per_s / check.throughput.tokens_per_s
    assert rec.speedup == pytest.approx(gain) and 1 <= gain < MIN_SPEEDUP   # the premise: faster, by little
    assert rec.setup == {} and rec.edits == () and "less than the speed model resolves" in rec.reason
