"""Properties over model sizes x hardware x scenarios (hypothesis).

For any request built from the documented inputs, recommend():
- raises nothing but PerfGuideError subclasses (documented, one-line errors);
- keeps the global batch: micro x accumulation x world / sequence split == global_batch_size for training;
- answers fits=True only when the predicted device total is within the usable memory (capacity less the
  headroom), otherwise says fits=False;
- is deterministic: the same request gives the same to_json().
And estimate() never predicts less memory for a larger micro-batch or a longer sequence.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from perfguide import CPU, GPU, SCENARIOS, Hardware, PerfGuideError, Setup, estimate, recommend
from perfguide.hardware.named import known_names
from perfguide.model.catalog import catalog_names

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub from property runs

SIZES = ("125m", "350m", "760m", "1.3b", "3b", "7b", "13b", "30b", "70b")
CATALOG = tuple(n for n in catalog_names())
GPU_NAMES = tuple(n for n in known_names() if n != "cpu")
FAST = settings(max_examples=50, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@st.composite
def requests(draw: st.DrawFn) -> dict:
    scenario = draw(st.sampled_from(SCENARIOS))
    model = draw(st.sampled_from(SIZES) | st.sampled_from(CATALOG))
    if scenario.endswith("cpu"):
        hardware = "cpu"
    elif scenario.endswith("many"):
        hardware = f"{draw(st.sampled_from(GPU_NAMES))}:{draw(st.sampled_from([2, 4, 8]))}"
        if scenario.startswith("train") and draw(st.booleans()):
            hardware += f"x{draw(st.sampled_from([2, 4]))}"
    else:
        hardware = draw(st.sampled_from(GPU_NAMES))
    kw: dict = {"seq_len": draw(st.sampled_from([64, 256, 512, 1024]))}
    if scenario.startswith("train"):
        kw["global_batch_size"] = draw(st.sampled_from([1, 2, 8, 16, 32, 64, 96]))
        kw.update(draw(st.fixed_dictionaries({}, optional={
            "precision": st.sampled_from(["bf16", "fp16", "fp32"]),
            "finetune": st.sampled_from(["full", "lora", "qlora"]),
            "gradient_checkpointing": st.booleans(),
            "allow_offload": st.booleans(),
            "headroom": st.sampled_from([0.0, 0.1, 0.3]),
        })))
    else:
        kw.update(draw(st.fixed_dictionaries({}, optional={
            "batch_size": st.sampled_from([1, 4, 32]),
            "max_new_tokens": st.sampled_from([1, 64, 512]),
            "prefer": st.sampled_from(["latency", "throughput"]),
            "precision": st.sampled_from(["bf16", "fp16", "fp32"]),
            "quantization": st.sampled_from(["int8", "nf4"]),
            "allow_offload": st.booleans(),
        })))
    return {"model": model, "scenario": scenario, "hardware": hardware, **kw}


def _recommend(req: dict):
    """recommend(), with the documented errors mapped to None; anything else propagates and fails the test."""
    try:
        return recommend(**req)
    except PerfGuideError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg, msg  # documented errors are one line
        return None


@FAST
@given(requests())
def test_recommend_keeps_its_promises(req: dict) -> None:
    rec = _recommend(req)
    if rec is None:
        return
    s, mem, cons = rec.setup, rec.memory, rec.request.constraints
    if req["scenario"].startswith("train"):
        # transformers Trainer.get_total_train_batch_size: micro x accumulation x world / sequence-parallel size
        assert s.micro_batch_size * s.gradient_accumulation_steps * s.world_size == req["global_batch_size"] * s.sequence_parallel
        assert s.global_batch_size == req["global_batch_size"]
        if req["scenario"] == "train_gpu_many":
            assert s.world_size == rec.hardware.gpu_count * rec.hardware.nodes
    if rec.fits:
        assert mem.capacity is not None
        assert mem.needed <= int(mem.capacity * (1 - cons.headroom)) + 1, (mem.needed, mem.capacity)
    else:
        assert rec.suggestions, "a plan that does not fit says what would"
    assert s.device == ("cpu" if req["scenario"].endswith("cpu") else "cuda")


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_recommend_is_deterministic(req: dict) -> None:
    first = _recommend(req)
    assume(first is not None)
    assert _recommend(req).to_json() == first.to_json()


@st.composite
def setups(draw: st.DrawFn) -> tuple[str, Setup, str | None]:
    """A hand-written Setup (what users pass to estimate) for a size, with or without hardware."""
    task = draw(st.sampled_from(["train", "infer"]))
    device = draw(st.sampled_from(["cuda", "cpu"]))
    fields: dict = {"task": task, "device": device}
    lora = draw(st.booleans()) if task == "train" else False
    dtypes = ["fp32", "bf16", "fp16"] + (["int8", "nf4"] if lora or task == "infer" else [])
    fields["weights_dtype"] = draw(st.sampled_from(dtypes))
    if task == "train":
        fields["autocast"] = draw(st.sampled_from([None, "bf16"] + ([] if device == "cpu" else ["fp16"])))
        fields["optimizer"] = draw(st.sampled_from(["adamw_torch_fused", "adamw_bnb_8bit", "adafactor", "sgd"]))
        fields["gradient_checkpointing"] = draw(st.booleans())
        if lora:
            fields["lora"] = {"r": draw(st.sampled_from([4, 16, 64]))}
        if device == "cuda":
            strategy = draw(st.sampled_from(["single", "ddp", "fsdp", "zero2", "zero3"]))
            fields["strategy"] = strategy
            fields["num_gpus"] = 1 if strategy == "single" else draw(st.sampled_from([2, 8]))
            fields["offload_optimizer"] = strategy in ("zero2", "zero3") and draw(st.booleans())
    else:
        fields["new_tokens"] = draw(st.sampled_from([0, 16, 256]))
        fields["cache_implementation"] = draw(st.sampled_from(["dynamic", "static"]))
    fields["attn_implementation"] = draw(st.sampled_from(["sdpa", "eager"]))
    model = draw(st.sampled_from(SIZES[:6]) | st.sampled_from(CATALOG))
    hardware = None if device == "cpu" else draw(st.none() | st.just(f"a100-80gb:{fields.get('num_gpus', 1)}"))
    return model, Setup(**fields), hardware


def _estimate(model: str, setup: Setup, hardware: str | None, **update: int):
    return estimate(model, setup.model_copy(update=update), hardware=hardware)


@FAST
@given(setups(), st.integers(1, 16), st.integers(1, 16))
def test_memory_is_monotone_in_micro_batch(case: tuple, micro: int, more: int) -> None:
    model, setup, hardware = case
    try:
        small = _estimate(model, setup, hardware, micro_batch_size=micro, seq_len=256)
    except PerfGuideError:
        return
    big = _estimate(model, setup, hardware, micro_batch_size=micro + more, seq_len=256)
    for field in ("peak_allocated", "peak_reserved", "device_total", "activations"):
        assert getattr(big, field) >= getattr(small, field), field


@FAST
@given(setups(), st.sampled_from([16, 64, 128, 256, 512]), st.sampled_from([1, 7, 64, 512, 1536]))
def test_memory_is_monotone_in_sequence_length(case: tuple, seq: int, more: int) -> None:
    model, setup, hardware = case
    try:
        short = _estimate(model, setup, hardware, micro_batch_size=2, seq_len=seq)
    except PerfGuideError:
        return
    long = _estimate(model, setup, hardware, micro_batch_size=2, seq_len=seq + more)
    for field in ("peak_allocated", "peak_reserved", "device_total", "activations", "kv_cache"):
        assert getattr(long, field) >= getattr(short, field), field


@FAST
@given(setups())
def test_estimate_is_deterministic_and_consistent(case: tuple) -> None:
    model, setup, hardware = case
    try:
        first = estimate(model, setup, hardware=hardware)
    except PerfGuideError:
        return
    assert estimate(model, setup, hardware=hardware).to_json() == first.to_json()
    assert first.peak_allocated <= first.peak_reserved <= first.device_total
    if first.capacity is not None:
        assert first.fits == (first.needed <= first.capacity)


# --- machines nobody named: mixed, unknown, busy, probed GPUs ------------------------------------------

_GPU = st.builds(
    lambda name, gib, free, cc, tflops: GPU(
        name=name, memory_total=gib * 2**30, memory_free=int(gib * 2**30 * free), compute_capability=cc,
        bf16_tflops=tflops, fp16_tflops=tflops, tf32_tflops=tflops, fp32_tflops=tflops and tflops / 8,
        memory_bandwidth_gbps=tflops and tflops * 6),
    st.sampled_from(["NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA Imaginary X1"]), st.sampled_from([4, 16, 24, 40, 80, 141]),
    st.sampled_from([0.05, 0.5, 1.0]), st.sampled_from([(6, 0), (7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0)]),
    st.none() | st.sampled_from([8.0, 65.0, 312.0, 989.0]))
_MACHINE = st.builds(
    lambda gpus, source, link: Hardware(gpus=tuple(g.model_copy(update={"index": i}) for i, g in enumerate(gpus)),
                                        cpu=CPU(physical_cores=16, logical_cores=32, ram_total=256 * 2**30, ram_available=200 * 2**30),
                                        source=source, interconnect=link if len(gpus) > 1 else "none"),
    st.lists(_GPU, min_size=1, max_size=4), st.sampled_from(["probe", "named"]), st.sampled_from(["nvlink", "pcie"]))


@FAST
@given(_MACHINE, st.sampled_from(SCENARIOS), st.sampled_from(SIZES[:7]), st.sampled_from([None, 8, 16, 48]))
def test_any_machine_plans_for_its_smallest_gpu(hw: Hardware, scenario: str, model: str, gbs: int | None) -> None:
    rec = _recommend({"model": model, "scenario": scenario, "hardware": hw, "seq_len": 512,
                      "global_batch_size": gbs if scenario.startswith("train") else None})
    if rec is None:
        return
    if scenario.startswith("train"):
        assert rec.setup.global_batch_size == (gbs or rec.setup.global_batch_size)
    if rec.setup.device == "cuda":
        small = hw.smallest_gpu
        # every rank must fit the smallest card, and on a probed machine the one with the least free memory (0 free: full)
        expected = min(small.memory_total, *(g.memory_free for g in hw.gpus)) if hw.source == "probe" else small.memory_total
        assert rec.memory.capacity == expected
        if rec.fits:
            assert rec.memory.needed <= expected * (1 - rec.request.constraints.headroom) + 1
        assert rec.setup.autocast != "bf16" or small.compute_capability >= (8, 0)


# --- garbage in: only documented errors out ------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
_NAME_PARTS = st.sampled_from([*GPU_NAMES, "cpu", "a100", "h100", "v100", "x", ""])


@FAST
@given(st.one_of(_TEXT, st.builds(lambda n, c: f"{n}:{c}", _NAME_PARTS, _TEXT)))
def test_any_hardware_string_is_a_target_or_a_one_line_error(name: str) -> None:
    from perfguide import Hardware
    from perfguide.errors import UnknownHardwareError

    try:
        hw = Hardware.from_name(name)
    except UnknownHardwareError as exc:
        assert ("\n" not in str(exc) and repr(name.strip()) in str(exc)) or "hardware" in str(exc)
        return
    assert hw.gpu_count >= 1 or hw.name == "cpu"


@FAST
@given(model=_TEXT, scenario=st.sampled_from(SCENARIOS) | _TEXT,
       seq_len=st.none() | st.integers(-5, 20_000_000), gbs=st.none() | st.integers(-5, 2_000_000))
def test_garbage_requests_raise_only_documented_errors(model: str, scenario: str, seq_len: int | None, gbs: int | None) -> None:
    _recommend({"model": model, "scenario": scenario, "hardware": "a100-80gb:2", "seq_len": seq_len, "global_batch_size": gbs})


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_is_implemented(scenario: str) -> None:
    hardware = "cpu" if scenario.endswith("cpu") else ("a100-80gb:8" if scenario.endswith("many") else "a100-80gb")
    rec = recommend("125m", scenario, hardware=hardware, seq_len=256, global_batch_size=16 if scenario.startswith("train") else None)
    assert rec.fits and rec.decisions
