"""torch.compile in the training plan (issue 11 item 9): the per-step gain against the one-off compile time, weighed on
the run's length (max_steps): a short run loses, a long one pays; both totals are in the decision."""

from __future__ import annotations

import re

import pytest

import perfguide as pg
from perfguide.techniques.torch_compile import compile_seconds

MODEL, HW = "meta-llama/Llama-3.2-1B", "h100-80gb"


def _decision(rec):
    return next(d for d in rec.decisions if d.setting == "torch_compile")


def test_short_run_compile_loses_and_says_both_totals():
    rec = pg.recommend(MODEL, scenario="train_gpu_one", hardware=HW, max_steps=5)
    d = _decision(rec)
    assert d.value is False and not rec.setup.torch_compile and "short run: compile loses" in d.reason
    eager, compiled = rec.throughput.step_time_s, d.alternatives[0].number
    once = compile_seconds(rec.model, rec.setup.replace(torch_compile=True))
    assert d.number == pytest.approx(once)
    totals = [float(x.replace(",", "")) for x in re.findall(r"([\d,]+) s (?:eager|compiled)", d.reason)]
    assert totals == pytest.approx([round(5 * eager), round(once + 5 * compiled)], abs=1)


def test_long_run_compiles_and_emits_the_trainer_flag():
    # precision pinned: only compile changes (test_compiled_plan_compares_fp8_again covers fp8 once compiled)
    rec = pg.recommend(MODEL, scenario="train_gpu_one", hardware=HW, max_steps=100_000, precision="bf16")
    d = _decision(rec)
    assert d.value is True and rec.setup.torch_compile and "compile pays" in d.reason
    assert rec.training_args_dict()["torch_compile"] is True
    eager = d.alternatives[0].number
    assert eager > rec.throughput.step_time_s                     # compiled steps are faster
    breakeven = d.number / (eager - rec.throughput.step_time_s)
    assert f"pays after {breakeven:,.0f} steps" in d.reason


def test_unknown_run_length_keeps_the_default_and_says_when_it_would_pay():
    rec = pg.recommend(MODEL, scenario="train_gpu_one", hardware=HW)
    d = _decision(rec)
    assert d.value is False and "max_steps" in d.reason and "pays after" in d.reason
    assert "PyTorch 2" in d.source


def test_requested_compile_is_honoured():
    rec = pg.recommend(MODEL, scenario="train_gpu_one", hardware=HW, torch_compile=True, max_steps=5)
    assert rec.setup.torch_compile and _decision(rec).value is True


def test_training_arguments_accept_it(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), torch_compile=True, use_cpu=True)
    assert args.torch_compile and args.torch_compile_backend == "inductor"


def test_max_steps_refused_for_inference():
    with pytest.raises(pg.PerfGuideError, match="max_steps"):
        pg.recommend(MODEL, scenario="infer_gpu_one", hardware=HW, max_steps=10)


def test_compiled_plan_compares_fp8_again_with_fused_casts():
    """The search priced fp8 with eager casts; once compiled, fp8 and bf16 are compared again (8B on 8 H100s, two
    sequences per GPU without accumulation: under FSDP2 accumulation holds unsharded gradients, which leaves fp8's
    casts no room at the default global batch)."""
    kw = dict(scenario="train_gpu_many", hardware="h100-80gb:8", max_steps=100_000, global_batch_size=16)
    rec = pg.recommend("meta-llama/Llama-3.1-8B", **kw)
    assert rec.setup.torch_compile and rec.setup.autocast == "fp8" and "fuses fp8's scaling casts" in _decision(rec).reason
    bf16 = pg.recommend("meta-llama/Llama-3.1-8B", fp8=False, **kw)
    assert bf16.setup.torch_compile and bf16.setup.autocast == "bf16" and rec.throughput.step_time_s < bf16.throughput.step_time_s
    assert pg.recommend("meta-llama/Llama-3.1-8B", precision="bf16", **kw).setup.autocast == "bf16"


def test_forced_fp8_is_kept_or_refused_never_replaced():
    """fp8=True is never carried into a DeepSpeed layout as bf16: DeepSpeed layouts are 'not offered' for it."""
    rec = pg.recommend("meta-llama/Llama-3.1-8B", scenario="train_gpu_many", hardware="h100-80gb:8", fp8=True)
    assert rec.setup.autocast == "fp8" and not rec.setup.is_deepspeed
    backend = next(d for d in rec.decisions if d.setting == "sharding_backend")
    assert all("not offered" in a.why_not and "DeepSpeed" in a.why_not for a in backend.alternatives if a.value.startswith("zero"))
    with pytest.raises(pg.ConflictingConstraintsError, match="fp8"):
        pg.recommend("meta-llama/Llama-3.1-8B", scenario="train_gpu_many", hardware="h100-80gb:8", fp8=True, strategy="zero3")
