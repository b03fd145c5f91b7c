"""The calibration store as state: it never breaks planning, never loses history, never rescales the wrong model.

Each test is one finding of issue 16 (the regression list). The runs recorded are real Verification objects
built from the numbers a run would measure; the store, the lock and the planner are the real ones.
"""

from __future__ import annotations

import json
import multiprocessing
import warnings
from pathlib import Path

import pytest
from helpers import GiB, hardware

import perfguide
from perfguide.measure import Verification, record
from perfguide.measure.calibration import MAX_CUDA_CONTEXT, Store, factors_for, robust_median, size_band
from perfguide.measure.types import Comparison, Measurement

LLAMA_8B = "llama-3.1-8b"


def probed(kind: str = "a100"):
    """A named spec-sheet machine presented as this machine's probe (calibration applies only to probes)."""
    return hardware(kind).model_copy(update={"source": "probe"})


def cuda_run(mem_ratio: float = 1.0, step_ratio: float = 1.0, device_total: int | None = None,
             peak_reserved: int | None = None, processes: int | None = None) -> Verification:
    comps = (Comparison(quantity="peak_allocated", predicted=100.0, measured=100.0 * mem_ratio, ratio=mem_ratio, unit="bytes"),
             Comparison(quantity="step_time_s", predicted=1.0, measured=step_ratio, ratio=step_ratio, unit="s"))
    m = Measurement(device="cuda", steps=3, device_total=device_total, peak_reserved=peak_reserved, device_processes=processes)
    return Verification(measured=m, comparisons=comps)


def plan(model: str, hw, **kw):
    return perfguide.recommend(model, "train_gpu_one", hardware=hw, seq_len=kw.pop("seq_len", 2048), global_batch_size=8, **kw)


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PERFGUIDE_CACHE_DIR", str(tmp_path))
    return tmp_path / "calibration.json"


@pytest.fixture(scope="module")
def tiny_rec():
    return perfguide.recommend("gpt2", "train_gpu_one", hardware=probed(), seq_len=128, global_batch_size=8)


def runs_in(path: Path) -> list[dict]:
    return json.loads(path.read_text())["runs"]


# --- wrong-shape / corrupt stores ------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"[]", b'{"machines": []}', b'{"machines": {"gpu:x": {"runs": [1, "a"]}}}',
                                     b'{"version": 2, "runs": [{"machine": 1}]}', b"{not json", b"\xff\xfe\x00garbage",
                                     b"[" * 100_000 + b"]" * 100_000])
def test_a_store_of_the_wrong_shape_is_set_aside_and_planning_goes_on(store, content):
    store.write_bytes(content)
    hw = probed()
    with pytest.warns(UserWarning, match="unreadable") as caught:
        rec = plan(LLAMA_8B, hw)
    assert rec.request.calibration is None and rec.setup is not None
    asides = list(store.parent.glob("calibration.json.unreadable-*"))
    assert len(asides) == 1 and asides[0].read_bytes() == content  # kept, byte for byte, never reset
    assert any(str(asides[0]) in str(w.message) for w in caught)      # the warning names where it went
    assert not store.exists()
    again = plan(LLAMA_8B, hw)  # no second warning, nothing else moved
    assert again.setup == rec.setup and len(list(store.parent.glob("calibration.json.unreadable-*"))) == 1


def test_recording_over_a_corrupt_store_keeps_the_old_file(store, tiny_rec):
    store.write_text("{truncated")
    with pytest.warns(UserWarning, match="unreadable"):
        assert record(tiny_rec, cuda_run()) == store
    assert len(runs_in(store)) == 1
    (aside,) = store.parent.glob("calibration.json.unreadable-*")
    assert aside.read_text() == "{truncated"


