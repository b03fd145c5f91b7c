"""Fuzz targets, one per input family (names, hardware names, configs, constraints, setups, probes, cache files):
whatever comes in, perfguide answers with a result or one PerfGuideError, never another exception.

Examples are few per family (CI time); bench/fuzz.py runs the same generators longer and counts outcomes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import fuzz_check_inputs as C
import fuzz_inputs as F
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])


def ok(result: str) -> None:
    assert result in ("result", "PerfGuideError"), result


@FUZZ
@given(F.model_names)
def test_fuzz_model_names(name):
    ok(F.check_name(name))


@FUZZ
@given(F.hardware_names)
def test_fuzz_hardware_names(name):
    ok(F.check_hardware(name))


@settings(FUZZ, max_examples=15)  # configs of unknown types are counted on the meta device: slower per example
@given(F.configs, st.sampled_from(["train_gpu_one", "infer_gpu_one"]))
def test_fuzz_configs(config, scenario):
    ok(F.check_config(config, scenario))


@FUZZ
@given(F.constraints, st.sampled_from(["train_gpu_one", "train_gpu_many", "infer_gpu_one", "infer_gpu_many", "train_cpu"]))
def test_fuzz_constraints(cons, scenario):
    ok(F.check_constraints(cons, scenario))


@FUZZ
@given(F.setups, st.sampled_from([None, "a100-80gb:2", "cpu"]))
def test_fuzz_setups(setup, hardware):
    ok(F.check_setup(setup, hardware))


@FUZZ
@given(F.boards)
def test_fuzz_probes(boards):
    assert F.check_probe(boards) == "result"


@FUZZ
@given(F.cpuinfo_texts)
def test_fuzz_cpuinfo(text):
    assert F.check_cpuinfo(text) == "result"


@FUZZ
@given(F.cache_bytes)
def test_fuzz_calibration_store_files(blob):
    with tempfile.TemporaryDirectory() as d:
        assert F.check_store(blob, Path(d)) == "result"  # an unreadable store is set aside, never raised


@FUZZ
@given(F.cache_bytes)
def test_fuzz_trace_cache_files(blob):
    with tempfile.TemporaryDirectory() as d:
        assert F.check_trace_cache(blob, Path(d)) == "result"


def test_the_fuzz_bench_counts_escapes_as_bugs():
    """bench/fuzz.py's counter must see an exception that is not a PerfGuideError, or its 0 would mean nothing."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_fuzz", Path(__file__).resolve().parents[1] / "bench" / "fuzz.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def broken(text: str) -> str:
        return F.outcome(lambda: {}[text])  # a KeyError escaping a "planner"

    counts, escaped, _ = bench.run_family(st.tuples(st.text(max_size=3)), broken, 5)
    counts.pop("slowest_ms", None)  # the family's slowest input rides in the counter; the report pops it the same way
    assert counts == {"KeyError": 5} and escaped
    counts, escaped, _ = bench.run_family(st.tuples(F.hardware_names), F.check_hardware, 5)
    counts.pop("slowest_ms", None)
    assert sum(counts.values()) == 5 and set(counts) <= {"result", "PerfGuideError"} and not escaped


@FUZZ
@given(F.train_constraints, st.sampled_from(["gpt2", "llama-3-8b", "1.3b"]), st.sampled_from(["a100-80gb", "t4", "h100"]),
       st.booleans())
def test_fuzz_constraints_are_honoured_or_refused(cons, model, gpu, many):
    """Never a constraint quietly replaced: the plan carries each one given, or recommend refuses in one line."""
    if not many:
        cons = {k: v for k, v in cons.items() if k != "strategy"}
    scenario, hw = ("train_gpu_many", f"{gpu}:4") if many else ("train_gpu_one", gpu)
    try:
        with F.warnings.catch_warnings():
            F.warnings.simplefilter("ignore")
            rec = F.perfguide.recommend(model, scenario, hardware=hw, global_batch_size=16, seq_len=512, **cons)
    except F.PerfGuideError:
        return
    assert F.not_honoured(rec.setup, cons) == []


def test_the_honoured_check_sees_a_replaced_constraint():
    from perfguide import Setup

    lora_bf16 = Setup(task="train", weights_dtype="bf16", lora={"r": 8}, optimizer="adamw_torch")
    assert F.not_honoured(lora_bf16, {"precision": "fp32"}) and F.not_honoured(lora_bf16, {"optimizer": "adafactor"})
    assert F.not_honoured(lora_bf16, {"finetune": "full"}) and not F.not_honoured(lora_bf16, {"finetune": "lora"})


# --- issue 26: CLI flags, output paths, fits vs report (a seeded few; bench/fuzz.py runs thousands) ----------
@settings(FUZZ, max_examples=15)
@given(F.cli_flags)
def test_fuzz_cli_flags(argv):
    ok(F.check_cli(argv))


@FUZZ
@given(st.lists(F.path_parts, max_size=3), st.booleans())
def test_fuzz_output_paths(parts, force):
    with tempfile.TemporaryDirectory() as d:
        ok(F.check_write(parts, Path(d), force))


@settings(FUZZ, max_examples=10)
@given(F.train_constraints, st.sampled_from(["train_gpu_one", "train_gpu_many"]))
def test_fuzz_fits_agrees_with_the_report(cons, scenario):
    ok(F.check_fits_agrees(cons, scenario))


# --- perfguide check: the config readers and launch / serve lines (bench/fuzz.py runs thousands) ----------------
@settings(FUZZ, max_examples=30)
@given(C.check_files, st.sampled_from([None, "llama-3-8b"]))
def test_fuzz_check_config_files(file, model):
    with tempfile.TemporaryDirectory() as d:
        ok(C.check_file(file[0], file[1], model, Path(d)))


@settings(FUZZ, max_examples=15)
@given(C.check_commands)
def test_fuzz_check_commands(words):
    ok(C.check_command(words))


@pytest.mark.parametrize("blob", [b"[" * 50_000 + b"]" * 50_000, b'{"zero_optimization": ' * 3000 + b"1" + b"}" * 3000])
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_nesting_bomb_is_one_line(blob, suffix, tmp_path):
    """Found by the check family: json / yaml recurse once per level and raised RecursionError out of the CLI."""
    assert C.check_file(suffix, blob, "llama-3-8b", tmp_path) == "PerfGuideError"


@pytest.mark.parametrize("data", [{"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": -2602105},
                                  {"base_model": "NousResearch/Llama-3.2-1B", "fsdp_config": 5},
                                  {"base_model": "NousResearch/Llama-3.2-1B", "plugins": 7},
                                  {"model_name_or_path": "llama-3-8b", "deepspeed": [[None, 1.5], {}]},
                                  {"model_name_or_path": "llama-3-8b", "deepspeed": "x" * 5000},
                                  {"train_micro_batch_size_per_gpu": float("inf")},
                                  {"zero_optimization": "stage3", "train_micro_batch_size_per_gpu": 1}])
def test_a_block_of_the_wrong_type_is_one_line(data, tmp_path):
    """Each once escaped as AttributeError / TypeError / OSError (file name too long) / OverflowError (int(inf))."""
    import json

    assert C.check_file(".json", json.dumps(data).encode(), "llama-3-8b", tmp_path) == "PerfGuideError"
