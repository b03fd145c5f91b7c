"""API-level behaviour that needs no other engine part: import weight, Setup parsing, input errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

import perfguide
from perfguide.errors import InvalidSetupError, PerfGuideError, UnknownScenarioError


def test_import_does_not_pull_heavy_libraries():
    code = (
        "import sys, perfguide; heavy = [m for m in ('torch', 'transformers', 'accelerate', 'bitsandbytes',"
        " 'deepspeed', 'peft', 'rich', 'matplotlib') if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_setup_dict_defaults_and_global_batch():
    s = perfguide.Setup.parse({"micro_batch_size": 4, "gradient_accumulation_steps": 8, "num_gpus": 2})
    assert s.global_batch_size == 4 * 8 * 2
    assert s.task == "train" and s.strategy == "single"


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ({"micro_batch": 4}, "did you mean: micro_batch_size"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"micro_batch_size": -3}, "micro_batch_size"),
        ({"weights_dtype": "fp8"}, "weights_dtype"),
        ({"optimizer": "adamw_hf"}, "unknown optimizer 'adamw_hf'"),
        ({"strategy": "zero4"}, "strategy"),
        ({"weights_dtype": "nf4"}, "needs lora"),
        ({"device": "cpu", "autocast": "fp16"}, "fp16 autocast does nothing on cpu"),
    ],
)
def test_setup_bad_values_give_one_line_errors(bad, fragment):
    with pytest.raises(InvalidSetupError) as info:
        perfguide.Setup.parse(bad)
    message = str(info.value)
    assert "\n" not in message
    assert fragment in message.lower()


def test_setup_must_be_dict_or_setup():
    with pytest.raises(InvalidSetupError, match="must be a perfguide.Setup or a dict"):
        perfguide.Setup.parse([1, 2])


def test_a_bare_serving_setup_says_how_to_wrap_it():
    from perfguide.setup import ServingSetup

    with pytest.raises(InvalidSetupError, match=r"wrap it: Setup\(task='infer', device='cuda', serving="):
        perfguide.estimate("gpt2", ServingSetup(engine="vllm"), hardware="a100-80gb")


def test_unknown_scenario_suggests_the_close_one():
    with pytest.raises(UnknownScenarioError, match="Did you mean: train_gpu_one"):
        perfguide.recommend("gpt2", scenario="train_gpu_on", hardware="a100-80gb")


@pytest.mark.parametrize("kwargs", [{"seq_len": 0}, {"seq_len": -5}, {"global_batch_size": 0}, {"global_batch_size": 2.5}])
def test_negative_or_zero_sizes_are_rejected(kwargs):
    with pytest.raises(PerfGuideError, match="must be a positive integer"):
        perfguide.recommend("gpt2", scenario="train_gpu_one", hardware="a100-80gb", **kwargs)


def test_unknown_constraint_is_named():
    with pytest.raises(PerfGuideError, match="unknown constraint 'precison'.*precision"):
        perfguide.recommend("gpt2", scenario="train_gpu_one", hardware="a100-80gb", precison="bf16")


def test_results_round_trip_json():
    s = perfguide.Setup(micro_batch_size=2, lora={"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]})
    assert perfguide.Setup.model_validate_json(s.to_json()) == s


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ({"offload_params": True}, "offload_params needs strategy"),
        ({"offload_params": True, "strategy": "zero2"}, "offload_params needs strategy"),
        ({"offload_optimizer": True, "strategy": "ddp"}, "offload_optimizer needs a sharded strategy"),
    ],
)
def test_offload_needs_a_strategy_that_can_offload(bad, fragment):
    with pytest.raises(InvalidSetupError, match=fragment):
        perfguide.Setup.parse(bad)
