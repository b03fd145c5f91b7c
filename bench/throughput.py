"""perfguide's training speed model against published throughput, out of sample.

Run: ``.venv/bin/python bench/throughput.py`` (writes bench/results/throughput.md). Every row of
bench/data/published_throughput.csv is either priced (tokens/s per GPU, predicted vs published) or listed with
the reason perfguide cannot express it. Figures are leave-one-source-out: the constants fitted from the rows
(perfguide/data/efficiency.json, see ``bench/throughput_fit.py``) are refitted without the source being
predicted, so no row is predicted by constants it helped choose. Beside each row: the usual hand estimate
(6·N·tokens at a fixed 40% MFU), on the same rows.
"""

from __future__ import annotations

import os
import statistics
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import SourceSummary, publish
from throughput_bnb import bnb_release
from throughput_rows import PROTOCOL, Case, load

from perfguide.speed.rates import gpu_peak_tflops
from perfguide.speed.training import training_speed

OUT = ROOT / "bench" / "results" / "throughput.md"
HAND_MFU = 0.40
#: issue 24's targets for the speed model: per-source median errors, and the rank correlation inside each table
TARGET_MEDIAN, TARGET_WORST, TARGET_SPEARMAN = 15.0, 30.0, 0.9

Predictor = Callable[[Case], float]


def predict(case: Case) -> float:
    """perfguide's tokens/s per GPU for the case (the raw cost model: no machine calibration)."""
    with warnings.catch_warnings(), bnb_release(case.bnb_release):
        warnings.simplefilter("ignore")
        tp = training_speed(case.spec, case.setup, case.hardware, framework=case.framework,
                            attention_kernel=case.attention_kernel, optimizer_impl=case.optimizer_impl,
                            loss=case.loss)
    step = tp.step_time_s + (PROTOCOL["run_overhead_s"] / case.steps if case.steps else 0.0)
    return tp.tokens_per_s * tp.step_time_s / step / case.setup.world_size * case.rank_share


def hand(case: Case) -> float:
    """The anchors' rule of thumb: 6 * N FLOPs per token at 40% of the compute dtype's peak."""
    gpu = case.hardware.smallest_gpu
    assert gpu is not None
    peak, _ = gpu_peak_tflops(gpu, case.setup.compute_dtype)
    return HAND_MFU * peak * 1e12 / (6 * case.spec.total_params)


def err(pred: float, pub: float) -> float:
    """Signed relative error of the predicted throughput, in percent."""
    return 100.0 * (pred - pub) / pub


def p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = 0.9 * (len(ordered) - 1)
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rho: Pearson correlation of the ranks (ties averaged)."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else float("nan")


def summary(cases: Sequence[Case], preds: dict[str, float]) -> dict[str, float]:
    errors = [abs(err(preds[c.row_id], c.published)) for c in cases]
    return {"n": len(errors), "median": statistics.median(errors) if errors else float("nan"), "p90": p90(errors)}


def by(cases: Sequence[Case], key: Callable[[Case], str]) -> dict[str, list[Case]]:
    out: dict[str, list[Case]] = {}
    for c in cases:
        out.setdefault(key(c), []).append(c)
    return out


def _fmt(x: float) -> str:
    return "n/a" if x != x else f"{x:.0f}%"


def _sources(cases: Sequence[Case], preds: dict[str, float]) -> SourceSummary:
    return SourceSummary.of({g: [abs(err(preds[c.row_id], c.published)) for c in rows]
                             for g, rows in by(cases, lambda c: c.group).items()})


def _rank_line(cases: Sequence[Case], preds: dict[str, float]) -> str:
    """Spearman's rho inside every table of >= 5 rows against the target; the tables below it by name."""
    rhos = {t: spearman([preds[c.row_id] for c in rows], [c.published for c in rows])
            for t, rows in by(cases, lambda c: c.table).items() if len(rows) >= 5}
    low = sorted(t for t, rho in rhos.items() if not rho >= TARGET_SPEARMAN)
    verdict = "met" if not low else f"NOT met ({', '.join(f'{t} {rhos[t]:.2f}' for t in low)})"
    return f"Spearman >= {TARGET_SPEARMAN} in {len(rhos) - len(low)}/{len(rhos)} tables of >= 5 rows: {verdict}"


