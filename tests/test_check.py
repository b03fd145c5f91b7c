"""perfguide.check on real objects and files: TrainingArguments / SFTConfig instances, the JSON / YAML HfArgumentParser
reads, accelerate configs accelerate's own loader reads and DeepSpeed JSON transformers' HfDeepSpeedConfig reads.

Each Setup read is checked field by field against the library's own reading of the same file (not against perfguide's
output), and each verdict against ``perfguide.estimate`` / ``estimate_speed`` of that Setup.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import perfguide
from perfguide.cli import main
from perfguide.integrations.readers.base import ConfigReadError

HW = "a100-80gb"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write_json(path: Path, data: dict) -> str:
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def write_yaml(path: Path, data: dict) -> str:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


def assert_priced_like_estimate(c: perfguide.Check, model: str, hardware: str) -> None:
    """The verdict is estimate() of the Setup read: the same bytes, the same fit, the same speed."""
    memory = perfguide.estimate(model, c.setup, hardware=hardware)
    assert c.memory == memory
    assert c.fits is memory.fits
    assert c.throughput == perfguide.estimate_speed(model, c.setup, hardware=hardware)


def source_of(c: perfguide.Check, field: str) -> str:
    return next(s.source for s in c.read if s.field == field)


# --- TrainingArguments / SFTConfig objects ---------------------------------------------------------------------

def test_training_arguments_instance_read_field_by_field(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    ta = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=8,
                           activation_checkpointing=True, optim="adamw_torch", use_cpu=True, bf16=True,
                           dataloader_num_workers=2, learning_rate=1e-4)
    c = perfguide.check("gpt2", ta, hardware=HW, device="cuda", seq_len=1024)
    s = c.setup
    assert s.micro_batch_size == ta.per_device_train_batch_size
    assert s.gradient_accumulation_steps == ta.gradient_accumulation_steps
    assert s.gradient_checkpointing is ta.activation_checkpointing
    assert s.optimizer == ta.optim.value
    assert s.autocast == ("bf16" if ta.bf16 else None)
    assert s.dataloader_num_workers == ta.dataloader_num_workers
    assert (s.device, s.seq_len) == ("cuda", 1024)
    assert "override" in source_of(c, "device") and "per_device_train_batch_size" in source_of(c, "micro_batch_size")
    assert "TrainingArguments: learning_rate" in c.ignored
    assert_priced_like_estimate(c, "gpt2", HW)


def test_sft_config_instance_keeps_trl_defaults(tmp_path: Path) -> None:
    from trl import SFTConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        sft = SFTConfig(output_dir=str(tmp_path), use_cpu=True, max_length=512, packing=True, per_device_train_batch_size=2)
    c = perfguide.check("gpt2", sft, hardware=HW, device="cuda")
    s = c.setup
    assert s.seq_len == sft.max_length
    assert s.micro_batch_size == sft.per_device_train_batch_size
    assert s.gradient_checkpointing is sft.activation_checkpointing is True  # TRL's default, not transformers'
    assert s.autocast == ("bf16" if sft.bf16 else None)
    assert s.padding_free is (sft.packing and sft.packing_strategy == "bfd")
    assert s.trainer == "trl"   # SFTTrainer runs it: TRL's loss path, not HF Trainer's full logits
    assert_priced_like_estimate(c, "gpt2", HW)


def test_training_arguments_keep_the_hf_trainer_loop(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ta = TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    assert perfguide.check("gpt2", ta, hardware=HW, device="cuda", seq_len=512).setup.trainer == "transformers"


# --- files HfArgumentParser reads --------------------------------------------------------------------------------

def test_training_args_json_as_hfargumentparser_reads_it(tmp_path: Path) -> None:
    from transformers import HfArgumentParser, TrainingArguments

    path = write_json(tmp_path / "args.json", {
        "output_dir": "out", "per_device_train_batch_size": 16, "gradient_accumulation_steps": 2, "bf16": True, "use_cpu": True,
        "optim": "adafactor", "gradient_checkpointing": True, "learning_rate": 2e-5, "tf32": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        (ta,) = HfArgumentParser(TrainingArguments).parse_json_file(path)
    c = perfguide.check("gpt2", path, hardware=HW, device="cuda", seq_len=512)
    s = c.setup
    assert (s.micro_batch_size, s.gradient_accumulation_steps) == (ta.per_device_train_batch_size, ta.gradient_accumulation_steps)
    assert s.optimizer == ta.optim.value and s.autocast == "bf16" and s.tf32 is ta.tf32
    assert s.gradient_checkpointing is ta.activation_checkpointing is True  # the deprecated alias, read as transformers 5 does
    assert any("gradient_checkpointing is the transformers 4 / deprecated name" in n for n in c.notes)
    assert_priced_like_estimate(c, "gpt2", HW)


def test_trl_script_yaml_names_the_model_and_lora(tmp_path: Path) -> None:
    """One YAML for TRL's sft.py: ScriptArguments + SFTConfig + ModelConfig keys, as HfArgumentParser parses them."""
    from transformers import HfArgumentParser
    from trl import ModelConfig, ScriptArguments, SFTConfig

    path = write_yaml(tmp_path / "sft.yaml", {
        "model_name_or_path": "gpt2", "dtype": "bfloat16", "dataset_name": "trl-lib/Capybara", "use_peft": True, "lora_r": 32,
        "lora_alpha": 64, "lora_target_modules": "all-linear", "max_length": 2048, "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 8, "output_dir": "out", "use_cpu": True, "learning_rate": 2e-4})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        _script, sft, model_cfg = HfArgumentParser((ScriptArguments, SFTConfig, ModelConfig)).parse_yaml_file(path)
    c = perfguide.check(None, path, hardware=HW, device="cuda", seq_len=1024)
    s = c.setup
    model = next(x for x in c.read if x.field == "model")
    assert model.value == model_cfg.model_name_or_path and model.source == "sft.yaml: model_name_or_path"
    assert c.model == perfguide.ModelSpec.from_any("gpt2").name
    assert s.weights_dtype == "bf16" and model_cfg.dtype == "bfloat16"
    assert s.lora is not None and (s.lora.r, s.lora.alpha, s.lora.target_modules) == (model_cfg.lora_r, model_cfg.lora_alpha, "all-linear")
    assert s.seq_len == 1024 and sft.max_length == 2048  # the override wins, and says so
    assert "override" in source_of(c, "seq_len")
    assert s.gradient_accumulation_steps == sft.gradient_accumulation_steps
    assert "sft.yaml: dataset_name" in c.ignored
    assert_priced_like_estimate(c, "gpt2", HW)


def test_trl_model_config_4bit_code_is_read(tmp_path: Path) -> None:
    """ModelConfig's bnb_4bit_quant_type reaches the Setup (fp4 and nf4 store the same bytes, but their bitsandbytes
    dequantize kernels decode at different speeds, speed/dequant.py); a code bitsandbytes has not is one line."""
    from transformers import HfArgumentParser
    from trl import ModelConfig, ScriptArguments, SFTConfig

    keys = {"model_name_or_path": "gpt2", "load_in_4bit": True, "bnb_4bit_quant_type": "fp4", "use_peft": True,
            "output_dir": "out", "use_cpu": True}
    path = write_yaml(tmp_path / "sft.yaml", keys)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        *_, model_cfg = HfArgumentParser((ScriptArguments, SFTConfig, ModelConfig)).parse_yaml_file(path)
    s = perfguide.check(None, path, hardware=HW, device="cuda", seq_len=512).setup
    assert s.weights_dtype == "nf4" and s.bnb_4bit_quant_type == model_cfg.bnb_4bit_quant_type == "fp4"
    bad = write_yaml(tmp_path / "bad.yaml", {**keys, "bnb_4bit_quant_type": "int3"})
    with pytest.raises(ConfigReadError, match=r"bnb_4bit_quant_type='int3' is not a value perfguide can price.*Accepted: fp4, nf4"):
        perfguide.check(None, bad, hardware=HW, device="cuda", seq_len=512)


# --- accelerate + DeepSpeed ----------------------------------------------------------------------------------------

def _accelerate_loads(path: str) -> object:
    from accelerate.commands.config.config_args import load_config_from_file

    return load_config_from_file(path)


def test_accelerate_with_deepspeed_file_auto_filled_from_training_args(tmp_path: Path) -> None:
    from transformers.integrations import HfDeepSpeedConfig

    ds = write_json(tmp_path / "ds.json", {
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True}, "gradient_clipping": "auto"})
    acc = write_yaml(tmp_path / "accelerate.yaml", {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "num_machines": 1, "num_processes": 8,
        "machine_rank": 0, "mixed_precision": "bf16", "deepspeed_config": {"deepspeed_config_file": "ds.json", "zero3_init_flag": True}})
    args = write_json(tmp_path / "args.json", {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "bf16": True})
    loaded = _accelerate_loads(acc)
    hf = HfDeepSpeedConfig(ds)
    c = perfguide.check("llama-3-8b", [acc, args], hardware="a100-80gb:8", seq_len=2048)
    s = c.setup
    assert s.num_gpus == loaded.num_processes // loaded.num_machines == 8
    assert s.strategy == f"zero{hf.get_value('zero_optimization.stage')}" and hf.is_zero3()
    assert s.offload_optimizer is hf.is_offload() is True and s.offload_params is False
    assert (s.micro_batch_size, s.gradient_accumulation_steps, s.autocast) == (4, 2, "bf16")  # "auto" filled from the Trainer's args
    assert any('train_micro_batch_size_per_gpu is "auto": filled with 4' in n for n in c.notes)
    assert s.overlap_comm is True and source_of(c, "overlap_comm") == "ds.json: zero_optimization.overlap_comm"   # now priced
    assert_priced_like_estimate(c, "llama-3-8b", "a100-80gb:8")


def test_accelerate_inline_deepspeed_and_fsdp(tmp_path: Path) -> None:
    inline = write_yaml(tmp_path / "zero2.yaml", {
        "distributed_type": "DEEPSPEED", "num_processes": 4, "mixed_precision": "bf16",
        "deepspeed_config": {"zero_stage": 2, "offload_optimizer_device": "cpu", "offload_param_device": "none",
                             "gradient_accumulation_steps": 4, "zero3_init_flag": False}})
    loaded = _accelerate_loads(inline)
    c = perfguide.check("llama-3-8b", inline, hardware="a100-80gb:4", seq_len=1024, micro_batch_size=1)
    assert (c.setup.strategy, c.setup.num_gpus) == (f"zero{loaded.deepspeed_config['zero_stage']}", loaded.num_processes)
    assert c.setup.offload_optimizer is True and c.setup.gradient_accumulation_steps == 4 and c.setup.autocast == "bf16"
    assert_priced_like_estimate(c, "llama-3-8b", "a100-80gb:4")

    fsdp = write_yaml(tmp_path / "fsdp.yaml", {
        "distributed_type": "FSDP", "num_processes": 8, "mixed_precision": "bf16",
        "fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": False, "fsdp_offload_params": True,
                        "fsdp_activation_checkpointing": True, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}})
    loaded = _accelerate_loads(fsdp)
    c = perfguide.check("llama-3-8b", fsdp, hardware="a100-80gb:8", seq_len=1024, micro_batch_size=2)
    s = c.setup
    assert loaded.fsdp_config["fsdp_reshard_after_forward"] is False
    assert (s.strategy, s.fsdp_version, s.offload_params, s.offload_optimizer, s.gradient_checkpointing) == ("fsdp_shard_grad_op", 2, True, True, True)
    assert_priced_like_estimate(c, "llama-3-8b", "a100-80gb:8")


