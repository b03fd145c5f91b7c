"""Odd machines and impossible requests: a model that fits nowhere gets an answer (fits=False + what would fit),
not an error, and a probed machine's quirks (mixed GPUs, MIG slices, hidden or failing GPUs, busy memory) decide the plan.

Probe faults are injected at the NVML boundary with tests/test_probe.py's FakeNVML (the one allowed mock),
then the whole public path (``recommend(hardware=None)``) runs on what the fake machine reports.
"""

from __future__ import annotations

import warnings

import pytest
import test_probe
from helpers import one_line
from test_probe import MIB, a100, mig_a100, t4

import perfguide
from perfguide import recommend
from perfguide.errors import ConflictingConstraintsError, WrongMachineError
from perfguide.hardware.probe import ProbeWarning

fake = test_probe.fake  # the fixture, requested by name as a test argument (an import would read as unused)


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")



# --- fits nowhere: an answer, not an exception ------------------------------------------------------

@pytest.mark.parametrize(("model", "scenario", "hw", "kw"), [
    ("70b", "train_gpu_one", "t4", {}), ("70b", "train_gpu_one", "a100-80gb", {}), ("70b", "train_cpu", "cpu", {}),
    ("gpt2", "train_gpu_one", "a100", {"headroom": 0.99}),
])
def test_model_that_fits_nowhere_gets_suggestions(model: str, scenario: str, hw: str, kw: dict) -> None:
    rec = recommend(model, scenario, hardware=hw, allow_offload=False, **kw)
    assert not rec.fits and rec.suggestions
    assert all(isinstance(s, str) and "\n" not in s for s in rec.suggestions)
    assert rec.memory.needed > int(rec.memory.capacity * (1 - rec.request.constraints.headroom))
    rec.report()  # the report renders a does-not-fit plan too


def test_70b_on_one_a100_suggests_what_would_fit() -> None:
    rec = recommend("70b", hardware="a100-80gb", allow_offload=False)
    assert not rec.fits
    text = " ".join(rec.suggestions)
    assert "qlora" in text and "train_gpu_many" in text


def test_inference_that_fits_nowhere() -> None:
    rec = recommend("70b", "infer_gpu_one", hardware="t4", allow_offload=False)
    assert not rec.fits and rec.suggestions


# --- probe faults, end to end ---------------------------------------------------------------------

def _probe_recommend(scenario: str = "train_gpu_one", model: str = "125m", **kw: object) -> perfguide.Recommendation:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProbeWarning)
        return recommend(model, scenario, hardware=None, seq_len=512, global_batch_size=8, **kw)


def test_recommend_on_a_mixed_box_plans_for_the_smallest_gpu(fake) -> None:
    fake([a100(0), t4(1)])
    rec = _probe_recommend()
    assert rec.hardware.gpu_count == 2 and rec.hardware.source == "probe"
    # every rank must fit the T4: its 15360 MiB, and its precision (cc 7.5: fp16 autocast, no bf16, no TF32)
    assert rec.memory.capacity == 15360 * MIB
    assert rec.setup.autocast == "fp16" and not rec.setup.tf32
    rec_a100 = recommend("125m", hardware="a100-80gb", seq_len=512, global_batch_size=8)
    assert rec_a100.setup.autocast == "bf16"  # the same request on the A100 alone would pick bf16


def test_recommend_on_a_mixed_box_does_not_promise_the_big_gpu(fake) -> None:
    fake([a100(0), t4(1)])
    rec = _probe_recommend(model="7b", allow_offload=False, finetune="full")
    assert rec.memory.capacity == 15360 * MIB
    assert not rec.fits or rec.memory.needed <= 15360 * MIB