def report(cases: list[Case], skipped: list, preds: dict[str, float], hands: dict[str, float], how: str,
           sample: str = "out of sample") -> str:
    model, anchor = summary(cases, preds), summary(cases, hands)
    lines = [
        "# Training throughput: perfguide vs published measurements", "",
        "Regenerate: `.venv/bin/python bench/throughput.py`. Rows: bench/data/published_throughput.csv (sources in "
        "its `source`/`source_path`/`commit` columns). Metric: tokens/s per GPU. Error = (predicted - published) / published.",
        "", how, "",
        f"- rows priced: {len(cases)}; rows perfguide cannot express: {len(skipped)} (listed at the end)",
        f"- **perfguide, {sample}: median |error| {_fmt(model['median'])}, p90 {_fmt(model['p90'])}**",
        f"- hand estimate (6·N·tokens at {HAND_MFU:.0%} MFU): median |error| {_fmt(anchor['median'])}, p90 {_fmt(anchor['p90'])}",
        f"- perfguide per source: {_sources(cases, preds).line(TARGET_MEDIAN, TARGET_WORST)}",
        f"- rank correlation: {_rank_line(cases, preds)}",
        "", "## By source (the unit left out)", "",
        "| source | rows | perfguide median | perfguide p90 | hand median | hand p90 |", "|---|---|---|---|---|---|",
    ]
    for group, rows in sorted(by(cases, lambda c: c.group).items()):
        m, h = summary(rows, preds), summary(rows, hands)
        lines.append(f"| {group} | {m['n']} | {_fmt(m['median'])} | {_fmt(m['p90'])} | {_fmt(h['median'])} | {_fmt(h['p90'])} |")
    lines += ["", "## Rank correlation inside each table (tables of >= 5 rows)", "",
              "| table | rows | Spearman perfguide | Spearman hand |", "|---|---|---|---|"]
    for table, rows in sorted(by(cases, lambda c: c.table).items()):
        if len(rows) < 5:
            continue
        pub = [c.published for c in rows]
        rho = spearman([preds[c.row_id] for c in rows], pub)
        rho_h = spearman([hands[c.row_id] for c in rows], pub)
        lines.append(f"| {table} | {len(rows)} | {rho:.3f} | {rho_h:.3f} |")
    lines += ["", "## Every row", "",
              "| row | source | framework | setup | GPU | published | perfguide | error | hand | hand error |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        p, h = preds[c.row_id], hands[c.row_id]
        lines.append(f"| {c.row_id} | {c.group} | {c.framework} | {c.label} | {c.hardware.name} | {c.published:.0f} | "
                     f"{p:.0f} | {err(p, c.published):+.0f}% | {h:.0f} | {err(h, c.published):+.0f}% |")
    lines += ["", "## Rows not priced", "", "| row | source | model | reason |", "|---|---|---|---|"]
    for row, why in skipped:
        lines.append(f"| {row['row_id']} | {row['source']} | {row['model']} | {why} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    from throughput_fit import PRIOR_WEIGHT, PRIOR_WEIGHTS, loso

    cases, skipped = load()
    hands = {c.row_id: hand(c) for c in cases}
    if "--as-shipped" in sys.argv:
        preds = {c.row_id: predict(c) for c in cases}
        how = "Constants: perfguide/data/efficiency.json as shipped, applied to rows it was fitted on (in-sample)."
        return publish(report(cases, skipped, preds, hands, how, "in sample"), OUT.with_name("throughput_in_sample.md"))
    nested = "--flat" not in sys.argv
    jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 1   # folds in parallel processes
    preds, folds = loso(cases, predict, nested=nested, jobs=jobs)
    weights = ", ".join(f"{g} {v[('prior_weight',)]}" for g, v in folds.items())
    how = ("Out of sample: each source's rows are predicted with the constants of bench/throughput_fit.py refitted on "
           f"the other {len(folds) - 1} sources (leave one source out); constants no remaining row informs keep their "
           "physical prior. The fit is a MAP fit (log-normal prior on each constant); its weight is chosen among "
           f"{' / '.join(map(str, PRIOR_WEIGHTS))} inside each fold by an inner leave-one-source-out on that fold's "
           f"training sources only (nested), so no choice sees the source it predicts (chosen: {weights}). "
           "`--jobs N` runs the folds in N processes (same numbers); `--flat` skips the inner loop (weight fixed at "
           f"{PRIOR_WEIGHT}); `--as-shipped` prices the rows with the all-rows fit stored in efficiency.json (in sample).")
    if not nested:
        how += " This run: --flat."
    return publish(report(cases, skipped, preds, hands, how) + _folds(folds), OUT)


def _folds(folds: dict[str, dict]) -> str:
    keys = list(next(iter(folds.values())))
    lines = ["", "## Constants fitted in each fold (source left out)", "",
             "| left out | " + " | ".join(".".join(k) for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for group, values in folds.items():
        lines.append(f"| {group} | " + " | ".join(f"{values[k]:.3g}" for k in keys) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
