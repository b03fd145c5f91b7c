"""How long perfguide takes to answer, next to accelerate's estimate-memory on the same offline config, and how
far its memory numbers are from published measurements, all in one run.

Run: ``.venv/bin/python bench/recommend_speed.py`` (writes bench/results/recommend_speed.md; ``--help``).

accelerate's ``estimate-memory`` needs the Hub twice: ``verify_on_hub`` (model_info metadata) and
``AutoConfig.from_pretrained(name)``. Here the catalog's config is written as ``config.json`` into a temporary
folder, that folder is the model name, and only ``verify_on_hub`` is swapped for a local answer (library
transformers, no ``auto_map``); everything else is accelerate's own ``gather_data``: ``AutoConfig`` from the
folder, ``init_empty_weights`` + ``AutoModel.from_config`` on the meta device, ``calculate_maximum_sizes`` and
``estimate_training_usage`` for each dtype. perfguide gets the same config dict.

The memory-error section calls bench/accuracy.py's ``evaluate_all`` on every published row and summarises the
trust A/B measured rows (the same rows accuracy.md's summary uses).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import perfguide
from bench._report import publish
from perfguide.model.catalog import config_of

OUT = ROOT / "bench" / "results" / "recommend_speed.md"
COMMAND = ".venv/bin/python bench/recommend_speed.py"

MODELS = ("openai-community/gpt2", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-2-7b-hf", "mistralai/Mistral-7B-v0.1",
          "Qwen/Qwen2.5-7B", "mistralai/Mixtral-8x7B-v0.1", "meta-llama/Llama-3.1-70B")
SCENARIOS = (("train_gpu_one", "a100-80gb"), ("train_gpu_many", "a100-80gb:8"), ("infer_gpu_one", "a100-80gb"))
# one fixed setup priced by estimate(): the apples-to-apples peer of accelerate's single-config sizing
ESTIMATE_SETUP = {"micro_batch_size": 1, "seq_len": 2048, "autocast": "bf16", "optimizer": "adamw_torch"}
ACCELERATE_DTYPES = ["float32", "float16", "int8", "int4"]  # estimate-memory's default --dtypes
COLD_MODEL = "meta-llama/Llama-2-7b-hf"
#: the plan issue 21 names: per-model invariants were recomputed for every candidate; timed here against the code
#: as it was before (a git worktree of BASELINE, in its own process) and the current tree, in the same run
BIG_CASE = ("meta-llama/Llama-3.1-405B", "train_gpu_many", "a100-80gb:8")
BASELINE = "b627a74"   # main before issue 21's architecture step 2
_TIME_CASE = ("import json, statistics, sys, time, warnings; warnings.simplefilter('ignore'); import perfguide; "
              "m, s, h, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]); t = time.perf_counter(); "
              "perfguide.recommend(m, s, hardware=h); first = time.perf_counter() - t; ts = []\n"
              "for _ in range(n):\n    t = time.perf_counter(); rec = perfguide.recommend(m, s, hardware=h); ts.append(time.perf_counter() - t)\n"
              "print(json.dumps({'first': first, 'median': statistics.median(ts), 'label': rec.setup.label, "
              "'step': rec.throughput.step_time_s, 'path': perfguide.__file__}))")


def time_call(fn: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """(first call s, median of ``repeats`` later calls s, last result): the first call is the warm-up."""
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times), out


# --- accelerate estimate-memory, offline ----------------------------------------------------------

@contextlib.contextmanager
def local_model_dir(config: dict[str, Any]) -> Iterator[str]:
    """A folder holding only ``config.json``: what AutoConfig.from_pretrained reads instead of the Hub."""
    with tempfile.TemporaryDirectory(prefix="perfguide-accel-") as d:
        Path(d, "config.json").write_text(json.dumps(config), encoding="utf-8")
        yield d


@contextlib.contextmanager
def offline_hub_metadata() -> Iterator[None]:
    """Answer accelerate's ``verify_on_hub`` locally: a transformers model without auto_map (no network)."""
    from accelerate.commands import estimate

    real = estimate.verify_on_hub
    estimate.verify_on_hub = lambda repo, token=None: SimpleNamespace(config={}, library_name="transformers")
    try:
        yield
    finally:
        estimate.verify_on_hub = real


def accelerate_estimate(model_dir: str) -> list[list[Any]]:
    """accelerate's own gather_data: rows of [dtype, largest layer bytes, total bytes, training usage dict]."""
    from accelerate.commands.estimate import gather_data

    args = SimpleNamespace(model_name=model_dir, library_name="transformers", dtypes=ACCELERATE_DTYPES, trust_remote_code=False)
    with offline_hub_metadata(), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gather_data(args)


