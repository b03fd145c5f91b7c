"""`perfguide check -- swift sft ...`: ms-swift's own command, read with ms-swift's defaults.

ms-swift cannot be installed beside the pinned environment, so the expected values are its source's, cited per test
(ms-swift at 3602360a5: swift/arguments/*.py, swift/trainers/arguments.py, swift/config/*.json), and its example
scripts' published peaks (examples/train/**.sh first-line comments). Before this reader the commands were refused
("cannot read a 'CUDA_VISIBLE_DEVICES=0' command").
"""
from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

import perfguide
from perfguide.errors import PerfGuideError

QWEN = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--dataset", "swift/self-cognition#1000"]


def _check(line: str, hardware: str = "a100-80gb:8") -> perfguide.Check:
    return perfguide.check(None, shlex.split(line), hardware=hardware)


def test_a_bare_command_takes_ms_swifts_defaults() -> None:
    """tuner_type 'lora' (base_args.py), rank 8 / alpha 32 / dropout 0.05 on all-linear (tuner_args.py),
    gradient_checkpointing True and per_device_train_batch_size 1 (trainers/arguments.py), and
    gradient_accumulation_steps = ceil(16 / batch / world size) (trainers/arguments.py __post_init__)."""
    s = _check(f"CUDA_VISIBLE_DEVICES=0 swift sft {shlex.join(QWEN)} --max_length 2048").setup
    assert s.lora is not None and (s.lora.r, s.lora.alpha, s.lora.dropout) == (8, 32, 0.05)
    assert s.lora.target_modules == "all-linear" and s.gradient_checkpointing is True
    assert (s.micro_batch_size, s.gradient_accumulation_steps, s.num_gpus, s.seq_len) == (1, 16, 1, 2048)


def test_processes_come_from_the_environment_words() -> None:
    s = _check(f"CUDA_VISIBLE_DEVICES=0,1,2,3 NPROC_PER_NODE=4 swift sft {shlex.join(QWEN)} --per_device_train_batch_size 2 "
               "--max_length 1024 --deepspeed zero2").setup
    assert s.num_gpus == 4 and s.gradient_accumulation_steps == math.ceil(16 / 2 / 4) and s.strategy == "zero2"


@pytest.mark.parametrize(("preset", "strategy", "offload"), [("zero3", "zero3", False), ("zero3_offload", "zero3", True),
                                                             ("zero2_offload", "zero2", True), ("zero1", "zero1", False)])
def test_deepspeed_presets_are_swifts_json_files(preset: str, strategy: str, offload: bool) -> None:
    """swift/config/{zero1,zero2_offload,zero3,zero3_offload}.json: the stage and offload_optimizer / offload_param."""
    s = _check(f"NPROC_PER_NODE=2 swift sft {shlex.join(QWEN)} --max_length 1024 --deepspeed {preset}").setup
    assert s.strategy == strategy and s.offload_optimizer is offload
    assert s.offload_params is (offload and strategy == "zero3")


def test_the_fsdp2_preset_checkpoints_in_fsdp() -> None:
    """swift/config/fsdp2.json: full_shard auto_wrap, fsdp_version 2, activation_checkpointing in fsdp_config (which
    sft_args._check_fsdp2_compatibility uses in place of gradient_checkpointing)."""
    s = _check(f"NPROC_PER_NODE=2 swift sft {shlex.join(QWEN)} --max_length 1024 --fsdp fsdp2 --gradient_checkpointing false").setup
    assert s.strategy == "fsdp" and s.fsdp_version == 2 and s.gradient_checkpointing is True


def test_torch_dtype_decides_the_amp_flag() -> None:
    """model_args._init_mixed_precision: bf16 for a bfloat16 load, fp16 for float16 / float32."""
    bf = _check(f"swift sft {shlex.join(QWEN)} --max_length 512 --tuner_type full --torch_dtype bfloat16").setup
    fp = _check(f"swift sft {shlex.join(QWEN)} --max_length 512 --tuner_type full --torch_dtype float32").setup
    assert (bf.weights_dtype, bf.autocast) == ("bf16", "bf16") and (fp.weights_dtype, fp.autocast) == ("fp32", "fp16")
    assert bf.lora is None


def test_qlora_is_bitsandbytes_nf4_with_double_quantization() -> None:
    """quant_args.py: bnb_4bit_use_double_quant True by default; ms-swift runs no prepare_model_for_kbit_training."""
    s = _check(f"swift sft {shlex.join(QWEN)} --max_length 2048 --quant_method bnb --quant_bits 4 --torch_dtype bfloat16").setup
    assert s.weights_dtype == "nf4" and s.nf4_double_quant is True and s.kbit_upcast is False