def test_deepspeed_mismatch_with_training_args_is_refused_as_transformers_refuses_it(tmp_path: Path) -> None:
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    ds = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}
    ta = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, use_cpu=True)
    hf = HfTrainerDeepSpeedConfig(dict(ds))
    hf.trainer_config_process(ta)
    with pytest.raises(ValueError, match="mismatch"):
        hf.trainer_config_finalize(ta, None, 0)
    args = write_json(tmp_path / "args.json", {"per_device_train_batch_size": 8, "deepspeed": "ds.json"})
    write_json(tmp_path / "ds.json", ds)
    with pytest.raises(ConfigReadError, match="micro_batch_size is set twice"):
        perfguide.check("gpt2", args, hardware=HW)


# --- the CLI: exit codes, the change that fits, unknown keys ---------------------------------------------------------

def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_exit_3_then_the_named_change_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {"per_device_train_batch_size": 16, "bf16": True, "optim": "adamw_torch", "learning_rate": 1e-5, "lerning_rate": 3}
    path = write_json(tmp_path / "args.json", data)
    code, out, err = run(capsys, "check", path, "--model", "llama-3-8b", "--hardware", HW, "--seq-len", "2048", "--json")
    assert code == 3, err
    result = json.loads(out)
    assert result["fits"] is False
    assert any(u.startswith("args.json: lerning_rate") and "learning_rate" in u for u in result["unknown"])
    fit = next(ch for ch in result["changes"] if ch["kind"] == "fit")
    (edit,) = [e for e in fit["edits"] if e["source"] == "args.json"]
    assert edit["format"] == "training_args" and all("." not in k for k in edit["keys"])
    write_json(tmp_path / "args.json", {**data, **edit["keys"]})
    code, out, err = run(capsys, "check", path, "--model", "llama-3-8b", "--hardware", HW, "--seq-len", "2048")
    assert code == 0, out + err
    assert "verdict: fits" in out


