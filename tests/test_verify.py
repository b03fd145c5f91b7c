"""verify(), PerfGuideCallback, calibration and the real-device batch finder, on this CPU machine."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from helpers import TINY_LLAMA, hardware, tiny_model, token_dataset

import perfguide
from perfguide.calibrate import Factors, factors, record
from perfguide.integrations.callback import PerfGuideCallback
from perfguide.measure.batch_finder import find_micro_batch, torch_try_step

SEQ = 32


@pytest.fixture(scope="module")
def rec():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no NVIDIA driver here: the probe warns and plans CPU-only
        return perfguide.recommend({"model_type": "llama", **TINY_LLAMA}, scenario="train_cpu", seq_len=SEQ, global_batch_size=4)


def test_verify_returns_real_measurements(rec):
    result = perfguide.verify(tiny_model(), rec, steps=3)
    m = result.measured
    assert m is not None and m.device == "cpu" and m.steps == 3
    assert m.step_time_s > 0 and m.tokens_per_s > 0
    assert m.rss_peak >= m.rss_baseline > 0
    names = {c.quantity for c in result.comparisons}
    assert "step_time_s" in names
    # comparisons are measured / predicted, computed from the numbers they carry
    for c in result.comparisons:
        assert c.ratio == pytest.approx(c.measured / c.predicted)


def test_callback_logs_predicted_and_measured_inside_trainer(rec, tmp_path, caplog):
    from transformers import Trainer

    cb = PerfGuideCallback(rec, measure_after_steps=2)
    args = rec.training_args(output_dir=str(tmp_path), max_steps=3, report_to="none", save_strategy="no", disable_tqdm=True)
    with caplog.at_level(logging.INFO, logger="perfguide.callback"):
        Trainer(model=tiny_model(), args=args, train_dataset=token_dataset(n=16, seed=1), callbacks=[cb]).train()
    assert cb.verification is not None and cb.verification.measured.steps == 2
    logged = [r.getMessage() for r in caplog.records if r.name == "perfguide.callback"]
    assert any("step_time_s: predicted" in line and "measured" in line for line in logged)


def test_simulated_oom_leaves_the_process_usable_and_suggests_a_smaller_setup(rec):
    def boom(step: int) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    result = perfguide.verify(tiny_model(), rec, steps=2, fault=boom)
    assert result.oom and not result.ok and result.measured is None
    s, smaller = rec.setup, result.suggestion
    assert smaller is not None
    assert smaller.global_batch_size == s.global_batch_size
    assert (smaller.micro_batch_size, smaller.gradient_checkpointing) != (s.micro_batch_size, s.gradient_checkpointing)
    again = perfguide.verify(tiny_model(), rec, steps=1)  # nothing left broken
    assert again.measured is not None and not again.oom


def test_calibration_round_trip(rec, tmp_path):
    path = tmp_path / "calibration.json"
    result = perfguide.verify(tiny_model(), rec, steps=2)
    record(rec, result, path=path)
    record(rec, result, path=path)
    f = factors(rec.hardware, path=path)
    assert isinstance(f, Factors) and f.samples == 2
    step = result.comparison("step_time_s")
    if 0.33 <= step.ratio <= 3:
        assert f.step_time == pytest.approx(step.ratio)
    assert factors(hardware("a100"), path=path) is None  # named hardware is never calibrated by this machine


def test_real_batch_finder_keeps_global_batch(rec):
    model = tiny_model()
    choice = find_micro_batch(rec, torch_try_step(rec, model), limit_bytes=8 * 2**30)
    assert choice.micro_batch_size * choice.gradient_accumulation_steps * choice.world_size == rec.request.global_batch_size
    assert all(p.peak_bytes is not None and p.peak_bytes >= 0 for p in choice.probes)


def test_recorded_calibration_changes_later_estimates_on_this_machine(rec, monkeypatch, tmp_path):
    from perfguide.measure.types import Comparison, Measurement, Verification

    monkeypatch.setenv("PERFGUIDE_CACHE_DIR", str(tmp_path))
    before = perfguide.estimate(rec.model, rec.setup, hardware=rec.hardware)
    run = Verification(measured=Measurement(device="cpu", steps=3), comparisons=(
        Comparison(quantity="rss_growth", predicted=100.0, measured=150.0, ratio=1.5, unit="bytes"),
        Comparison(quantity="step_time_s", predicted=1.0, measured=2.0, ratio=2.0, unit="s"),
    ))
    record(rec, run)
    after = perfguide.estimate(rec.model, rec.setup, hardware=rec.hardware)
    # on CPU the part above the resident weights is scaled by the measured ratio
    expected = before.weights + int((before.peak_allocated - before.weights) * 1.5)
    assert after.peak_allocated == expected
    assert any("calibrated" in n for n in after.notes)
    from perfguide.speed import estimate_speed

    named_twin = rec.hardware.model_copy(update={"source": "named"})  # same machine, never calibrated
    assert estimate_speed(rec.model, rec.setup, rec.hardware).step_time_s == pytest.approx(
        estimate_speed(rec.model, rec.setup, named_twin).step_time_s * 2.0)
    # a named target is somebody else's machine: never calibrated
    named = perfguide.estimate(rec.model, rec.setup, hardware=hardware("a100"))
    assert not any("calibrated" in n for n in named.notes)


def test_calibrate_cli_runs_real_steps_and_records(tmp_path, monkeypatch, capsys):
    """`perfguide calibrate <config dir>`: plan here, train a few real steps, store the ratios."""
    import json

    from perfguide.cli import main

    monkeypatch.setenv("PERFGUIDE_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = tmp_path / "tiny"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], **TINY_LLAMA}))
    code = main(["calibrate", str(model_dir), "--steps", "2", "--seq-len", "16", "--global-batch-size", "2"])
    out = capsys.readouterr().out
    assert code == 0 and "step_time_s: predicted" in out and "recorded in" in out
    stored = json.loads((tmp_path / "cache" / "calibration.json").read_text())
    runs = [r for m in stored["machines"].values() for r in m["runs"]]
    assert len(runs) == 1 and runs[0]["step_time_s"] > 0
