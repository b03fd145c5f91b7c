"""CLI parity with the API: every Constraints field, request argument and Setup field is a flag; each recommend flag
reaches the plan; the exit statuses (3 when nothing fits), JSON errors, --write-configs and env are what the docs say.
Expected values come from the pydantic models and from the Python API called with the same arguments."""

from __future__ import annotations

import inspect
import json
import shlex
from importlib import metadata
from pathlib import Path

import pytest

from perfguide import Recommendation, recommend
from perfguide.cli import EXIT_NO_FIT, build_parser, main
from perfguide.scenarios.types import Constraints
from perfguide.setup import LoraSpec, Setup


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def options(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "==SUPPRESS==" and hasattr(a, "choices") and a.choices)
    return {o for action in sub.choices[command]._actions for o in action.option_strings}


def field_flags(model, skip=()) -> set[str]:
    """The flag each field should have: --name, nested models as --name-sub."""
    out = set()
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        nested = [a for a in getattr(field.annotation, "__args__", (field.annotation,)) if isinstance(a, type) and issubclass(a, (LoraSpec,))]
        subs = nested[0].model_fields if nested else {None: None}
        out |= {f"--{name}-{s}".replace("_", "-") if s else f"--{name}".replace("_", "-") for s in subs}
    return out


def test_every_constraint_and_request_argument_is_a_recommend_flag():
    have = options("recommend")
    assert field_flags(Constraints) <= have, field_flags(Constraints) - have
    arguments = [p for p in inspect.signature(recommend).parameters.values() if p.kind is not p.VAR_KEYWORD and p.name != "model"]
    wanted = {"--" + p.name.replace("_", "-") for p in arguments}
    assert wanted == {"--scenario", "--hardware", "--host-ram", "--seq-len", "--global-batch-size"} and wanted <= have


def test_every_setup_field_is_an_estimate_flag():
    have = options("estimate")
    wanted = field_flags(Setup, skip=("serving",))
    assert wanted <= have, wanted - have


# one value per Constraints field, checked against the plan the Python API makes from the same constraint
FLAG_CASES = [
    (["--precision", "fp16"], {"precision": "fp16"}),
    (["--optimizer", "adafactor"], {"optimizer": "adafactor"}),
    (["--finetune", "lora"], {"finetune": "lora"}),
    (["--lora-r", "8", "--lora-alpha", "16", "--lora-dropout", "0.1"], {"lora": {"r": 8, "alpha": 16, "dropout": 0.1}}),
    (["--lora-target-modules", "c_attn,c_proj"], {"lora": {"target_modules": ("c_attn", "c_proj")}}),
    (["--lora-use-dora", "--lora-use-rslora"], {"lora": {"use_dora": True, "use_rslora": True}}),
    (["--gradient-checkpointing"], {"gradient_checkpointing": True}),
    (["--no-gradient-checkpointing"], {"gradient_checkpointing": False}),
    (["--attn-implementation", "eager"], {"attn_implementation": "eager"}),
    (["--micro-batch-size", "2"], {"micro_batch_size": 2}),
    (["--headroom", "0.3"], {"headroom": 0.3}),
    (["--no-allow-offload"], {"allow_offload": False}),
    (["--from-scratch"], {"from_scratch": True}),
]
MANY_CASES = [
    (["--num-gpus", "4"], {"num_gpus": 4}),
    (["--strategy", "zero3"], {"strategy": "zero3"}),
    (["--nodes", "2"], {"nodes": 2}),
]
INFER_CASES = [
    (["--prompt-len", "128"], {"prompt_len": 128}),
    (["--max-new-tokens", "64"], {"max_new_tokens": 64}),
    (["--batch-size", "4"], {"batch_size": 4}),
    (["--quantization", "nf4"], {"quantization": "nf4"}),
    (["--prefer", "latency"], {"prefer": "latency"}),
]


def _same_plan(capsys, scenario, hardware, flags, constraints):
    code, out, _ = run(capsys, "recommend", "gpt2", "--scenario", scenario, "--hardware", hardware, "--seq-len", "256", *flags, "--json")
    assert code == 0
    got = Recommendation.model_validate_json(out)
    want = recommend("gpt2", scenario, hardware=hardware, seq_len=256, **constraints)
    assert got.request.constraints == want.request.constraints
    assert got.setup == want.setup
    return got


