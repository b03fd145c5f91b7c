"""An MXFP4 checkpoint (gpt-oss) trains as the bf16 weights transformers dequantizes it to, as published gpt-oss
fine-tunes do (NVIDIA: "SFT on an upcasted BF16 version of the model"); it was refused as a quantized checkpoint."""

from __future__ import annotations

import pytest

import perfguide

GPT_OSS = "openai/gpt-oss-20b"


@pytest.fixture(scope="module")
def rec() -> perfguide.Recommendation:
    return perfguide.recommend(GPT_OSS, "train_gpu_one", hardware="h100-80gb", finetune="lora")


def test_the_plan_trains_bf16_weights_priced_at_two_bytes_a_parameter(rec: perfguide.Recommendation) -> None:
    params = perfguide.ModelSpec.from_any(GPT_OSS).total_params
    assert rec.fits and rec.setup.weights_dtype == "bf16" and rec.setup.lora is not None
    # by hand: every base weight in bf16 (2 B), not the checkpoint's ~4.25 bits of MXFP4 experts
    assert abs(rec.memory.weights - 2 * params) / (2 * params) < 0.05
    d = rec.decision("checkpoint_dequantize")
    assert d.value == "mxfp4 -> bf16" and d.source and "bf16" in d.reason


def test_model_kwargs_ask_transformers_to_dequantize(rec: perfguide.Recommendation) -> None:
    from transformers import Mxfp4Config

    qc = rec.model_kwargs()["quantization_config"]
    assert isinstance(qc, Mxfp4Config) and qc.dequantize is True


def test_serving_still_reads_the_checkpoint_as_mxfp4() -> None:
    served = perfguide.recommend(GPT_OSS, "infer_gpu_one", hardware="h100-80gb", engine="vllm")
    assert "mxfp4" in served.setup.label
    assert all(d.setting != "checkpoint_dequantize" for d in served.decisions)
