"""A launched script's YAML, as its parser takes it: ``accelerate launch --config_file zero3.yaml scripts/sft.py
--config recipe.yaml`` (the alignment-handbook / open-r1 form). Each reading is compared with TRL's own TrlParser
parsing the same words, not with perfguide's output. Before, ``--config`` was passed over and the SFTConfig defaults
priced; a bare YAML path that the parser refuses was passed over too.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import perfguide
from perfguide.errors import PerfGuideError

SCRIPT = '''from dataclasses import dataclass, field
from trl import ModelConfig, SFTConfig, TrlParser


@dataclass
class ScriptArguments:
    chat_template: str | None = field(default=None)


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
'''
RECIPE = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dtype": "bfloat16", "per_device_train_batch_size": 8,
          "gradient_accumulation_steps": 2, "max_length": 4096, "activation_checkpointing": False, "bf16": True,
          "output_dir": "out", "chat_template": "{{ messages }}", "env": {"TOKENIZERS_PARALLELISM": "false"}}


def _files(tmp_path: Path) -> tuple[Path, Path]:
    script, recipe = tmp_path / "sft.py", tmp_path / "recipe.yaml"
    script.write_text(SCRIPT, encoding="utf-8")
    recipe.write_text(yaml.safe_dump(RECIPE), encoding="utf-8")
    return script, recipe


def _trl_reads(words: list[str]) -> tuple:
    """What the script itself parses the words into (the ScriptArguments class is the script's own; --use_cpu only
    lets the CPU build bf16 arguments)."""
    from dataclasses import dataclass, field

    from trl import ModelConfig, SFTConfig, TrlParser

    @dataclass
    class ScriptArguments:
        chat_template: str | None = field(default=None)

    return TrlParser((ScriptArguments, SFTConfig, ModelConfig)).parse_args_and_config([*words, "--use_cpu"])


def test_the_config_yaml_is_read_under_the_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script, recipe = _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    words = ["--config", recipe.name, "--per_device_train_batch_size", "4"]
    _, args, model = _trl_reads(words)
    check = perfguide.check(None, ["accelerate", "launch", "--num_processes", "2", script.name, *words], hardware="a100-80gb:2")
    s = check.setup
    assert (s.micro_batch_size, s.gradient_accumulation_steps, s.seq_len) == (
        args.per_device_train_batch_size, args.gradient_accumulation_steps, args.max_length) == (4, 2, 4096)
    assert s.gradient_checkpointing is args.activation_checkpointing is False
    assert s.weights_dtype == "bf16" and model.dtype == "bfloat16" and check.model == RECIPE["model_name_or_path"]
    assert all("over recipe.yaml" in r.source for r in check.read if r.field == "micro_batch_size")


def test_a_bare_yaml_path_is_refused_as_the_parser_refuses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """alignment-handbook's zephyr README launches ``scripts/dpo.py recipes/.../config_qlora.yaml``: its TrlParser stops
    on the word, so the check says how to pass it instead of pricing the defaults."""
    script, recipe = _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError):
        _trl_reads([recipe.name])
    with pytest.raises(PerfGuideError, match=r"takes `--config FILE` \(TrlParser\); pass --config recipe.yaml"):
        perfguide.check(None, ["python", script.name, recipe.name], hardware="a100-80gb")
    with pytest.raises(PerfGuideError, match="only as two words"):
        perfguide.check(None, ["python", script.name, f"--config={recipe.name}"], hardware="a100-80gb")


def test_a_sole_yaml_an_hf_script_reads_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' examples' pattern: ``if len(sys.argv) == 2 and sys.argv[1].endswith('.yaml'): parse_yaml_file``."""
    script = tmp_path / "train.py"
    script.write_text("import sys\nfrom transformers import HfArgumentParser, TrainingArguments\n"
                      "parser = HfArgumentParser((TrainingArguments,))\n"
                      "(args,) = parser.parse_yaml_file(sys.argv[1])\n", encoding="utf-8")
    values = {"output_dir": "out", "per_device_train_batch_size": 3, "gradient_accumulation_steps": 5, "use_cpu": True}
    (tmp_path / "args.yaml").write_text(yaml.safe_dump(values), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    from transformers import HfArgumentParser, TrainingArguments

    (args,) = HfArgumentParser((TrainingArguments,)).parse_yaml_file(str(tmp_path / "args.yaml"))
    s = perfguide.check("gpt2", ["python", "train.py", "args.yaml"], hardware="a100-80gb").setup
    assert (s.micro_batch_size, s.gradient_accumulation_steps) == (args.per_device_train_batch_size, args.gradient_accumulation_steps)
    with pytest.raises(PerfGuideError, match="HfArgumentParser refuses a word that is no flag"):
        perfguide.check("gpt2", ["python", "train.py", "args.yaml", "--seed", "1"], hardware="a100-80gb")


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("route", [["--fsdp", "full_shard"], []])
def test_checkpointing_under_fsdp_is_written_where_either_route_reads_it(on: bool, route: list[str]) -> None:
    """The handbook's full recipe was told to move to FSDP without checkpointing as ``--fsdp_config
    '{"activation_checkpointing": false}'`` while its YAML kept ``gradient_checkpointing: true``: transformers reads
    fsdp_config only where the arguments' own ``fsdp`` is set, so checkpointing stayed on under an accelerate config's
    FSDP (``route == []``). The flags as written, parsed by transformers over the YAML's value, give the plan's."""
    import shlex

    from transformers import HfArgumentParser, TrainingArguments

    from perfguide.integrations.readers.script_flags import write
    from perfguide.integrations.readers.verdict import Edit

    setup = perfguide.Setup(task="train", strategy="fsdp", num_gpus=2, gradient_checkpointing=on)
    keys, _ = write({"gradient_checkpointing": on}, setup)
    words = shlex.split(Edit(format="script_flags", source="flags", syntax="flags", keys=keys).text())
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", "out", "--use_cpu", "--gradient_checkpointing", str(not on), *route, *words])
    assert args.activation_checkpointing is on
    assert not (args.activation_checkpointing and (args.fsdp_config or {}).get("activation_checkpointing"))  # the Trainer refuses both


def test_each_gone_key_is_absent_from_the_installed_class_that_dropped_it() -> None:
    """hf_keys.GONE_IN against the installed wheels (transformers 5.24, TRL 1.16, both past every removal listed)."""
    import dataclasses

    from transformers import TrainingArguments
    from trl import DPOConfig, ModelConfig, SFTConfig

    from perfguide._packages import installed_release
    from perfguide.integrations.readers.hf_keys import GONE_IN
    from perfguide.memory.loss_path import version_tuple

    fields = {f.name for cls in (TrainingArguments, SFTConfig, DPOConfig, ModelConfig) for f in dataclasses.fields(cls)}
    for key, (package, gone) in GONE_IN.items():
        assert version_tuple(installed_release(package) or "0") >= version_tuple(gone)
        assert key not in fields, key
    assert "gradient_checkpointing" in fields   # still an alias: not listed as gone


def test_a_recipe_the_installed_parser_stops_on_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """alignment-handbook's recipes (trl>=0.19.1 in its setup.py) write torch_dtype, max_seq_length and warmup_ratio:
    with the TRL and transformers installed here TrlParser refuses them before training. The check still prices them as
    the keys they were, and says the run does not start here, naming what to write instead."""
    script, recipe = _files(tmp_path)
    values = {k: v for k, v in RECIPE.items() if k not in ("dtype", "max_length", "env")}
    recipe.write_text(yaml.safe_dump({**values, "torch_dtype": "bfloat16", "max_seq_length": 2048, "warmup_ratio": 0.1}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="Unknown arguments"):
        _trl_reads(["--config", recipe.name])
    check = perfguide.check(None, ["python", script.name, "--config", recipe.name], hardware="a100-80gb")
    assert check.setup.seq_len == 2048 and check.setup.weights_dtype == "bf16"
    stops = [n for n in check.notes if "does not start here" in n]
    assert len(stops) == 3 and any("write dtype" in n for n in stops) and any("write max_length" in n for n in stops)


def test_double_quantization_is_written_as_modelconfigs_flag() -> None:
    """The handbook's QLoRA recipe was told to set ``nf4_double_quant=True`` on "perfguide Setup (no key in your
    configs)": TRL's ModelConfig has the key, which the script's own parser reads."""
    import shlex

    from trl import ModelConfig, TrlParser

    from perfguide.integrations.readers.script_flags import write
    from perfguide.integrations.readers.verdict import Edit

    setup = perfguide.Setup(task="train", weights_dtype="nf4", lora=perfguide.LoraSpec(r=16), nf4_double_quant=True)
    keys, rest = write({"nf4_double_quant": True}, setup)
    assert not rest
    words = shlex.split(Edit(format="script_flags", source="flags", syntax="flags", keys=keys).text())
    (model,) = TrlParser((ModelConfig,)).parse_args_and_config(["--model_name_or_path", "x", *words])
    assert model.use_bnb_nested_quant is True


def test_a_config_flag_of_a_script_not_on_disk_is_not_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The handbook's README launches scripts/run_orpo.py, gone from the repository: its --config YAML was dropped unread
    and the check failed with 'no model'. Now it says why."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(RECIPE), encoding="utf-8")
    with pytest.raises(PerfGuideError, match="not a file here, so which parser reads --config recipe.yaml is unknown"):
        perfguide.check(None, ["accelerate", "launch", "scripts/run_orpo.py", "--config", "recipe.yaml"], hardware="a100-80gb")


@pytest.mark.parametrize(("flags", "seq_len", "target_len"), [(["--block_size", "512"], 512, None), (["--max_seq_length", "128"], 128, None),
                                                              (["--max_source_length", "1024", "--max_target_length", "128"], 1024, 128)])
def test_a_trainingarguments_scripts_own_length_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                                      seq_len: int, target_len: int | None) -> None:
    """transformers' example scripts parse (ModelArguments, DataTrainingArguments, TrainingArguments): run_clm.py's
    ``--block_size``, run_glue.py's ``--max_seq_length``, run_summarization.py's ``--max_source_length`` /
    ``--max_target_length`` are their data arguments, the lengths they train at. They were unknown keys (block_size),
    or TRL's removed SFTConfig key, said to stop the script (max_seq_length)."""
    script = tmp_path / "run_example.py"
    script.write_text("from dataclasses import dataclass\nfrom transformers import HfArgumentParser, TrainingArguments\n\n"
                      "@dataclass\nclass DataTrainingArguments:\n    block_size: int | None = None\n    max_seq_length: int = 128\n"
                      "    max_source_length: int = 1024\n    max_target_length: int = 128\n\n"
                      "parser = HfArgumentParser((DataTrainingArguments, TrainingArguments))\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    from dataclasses import dataclass

    from transformers import HfArgumentParser, TrainingArguments

    @dataclass
    class DataTrainingArguments:
        block_size: int | None = None
        max_seq_length: int = 128
        max_source_length: int = 1024
        max_target_length: int = 128

    data, _ = HfArgumentParser((DataTrainingArguments, TrainingArguments)).parse_args_into_dataclasses(
        [*flags, "--output_dir", "out", "--use_cpu"])
    assert getattr(data, flags[0].lstrip("-")) == int(flags[1])   # the script's own parser takes the flag, at that value
    check = perfguide.check("google-t5/t5-small", ["python", script.name, *flags, "--per_device_train_batch_size", "4"],
                            hardware="a100-80gb")
    assert check.setup.seq_len == seq_len and check.setup.target_len == target_len
    assert not check.unknown and not any("does not start here" in n for n in check.notes)


def test_a_script_that_loads_a_classifier_is_priced_with_its_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' run_glue.py loads ``AutoModelForSequenceClassification``: its logits are num_labels wide, not the
    vocabulary (BERT's 30,522 x 128 tokens x 32 rows in fp32 alone is 500 MB); the width defaults to transformers' 2."""
    script = tmp_path / "run_glue.py"
    script.write_text("from transformers import AutoModelForSequenceClassification, HfArgumentParser, TrainingArguments\n"
                      "parser = HfArgumentParser((TrainingArguments,))\n"
                      "model = AutoModelForSequenceClassification.from_pretrained('x', num_labels=3)\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    words = ["python", script.name, "--max_seq_length", "128", "--per_device_train_batch_size", "32"]
    check = perfguide.check("google-bert/bert-base-uncased", words, hardware="a100-80gb")
    given = perfguide.check("google-bert/bert-base-uncased", words, hardware="a100-80gb", num_labels=3)
    assert check.memory is not None and check.memory.logits < 32 * 128 * 30522 * 4
    assert any("seq-cls head (2 labels) the command trains; its width is transformers' default" in n for n in check.notes)
    assert any("seq-cls head (3 labels) given to perfguide check" in n for n in given.notes)
