"""The perfguide command, run in-process through main([...]) and once as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

from perfguide import Hardware, MemoryEstimate, PerfGuideError, Recommendation
from perfguide.cli import build_parser, main
from perfguide.cli_flags import setup_from_args


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, fragment: str) -> None:
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert fragment in err


# --- parser and help --------------------------------------------------------------------------

def test_help_lists_commands_with_examples(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("probe", "recommend", "estimate", "calibrate", "env"):
        assert command in out
    assert "examples:" in out and "perfguide recommend" in out


def test_recommend_help_shows_every_flag(capsys):
    code, out, _ = run(capsys, "recommend", "--help")
    assert code == 0
    for flag in ("--scenario", "--hardware", "--seq-len", "--global-batch-size", "--nodes", "--precision", "--optimizer",
                 "--finetune", "--max-new-tokens", "--batch-size", "--json", "--markdown", "--plot",
                 "--write-accelerate-config", "--training-args"):
        assert flag in out


def test_version_and_missing_command(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("perfguide ")
    code, _, err = run(capsys)
    assert code == 2 and "usage: perfguide" in err


@pytest.mark.parametrize("argv, level", [(["recommend", "x"], 0), (["-v", "recommend", "x"], 1), (["recommend", "x", "-vv"], 2)])
def test_verbose_counts_before_or_after_the_command(argv, level):
    assert build_parser().parse_args(argv).verbose == level


def test_output_modes_exclude_each_other(capsys):
    code, _, err = run(capsys, "recommend", "gpt2", "--json", "--markdown")
    assert code == 2 and "not allowed with argument" in err


def test_estimate_flags_map_to_setup_fields():
    args = build_parser().parse_args(["estimate", "gpt2", "--micro-batch-size", "8", "--no-gradient-checkpointing",
                                      "--optimizer", "none", "--autocast", "bf16", "--lora-r", "8", "--strategy", "zero3"])
    assert setup_from_args(args) == {"micro_batch_size": 8, "gradient_checkpointing": False, "optimizer": None,
                                     "autocast": "bf16", "strategy": "zero3", "lora": {"r": 8}}
    untouched = build_parser().parse_args(["estimate", "gpt2"])
    assert setup_from_args(untouched) == {}


# --- errors: one line on stderr, exit status 2 --------------------------------------------------

def test_unknown_scenario_is_one_line_exit_2(capsys):
    code, out, err = run(capsys, "recommend", "gpt2", "--scenario", "train_gpu_on", "--hardware", "a100-80gb")
    assert_one_line_error(code, out, err, "unknown scenario 'train_gpu_on'")
    assert "Did you mean: train_gpu_one" in err


@pytest.mark.parametrize("flags, fragment", [
    (["--weights-dtype", "fp8"], "weights_dtype"),
    (["--micro-batch-size", "0"], "micro_batch_size"),
    (["--optimizer", "adamw_hf"], "unknown optimizer 'adamw_hf'"),
    (["--weights-dtype", "nf4"], "needs LoRA"),
])
def test_bad_setup_flags_are_one_line_exit_2(capsys, flags, fragment):
    code, out, err = run(capsys, "estimate", "gpt2", *flags)
    assert_one_line_error(code, out, err, fragment)


def test_calibrate_is_wired(capsys):
    code, out, _ = run(capsys, "calibrate", "--help")
    assert code == 0 and "calibrate" in out


# --- real engine ------------------------------------------------------------------------------

def test_unknown_hardware_is_one_line_exit_2(capsys):
    code, out, err = run(capsys, "recommend", "gpt2", "--hardware", "a100-90gb")
    assert_one_line_error(code, out, err, "a100-90gb")


def test_probe_json_parses_as_hardware(capsys):
    code, out, _ = run(capsys, "probe", "--json")
    assert code == 0
    hw = Hardware.model_validate_json(out)
    assert hw.cpu.logical_cores == os.cpu_count()


def test_probe_and_env_text(capsys):
    code, out, _ = run(capsys, "probe")
    assert code == 0 and "- CPU:" in out and "- RAM:" in out
    code, out, _ = run(capsys, "env")
    assert code == 0 and out.startswith("Copy-and-paste")
    assert f"- Python: {sys.version.split()[0]}" in out
    import torch  # env imported it already, to name the accelerator torch was built for

    assert f"- torch: {torch.__version__}" in out and f"- transformers: {metadata.version('transformers')}" in out
    assert "- PyTorch accelerator: " in out


def test_recommend_json_round_trips(capsys):
    code, out, _ = run(capsys, "recommend", "gpt2", "--hardware", "a100-80gb", "--seq-len", "512", "--global-batch-size", "16", "--json")
    assert code == 0
    rec = Recommendation.model_validate_json(out)
    assert rec.request.seq_len == 512 and rec.setup.global_batch_size == 16
    assert json.loads(rec.to_json()) == json.loads(out)


def test_recommend_text_report(capsys):
    code, out, _ = run(capsys, "recommend", "gpt2", "--hardware", "a100-80gb", "--seq-len", "512")
    assert code == 0
    assert out.startswith("perfguide train_gpu_one: openai-community/gpt2 on a100-80gb")
    assert "Decisions" in out and "Memory per device" in out and "█" in out


def test_recommend_training_args_are_json(capsys):
    code, out, _ = run(capsys, "recommend", "gpt2", "--hardware", "a100-80gb", "--training-args")
    assert code == 0
    kwargs = json.loads(out)
    assert kwargs["per_device_train_batch_size"] >= 1


def test_estimate_json_has_the_memory_and_the_speed(capsys):
    import perfguide
    from perfguide.speed.types import SetupEstimate

    flags = ("--micro-batch-size", "2", "--seq-len", "256")
    code, out, _ = run(capsys, "estimate", "gpt2", "--hardware", "a100-80gb", *flags, "--json")
    assert code == 0
    got = SetupEstimate.model_validate_json(out)
    est = got.memory
    assert isinstance(est, MemoryEstimate)
    # gpt2 has 124,439,808 parameters; fp32 weights are 4 bytes each
    assert est.weights >= 124_439_808 * 4 and est.capacity is not None
    # the speed is the API's Throughput for the same Setup: 2 x 256 tokens per step on one GPU
    want = perfguide.estimate_speed("gpt2", {"micro_batch_size": 2, "seq_len": 256}, hardware="a100-80gb")
    assert got.speed == want
    assert got.speed.tokens_per_s == pytest.approx(2 * 256 / got.speed.step_time_s)
    assert 0 < got.speed.mfu < 1
    code, out, _ = run(capsys, "estimate", "gpt2", *flags, "--json")       # no hardware: no speed
    assert code == 0 and SetupEstimate.model_validate_json(out).speed is None


# --- subprocess smoke ---------------------------------------------------------------------------

@pytest.mark.slow
def test_python_dash_m_perfguide_help():
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "perfguide", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: perfguide" in done.stdout and "recommend" in done.stdout


def test_recommend_writes_plot_and_accelerate_config(capsys, tmp_path):
    import yaml

    png, config = tmp_path / "mem.png", tmp_path / "accelerate.yaml"
    code, out, err = run(capsys, "recommend", "gpt2", "--hardware", "a100-80gb", "--seq-len", "256",
                         "--plot", str(png), "--write-accelerate-config", str(config), "--json")
    assert code == 0
    Recommendation.model_validate_json(out)            # stdout stays pure JSON; file messages go to stderr
    assert str(png) in err and str(config) in err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert isinstance(yaml.safe_load(config.read_text()), dict)


def test_warnings_and_errors_from_a_command_are_one_stderr_line(capsys):
    import argparse
    import warnings

    from perfguide.cli import run_command

    def degraded(_args: argparse.Namespace) -> int:
        warnings.warn("probe degraded: NVML missing", UserWarning, stacklevel=1)
        return 0

    def failing(_args: argparse.Namespace) -> int:
        raise PerfGuideError("unknown thing 'x'. Accepted: a, b.")

    assert run_command(argparse.Namespace(func=degraded)) == 0
    assert capsys.readouterr().err == "warning: probe degraded: NVML missing\n"
    assert run_command(argparse.Namespace(func=failing)) == 2
    assert capsys.readouterr().err == "error: unknown thing 'x'. Accepted: a, b.\n"


@pytest.mark.slow
def test_a_reader_that_stops_early_gets_no_traceback():
    # `perfguide recommend ... --json | head -5`: head exits after 5 lines and the next write raises EPIPE; the
    # command must end quietly with the shell's status for a SIGPIPE'd writer (128 + 13), not print a traceback
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "perfguide", "recommend", "gpt2", "--hardware", "t4", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()                     # the reader is gone before the report is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
