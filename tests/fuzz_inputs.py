"""Fuzzed inputs, one hypothesis strategy per input family, and the one invariant they all share:
every call ends in a result (a plan, an estimate, a Hardware, factors) or a PerfGuideError, never another exception.

Used by tests/test_fuzz.py (a few dozen examples per family, so CI stays fast) and bench/fuzz.py (more
examples, counts per outcome). Values are drawn from what users and files actually send, plus the hostile
edges: NaN/inf, bools for ints, numeric strings, huge and negative numbers, control characters, deep nesting.
"""

from __future__ import annotations

import os
import string
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a fuzzed name must never reach the hub

import perfguide
from perfguide import PerfGuideError

TINY = dict(model_type="llama", vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox", "opt", "gemma2", "nonsense-type", "")

# --- atoms ---------------------------------------------------------------------------------------------
hostile_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["", " ", "\x1b[2J", "\u202e", "../../etc", "~nouser/x", "a" * 300, "NaN", "1e400", "-1", "0", "8", "\x00"])
numbers = (st.integers(min_value=-(10**12), max_value=10**12) | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([0, 1, -1, 2**63, 10**40]))
scalars = numbers | st.booleans() | st.none() | hostile_text
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=6)

# --- families ----------------------------------------------------------------------------------------
model_names = (hostile_text | st.sampled_from(["gpt2", "llama-3-8b", "7b", "0b", "0.5m", "1.5B", "0.0000000001k", "t5-small"])
               | st.builds(lambda n, u: f"{n}{u}", st.floats(min_value=0, max_value=1e6, allow_nan=False), st.sampled_from("kmbtKMBT")))

gpu_words = st.sampled_from(["a100-80gb", "h100", "l4", "t4", "cpu", "A100", "h100-sxm", "rtx4090", "mi300x", "nope"])
counts = st.integers(min_value=-5, max_value=10**6).map(str) | st.sampled_from(["", "x", "8x", "8x2", "8*2", "1e3", "9" * 50, " 4 "])
hardware_names = hostile_text | st.builds(lambda g, c: f"{g}:{c}", gpu_words, counts) | gpu_words

config_keys = st.sampled_from(["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                               "vocab_size", "max_position_embeddings", "sliding_window", "head_dim", "tie_word_embeddings",
                               "architectures", "torch_dtype", "_name_or_path", "num_local_experts", "n_embd", "n_layer", "n_head",
                               "rope_scaling", "use_sliding_window", "is_encoder_decoder"])
configs = st.builds(lambda mt, upd: {**TINY, "model_type": mt, **upd}, st.sampled_from(MODEL_TYPES),
                    st.dictionaries(config_keys, values | st.integers(min_value=1, max_value=4096), max_size=4))

constraint_keys = st.sampled_from(["precision", "optimizer", "finetune", "lora", "gradient_checkpointing", "attn_implementation",
                                   "micro_batch_size", "headroom", "nodes", "num_gpus", "strategy", "allow_offload", "from_scratch",
                                   "prompt_len", "max_new_tokens", "batch_size", "quantization", "prefer", "engine", "not_a_key"])
good_values = st.sampled_from(["bf16", "fp16", "fp32", "lora", "qlora", "full", "fsdp", "zero3", "ddp", "tp", "adafactor",
                               "adamw_bnb_8bit", "sdpa", "eager", "nf4", "int8", "latency", "vllm", 0.1, 0.5, 1, 2, 8, True, False])
constraints = st.dictionaries(constraint_keys, good_values | values, max_size=4)

setup_keys = st.sampled_from(["task", "device", "micro_batch_size", "seq_len", "gradient_accumulation_steps", "weights_dtype", "autocast",
                              "optimizer", "gradient_checkpointing", "lora", "strategy", "num_gpus", "nodes", "offload_optimizer",
                              "offload_params", "new_tokens", "liger_kernel", "padding_free", "avg_seq_len", "bogus"])