# --- perfguide ------------------------------------------------------------------------------------

def perfguide_recommend(config: dict[str, Any], scenario: str, hardware: str) -> perfguide.Recommendation:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return perfguide.recommend(config, scenario=scenario, hardware=hardware)


def perfguide_estimate(config: dict[str, Any], hardware: str) -> perfguide.MemoryEstimate:
    return perfguide.estimate(config, ESTIMATE_SETUP, hardware=hardware)


def speed_rows(models: tuple[str, ...], scenarios: tuple[tuple[str, str], ...], repeats: int, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Per model: recommend() per scenario, estimate(), accelerate's gather_data; first call and warm median."""
    rows = []
    for hub_id in models:
        config = config_of(hub_id)
        row: dict[str, Any] = {"model": hub_id, "recommend": {}}
        for scenario, hw in scenarios:
            first, median, rec = time_call(lambda config=config, scenario=scenario, hw=hw: perfguide_recommend(config, scenario, hw), repeats)
            row["recommend"][scenario] = {"first": first, "median": median, "fits": rec.fits, "setup": rec.setup.label}
        first, median, est = time_call(lambda config=config: perfguide_estimate(config, scenarios[0][1]), repeats)
        row["estimate"] = {"first": first, "median": median, "peak": est.peak_allocated}
        with local_model_dir(config) as d:
            first, median, data = time_call(lambda: accelerate_estimate(d), repeats)
        row["accelerate"] = {"first": first, "median": median, "total_fp32": data[0][2],
                             "training": max(data[0][3].values())}
        row["perfguide_fp32_weights"] = 4 * (perfguide.ModelSpec.from_any(config).total_params)
        per = ", ".join(f"{k} {v['median'] * 1e3:.1f} ms" for k, v in row["recommend"].items())
        log(f"{hub_id}: recommend {per}; "
            f"estimate {row['estimate']['median'] * 1e3:.2f} ms; accelerate {row['accelerate']['median'] * 1e3:.1f} ms")
        rows.append(row)
    return rows


# --- cold start: a fresh interpreter per tool, imports included ----------------------------------

_COLD = {
    "perfguide.recommend": (
        "import perfguide, warnings; warnings.simplefilter('ignore');"
        "perfguide.recommend(json.loads(cfg), scenario='train_gpu_one', hardware='a100-80gb')"),
    # accelerate_estimate() spelled out, so that this process imports accelerate and transformers only
    "accelerate gather_data": (
        "import contextlib, io, pathlib, tempfile, types; from accelerate.commands import estimate as e;"
        "e.verify_on_hub = lambda repo, token=None: types.SimpleNamespace(config={}, library_name='transformers');"
        "d = tempfile.mkdtemp(); pathlib.Path(d, 'config.json').write_text(cfg);"
        "args = types.SimpleNamespace(model_name=d, library_name='transformers', dtypes=DTYPES, trust_remote_code=False);"
        "out = contextlib.redirect_stdout(io.StringIO()); out.__enter__(); e.gather_data(args); out.__exit__(None, None, None)"),
}


def cold_start(hub_id: str) -> dict[str, float]:
    """Seconds from before the first import to the answer, in a fresh process (interpreter start excluded)."""
    out = {}
    for name, body in _COLD.items():
        with tempfile.TemporaryDirectory(prefix="perfguide-cold-") as tmp:
            code = ("import sys, time, json; t0 = time.perf_counter(); cfg = sys.argv[1]; DTYPES = json.loads(sys.argv[2]);"
                    f"{body}; print(time.perf_counter() - t0)")
            env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore", TMPDIR=tmp)
            res = subprocess.run([sys.executable, "-c", code, json.dumps(config_of(hub_id)), json.dumps(ACCELERATE_DTYPES)],
                                 capture_output=True, text=True, env=env, check=True, cwd=ROOT)
        out[name] = float(res.stdout.strip().splitlines()[-1])
    return out


def _time_case_in(tree: Path, repeats: int) -> dict[str, Any]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(tree))
    res = subprocess.run([sys.executable, "-c", _TIME_CASE, *BIG_CASE, str(repeats)], capture_output=True, text=True,
                         env=env, check=False, cwd=tree)
    if res.returncode:
        raise RuntimeError(f"timing {BIG_CASE} in {tree} failed: {res.stderr[-1500:]}")
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    assert Path(out["path"]).resolve().is_relative_to(tree.resolve()), f"timed {out['path']}, not the tree {tree}"
    return out