def test_estimate_and_cli_survive_a_wrong_shape_store(store, capsys):
    from perfguide.cli import main

    store.write_text("[]")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = perfguide.estimate(LLAMA_8B, {"task": "train", "device": "cuda", "seq_len": 512}, hardware=probed())
    assert est.device_total > 0
    store.write_text('{"machines": []}')
    code = main(["recommend", "gpt2", "--scenario", "train_cpu", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["setup"]


# --- writers ---------------------------------------------------------------------------------------
def _record_one(rec_json: str, path: str, i: int, barrier) -> None:
    from perfguide.recommendation import Recommendation

    rec = Recommendation.model_validate_json(rec_json)
    barrier.wait()
    assert record(rec, cuda_run(step_ratio=1.0 + i / 100), path=Path(path)) == Path(path)


@pytest.mark.slow
def test_eight_processes_recording_at_once_lose_nothing(tmp_path, tiny_rec):
    path = tmp_path / "calibration.json"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(8)
    procs = [ctx.Process(target=_record_one, args=(tiny_rec.to_json(), str(path), i, barrier)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0] * 8
    store = Store.model_validate_json(path.read_text())  # it parses, with the schema
    assert sorted(round(r.ratios["step_time_s"], 2) for r in store.runs) == [1.0 + i / 100 for i in range(8)]
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.unreadable-*"))


def test_an_unwritable_store_warns_and_the_run_is_still_returned(tmp_path, tiny_rec):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.warns(UserWarning, match="could not record"):
        assert record(tiny_rec, cuda_run(), path=blocker / "calibration.json") is None


def test_the_callback_finishes_training_on_an_unwritable_store(tmp_path, monkeypatch):
    from helpers import TINY_LLAMA, tiny_model, token_dataset
    from transformers import Trainer

    from perfguide.measure import PerfGuideCallback

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("PERFGUIDE_CACHE_DIR", str(blocker))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = perfguide.recommend({"model_type": "llama", **TINY_LLAMA}, "train_cpu", seq_len=16, global_batch_size=2)
    cb = PerfGuideCallback(rec, measure_after_steps=2, record=True)
    args = rec.training_args(output_dir=str(tmp_path / "out"), max_steps=2, report_to="none", save_strategy="no", disable_tqdm=True)
    with pytest.warns(UserWarning, match="could not record"):
        Trainer(model=tiny_model(), args=args, train_dataset=token_dataset(n=8), callbacks=[cb]).train()
    assert cb.verification is not None and cb.verification.measured.step_time_s > 0 and cb.recorded is None


# --- what a run may change -----------------------------------------------------------------------
def test_a_tiny_models_ratios_never_rescale_an_8b_model(store, tiny_rec):
    hw = probed()
    before = plan(LLAMA_8B, hw)
    for _ in range(3):
        record(tiny_rec, cuda_run(mem_ratio=2.9, step_ratio=0.34))
    assert factors_for(hw, tiny_rec.model).memory == pytest.approx(2.9)  # it does calibrate gpt2-sized models
    after = plan(LLAMA_8B, hw)
    assert after.request.calibration is None
    assert (after.fits, after.setup) == (before.fits, before.setup)
    assert after.throughput.step_time_s == pytest.approx(before.throughput.step_time_s)


def test_size_bands_are_half_decades():
    assert size_band(124_000_000) == size_band(300_000_000) != size_band(8_030_261_248)
    assert size_band(8_030_261_248) == size_band(4_000_000_000) != size_band(1_000_000_000)


def test_outliers_are_left_out_once_sane_runs_exist():
    # 2.9 is 3+ MADs out: the median of the other four (1.00-1.02), not of all five (1.02)
    assert robust_median([1.0, 1.05, 0.95, 1.02, 2.9]) == pytest.approx((1.0 * 1.02) ** 0.5)
    assert robust_median([1.2, 6.2]) == pytest.approx(1.2)  # a sane run outweighs an outlier
    assert robust_median([1.2]) == pytest.approx(1.2)
    assert robust_median([]) is None


def test_a_first_outlier_is_kept_with_its_spread_not_discarded(store, tiny_rec):
    """Issue 24: `perfguide calibrate` measured 6.2x the predicted step on a loaded CPU and recorded nothing usable.
    The first measurement of a scope is now kept and used (capped at the sane band's 3x), its step spread stored."""
    steps = (6.0, 6.4, 6.2)  # steady steps of one run: spread (6.4 - 6.0) / (2 * 6.2)
    comps = (Comparison(quantity="step_time_s", predicted=1.0, measured=6.2, ratio=6.2, unit="s"),)
    run = Verification(measured=Measurement(device="cpu", steps=4, step_time_s=6.2, step_times_s=steps), comparisons=comps)
    record(tiny_rec, run)
    stored = runs_in(store)[-1]
    assert stored["ratios"]["step_time_s"] == pytest.approx(6.2)
    assert stored["spread"]["step_time_s"] == pytest.approx(0.4 / (2 * 6.2))
    factors = factors_for(probed(), tiny_rec.model)
    assert factors is not None and factors.step_time == pytest.approx(6.2)
    from perfguide.cli_calibrate import outlier_note

    assert "outlier" in outlier_note(6.2) and "recorded and used" in outlier_note(6.2)
    assert outlier_note(1.4) == ""


def test_cuda_context_is_only_stored_when_the_device_was_otherwise_idle(store, tiny_rec):
    busy = cuda_run(device_total=60 * GiB, peak_reserved=12 * GiB, processes=2)  # another tenant held 48 GiB
    unknown = cuda_run(device_total=13 * GiB, peak_reserved=12 * GiB, processes=None)
    alone_but_huge = cuda_run(device_total=60 * GiB, peak_reserved=12 * GiB, processes=1)
    for v in (busy, unknown, alone_but_huge):
        record(tiny_rec, v)
    assert [r["cuda_context_bytes"] for r in runs_in(store)] == [None, None, None]
    assert 48 * GiB > MAX_CUDA_CONTEXT
    record(tiny_rec, cuda_run(device_total=12 * GiB + 600 * 2**20, peak_reserved=12 * GiB, processes=1))
    assert runs_in(store)[-1]["cuda_context_bytes"] == 600 * 2**20
    assert factors_for(probed(), tiny_rec.model).cuda_context_bytes == 600 * 2**20


def test_oom_runs_are_not_recorded(store, tiny_rec):
    assert record(tiny_rec, Verification(measured=None, oom=True, ok=False, error="out of memory")) is None
    assert not store.exists()


def test_a_named_target_is_never_calibrated(store, tiny_rec):
    record(tiny_rec, cuda_run(mem_ratio=1.5))
    assert factors_for(probed(), tiny_rec.model) is not None
    assert factors_for(hardware("a100"), tiny_rec.model) is None


# --- issue 26: set-aside names, symlinked stores, the reader's bounds -------------------------------------
def test_two_stores_set_aside_in_the_same_second_both_survive(store, monkeypatch):
    from perfguide.measure import calibration

    monkeypatch.setattr(calibration.time, "strftime", lambda fmt, *a: "20260101-000000")  # the same second
    for content in ("{first", "{second"):
        store.write_text(content)
        with pytest.warns(UserWarning, match="unreadable"):
            calibration._load_or_set_aside(store)
    kept = sorted(p.read_text() for p in store.parent.glob("calibration.json.unreadable-*"))
    assert kept == ["{first", "{second"]


def test_a_symlinked_store_is_written_through_to_its_target(store, tiny_rec, tmp_path):
    shared = tmp_path / "shared" / "team-calibration.json"
    shared.parent.mkdir()
    shared.write_text(json.dumps({"version": 2, "runs": []}))
    store.symlink_to(shared)
    assert record(tiny_rec, cuda_run(step_ratio=1.2)) == shared
    assert store.is_symlink() and Path(store.resolve()) == shared   # the link is still the link
    assert [r["ratios"]["step_time_s"] for r in runs_in(shared)] == [1.2]
    assert factors_for(probed(), tiny_rec.model).step_time == pytest.approx(1.2)


@pytest.mark.parametrize("run", [{"cuda_context_bytes": 1e15}, {"cuda_context_bytes": 0}, {"ratios": {"step_time_s": -1.0}},
                                 {"ratios": {"peak_allocated": float("inf")}}, {"time": float("nan")}])
def test_the_reader_holds_a_store_to_the_writers_bounds(store, run):
    """A value make_run would never store (a 1 PB CUDA context, a negative ratio) is not read as calibration."""
    good = {"machine": "gpu:NVIDIA A100-SXM4-80GB:85899345920", "family": "llama", "band": "1e9.5-1e10", "model": "m",
            "setup": "s", "time": 1.0, "ratios": {"step_time_s": 1.1}}
    store.write_text(json.dumps({"version": 2, "runs": [{**good, **run}]}).replace("NaN", "1e400").replace("Infinity", "1e400"))
    with pytest.warns(UserWarning, match="unreadable"):
        rec = plan(LLAMA_8B, probed())
    assert rec.request.calibration is None