setup_values = st.sampled_from(["train", "infer", "cuda", "cpu", "bf16", "fp16", "fp32", "nf4", "int8", "fsdp", "zero3", "tp", "ddp",
                                {"r": 8}, {"r": 0}, 1, 4, 64, 2048, True, False, None])
setups = st.dictionaries(setup_keys, setup_values | values, max_size=5)

cache_bytes = st.binary(max_size=200) | st.sampled_from([b"[]", b"{}", b'{"machines": []}', b'{"version": 2, "runs": [{}]}',
                                                         b'{"version": 2, "runs": []}', b"[" * 5000 + b"]" * 5000, b"\xff\xfe"]) \
    | st.builds(lambda v: __import__("json").dumps(v).encode(), values)

cpuinfo_texts = st.text(max_size=300) | st.builds(
    lambda name, flags, mhz: f"processor\t: 0\nmodel name\t: {name}\nflags\t\t: {flags}\ncpu MHz\t\t: {mhz}\nphysical id\t: 0\n",
    hostile_text, st.text(alphabet=string.ascii_lowercase + " _", max_size=40), hostile_text)


# --- the invariant -------------------------------------------------------------------------------------
def outcome(call: Callable[[], Any]) -> str:
    """'result', 'PerfGuideError', or the name of any other exception (a bug)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call()
        except PerfGuideError:
            return "PerfGuideError"
        except Exception as exc:  # noqa: BLE001 - classifying every escape is the point
            return type(exc).__name__
    return "result"


def check_name(name: str) -> str:
    return outcome(lambda: perfguide.recommend(name, hardware="a100-80gb", seq_len=128, global_batch_size=8))


def check_hardware(name: str) -> str:
    return outcome(lambda: perfguide.recommend("gpt2", "train_gpu_many", hardware=name, seq_len=128))


def check_config(config: dict[str, Any], scenario: str = "train_gpu_one") -> str:
    return outcome(lambda: perfguide.recommend(config, scenario, hardware="a100-80gb", seq_len=64, global_batch_size=4).report())


def check_constraints(cons: dict[str, Any], scenario: str = "train_gpu_one") -> str:
    hw = "a100-80gb:4" if scenario.endswith("many") else "a100-80gb"
    return outcome(lambda: perfguide.recommend("gpt2", scenario, hardware=hw, seq_len=128, global_batch_size=8, **cons))


def check_setup(setup: dict[str, Any], hardware: str | None = "a100-80gb:2") -> str:
    return outcome(lambda: perfguide.estimate("gpt2", setup, hardware=hardware))


def check_store(blob: bytes, directory: Path) -> str:
    """A store holding ``blob``: reading factors and recording a run both survive it (warnings allowed)."""
    from perfguide.measure import Verification, record
    from perfguide.measure.calibration import factors_for
    from perfguide.measure.types import Comparison, Measurement

    path = directory / "calibration.json"
    path.write_bytes(blob)
    hw = perfguide.Hardware.from_name("a100-80gb").model_copy(update={"source": "probe"})
    rec = perfguide.recommend("gpt2", hardware=hw, seq_len=128, global_batch_size=8)
    run = Verification(measured=Measurement(device="cuda", steps=2), comparisons=(
        Comparison(quantity="step_time_s", predicted=1.0, measured=1.1, ratio=1.1, unit="s"),))

    def both() -> None:
        factors_for(hw, rec.model, path=path)
        assert record(rec, run, path=path) == path
        factors_for(hw, rec.model, path=path)

    return outcome(both)


def check_trace_cache(blob: bytes, directory: Path) -> str:
    from perfguide.memory.tracing import cache

    (directory / "trace").mkdir(exist_ok=True)
    (directory / "trace" / "k.json").write_bytes(blob)
    old = os.environ.get("PERFGUIDE_CACHE_DIR")
    os.environ["PERFGUIDE_CACHE_DIR"] = str(directory)
    try:
        return outcome(lambda: cache.load("k"))
    finally:
        if old is None:
            os.environ.pop("PERFGUIDE_CACHE_DIR")
        else:
            os.environ["PERFGUIDE_CACHE_DIR"] = old


def check_cpuinfo(text: str) -> str:
    from perfguide.hardware.cpu import parse_cpuinfo

    return outcome(lambda: parse_cpuinfo(text))


board_names = hostile_text | st.binary(max_size=30) | st.none() | st.sampled_from(["NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA H100 80GB HBM3"])
boards = st.lists(st.fixed_dictionaries({
    "name": board_names,
    "total_mib": st.integers(min_value=-10, max_value=10**7),
    "cc": st.tuples(st.integers(min_value=-1, max_value=20), st.integers(min_value=-1, max_value=9)),
    "sms": st.none() | st.integers(min_value=-1, max_value=500),
    "free_mib": st.none() | st.integers(min_value=-10, max_value=10**7),
    "fail": st.sets(st.sampled_from(["handle", "name", "uuid", "memory", "cc"])),
}), max_size=4)


def check_probe(spec: list[dict[str, Any]]) -> str:
    """probe() over fake NVML boards (tests/test_probe.py's stand-in for the driver): it must never raise at all."""
    import importlib
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_probe import Board, FakeNVML

    probe_module = importlib.import_module("perfguide.hardware.probe")
    fake = FakeNVML([Board(uuid=f"GPU-{i}", **b) for i, b in enumerate(spec)])
    real = probe_module._nvml
    probe_module._nvml = lambda: fake
    try:
        got = outcome(perfguide.probe)
    finally:
        probe_module._nvml = real
    return "result" if got == "result" else f"probe raised {got}"


TRAIN_CHOICES = dict(precision=["bf16", "fp16", "fp32"], optimizer=["adamw_torch", "adafactor", "adamw_bnb_8bit", "sgd"],
                     gradient_checkpointing=[True, False], attn_implementation=["eager", "sdpa"], micro_batch_size=[1, 2, 4],
                     strategy=["ddp", "fsdp", "zero2", "zero3"], finetune=["full", "lora", "qlora"])
train_constraints = st.dictionaries(st.sampled_from(sorted(TRAIN_CHOICES)), st.just(None), min_size=1, max_size=3).flatmap(
    lambda keys: st.fixed_dictionaries({k: st.sampled_from(TRAIN_CHOICES[k]) for k in keys}))


def not_honoured(setup: Any, cons: dict[str, Any]) -> list[str]:
    """The constraints a plan's setup does not carry (a plan must honour every one it was given, or refuse)."""
    bad = []
    if "precision" in cons:
        p = cons["precision"]
        ok = (setup.autocast == p or setup.weights_dtype == p) if p != "fp32" else setup.autocast is None and setup.weights_dtype == "fp32"
        bad += [] if ok else [f"precision={p!r} -> weights {setup.weights_dtype}, autocast {setup.autocast}"]
    bad += [f"{k}={cons[k]!r} -> {getattr(setup, k)!r}" for k in ("optimizer", "gradient_checkpointing", "attn_implementation",
                                                                  "micro_batch_size", "strategy") if k in cons and getattr(setup, k) != cons[k]]
    if "finetune" in cons:
        got = "qlora" if setup.lora and setup.weights_dtype in ("nf4", "int8") else "lora" if setup.lora else "full"
        bad += [] if got == cons["finetune"] else [f"finetune={cons['finetune']!r} -> {got}"]
    return bad


def tally(results: list[str]) -> Counter[str]:
    return Counter(results)


# --- every model type transformers ships -------------------------------------------------------------------
def walk_model_type(model_type: str) -> list[str]:
    """Plan ``model_type``'s default config for training and inference: each must be a plan or one PerfGuideError
    line; returns the failures (empty when both hold). A config class that cannot build its own defaults is
    transformers' problem, not a perfguide input, and is skipped."""
    from transformers import CONFIG_MAPPING

    from perfguide.model.resolve import spec_from_any

    try:
        config = CONFIG_MAPPING[model_type]()
    except Exception:  # noqa: BLE001 - see the docstring
        return []
    failures: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            spec = spec_from_any(config)
        except PerfGuideError as exc:
            return [f"{model_type}: multi-line refusal"] if "\n" in str(exc) else []
        except Exception as exc:  # noqa: BLE001 - the finding: anything else is a crash
            return [f"{model_type}: {type(exc).__name__}: {str(exc)[:100]}"]
        for scenario in ("train_gpu_one", "infer_gpu_one"):
            try:
                perfguide.recommend(spec, scenario, hardware="a100-80gb").report()
            except PerfGuideError as exc:
                if "\n" in str(exc):
                    failures.append(f"{model_type} {scenario}: multi-line refusal")
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{model_type} {scenario}: {type(exc).__name__}: {str(exc)[:100]}")
    return failures


# --- CLI flags, output paths, plan/report agreement ----------------------------------------------------------
cli_flags = st.lists(st.sampled_from(["--scenario", "--hardware", "--seq-len", "--global-batch-size", "--host-ram", "--precision",
                                      "--optimizer", "--finetune", "--micro-batch-size", "--strategy", "--json", "--markdown",
                                      "--brief", "--force", "--engine", "--quantization", "--batch-size", "--bogus", "-vv"])
                     | hostile_text | numbers.map(str), max_size=6)


def check_cli(argv: list[str]) -> str:
    """``perfguide recommend gpt2 ARGV...``: exit 0, 2 or 3, never a traceback (an exception out of main)."""
    import contextlib
    import io

    from perfguide.cli import main

    def run() -> None:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            code = main(["recommend", "gpt2", "--hardware", "a100-80gb", "--seq-len", "128", *argv])
        if code not in (0, 2, 3) or "Traceback" in err.getvalue():
            raise AssertionError(f"exit {code}")

    return outcome(run)


path_parts = st.sampled_from(["a.yaml", "x" * 300, "", "..", "sub/dir/b.json", "/proc/x", "\x00", "~nouser/c", "/dev/null",
                              "d" * 200 + "/e"]) | hostile_text


def check_write(parts: list[str], directory: Path, force: bool) -> str:
    """write_files to a hostile path: written, or one PerfGuideError leaving ``directory`` as it was."""
    from perfguide.integrations.files import write_files

    before = sorted(p.name for p in directory.rglob("*"))
    target = directory.joinpath(*[p for p in parts if p]) if parts else directory

    def write() -> None:
        try:
            write_files({target: "a: 1\n"}, overwrite=force)
        except PerfGuideError:
            after = sorted(p.name for p in directory.rglob("*"))
            if after != before:
                raise AssertionError(f"a refused write changed the folder: {before} -> {after}") from None
            raise

    return outcome(write)


def check_fits_agrees(cons: dict[str, Any], scenario: str = "train_gpu_one") -> str:
    """A plan's ``fits`` and its report's verdict say the same thing."""
    hw = "a100-80gb:4" if scenario.endswith("many") else "a100-80gb"

    def both() -> None:
        rec = perfguide.recommend("llama-3-8b", scenario, hardware=hw, seq_len=512, global_batch_size=8, **cons)
        brief = rec.report(brief=True).lower()
        says_no = "does not fit" in brief or "nothing fits" in brief
        if says_no == rec.fits:
            raise AssertionError(f"fits={rec.fits} but the report says {brief[:120]!r}")
        false = false_comparisons(rec.report())
        if false:
            raise AssertionError(f"false comparison in the report: {false[0]}")

    return outcome(both)


_SIZES = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}
_COMPARISON = __import__("re").compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)\s*(>|<)\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)", 2)


def false_comparisons(text: str) -> list[str]:
    """Every "A GiB > B GiB" (or <) a report prints that is not true of the numbers it prints."""
    bad = []
    for m in _COMPARISON.finditer(text):
        a, b = float(m[1]) * _SIZES[m[2].lower()], float(m[4]) * _SIZES[m[5].lower()]
        if (m[3] == ">" and not a > b) or (m[3] == "<" and not a < b):
            bad.append(m[0])
    return bad