@pytest.mark.parametrize(("words", "said"), [
    ("CUDA_VISIBLE_DEVICES=0,1 swift sft", "device_map"),                            # multi-gpu/device_map/train.sh
    ("CUDA_VISIBLE_DEVICES=0,1,2,3 NPROC_PER_NODE=2 swift sft", "its share of them"),  # multi-gpu/ddp_device_map
    ("swift sft --tuner_type adalora", "accepted: lora, full"),
    ("swift sft --task_type embedding", "accepted: causal_lm, seq_cls, reranker"),
    ("swift sft --optimizer muon", "optimizer plugin"),
    ("swift sft --quant_method hqq --quant_bits 4", "accepted: bnb"),
    ("swift sft --tuner_backend unsloth", "Unsloth"),
    ("swift rlhf --rlhf_type dpo", "accepted: `swift sft ...`"),
])
def test_what_is_not_priced_is_one_line(words: str, said: str) -> None:
    with pytest.raises(PerfGuideError, match=said) as err:
        _check(f"{words} {shlex.join(QWEN)} --max_length 1024")
    assert "\n" not in str(err.value)


#: ms-swift's examples/train scripts (at 3602360a5) that ran as published: the first-line peak, the flags that price it
PUBLISHED = {
    "full/train.sh (# 76GiB)": ("CUDA_VISIBLE_DEVICES=0 swift sft --tuner_type full --torch_dtype bfloat16 "
                                "--per_device_train_batch_size 1 --gradient_accumulation_steps 16 --max_length 2048", 76.0),
    "multi-gpu/deepspeed/train_zero3.sh (# 16GiB * 2)": ("CUDA_VISIBLE_DEVICES=0,1 NPROC_PER_NODE=2 swift sft --tuner_type lora "
                                                         "--torch_dtype bfloat16 --per_device_train_batch_size 1 --lora_rank 8 "
                                                         "--lora_alpha 32 --target_modules all-linear --gradient_accumulation_steps 8 "
                                                         "--max_length 2048 --deepspeed zero3", 16.0),
    "qlora/bnb/train.sh (# 10GB)": ("CUDA_VISIBLE_DEVICES=0 swift sft --tuner_type lora --torch_dtype bfloat16 --quant_method bnb "
                                    "--quant_bits 4 --bnb_4bit_compute_dtype bfloat16 --bnb_4bit_quant_type nf4 "
                                    "--bnb_4bit_use_double_quant true --per_device_train_batch_size 1 --max_length 2048", 10e9 / 2**30),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_example_runs_fit_and_land_near_their_peak(name: str) -> None:
    """Each ran as published (its first-line figure, a device reading on an 80 GB card): the check must say it fits,
    and its peak must be within 20% of the figure (the allocator's share of a variable-length run is not priced:
    bench/results/accuracy.md's ms-swift section)."""
    line, published = PUBLISHED[name]
    env, _, rest = line.partition("swift sft")
    check = _check(f"{env}swift sft {shlex.join(QWEN)} {rest}")
    assert check.fits and check.memory is not None
    assert abs(check.memory.device_total / 2**30 / published - 1) < 0.20


def test_a_change_is_written_as_swift_flags_it_reads_back() -> None:
    """Every flag a change writes is an ms-swift or transformers argument (foreign_keys.SWIFT, read from its source),
    and reading the command with them applied gives the plan's fields."""
    from perfguide.integrations.readers.foreign_keys import SWIFT
    from perfguide.integrations.readers.swift import write
    from perfguide.integrations.readers.training_args import KNOWN

    setup = perfguide.Setup(task="train", weights_dtype="nf4", lora=perfguide.LoraSpec(r=16), nf4_double_quant=False,
                            gradient_checkpointing=False, seq_len=4096, micro_batch_size=2, strategy="zero2", num_gpus=2)
    changes = {"weights_dtype": "nf4", "nf4_double_quant": False, "gradient_checkpointing": False, "seq_len": 4096,
               "micro_batch_size": 2, "strategy": "zero2"}
    keys, rest = write(changes, setup)
    assert not rest and all(k[2:] in SWIFT | KNOWN for k in keys)
    words = [w for k, v in keys.items() for w in (k, json.dumps(v) if isinstance(v, bool) else str(v))]
    s = _check(f"NPROC_PER_NODE=2 swift sft {shlex.join(QWEN)} {shlex.join(words)}").setup
    assert (s.weights_dtype, s.nf4_double_quant, s.gradient_checkpointing, s.seq_len, s.micro_batch_size, s.strategy) == (
        "nf4", False, False, 4096, 2, "zero2")


def test_the_environment_before_another_launcher_is_named_not_read(tmp_path: Path) -> None:
    check = perfguide.check("gpt2", ["CUDA_VISIBLE_DEVICES=0", "torchrun", "--nproc_per_node", "1", "train.py",
                                     "--per_device_train_batch_size", "2"], hardware="a100-80gb")
    assert check.setup.micro_batch_size == 2
    assert any("environment CUDA_VISIBLE_DEVICES before the command: not read" in n for n in check.notes)


@pytest.mark.parametrize(("words", "labels"), [("--task_type seq_cls --num_labels 1", 1), ("--task_type reranker", 1),
                                               ("--task_type seq_cls", 2)])
def test_a_classifier_run_is_priced_with_its_head(words: str, labels: int) -> None:
    """seq_cls/regression/sft.sh (Qwen2.5-0.5B, 16 x 2,048 tokens): swift loads AutoModelForSequenceClassification
    (swift/model/register.py; a reranker with one label, seq_cls with --num_labels, else transformers' 2). The LM run
    holds at least the bf16 logits, 16 x 2,048 x 151,936 x 2 B; the classifier's are 16 x labels values."""
    base = "swift sft --model Qwen/Qwen2.5-0.5B --dataset x --torch_dtype bfloat16 --per_device_train_batch_size 16 --max_length 2048"
    lm, cls = _check(base, "a100-80gb"), _check(f"{base} {words}", "a100-80gb")
    assert lm.memory is not None and cls.memory is not None
    assert lm.memory.logits >= 16 * 2048 * 151936 * 2 and cls.memory.logits < 2**20
    assert any(n.startswith(f"priced with the seq-cls head ({labels} label{'s' * (labels != 1)}) the command trains") for n in cls.notes)
    assert not any("train_type" in n for n in cls.notes)   # no 3.x name in the command, so no note of it


def test_the_head_can_be_given_to_check() -> None:
    """``task`` / ``num_labels`` as ``recommend`` takes them, for a config that cannot say (a run_glue command)."""
    args = {"per_device_train_batch_size": 32, "bf16": True}
    check = perfguide.check("google-bert/bert-base-uncased", args, hardware="a100-80gb", task="seq-cls", num_labels=3, seq_len=128)
    assert check.memory is not None and check.memory.logits < 2**20
    assert "priced with the seq-cls head (3 labels) given to perfguide check" in check.notes
    with pytest.raises(PerfGuideError, match="accepted: causal-lm, seq-cls"):
        perfguide.check("gpt2", args, hardware="a100-80gb", task="image-cls")


def test_swifts_entry_script_under_accelerate_takes_the_launchers_processes(tmp_path: Path) -> None:
    """examples/train/multi-gpu/fsdp2_lora/train.sh (# 14.7GiB * 2): `accelerate launch --config_file fsdp2.json
    swift/cli/sft.py ...` with FSDP2 and fsdp_activation_checkpointing in the accelerate config (num_processes 2) and
    `--gradient_checkpointing false` on the script: two processes, checkpointed by FSDP, within 20% of the figure.
    The script's ms-swift flags had been read as TrainingArguments ones."""
    acc = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "bf16", "num_machines": 1,
           "num_processes": 2, "fsdp_config": {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_reshard_after_forward": True,
                                               "fsdp_activation_checkpointing": True, "fsdp_version": 2}}
    path = tmp_path / "fsdp2.json"
    path.write_text(json.dumps(acc), encoding="utf-8")
    flags = ("--tuner_type lora --torch_dtype bfloat16 --per_device_train_batch_size 1 --lora_rank 8 --lora_alpha 32 "
             "--gradient_checkpointing false --target_modules all-linear --gradient_accumulation_steps 8 --max_length 2048")
    check = _check(f"accelerate launch --config_file {path} swift/cli/sft.py {shlex.join(QWEN)} {flags}")
    s = check.setup
    assert (s.num_gpus, s.strategy, s.fsdp_version, s.gradient_checkpointing) == (2, "fsdp", 2, True)
    assert s.lora is not None and s.lora.target_modules == "all-linear"
    assert check.memory is not None and abs(check.memory.device_total / 2**30 / 14.7 - 1) < 0.20


