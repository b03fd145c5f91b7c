"""`perfguide check -- trl sft ...` / `trl dpo ...`: TRL's own CLI, the first command of TRL's docs.

The split of flags between the script and `accelerate launch` is checked against TRL's own parser
(trl.scripts.<sft|dpo>.make_parser().parse_args_and_config, which trl/cli/commands/training.py runs), and the named
accelerate configs against the files the installed TRL ships.
"""
from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path

import pytest
import yaml

import perfguide
from perfguide.errors import PerfGuideError
from perfguide.integrations.readers import trl_cli
from perfguide.integrations.readers.script_flags import write

ARGV = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "4",
        "--num_processes", "8", "--accelerate_config", "zero3", "--mixed_precision", "bf16", "--use_peft", "--lora_r", "32",
        "--max_length", "2048", "--output_dir", "out"]


def _trl_split(sub: str, argv: list[str]) -> set[str]:
    """The flags TRL's CLI hands to accelerate launch (its parser's leftovers); --use_cpu only lets the CPU build the
    config (bf16 needs a GPU there) and is the script's either way."""
    parser = importlib.import_module(f"trl.scripts.{sub}").make_parser(prog=f"trl {sub}")
    *_, from_config, from_cli = parser.parse_args_and_config([*argv, "--use_cpu"], return_remaining_strings=True,
                                                             separate_remaining_strings=True)
    return {w[2:] for w in (*from_config, *from_cli) if w.startswith("--")}


@pytest.mark.parametrize("sub", ["sft", "dpo"])
def test_flags_split_as_trls_own_cli_splits_them(sub: str) -> None:
    _, script, launch = trl_cli.split(["trl", sub, *ARGV])
    assert set(launch) == _trl_split(sub, ARGV) == {"num_processes", "accelerate_config", "mixed_precision"}
    assert script["gradient_accumulation_steps"] == "4"   # accelerate has the flag too; TRL's script parser takes it first


def test_trl_sft_command_is_priced_as_its_flags_say() -> None:
    check = perfguide.check(None, ["trl", "sft", *ARGV], hardware="a100-80gb:8")
    s = check.setup
    assert (s.micro_batch_size, s.gradient_accumulation_steps, s.seq_len, s.num_gpus) == (2, 4, 2048, 8)
    assert s.lora is not None and s.lora.r == 32 and s.trainer == "trl" and s.objective == "sft"
    shipped = yaml.safe_load((Path(importlib.import_module("trl").__file__).parent / "accelerate_configs" / "zero3.yaml").read_text())
    assert shipped["deepspeed_config"]["zero_stage"] == 3 and s.strategy == "zero3"
    recommended = [c for c in check.changes if c.kind == "recommended"]
    assert recommended and not {"trainer", "objective"} & set(recommended[0].setup)   # compared with a TRL plan


def test_a_4bit_base_stays_16_bit_outside_its_linears() -> None:
    """The installed TRL's trainers run no peft k-bit preparation (SFTTrainer and DPOTrainer call neither
    prepare_model_for_kbit_training nor the bf16 recast: only trl.experimental's ORPO / CPO import them), so
    ``--load_in_4bit --use_peft`` reads the embedding, head and norms in the load dtype."""
    import trl

    root = Path(trl.__file__).parent
    calls = [p.relative_to(root) for p in root.rglob("*.py") if "prepare_model_for_kbit_training(" in p.read_text(encoding="utf-8")]
    assert calls and all(str(c).startswith("experimental") for c in calls)
    s = perfguide.check(None, ["trl", "sft", *ARGV, "--load_in_4bit", "--dtype", "bfloat16"], hardware="a100-80gb:8").setup
    assert s.weights_dtype == "nf4" and s.kbit_upcast is False and not s.kbit_recast_bf16
    s = perfguide.check(None, ["trl", "sft", *ARGV, "--load_in_4bit"], hardware="a100-80gb:8").setup
    assert s.weights_dtype == "nf4" and s.kbit_upcast is True   # TRL's float32 load: the same bytes as peft's upcast


def test_trl_scripts_load_the_model_in_modelconfigs_dtype() -> None:
    """TRL's ModelConfig defaults dtype to "float32" (PR #4778, trl 0.27) and its sft script hands it to
    from_pretrained, so `trl sft` without --dtype trains fp32 weights under bf16 autocast; it was priced at the
    checkpoint's bf16 (transformers' dtype='auto'), about half the weights, gradients and AdamW states."""
    import dataclasses
    import inspect

    import trl
    from trl.scripts import sft

    assert {f.name: f.default for f in dataclasses.fields(trl.ModelConfig)}["dtype"] == "float32"   # the premise
    assert "dtype=model_args.dtype" in inspect.getsource(sft.main)
    one = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--output_dir", "out"]   # one process: no sharded masters
    read = {flags: perfguide.check(None, ["trl", "sft", *one, *flags], hardware="a100-80gb").setup.weights_dtype
            for flags in ((), ("--dtype", "bfloat16"), ("--dtype", "auto"))}
    assert read == {(): "fp32", ("--dtype", "bfloat16"): "bf16", ("--dtype", "auto"): "bf16"}   # Qwen2.5's checkpoint is bf16


def test_a_trl_directory_in_the_working_directory_is_no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's docs run `trl sft ...` from a checkout of TRL, whose trl/ package directory was taken for a config path."""
    (tmp_path / "trl").mkdir()
    monkeypatch.chdir(tmp_path)
    assert perfguide.check(None, ["trl", "sft", *ARGV], hardware="a100-80gb:8").setup.trainer == "trl"
    assert perfguide.check(None, shlex.join(["trl", "sft", *ARGV]), hardware="a100-80gb:8").setup.trainer == "trl"