def test_recommend_on_a_mig_slice(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    fake([mig_a100()])
    rec = _probe_recommend()
    assert rec.memory.capacity == 4864 * MIB  # the 1g.5gb slice is the smallest device
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-aaaa")
    rec = _probe_recommend()
    assert rec.hardware.gpu_count == 1 and rec.memory.capacity == 19968 * MIB and rec.setup.autocast == "bf16"


def test_recommend_with_visible_uuid_picks_that_gpu(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    fake([t4(0), a100(1)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a100000")
    rec = _probe_recommend()
    assert rec.memory.capacity == 81920 * MIB and rec.setup.autocast == "bf16"


@pytest.mark.parametrize("value", ["", "-1"])
def test_recommend_with_every_gpu_hidden(fake, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    fake([a100(0)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    with pytest.raises(WrongMachineError) as exc:
        _probe_recommend()
    one_line(exc, "train_cpu")
    assert _probe_recommend("train_cpu").setup.device == "cpu"


@pytest.mark.parametrize("kw", [{"init_error": RuntimeError("NVML Shared Library Not Found")}, {"count_error": True}])
def test_recommend_when_nvml_fails_plans_cpu_only(fake, kw: dict) -> None:
    fake([a100(0)], **kw)
    with pytest.warns(ProbeWarning):
        hw = perfguide.probe()
    assert not hw.has_gpu
    assert _probe_recommend("infer_cpu").setup.device == "cpu"


def test_recommend_when_one_gpu_errors_on_queries(fake) -> None:
    fake([a100(0, fail={"handle"}), t4(1, fail={"memory", "cc"})])
    rec = _probe_recommend()
    # the A100 cannot be opened and is left out; the T4 falls back to its spec sheet (16 GB board, 15360 MiB, of which
    # CUDA can allocate the 14.56 GiB torch prints as its total capacity)
    assert rec.hardware.gpu_count == 1 and rec.memory.capacity == round(14.56 * 2**30) and rec.setup.autocast == "fp16"
    assert any("could not be read" in w for w in rec.hardware.warnings)


def test_busy_gpu_counts_only_its_free_memory_in_every_scenario(fake) -> None:
    fake([a100(0, free_mib=1000)])  # another job holds all but 1000 MiB
    for scenario in ("train_gpu_one", "infer_gpu_one", "infer_gpu_many"):
        rec = _probe_recommend(scenario)
        assert rec.memory.capacity == 1000 * MIB, scenario
        assert not rec.fits or rec.memory.needed <= 0.9 * 1000 * MIB, scenario


def test_cpu_training_on_a_box_with_a_busy_gpu_plans_for_ram(fake) -> None:
    fake([a100(0, free_mib=1000)])
    rec = _probe_recommend("train_cpu")
    assert rec.setup.device == "cpu" and rec.memory.capacity == rec.hardware.cpu.ram_available
    assert rec.fits and rec.memory.device_total > 1000 * MIB  # judged against RAM, not the GPU's free 1000 MiB


def test_70b_on_a_t4_names_a_gpu_where_qlora_fits() -> None:
    rec = recommend("70b", hardware="t4")
    assert not rec.fits
    (hint,) = [s for s in rec.suggestions if "finetune='qlora' on hardware=" in s]
    name = hint.split("hardware='")[1].split("'")[0]
    check = recommend("70b", hardware=name, finetune="qlora")  # the suggestion holds when followed
    assert check.fits and check.setup.weights_dtype == "nf4"


# --- MIG slices: one CUDA process sees one slice; only independent replicas span several ------------

def test_training_across_mig_slices_is_refused(fake) -> None:
    fake([mig_a100()])
    with pytest.raises(ConflictingConstraintsError) as exc:
        _probe_recommend("train_gpu_many")
    one_line(exc, "MIG", "train_gpu_one", "CUDA_VISIBLE_DEVICES=MIG-")


def test_serving_across_mig_slices_uses_replicas_only(fake) -> None:
    fake([mig_a100()])
    rec = _probe_recommend("infer_gpu_many", model="125m")
    assert rec.setup.strategy == "single" and rec.setup.num_gpus == 2
    assert all(c.setup.strategy == "single" for c in rec.candidates)
    big = _probe_recommend("infer_gpu_many", model="7b")  # 13.5 GB of bf16 weights: no slice holds it, no split either
    assert big.setup.num_gpus == 1 or big.setup.strategy == "single"  # replicas, or one slice offloading to RAM
    with pytest.raises(ConflictingConstraintsError) as exc:
        _probe_recommend("infer_gpu_many", strategy="tp")
    one_line(exc, "'tp'", "MIG", "strategy='single'")


@pytest.mark.parametrize(("hw", "world"), [("a100:6", 6), ("a100:7x3", 21), ("a100:8", 8), ("a100:16x4", 64)])
def test_default_global_batch_splits_over_any_world_size(hw: str, world: int) -> None:
    """Without global_batch_size the default (32) is rounded up to the world size instead of raising."""
    rec = recommend("125m", "train_gpu_many", hardware=hw, seq_len=256)
    assert rec.setup.world_size == world
    assert rec.setup.global_batch_size == -(-32 // world) * world
    with pytest.raises(ConflictingConstraintsError) as exc:  # an explicit batch that cannot split is still an error
        recommend("125m", "train_gpu_many", hardware=hw, seq_len=256, global_batch_size=world + 1)
    one_line(exc, f"global_batch_size={world + 1}")



def test_serving_that_fits_nowhere_names_the_limit_and_a_gpu_that_holds_it() -> None:
    rec = recommend("70b", "infer_gpu_one", hardware="t4", allow_offload=False)
    assert not rec.fits
    first, *rest = rec.suggestions
    assert "per GPU" in first and "is usable" in first
    (hint,) = [s for s in rest if "holds it on one GPU" in s]
    name = hint.split("hardware='")[1].split("'")[0]
    assert recommend("70b", "infer_gpu_one", hardware=name, allow_offload=False).fits  # the hint holds when followed
    assert any("allow_offload=True" in s for s in rest)


def test_serving_no_fit_hints_only_what_still_applies() -> None:
    rec = recommend("100t", "infer_gpu_many", hardware="h100:8")  # offload is on and the box has 8 GPUs already
    assert not rec.fits and "CPU RAM" in rec.suggestions[0]
    assert not any("allow_offload=True" in s or "scenario='infer_gpu_many'" in s for s in rec.suggestions)
    rec = recommend("999t", "infer_cpu", hardware="cpu")
    assert not rec.fits and "of RAM" in rec.suggestions[0] and "infer_gpu_one" in rec.suggestions[-1]