@pytest.mark.parametrize(("flags", "constraints"), FLAG_CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_training_flag_reaches_the_plan(capsys, flags, constraints):
    got = _same_plan(capsys, "train_gpu_one", "a100-80gb", flags, constraints)
    assert got.request.constraints != Constraints()  # the flag was not dropped


@pytest.mark.parametrize(("flags", "constraints"), MANY_CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_multi_gpu_flag_reaches_the_plan(capsys, flags, constraints):
    got = _same_plan(capsys, "train_gpu_many", "a100-80gb:8", flags, constraints)
    assert got.request.constraints != Constraints()


@pytest.mark.parametrize(("flags", "constraints"), INFER_CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_inference_flag_reaches_the_plan(capsys, flags, constraints):
    got = _same_plan(capsys, "infer_gpu_one", "l4", flags, constraints)
    assert got.request.constraints != Constraints()


def test_trust_remote_code_flag(capsys):
    args = build_parser().parse_args(["recommend", "gpt2", "--trust-remote-code"])
    assert args.trust_remote_code is True
    code, out, _ = run(capsys, "recommend", "gpt2", "--hardware", "a100-80gb", "--trust-remote-code", "--json")
    assert code == 0 and Recommendation.model_validate_json(out).request.constraints.trust_remote_code is True


def test_bad_constraint_value_is_the_apis_one_line_error(capsys):
    code, out, err = run(capsys, "recommend", "gpt2", "--hardware", "a100-80gb", "--headroom", "1.5")
    assert code == 2 and out == "" and err.startswith("error: ") and "headroom" in err and err.count("\n") == 1


# --- exit statuses and JSON errors -------------------------------------------------------------------------

def test_nothing_fits_exits_3_with_the_report(capsys):
    code, out, err = run(capsys, "recommend", "llama-3-70b", "--hardware", "t4", "--finetune", "full")
    assert code == EXIT_NO_FIT == 3
    assert "Nothing fits" in out and "nothing fits" in err
    code, out, _ = run(capsys, "recommend", "llama-3-70b", "--hardware", "t4", "--finetune", "full", "--json")
    assert code == 3 and Recommendation.model_validate_json(out).fits is False
    code, _, _ = run(capsys, "recommend", "gpt2", "--hardware", "a100-80gb")
    assert code == 0  # control: a plan that fits


def test_json_errors_are_a_json_object_on_stdout(capsys):
    code, out, err = run(capsys, "recommend", "gpt2", "--hardware", "a100-90gb", "--json")
    assert code == 2 and err.startswith("error: ")
    error = json.loads(out)["error"]
    assert error["type"] == "UnknownHardwareError" and "a100-90gb" in error["message"] and error["exit_code"] == 2
    code, out, _ = run(capsys, "recommend", "gpt2", "--lora-r", "x", "--json")
    assert code == 2 and json.loads(out)["error"]["type"] == "UsageError" and "--lora-r" in json.loads(out)["error"]["message"]
    code, out, _ = run(capsys, "estimate", "gpt2", "--weights-dtype", "nf4", "--json")
    assert code == 2 and "LoRA" in json.loads(out)["error"]["message"]
    code, out, _ = run(capsys, "recommend", "gpt2", "--hardware", "a100-90gb")
    assert code == 2 and out == ""  # without --json stdout stays empty


# --- --write-configs ---------------------------------------------------------------------------------------

def _launch_line(err: str) -> list[str]:
    line = next(l for l in err.splitlines() if l.startswith("launch with: "))
    return shlex.split(line.removeprefix("launch with: "))


def test_write_configs_writes_every_file_the_launch_command_names(capsys, tmp_path):
    out_dir = tmp_path / "cfg"
    argv = ("recommend", "llama-3-8b", "--scenario", "train_gpu_many", "--hardware", "a100-80gb:8", "--strategy", "zero3",
            "--write-configs", str(out_dir))
    code, _, err = run(capsys, *argv)
    assert code == 0
    argv_launch = _launch_line(err)
    named = [argv_launch[i + 1] for i, a in enumerate(argv_launch) if a in ("--config_file", "--deepspeed_config_file")]
    assert len(named) == 2 and all(Path(p).is_file() for p in named)
    rec = recommend("llama-3-8b", "train_gpu_many", hardware="a100-80gb:8", strategy="zero3")
    assert json.loads((out_dir / "training_args.json").read_text()) == json.loads(json.dumps(rec.training_args_dict()))
    assert json.loads((out_dir / "sft_config.json").read_text())["max_length"] == rec.setup.seq_len
    assert json.loads((out_dir / "accelerate_deepspeed.json").read_text()) == rec.deepspeed_config()
    # a second run keeps the files; --force replaces them
    (out_dir / "training_args.json").write_text("{}")
    code, _, err = run(capsys, *argv)
    assert code == 2 and "already exists" in err and "--force" in err
    assert (out_dir / "training_args.json").read_text() == "{}"
    code, _, _ = run(capsys, *argv, "--force")
    assert code == 0 and json.loads((out_dir / "training_args.json").read_text()) != {}


def test_write_accelerate_config_flag_refuses_to_overwrite(capsys, tmp_path):
    target = tmp_path / "accelerate.yaml"
    target.write_text("mine: true\n")
    code, _, err = run(capsys, "recommend", "gpt2", "--hardware", "a100-80gb", "--write-accelerate-config", str(target))
    assert code == 2 and "already exists" in err and target.read_text() == "mine: true\n"
    code, _, _ = run(capsys, "recommend", "gpt2", "--hardware", "a100-80gb", "--write-accelerate-config", str(target), "--force")
    assert code == 0 and "mine" not in target.read_text()


def test_sft_config_output_is_the_api_dict(capsys):
    code, out, _ = run(capsys, "recommend", "gpt2", "--hardware", "a100-80gb", "--seq-len", "512", "--sft-config")
    assert code == 0
    want = recommend("gpt2", hardware="a100-80gb", seq_len=512).sft_config_dict()
    assert json.loads(out) == json.loads(json.dumps(want))


# --- env -----------------------------------------------------------------------------------------------------

def test_env_reports_what_accelerate_and_transformers_env_do(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    code, out, _ = run(capsys, "env", "--json")
    info = json.loads(out)
    assert code == 0
    for lib in ("huggingface_hub", "safetensors", "numpy", "accelerate", "transformers", "trl", "peft"):
        assert info[lib] == metadata.version(lib)
    assert info["Accelerate default config"].startswith("not found")
    assert info["`accelerate` bash location"].endswith("accelerate")
    config = tmp_path / "accelerate" / "default_config.yaml"
    config.parent.mkdir()
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 4\n")
    code, out, _ = run(capsys, "env")
    line = next(l for l in out.splitlines() if l.startswith("- Accelerate default config: "))
    assert "distributed_type=MULTI_GPU" in line and "num_processes=4" in line and str(config) in line
