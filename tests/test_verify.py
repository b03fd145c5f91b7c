"""verify(), PerfGuideCallback, calibration and the real-device batch finder, on this CPU machine."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from helpers import TINY_LLAMA, hardware, tiny_model, token_dataset

import perfguide
from perfguide.measure import PerfGuideCallback, record
from perfguide.measure.batch_finder import find_micro_batch, torch_try_step
from perfguide.measure.calibration import factors_for
from perfguide.memory import Factors

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
    f = factors_for(rec.hardware, rec.model, path=path)
    assert isinstance(f, Factors) and f.samples == 2
    step = result.comparison("step_time_s")
    if 0.33 <= step.ratio <= 3:
        assert f.step_time == pytest.approx(step.ratio)
    assert factors_for(hardware("a100"), rec.model, path=path) is None  # named hardware is never calibrated by this machine


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

    # the cost model itself is pure: it scales only by the factors it is handed
    f = factors_for(rec.hardware, rec.model)
    assert f is not None and f.step_time == pytest.approx(2.0)
    assert estimate_speed(rec.model, rec.setup, rec.hardware, f).step_time_s == pytest.approx(
        estimate_speed(rec.model, rec.setup, rec.hardware).step_time_s * 2.0)
    again = perfguide.recommend(rec.model, "train_cpu", hardware=rec.hardware, seq_len=SEQ, global_batch_size=4)
    assert again.request.calibration == f and any("calibrated" in n for n in again.memory.notes)
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
    runs = stored["runs"]
    assert len(runs) == 1 and runs[0]["ratios"]["step_time_s"] > 0 and runs[0]["family"] == "llama"


def test_calibrate_refuses_a_plan_that_does_not_fit(tmp_path, monkeypatch, capsys):
    """Training a plan whose own verdict is "does not fit" would record an OOM as calibration."""
    from perfguide.cli import main

    monkeypatch.setenv("PERFGUIDE_CACHE_DIR", str(tmp_path))
    code = main(["calibrate", "llama-3.1-70b", "--seq-len", "2048", "--global-batch-size", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "does not fit" in err and "Traceback" not in err
    assert not (tmp_path / "calibration.json").exists()


@pytest.mark.slow
def test_calibrate_an_encoder_decoder(tmp_path, monkeypatch, capsys):
    """`perfguide calibrate t5-small` used to die inside T5's forward (no decoder_start_token_id in the config)."""
    import json

    from perfguide.cli import main

    monkeypatch.setenv("PERFGUIDE_CACHE_DIR", str(tmp_path))
    code = main(["calibrate", "t5-small", "--steps", "1", "--seq-len", "8", "--global-batch-size", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    (run,) = json.loads((tmp_path / "calibration.json").read_text())["runs"]
    assert run["family"] == "t5" and run["ratios"]


def test_verify_with_a_smaller_vocabulary_than_the_plan_is_one_line(rec):
    from helpers import one_line

    with pytest.raises(perfguide.PerfGuideError) as exc:
        perfguide.verify(tiny_model(vocab_size=64), rec, steps=1)
    one_line(exc, "vocab_size=128", "64")