def test_cli_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "args.json"
    broken.write_text('{"per_device_train_batch_size": 4,', encoding="utf-8")
    for argv in (("check", str(broken), "--model", "gpt2", "--hardware", HW),
                 ("check", str(tmp_path / "missing.yaml"), "--model", "gpt2", "--hardware", HW),
                 ("check", write_json(tmp_path / "nomodel.json", {"bf16": True}), "--hardware", HW),
                 ("check", write_json(tmp_path / "bad.json", {"per_device_train_batch_size": "four"}), "--model", "gpt2", "--hardware", HW),
                 ("check", write_json(tmp_path / "opt.json", {"optim": "adamw_torch_fusd"}), "--model", "gpt2", "--hardware", HW)):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "", (argv, out, err)
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err


# --- round trip: what perfguide writes reads back as the same plan ----------------------------------------------------

#: Setup fields the written files cannot carry: the load dtype and LoRA go to from_pretrained / prepare_model
#: (rec.model_kwargs(), rec.lora_config()), optimizer-in-backward and a k-bit base's cast to prepare_model, CPU threads
#: to the launch command
NOT_IN_FILES = ("weights_dtype", "lora", "optimizer_in_backward", "kbit_upcast", "cpu_threads")


@pytest.mark.parametrize(("model", "scenario", "hardware", "constraints"), [
    ("llama-3-8b", "train_gpu_many", "a100-80gb:8", {"strategy": "zero3"}),
    ("llama-3-8b", "train_gpu_many", "a100-80gb:8", {"strategy": "fsdp"}),
    ("qwen2.5-7b", "train_gpu_many", "a100-40gb:4", {"strategy": "zero2"}),
    ("llama-3-8b", "train_gpu_one", "a100-40gb", {}),
    ("llama-3-8b", "train_gpu_one", "l4", {"finetune": "qlora"}),
    ("gpt2", "train_cpu", "cpu", {}),
])
def test_written_configs_read_back_as_the_same_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, scenario: str,
                                                    hardware: str, constraints: dict) -> None:
    rec = perfguide.recommend(model, scenario, hardware=hardware, seq_len=1024, global_batch_size=64, **constraints)
    argv = ["recommend", model, "--scenario", scenario, "--hardware", hardware, "--seq-len", "1024", "--global-batch-size", "64",
            "--write-configs", str(tmp_path)]
    for key, value in constraints.items():
        argv += [f"--{key.replace('_', '-')}", value]
    assert main(argv) == 0
    capsys.readouterr()
    kept = {f: getattr(rec.setup, f) for f in NOT_IN_FILES}
    kept["lora"] = kept["lora"].to_dict() if kept["lora"] else None
    for files in (["sft_config.json", "accelerate.yaml"], ["training_args.json", "accelerate.yaml"]):
        # TrainingArguments has no sequence length; activation offloading and padding-free are SFTConfig keys (for a
        # plain Trainer, rec.prepare_model applies them)
        extra = ({"seq_len": 1024, "activation_offloading": rec.setup.activation_offloading, "padding_free": rec.setup.padding_free}
                 if files[0] == "training_args.json" else {})
        c = perfguide.check(model, [str(tmp_path / f) for f in files], hardware=hardware, **kept, **extra)
        # an SFTConfig is run by SFTTrainer, so it reads back as TRL's loop whatever loop the plan priced
        want = rec.setup if files[0] == "training_args.json" else rec.setup.model_copy(update={"trainer": "trl"})
        assert c.setup == want, {f: (getattr(want, f), getattr(c.setup, f)) for f in type(want).model_fields
                                 if getattr(want, f) != getattr(c.setup, f)}
        assert c.fits is rec.fits