def test_trl_dpo_command_prices_dpo() -> None:
    s = perfguide.check(None, ["trl", "dpo", *ARGV], hardware="a100-80gb:8").setup
    assert s.objective == "dpo" and s.trainer == "trl"


def test_a_config_file_under_the_command_line(tmp_path: Path) -> None:
    """TrlParser: the --config YAML's values, each overridden by the same flag on the command line."""
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nper_device_train_batch_size: 8\nmax_length: 4096\nnum_processes: 2\n")
    s = perfguide.check(None, ["trl", "sft", "--config", str(cfg), "--per_device_train_batch_size", "4"], hardware="a100-80gb:2").setup
    assert (s.micro_batch_size, s.seq_len, s.num_gpus) == (4, 4096, 2)


def test_what_perfguide_cannot_read_is_one_line() -> None:
    with pytest.raises(PerfGuideError, match="accepted: `trl sft ...` and `trl dpo ...`"):
        perfguide.check(None, ["trl", "grpo", "--model_name_or_path", "gpt2"], hardware="a100-80gb")
    with pytest.raises(PerfGuideError, match="neither a file nor a config TRL ships; accepted: a path, or .*zero3"):
        perfguide.check(None, ["trl", "sft", "--model_name_or_path", "gpt2", "--accelerate_config", "zero9"], hardware="a100-80gb")
    check = perfguide.check(None, ["trl", "sft", "--model_name_or_path", "gpt2", "--per_device_batch_size", "2"], hardware="a100-80gb")
    assert any("--per_device_batch_size" in u and "--per_device_train_batch_size" in u for u in check.unknown)


def test_a_nested_change_is_one_json_flag_the_script_parses() -> None:
    """A dict argument is spelled as JSON after its flag (HfArgumentParser's only spelling), quoted for the shell."""
    setup = perfguide.Setup(task="train", strategy="fsdp", num_gpus=2, gradient_checkpointing=False)
    keys, _ = write({"gradient_checkpointing": False}, setup)
    flag, value = next((k, v) for k, v in keys.items() if "fsdp" in k)
    assert "." not in flag and isinstance(json.loads(value), dict)
    from perfguide.integrations.readers.verdict import Edit

    line = Edit(format="script_flags", source="flags", syntax="flags", keys=keys).text()
    assert json.loads(shlex.split(line)[shlex.split(line).index(flag) + 1]) == json.loads(value)
    from transformers import HfArgumentParser, TrainingArguments

    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(["--output_dir", "out", flag, value])
    assert args.fsdp_config == json.loads(value)   # the flag as written is what transformers' own parser reads


@pytest.mark.parametrize(("target", "expect_fsdp", "expect_ds"), [
    ({"strategy": "zero2", "num_gpus": 2}, False, True),
    ({"strategy": "fsdp", "num_gpus": 2}, True, False),
    ({"strategy": "ddp", "num_gpus": 2}, False, False),
])
def test_strategy_flags_parse_in_transformers(target: dict, expect_fsdp: bool, expect_ds: bool) -> None:
    """`fsdp` and `deepspeed` are string arguments on the command line: a written 'False' / 'None' would be read as an
    FSDP option or a config path and refused by TrainingArguments; off is '' and FSDP on its sharding option."""
    from transformers import HfArgumentParser, TrainingArguments

    setup = perfguide.Setup(task="train", **target)
    keys, _ = write({"strategy": setup.strategy}, setup)
    flags = [tok for k, v in keys.items() for tok in ((k,) if v is True else (k, str(v)))]
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(["--output_dir", "out", "--use_cpu", *flags])
    assert bool(args.fsdp) is expect_fsdp and bool(args.deepspeed) is expect_ds


def _installed_script(name: str) -> str:
    import trl

    return str(Path(trl.__file__).parent / "scripts" / name)


def test_a_trl_script_launched_by_path_reads_as_trl_sft_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python trl/scripts/sft.py ...` (TRL's docs' other spelling) parses into SFTConfig and ModelConfig, as `trl sft`
    does: it was read with TrainingArguments' defaults (no checkpointing, fp32 compute, 2,048 tokens), which for
    Llama-2-7b int8 LoRA read 175 GiB, "does not fit". The script's classes are read from the installed script."""
    from perfguide.integrations.readers import script_kind

    read = {n: script_kind.config_class(p, script_kind.source_of(p, "/"))
            for n, p in ((n, _installed_script(n)) for n in ("sft.py", "dpo.py", "kto.py", "grpo.py"))}
    assert read == {"sft.py": ("SFTConfig", True), "dpo.py": ("DPOConfig", True), "kto.py": ("KTOConfig", True),
                    "grpo.py": ("GRPOConfig", True)}   # each beside TRL's ModelConfig
    one = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--output_dir", "out"]
    by_cli = perfguide.check(None, ["trl", "sft", *one], hardware="a100-80gb").setup
    by_path = perfguide.check(None, ["python", _installed_script("sft.py"), *one], hardware="a100-80gb").setup
    assert by_path == by_cli and (by_path.gradient_checkpointing, by_path.autocast, by_path.seq_len) == (True, "bf16", 1024)
    monkeypatch.chdir(tmp_path)   # not on disk: TRL's own script known by its path
    assert perfguide.check(None, ["python", "trl/scripts/dpo.py", *one], hardware="a100-80gb").setup.objective == "dpo"


def test_a_script_on_an_unpriced_trl_objective_is_refused() -> None:
    with pytest.raises(PerfGuideError, match="parses its flags into KTOConfig, a training objective perfguide does not price") as exc:
        perfguide.check(None, ["python", _installed_script("kto.py"), "--model_name_or_path", "Qwen/Qwen2.5-0.5B"], hardware="a100-80gb")
    assert "\n" not in str(exc.value)
