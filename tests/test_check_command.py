"""perfguide check of launch command lines: the script's flags read as HfArgumentParser reads them, the launcher's
world size and plugin flags, and an accelerate --config_file under them."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import perfguide
from perfguide.cli import main


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


SCRIPT = ["--model_name_or_path", "llama-3-8b", "--output_dir", "out", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps",
          "2", "--bf16", "--activation_checkpointing", "--optim", "adamw_torch", "--learning_rate", "2e-5", "--use_cpu"]


def test_torchrun_script_flags_as_hfargumentparser_reads_them() -> None:
    from transformers import HfArgumentParser, TrainingArguments
    from trl import ModelConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ta, model_cfg = HfArgumentParser((TrainingArguments, ModelConfig)).parse_args_into_dataclasses(args=SCRIPT)
    c = perfguide.check(None, ["torchrun", "--nproc_per_node", "4", "--standalone", "train.py", *SCRIPT], hardware="a100-80gb:4",
                        seq_len=2048, device="cuda")
    s = c.setup
    assert next(x.value for x in c.read if x.field == "model") == model_cfg.model_name_or_path
    assert (s.micro_batch_size, s.gradient_accumulation_steps) == (ta.per_device_train_batch_size, ta.gradient_accumulation_steps)
    assert s.autocast == "bf16" and ta.bf16 and s.gradient_checkpointing is ta.activation_checkpointing is True
    assert s.optimizer == ta.optim.value and (s.num_gpus, s.strategy) == (4, "ddp")
    assert "script flags: learning_rate" in c.ignored and "torchrun flags: --standalone" in c.ignored
    memory = perfguide.estimate("llama-3-8b", s, hardware="a100-80gb:4")
    assert c.memory == memory and c.fits is memory.fits


def test_accelerate_launch_flags_win_over_its_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "acc.yaml"
    config.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: fp16\n", encoding="utf-8")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
                              "train_micro_batch_size_per_gpu": "auto"}), encoding="utf-8")
    argv = ["accelerate", "launch", "--config_file", str(config), "--num_processes", "8", "--mixed_precision", "bf16", "--use_deepspeed",
            "--deepspeed_config_file", str(ds), "train.py", "--per_device_train_batch_size", "2"]
    c = perfguide.check("llama-3-70b", argv, hardware="a100-80gb:8", seq_len=1024)
    s = c.setup
    assert (s.num_gpus, s.autocast, s.strategy, s.offload_params, s.offload_optimizer) == (8, "bf16", "zero3", True, True)
    assert s.micro_batch_size == 2
    assert any("acc.yaml: num_processes=8" in n or "num_processes" in n for n in c.notes)
    code = main(["check", "--hardware", "a100-80gb:8", "--model", "llama-3-70b", "--seq-len", "1024", "--", *argv])
    out, err = capsys.readouterr()
    assert code in (0, 3) and "accelerate flags: --num_processes" in out, err


def test_unknown_launchers_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["torchrun", "--nproc_per_node", "2"], ["foo", "train.py"]):
        assert main(["check", "--hardware", "a100-80gb", "--", *command]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
