"""A forced constraint is honoured (warned where risky) or refused in one line saying why; never dropped or replaced.

The cases are issue 23's: switches forced on for a small model on an H100 (where the search alone would leave them
off), a forced inference quantization that does not fit, a node count said twice, and precisions that run (bf16
emulated on a T4, fp16 for a bf16-trained family: Unsloth's T4 notebooks) against one that cannot (a family that
overflows in fp16). Training and inference give one verdict on the same precision.
"""

from __future__ import annotations

import pytest
from helpers import one_line

from perfguide import recommend
from perfguide.errors import ConflictingConstraintsError


@pytest.mark.parametrize("switch,field,value", [
    ("fp8", "autocast", "fp8"),
    ("activation_offloading", "activation_offloading", True),
    ("optimizer_in_backward", "optimizer_in_backward", True),
])
def test_a_switch_forced_on_comes_back_on(switch: str, field: str, value: object) -> None:
    rec = recommend("gpt2", "train_gpu_one", hardware="h100-80gb", **{switch: True})
    assert getattr(rec.setup, field) == value and rec.fits


def test_a_switch_forced_off_stays_off() -> None:
    rec = recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="a100-80gb", liger_kernel=False, seq_len=2048,
                    global_batch_size=16)
    assert rec.setup.liger_kernel is False


def test_a_switch_that_cannot_run_is_refused_in_one_line() -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:       # Liger has no GPT-2 kernels
        recommend("gpt2", "train_gpu_one", hardware="h100-80gb", liger_kernel=True)
    one_line(exc, "liger_kernel=True", "gpt2")
    with pytest.raises(ConflictingConstraintsError) as exc:       # stepping inside backward is one process only
        recommend("gpt2", "train_gpu_many", hardware="h100-80gb:2", optimizer_in_backward=True)
    one_line(exc, "optimizer_in_backward=True")


def test_forced_int8_inference_is_never_swapped_for_offloaded_16_bit() -> None:
    """70B in int8 is ~70 GB: it cannot fit a 24 GB card; the plan says so instead of loading bf16 + CPU offload."""
    rec = recommend("meta-llama/Llama-3.1-70B", "infer_gpu_one", hardware="rtx4090", quantization="int8")
    assert rec.setup.weights_dtype == "int8" and not rec.setup.offload_params and not rec.fits
    assert rec.memory.device_total > 0.9 * 70e9


def test_nodes_said_twice_must_agree() -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="a100-80gb:8x2", nodes=4)
    one_line(exc, "nodes=4", "a100-80gb:8x4")
    rec = recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="a100-80gb:8", nodes=4)
    assert rec.setup.nodes == 4 and "a100-80gb:8x4" in rec.report().splitlines()[0]


def test_fp16_lora_of_phi3_on_a_t4_is_honoured() -> None:
    """Unsloth's free-Colab notebooks fine-tune Phi-3 mini on a T4 (no bf16) in fp16 AMP."""
    rec = recommend("microsoft/Phi-3-mini-4k-instruct", "train_gpu_one", hardware="t4", precision="fp16", finetune="lora")
    assert rec.setup.autocast == "fp16" and rec.setup.lora is not None
    assert any("precision='fp16' is honoured" in w for w in rec.warnings)


@pytest.mark.parametrize("scenario", ["train_gpu_one", "infer_gpu_one"])
def test_one_verdict_on_fp16_for_a_family_that_overflows(scenario: str) -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("google/gemma-2-2b", scenario, hardware="t4", precision="fp16")
    one_line(exc, "precision='fp16'", "overflows")
