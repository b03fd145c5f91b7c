"""Bounded fuzzing of every input family -> bench/results/fuzz.md: counts per outcome.

Run: ``.venv/bin/python bench/fuzz.py [--examples N]``. The generators are tests/fuzz_inputs.py's (the same
ones the CI fuzz tests draw a few of); here each family gets N examples (configs N/3: each unknown model type
is built on the meta device). An outcome is "result" (a plan, an estimate, a Hardware, factors), "PerfGuideError"
(one line naming what was wrong and what is accepted; for ``perfguide check``: exit 2 with one stderr line), or the name of any other exception, which is a bug.
Seeded (derandomize), so a rerun draws the same inputs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

import fuzz_check_inputs as C
import fuzz_inputs as F
from _report import publish
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

OUT = ROOT / "bench" / "results" / "fuzz.md"
OUTCOMES = ("result", "PerfGuideError")


def run_family(strategy: Any, check: Callable[..., str], examples: int) -> tuple[Counter[str], list[str], float]:
    """Draw ``examples`` inputs, classify each call; keep a few reprs of inputs that escaped as another exception."""
    counts: Counter[str] = Counter()
    escaped: list[str] = []

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def body(args: tuple[Any, ...]) -> None:
        began = time.perf_counter()
        got = check(*args)
        counts["slowest_ms"] = max(counts["slowest_ms"], int(1000 * (time.perf_counter() - began)))
        counts[got] += 1
        if got not in OUTCOMES and len(escaped) < 3:
            escaped.append(f"{got}: {repr(args)[:160]}")

    start = time.perf_counter()
    body()
    return counts, escaped, time.perf_counter() - start


def families(tmp: Path) -> list[tuple[str, Any, Callable[..., str], float]]:
    """(name, strategy of argument tuples, check, share of N)."""
    return [
        ("model names", st.tuples(F.model_names), F.check_name, 1.0),
        ("hardware names", st.tuples(F.hardware_names), F.check_hardware, 1.0),
        ("configs (train)", st.tuples(F.configs), lambda c: F.check_config(c, "train_gpu_one"), 1 / 3),
        ("configs (infer)", st.tuples(F.configs), lambda c: F.check_config(c, "infer_gpu_one"), 1 / 3),
        ("constraints", st.tuples(F.constraints, st.sampled_from(["train_gpu_one", "train_gpu_many", "infer_gpu_one", "infer_gpu_many",
                                                                  "train_cpu"])), F.check_constraints, 1.0),
        ("setups", st.tuples(F.setups, st.sampled_from([None, "a100-80gb:2", "cpu"])), F.check_setup, 1.0),
        ("probes (fake NVML boards)", st.tuples(F.boards), F.check_probe, 1.0),
        ("cpuinfo text", st.tuples(F.cpuinfo_texts), F.check_cpuinfo, 1.0),
        ("calibration store files", st.tuples(F.cache_bytes), lambda b: F.check_store(b, Path(tempfile.mkdtemp(dir=tmp))), 1.0),
        ("trace cache files", st.tuples(F.cache_bytes), lambda b: F.check_trace_cache(b, Path(tempfile.mkdtemp(dir=tmp))), 1.0),
        ("CLI flags", st.tuples(F.cli_flags), F.check_cli, 1.0),
        ("output paths (--write-*)", st.tuples(st.lists(F.path_parts, max_size=3), st.booleans()),
         lambda parts, force: F.check_write(parts, Path(tempfile.mkdtemp(dir=tmp)), force), 1.0),
        ("fits vs report", st.tuples(F.train_constraints, st.sampled_from(["train_gpu_one", "train_gpu_many"])), F.check_fits_agrees, 1 / 3),
        ("check: config files (mutated published examples, junk bytes)", st.tuples(C.check_files, st.sampled_from([None, "llama-3-8b", "gpt2"])),
         lambda f, model: C.check_file(f[0], f[1], model, Path(tempfile.mkdtemp(dir=tmp))), 1.0),
        ("check: launch and serve command lines", st.tuples(C.check_commands), C.check_command, 1.0),
    ]


def model_type_rows(limit: int) -> tuple[list[str], list[str], int]:
    """Every model type transformers ships (or a seeded sample of ``limit``), trained and served from defaults."""
    import random

    from transformers import CONFIG_MAPPING

    types = sorted(CONFIG_MAPPING.keys())
    shipped = len(types)
    if 0 < limit < len(types):
        types = sorted(random.Random(26).sample(types, limit))
    start, bugs, slowest = time.perf_counter(), [], 0.0
    for t in types:
        began = time.perf_counter()
        bugs += F.walk_model_type(t)
        slowest = max(slowest, time.perf_counter() - began)
    seconds = time.perf_counter() - start
    row = (f"| model types ({len(types)} of {shipped} in CONFIG_MAPPING, x2 scenarios) | {2 * len(types)} | "
           f"{2 * len(types) - len(bugs)} (plan or one-line refusal) | - | {len(bugs)} | {seconds:.0f} s | {slowest:.1f} s (both plans) |")
    return [row], [f"- model types: {b}" for b in bugs[:5]], 2 * len(types)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300, help="examples per family (default 300)")
    parser.add_argument("--model-types", type=int, default=0, help="model types to walk (default 0: all of CONFIG_MAPPING)")
    args = parser.parse_args(argv)
    rows, bugs = [], []
    total = 0
    with tempfile.TemporaryDirectory() as d:
        os.environ["PERFGUIDE_CACHE_DIR"] = d  # never the user's own calibration store
        for name, strategy, check, share in families(Path(d)):
            n = max(10, int(args.examples * share))
            counts, escaped, seconds = run_family(strategy, check, n)
            slowest = counts.pop("slowest_ms", 0) / 1000
            other = sum(v for k, v in counts.items() if k not in OUTCOMES)
            rows.append(f"| {name} | {sum(counts.values())} | {counts['result']} | {counts['PerfGuideError']} | {other} | {seconds:.0f} s | {slowest:.1f} s |")
            bugs += [f"- {name}: {e}" for e in escaped]
            total += sum(counts.values())
        more_rows, more_bugs, n = model_type_rows(args.model_types)
        rows, bugs, total = rows + more_rows, bugs + more_bugs, total + n
    lines = ["# Fuzzing: every input ends in a result or one PerfGuideError", "",
             f"`bench/fuzz.py --examples {args.examples} --model-types {args.model_types}` (seeded): {total} inputs. "
             "Generators: tests/fuzz_inputs.py. \"other\" counts any other exception escaping, a CLI exit other than "
             "0/2/3, a refused write that changed its folder, or a report whose verdict contradicts `fits` (each a bug); "
             "it must be 0. \"slowest input\" is the longest single call (a hang would show there; the first call of a family "
             "pays its imports).", "",
             "| family | inputs | result | PerfGuideError | other | time | slowest input |", "|---|---|---|---|---|---|---|", *rows, "",
             "## Other exceptions", "", *(bugs or ["none"]), ""]
    publish("\n".join(lines), OUT)
    return 1 if bugs else 0


if __name__ == "__main__":
    raise SystemExit(main())