def test_key_lists_are_the_pinned_libraries_own() -> None:
    """The readers list each format's keys without importing the library; here they are compared with it."""
    import dataclasses

    import transformers
    import trl
    from accelerate.commands.config.config_args import ClusterConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from perfguide.integrations.readers import accelerate, deepspeed, hf_keys

    def names(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    assert set(hf_keys.TRAINING_ARGUMENTS) == names(transformers.TrainingArguments)
    assert set(hf_keys.SFT_CONFIG) == names(trl.SFTConfig) - names(transformers.TrainingArguments)
    assert set(hf_keys.MODEL_CONFIG) == names(trl.ModelConfig)
    assert set(hf_keys.SCRIPT_ARGUMENTS) == names(trl.ScriptArguments)
    assert set(accelerate.KEYS) == names(ClusterConfig)
    zero = {n for f, info in DeepSpeedZeroConfig.model_fields.items() for n in (f, info.alias) if n}
    assert set(deepspeed.ZERO_KEYS) == zero
    assert not set(hf_keys.RENAMED) & set(hf_keys.TRAINING_ARGUMENTS) - {"gradient_checkpointing", "gradient_checkpointing_kwargs"}


@pytest.mark.parametrize(("keys", "said"), [
    ({"eval_strategy": "steps"}, "per_device_eval_batch_size (default 8): evaluation runs 8 rows per device where the step runs 1"),
    ({"eval_strategy": "epoch", "per_device_eval_batch_size": 16}, "evaluation runs 16 rows per device where the step runs 1"),
    ({"evaluation_strategy": "steps", "per_device_eval_batch_size": 1}, None),   # no more rows than the step
    ({"per_device_eval_batch_size": 16}, None),                                  # eval_strategy "no": no evaluation
])
def test_an_evaluation_larger_than_the_step_is_said(keys: dict, said: str | None) -> None:
    """TrainingArguments evaluates 8 rows per device unless told (its own default, read from the installed release);
    an evaluation at more rows than the priced step holds that many rows of full logits, which only the step's price
    does not see: said with the fix, and not listed as a key with no effect."""
    import transformers

    assert transformers.TrainingArguments(output_dir="out").per_device_eval_batch_size == 8
    c = perfguide.check("gpt2", {"per_device_train_batch_size": 1, **keys}, hardware=HW, device="cuda", seq_len=512)
    notes = [n for n in c.notes if "evaluation runs" in n]
    if said is None:
        assert not notes
        return
    assert len(notes) == 1 and said in notes[0] and notes[0].endswith("set per_device_eval_batch_size=1")
    assert not any(k.endswith("per_device_eval_batch_size") for k in c.ignored)
