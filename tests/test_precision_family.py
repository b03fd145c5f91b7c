"""Precision by model family on GPUs without bf16 (issue 11, technique 12): one precision per plan.

bf16-trained Llama / Mistral / Qwen2 checkpoints fine-tune in fp16 AMP (with a warning); T5 and Gemma overflow
in fp16 and stay fp32 (refused when forced), each with its source. The decision, the Setup, ``model_kwargs``
and the 4-bit compute dtype of a plan always agree.
"""

from __future__ import annotations

import pytest

try:
    from helpers import one_line
except ImportError:  # run from the repo root
    from tests.helpers import one_line

import perfguide as pg
from perfguide.errors import ConflictingConstraintsError

torch = pytest.importorskip("torch")
_DTYPE = {"fp16": "float16", "no": "float32", "bf16": "bfloat16"}


def _agree(rec: pg.Recommendation) -> str:
    """The one precision of the plan, after checking every place that states it."""
    decided = rec.decision("mixed_precision").value
    assert (rec.setup.autocast or "no") == decided
    kw = rec.model_kwargs()
    assert kw["dtype"] is getattr(torch, _DTYPE[decided])
    assert kw["quantization_config"].bnb_4bit_compute_dtype is getattr(torch, _DTYPE[decided])
    assert rec.training_args_dict().get("fp16", False) == (decided == "fp16")
    return decided


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B", "mistralai/Mistral-7B-v0.1", "Qwen/Qwen2.5-7B"])
def test_bf16_trained_llama_family_trains_fp16_on_a_t4_with_a_warning(model):
    rec = pg.recommend(model, "train_gpu_one", hardware="t4", seq_len=512, finetune="qlora")
    assert rec.model.native_dtype == "bf16"
    assert _agree(rec) == "fp16"
    assert any("fp16 AMP" in w and "inf/NaN" in w for w in rec.warnings)


@pytest.mark.parametrize("model", ["google/gemma-2-2b", "t5-small"])
def test_families_that_overflow_stay_fp32_with_their_source(model):
    rec = pg.recommend(model, "train_gpu_one", hardware="t4", seq_len=512, finetune="qlora")
    assert _agree(rec) == "no"
    assert any("overflows" in w and ("transformers" in w) for w in rec.warnings)


def test_forced_fp16_is_refused_for_t5_and_allowed_for_llama():
    with pytest.raises(ConflictingConstraintsError) as exc:
        pg.recommend("t5-small", "train_gpu_one", hardware="t4", seq_len=512, finetune="qlora", precision="fp16")
    one_line(exc, "fp16", "#14189")
    rec = pg.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="t4", seq_len=512, finetune="qlora", precision="fp16")
    assert _agree(rec) == "fp16" and any("inf/NaN" in w for w in rec.warnings)


def test_fp16_lora_on_a_t4_is_many_times_faster_than_fp32():
    fp16 = pg.recommend("meta-llama/Llama-3.2-1B", "train_gpu_one", hardware="t4", seq_len=512, finetune="lora")
    fp32 = pg.recommend("meta-llama/Llama-3.2-1B", "train_gpu_one", hardware="t4", seq_len=512, finetune="lora", precision="fp32")
    assert (fp16.setup.autocast, fp32.setup.autocast) == ("fp16", None)
    # T4: 65 fp16 tensor-core TFLOP/s vs 8.1 fp32 (spec sheet): the plan's step must reflect most of that ratio
    assert fp32.throughput.step_time_s > 3 * fp16.throughput.step_time_s