def test_deepspeed_keeps_fp32_masters_of_a_bfloat16_load() -> None:
    """--torch_dtype bfloat16 loads the model in bf16, but DeepSpeed's engine steps fp32 master weights with fp32 Adam
    states whatever the load dtype (its bf16 / ZeRO optimizers keep an fp32 partition): 12 bytes per parameter over the
    ranks, where a bf16 step would keep 4. (ms-swift's zero2 / zero3 presets set no bf16_master_weights_and_grads.)"""
    from perfguide.model.types import ModelSpec

    check = _check("NPROC_PER_NODE=4 swift sft --model Qwen/Qwen2.5-7B --tuner_type full --torch_dtype bfloat16 --deepspeed zero2",
                   hardware="a100-80gb:4")
    assert (check.setup.weights_dtype, check.setup.autocast, check.setup.strategy) == ("fp32", "bf16", "zero2")
    params = ModelSpec.from_any("Qwen/Qwen2.5-7B").total_params
    assert check.memory.optimizer_states >= 12 * params / 4


def test_logits_to_keep_is_said_an_upper_bound_where_ms_swift_turns_it_on() -> None:
    """ms-swift 4.x runs the LM head only on the labelled positions unless told not to (``use_logits_to_keep`` None:
    on for a causal LM whose forward takes ``logits_to_keep``, off under sequence parallelism;
    swift/trainers/mixin.py get_use_logits_to_keep, seq2seq_trainer.py). It was listed as having no effect."""
    def said(line: str) -> bool:
        c = _check(line)
        assert not any(k.endswith("use_logits_to_keep") for k in c.ignored)
        return any("--use_logits_to_keep" in n and "upper bound" in n for n in c.notes)

    base = "swift sft " + " ".join(QWEN) + " --max_length 2048"
    assert said(base)
    assert not said(base + " --use_logits_to_keep false")
    assert not said("NPROC_PER_NODE=2 " + base + " --attn_impl flash_attn --sequence_parallel_size 2")