def before_and_now(repeats: int, baseline: str = BASELINE) -> dict[str, Any]:
    """The big case timed on the baseline commit (a temporary git worktree) and on this tree, alternately in two
    fresh processes each so that load on the shared machine falls on both."""
    with tempfile.TemporaryDirectory(prefix="perfguide-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), baseline], cwd=ROOT, check=True, capture_output=True)
        try:
            runs = [(_time_case_in(tree, repeats), _time_case_in(ROOT, repeats)) for _ in range(2)]
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False, capture_output=True)
    before = min((b for b, _ in runs), key=lambda r: r["median"])
    now = min((n for _, n in runs), key=lambda r: r["median"])
    return {"baseline": baseline, "before": before, "now": now}


# --- memory error vs published measurements (bench/accuracy.py) -----------------------------------

def _load_accuracy() -> Any:
    import accuracy

    return accuracy


def p90(values: list[float]) -> float:
    """90th percentile as bench/accuracy.md reports it: the sorted value at index round(0.9 * (n - 1))."""
    s = sorted(values)
    return s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]


def memory_error(trust: tuple[str, ...] = ("A", "B"), max_rows: int | None = None) -> dict[str, Any]:
    """Median and p90 absolute % error of perfguide and of the anchors on the published measured rows."""
    acc = _load_accuracy()
    with acc.CSV.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))[:max_rows]
    timings: list[float] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = acc.evaluate_all(rows, timings)   # each row read as accuracy.md reads it (held-out constants, releases)
    values = [r for r in results if r.kind == "value" and r.row["trust"] in trust]
    errors: dict[str, list[float]] = {"perfguide": [r.err_pct for r in values]}
    for r in values:
        for name, err in r.anchors.items():
            errors.setdefault(name, []).append(err)
    return {"rows": len(rows), "compared": len(values), "trust": trust,
            "stats": {k: {"n": len(v), "median": statistics.median(v), "p90": p90(v)} for k, v in errors.items() if v}}


# --- report ---------------------------------------------------------------------------------------

def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}" if s < 0.1 else f"{s * 1e3:.0f}"


def _times(ratio: float) -> str:
    """'**21.7x** faster' for accelerate-time / perfguide-time ratios, '**2.0x** slower' below 1."""
    r = ratio if ratio >= 1 else 1 / ratio
    return f"**{r:.{0 if r >= 100 else 1}f}x** {'faster' if ratio >= 1 else 'slower'}"


def render(speed: list[dict[str, Any]], cold: dict[str, float] | None, mem: dict[str, Any] | None, repeats: int,
           scenarios: tuple[tuple[str, str], ...], big: dict[str, Any] | None = None) -> str:
    names = [s for s, _ in scenarios]
    rec_all = [v["median"] for r in speed for v in r["recommend"].values()]
    est_all = [r["estimate"]["median"] for r in speed]
    acc_all = [r["accelerate"]["median"] for r in speed]
    lines = [
        "# perfguide answer time vs accelerate estimate-memory, and memory error vs published measurements", "",
        f"Regenerate: `{COMMAND}`", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs: absolute times vary; the ratios "
        "are measured in one run). Models are the offline catalog's configs; hardware is named (no probing).",
        f"Times: first call (warm-up, in this process), then the median of {repeats} calls. accelerate = its "
        "`estimate-memory` `gather_data` on the same config (only the Hub metadata lookup answered locally, see the "
        "module docstring). estimate = `perfguide.estimate(config, " + json.dumps(ESTIMATE_SETUP) + ", hardware='a100-80gb')`.", "",
        "## Headline", "",
        f"- perfguide.recommend answers {_times(statistics.median(acc_all) / statistics.median(rec_all))} than "
        f"accelerate's estimate-memory: {_ms(statistics.median(rec_all))} ms (median over {len(speed)} models x "
        f"{len(names)} scenarios) vs {_ms(statistics.median(acc_all))} ms (median over the models), warm, same process",
        f"- perfguide.estimate (analytic, one setup) is {_times(statistics.median(acc_all) / statistics.median(est_all))}: "
        f"{_ms(statistics.median(est_all))} ms vs {_ms(statistics.median(acc_all))} ms",
    ]
    if cold:
        p, a = cold["perfguide.recommend"], cold["accelerate gather_data"]
        lines.append(f"- cold start ({COLD_MODEL}, fresh process, imports included): perfguide.recommend {p:.2f} s, "
                     f"accelerate gather_data {a:.2f} s (x{a / p:.1f})")
    if mem:
        st = mem["stats"]
        lines.append(f"- memory error on {st['perfguide']['n']} published trust {'/'.join(mem['trust'])} measurements: perfguide "
                     f"median {st['perfguide']['median']:.1f}%, p90 {st['perfguide']['p90']:.1f}%"
                     + "".join(f"; {k} formula median {v['median']:.1f}%, p90 {v['p90']:.1f}% (n={v['n']})" for k, v in st.items() if k != "perfguide"))
    if big:
        b, n = big["before"], big["now"]
        lines.append(f"- the {BIG_CASE[0]} {BIG_CASE[1]} plan on {BIG_CASE[2]}: {_ms(n['median'])} ms now vs "
                     f"{_ms(b['median'])} ms at {big['baseline']} (before per-model facts were kept per request), "
                     f"**{b['median'] / n['median']:.1f}x** faster, same run")
    lines += ["", "perfguide.recommend searches precision, micro-batch, accumulation, checkpointing, optimizer, "
              "layouts (and LoRA when full fine-tuning does not fit) and prices every candidate; accelerate sizes the "
              "weights (batch 1, no activations) of one config. The estimate column is the like-for-like pricing of one setup.", "",
              "## Answer time per model (ms)", "",
              "| model | " + " | ".join(f"recommend {n} (first / median)" for n in names)
              + " | estimate (first / median) | accelerate (first / median) | accelerate / recommend | accelerate / estimate |",
              "|---|" + "---|" * (len(names) + 4)]
    for r in speed:
        recs = [r["recommend"][n] for n in names]
        rmed = statistics.median(v["median"] for v in recs)
        lines.append(f"| {r['model']} | " + " | ".join(f"{_ms(v['first'])} / {_ms(v['median'])}" for v in recs)
                     + f" | {_ms(r['estimate']['first'])} / {_ms(r['estimate']['median'])}"
                     + f" | {_ms(r['accelerate']['first'])} / {_ms(r['accelerate']['median'])}"
                     + f" | {r['accelerate']['median'] / rmed:.1f} | {r['accelerate']['median'] / r['estimate']['median']:.0f} |")
    lines += ["", "## Same config, same sizes (sanity check)", "",
              "| model | accelerate total fp32 | perfguide 4 x params | accelerate 'Training using Adam' fp32 | perfguide estimate peak allocated |",
              "|---|---|---|---|---|"]
    gib = 2**30
    for r in speed:
        lines.append(f"| {r['model']} | {r['accelerate']['total_fp32'] / gib:.2f} GiB | {r['perfguide_fp32_weights'] / gib:.2f} GiB | "
                     f"{r['accelerate']['training'] / gib:.2f} GiB | {r['estimate']['peak'] / gib:.2f} GiB |")
    lines += ["", "accelerate builds `AutoModel` (no LM head), so its total is below 4 x params for untied heads; its "
              "training figure has no activations. perfguide's peak is for the estimate setup above (bf16 AMP, AdamW, "
              "batch 1 x 2048 tokens)."]
    if big:
        b, n = big["before"], big["now"]
        lines += ["", f"## {BIG_CASE[0]} {BIG_CASE[1]} ({BIG_CASE[2]}): before and now", "",
                  f"Timed in fresh processes on a git worktree of {big['baseline']} and on this tree, twice each, "
                  f"alternating (the faster of each pair kept); first call, then the median of {repeats}.", "",
                  "| code | first (ms) | median (ms) | chosen setup | step (s) |", "|---|---|---|---|---|",
                  f"| {big['baseline']} | {_ms(b['first'])} | {_ms(b['median'])} | {b['label']} | {b['step']:.4g} |",
                  f"| this tree | {_ms(n['first'])} | {_ms(n['median'])} | {n['label']} | {n['step']:.4g} |"]
    if mem:
        lines += ["", "## Memory error vs published measurements", "",
                  f"From bench/accuracy.py's `evaluate` on all {mem['rows']} rows of its CSV; {mem['compared']} measured rows "
                  f"with trust {'/'.join(mem['trust'])} compared in their own metric and unit. Absolute % error; p90 = sorted value at index round(0.9 (n-1)), as in accuracy.md.", "",
                  "| estimator | n | median | p90 |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['n']} | {v['median']:.1f}% | {v['p90']:.1f}% |" for k, v in mem["stats"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="timed calls after the warm-up (default 7)")
    ap.add_argument("--no-cold", action="store_true", help="skip the two fresh-process cold-start timings")
    ap.add_argument("--out", type=Path, default=OUT, help=f"markdown report (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--baseline", default=BASELINE, help=f"commit the big case is also timed on (default {BASELINE}); 'none' skips it")
    a = ap.parse_args(argv)
    speed = speed_rows(MODELS, SCENARIOS, a.repeats)
    cold = None if a.no_cold else cold_start(COLD_MODEL)
    big = None if a.baseline == "none" else before_and_now(a.repeats, a.baseline)
    mem = memory_error()
    text = render(speed, cold, mem, a.repeats, SCENARIOS, big)
    return publish(text, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
