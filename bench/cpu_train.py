"""Does perfguide's train_cpu recommendation pick the fastest setup on this machine? Measure it against a grid.

Run: ``.venv/bin/python bench/cpu_train.py`` (writes bench/results/cpu_train.md; ``--help`` for sizes).

A small Llama (built from a config, never downloaded) trains a few real optimizer steps for the recommended
setup and for every point of threads x micro-batch x precision, all in this one process, one after another,
with the global batch held fixed by gradient accumulation. Every point runs through the real ``Trainer`` built
from ``rec.training_args(**overrides)``: the optimizer (fused AdamW), accelerate's bf16 autocast, the
accumulation loop and the dataloader are exactly what a user of the recommendation runs, and the grid only
turns the three knobs under test. A step is timed from one ``on_step_end`` to the next, so data loading,
forward/backward of every micro-batch, clipping and the optimizer update all count; the first ``--warmup``
steps (optimizer-state allocation, oneDNN kernel creation) are excluded.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import perfguide
from bench._report import publish
from perfguide.measure.verify import random_token_dataset
from perfguide.recommendation import Recommendation
from perfguide.speed import estimate_speed

OUT = ROOT / "bench" / "results" / "cpu_train.md"
COMMAND = ".venv/bin/python bench/cpu_train.py"

# ~10.6M parameters: big enough that matmuls, not Python overhead, dominate a step; small enough that the
# 17 measured setups run in a few minutes on two cores.
CONFIG: dict[str, Any] = dict(
    model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=8192, hidden_size=256, intermediate_size=704,
    num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
    tie_word_embeddings=False,
)
SEQ_LEN = 128
GLOBAL_BATCH = 8
MICRO_BATCHES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Point:
    """One measured setup: the three knobs under test (everything else is the recommendation's)."""

    threads: int
    micro_batch: int
    precision: str  # "fp32" or "bf16" (autocast over fp32 weights, as the Trainer's bf16=True does)

    @property
    def label(self) -> str:
        return f"threads={self.threads} mb={self.micro_batch} {self.precision}"


@dataclass(frozen=True)
class Row:
    name: str
    point: Point
    accumulation: int
    tokens_per_s: float
    step_times: tuple[float, ...]
    predicted_tokens_per_s: float
    recommended: bool = False


def recommended_point(rec: Recommendation) -> Point:
    s = rec.setup
    return Point(threads=s.cpu_threads or rec.hardware.cpu.physical_cores, micro_batch=s.micro_batch_size,
                 precision="bf16" if s.autocast == "bf16" else "fp32")


def grid(rec: Recommendation, micro_batches: tuple[int, ...] = MICRO_BATCHES) -> tuple[list[Point], list[str]]:
    """(points, skipped-reasons): threads {1, physical cores} x micro-batches dividing the batch x precisions."""
    cpu = rec.hardware.cpu
    threads = sorted({1, cpu.physical_cores})
    precisions = ["fp32"]
    skipped = []
    if cpu.native_bf16:
        precisions.append("bf16")
    else:
        skipped.append(f"bf16 autocast: {cpu.model_name} has no AVX512-BF16/AMX (hardware.cpu.native_bf16 is False), "
                       "so bf16 would be emulated; not measured")
    batch = rec.request.global_batch_size
    mbs = [m for m in micro_batches if batch % m == 0]
    skipped += [f"micro-batch {m}: does not divide the global batch {batch}" for m in micro_batches if batch % m]
    return [Point(t, m, p) for t in threads for p in precisions for m in mbs], skipped


def predicted_tokens_per_s(rec: Recommendation, point: Point) -> float:
    """perfguide's speed model on the recommended setup with the three knobs turned to ``point``."""
    s = rec.setup.replace(micro_batch_size=point.micro_batch, gradient_accumulation_steps=rec.request.global_batch_size // point.micro_batch, autocast="bf16" if point.precision == "bf16" else None, cpu_threads=point.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return estimate_speed(rec.model, s, rec.hardware).tokens_per_s


def _step_timer() -> Any:
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall-clock time at the end of every optimizer step; step k costs ends[k] - ends[k-1]."""

        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    return StepTimer()


def train_steps(rec: Recommendation, config: dict[str, Any], overrides: dict[str, Any], threads: int, warmup: int, steps: int,
                seed: int = 0) -> tuple[float, ...]:
    """Seconds of each measured optimizer step (after ``warmup`` >= 1 steps) of a freshly initialised model."""
    if warmup < 1 or steps < 1:
        raise ValueError(f"warmup and steps must be >= 1 (a step is timed from the previous step's end), got {warmup}, {steps}")
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _timed_training(rec, config, overrides, warmup, steps, seed)
    finally:
        torch.set_num_threads(before)  # a caller (or a test process) keeps its own setting


def _timed_training(rec: Recommendation, config: dict[str, Any], overrides: dict[str, Any], warmup: int, steps: int,
                    seed: int) -> tuple[float, ...]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PrinterCallback, Trainer

    torch.manual_seed(seed)
    hf_config = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    model = AutoModelForCausalLM.from_config(hf_config, **rec.model_kwargs())
    mb = overrides.get("per_device_train_batch_size", rec.setup.micro_batch_size)
    ga = overrides.get("gradient_accumulation_steps", rec.setup.gradient_accumulation_steps)
    total = warmup + steps
    data = random_token_dataset(rec, rows=mb * ga * total, seed=seed)
    timer = _step_timer()
    with tempfile.TemporaryDirectory(prefix="perfguide-bench-") as out:
        args = rec.training_args(output_dir=out, max_steps=total, save_strategy="no", logging_strategy="no",
                                 report_to="none", disable_tqdm=True, **overrides)
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[timer])
        trainer.remove_callback(PrinterCallback)  # the end-of-training metrics dict, once per setup
        trainer.train()
    ends = timer.ends
    if len(ends) != total:
        raise RuntimeError(f"expected {total} optimizer steps, the Trainer ran {len(ends)}")
    return tuple(b - a for a, b in zip(ends[warmup - 1:], ends[warmup:]))


def overrides_for(rec: Recommendation, point: Point) -> dict[str, Any]:
    return {"per_device_train_batch_size": point.micro_batch,
            "gradient_accumulation_steps": rec.request.global_batch_size // point.micro_batch,
            "bf16": point.precision == "bf16"}


def measure(rec: Recommendation, config: dict[str, Any], name: str, point: Point, overrides: dict[str, Any], warmup: int,
            steps: int, recommended: bool = False) -> Row:
    times = train_steps(rec, config, overrides, point.threads, warmup, steps)
    tokens = rec.request.global_batch_size * rec.request.seq_len
    # the fastest measured step (timeit's rule): slower ones are other processes interfering, which a shared
    # machine adds in bursts of several seconds; on a quiet machine fastest and median agree within a few %
    return Row(name=name, point=point, accumulation=rec.request.global_batch_size // point.micro_batch,
               tokens_per_s=tokens / min(times), step_times=times, predicted_tokens_per_s=predicted_tokens_per_s(rec, point),
               recommended=recommended)


def run(warmup: int = 1, steps: int = 3, micro_batches: tuple[int, ...] = MICRO_BATCHES, max_points: int | None = None,
        seq_len: int = SEQ_LEN, global_batch: int = GLOBAL_BATCH, config: dict[str, Any] | None = None,
        hardware: perfguide.Hardware | None = None, log: Any = print) -> dict[str, Any]:
    """Recommend (on the probed machine by default), then measure the recommendation and every grid point, in order."""
    config = config or CONFIG
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no NVIDIA driver" is expected here
        rec = perfguide.recommend(config, scenario="train_cpu", hardware=hardware, seq_len=seq_len, global_batch_size=global_batch)
    points, skipped = grid(rec, micro_batches)
    points = points[:max_points] if max_points is not None else points
    t0, load_before = time.perf_counter(), os.getloadavg()[0]
    rec_point = recommended_point(rec)
    # one unreported step first: the process's first Trainer pays lazy imports and oneDNN/allocator set-up that
    # would otherwise land on whichever setup is measured first (the recommended one)
    train_steps(rec, config, {}, rec_point.threads, warmup=1, steps=1)
    rows = [measure(rec, config, "recommended", rec_point, {}, warmup, steps, recommended=True)]
    log(f"recommended ({rec.setup.label}, threads={rec_point.threads}): {rows[0].tokens_per_s:,.0f} tokens/s")
    for p in points:
        rows.append(measure(rec, config, "grid", p, overrides_for(rec, p), warmup, steps))
        log(f"{p.label}: {rows[-1].tokens_per_s:,.0f} tokens/s")
    return {"rec": rec, "rows": rows, "skipped": skipped, "rec_point": rec_point, "warmup": warmup, "steps": steps,
            "seconds": time.perf_counter() - t0, "load": (load_before, os.getloadavg()[0])}


# --- report ---------------------------------------------------------------------------------------

def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers: recommended/best measured throughput, and predicted vs measured step time.

    When the recommended setup is also a grid point it was measured twice; like every setup, it is credited with
    its fastest measured step (over both runs), so the ratio compares setups, not moments of the machine.
    """
    rows: list[Row] = result["rows"]
    rec: Recommendation = result["rec"]
    rec_row = rows[0]
    twin = next((r for r in rows[1:] if r.point == rec_row.point), None)
    rec_tps = max(rec_row.tokens_per_s, twin.tokens_per_s if twin else 0.0)
    best = max(rows, key=lambda r: r.tokens_per_s)
    pred_best = max(rows[1:], key=lambda r: r.predicted_tokens_per_s) if len(rows) > 1 else rec_row
    return {"ratio": rec_tps / best.tokens_per_s, "rec_tps": rec_tps, "best": best, "rec_row": rec_row, "twin": twin,
            "best_is_recommended": best.point == rec_row.point, "predicted_step_s": rec.throughput.step_time_s,
            "measured_step_s": rec.request.global_batch_size * rec.request.seq_len / rec_tps, "predicted_best": pred_best}


def knob_effects(rows: list[Row]) -> list[tuple[str, float, float, int]]:
    """(knob change, measured speed-up, predicted speed-up, pairs): medians over grid pairs differing in that knob only.

    This is the "why" when the recommendation is not the fastest: it shows which knob perfguide's speed model
    mis-ranks on this machine.
    """
    grid_rows = [r for r in rows if not r.recommended]
    by_point = {r.point: r for r in grid_rows}
    threads = sorted({r.point.threads for r in grid_rows})
    mbs = sorted({r.point.micro_batch for r in grid_rows})
    changes = []
    if len(threads) > 1:
        changes.append((f"threads {threads[0]} -> {threads[-1]}", lambda p: p.threads == threads[0], {"threads": threads[-1]}))
    if {"fp32", "bf16"} <= {r.point.precision for r in grid_rows}:
        changes.append(("fp32 -> bf16 autocast", lambda p: p.precision == "fp32", {"precision": "bf16"}))
    if len(mbs) > 1:
        changes.append((f"micro-batch {mbs[0]} -> {mbs[-1]} (less accumulation)", lambda p: p.micro_batch == mbs[0], {"micro_batch": mbs[-1]}))
    out = []
    for name, is_base, update in changes:
        pairs = [(r, by_point[other]) for r in grid_rows if is_base(r.point)
                 and (other := Point(**{**r.point.__dict__, **update})) in by_point]
        if pairs:
            out.append((name, statistics.median(b.tokens_per_s / a.tokens_per_s for a, b in pairs),
                        statistics.median(b.predicted_tokens_per_s / a.predicted_tokens_per_s for a, b in pairs), len(pairs)))
    return out


def busy_machine(result: dict[str, Any], spread_limit: float = 0.2) -> str | None:
    """A warning when other processes shared the run: strong if steps of one setup were far apart, mild if only busy."""
    rows: list[Row] = result["rows"]
    spread = [max(r.step_times) / min(r.step_times) - 1 for r in rows if len(r.step_times) > 1]
    noisy = sum(1 for x in spread if x > spread_limit)
    cores = result["rec"].hardware.cpu.logical_cores
    load = result["load"][0]  # before the first setup: afterwards the bench's own threads are in it
    busy = load > 0.25 * cores + 0.5
    if noisy > len(rows) // 10:
        return (f"**This run was disturbed by other processes** (1-min load average {load:.1f} on {cores} cores at the start; "
                f"{noisy} of {len(spread)} setups had measured steps more than {spread_limit:.0%} apart): "
                f"treat the ratios below as noise and rerun `{COMMAND}` on a quiet machine.")
    if busy:
        return (f"Other processes were running (1-min load average {load:.1f} on {cores} cores at the start). The steps of "
                f"each setup agree within {spread_limit:.0%} ({noisy} of {len(spread)} setups beyond), but setups measured "
                f"at different moments can still differ by the repeat noise shown below; rerun `{COMMAND}` on a quiet "
                "machine for final numbers.")
    return None


def _finding(s: dict[str, Any]) -> list[str]:
    """Whether the recommendation is the fastest measured setup; if not, by how much and which knob is mis-ranked."""
    best, rec_row, twin = s["best"], s["rec_row"], s["twin"]
    noise = abs(twin.tokens_per_s / rec_row.tokens_per_s - 1) if twin else None
    out = []
    if noise is not None:
        out.append(f"- The recommended setup was measured twice (the recommended run and its grid copy): "
                   f"{rec_row.tokens_per_s:,.0f} vs {twin.tokens_per_s:,.0f} tokens/s, {noise:.1%} apart. "
                   "Differences below that are run-to-run noise on this machine; the recommendation is credited with the faster.")
    if s["best_is_recommended"]:
        out.append("- The recommended setup is the fastest measured setup.")
        return out
    gap = 1 - s["ratio"]
    within_noise = noise is not None and gap <= noise
    differs = [k for k, a, b in (("threads", best.point.threads, rec_row.point.threads),
                                 ("micro-batch", best.point.micro_batch, rec_row.point.micro_batch),
                                 ("precision", best.point.precision, rec_row.point.precision)) if a != b]
    out.append(f"- The fastest measured setup is {best.point.label} ({best.tokens_per_s:,.0f} tokens/s): the recommendation is "
               f"{gap:.1%} slower{' (within the noise above)' if within_noise else ''}; it differs in {', '.join(differs) or 'nothing'}.")
    rel = best.predicted_tokens_per_s / rec_row.predicted_tokens_per_s
    out.append(f"- perfguide's speed model predicted {best.point.label} at {best.predicted_tokens_per_s:,.0f} tokens/s vs "
               f"{rec_row.predicted_tokens_per_s:,.0f} for the recommendation (x{rel:.2f}): "
               + ("it ranks the faster setup clearly lower, so the gap is a speed-model error on this machine (see the knob table)."
                  if rel < 0.95 else "a near tie in the model (within 5%), which it cannot resolve; the knob table shows which effect it under-rates."
                  if rel < 1 else "it ranks the faster setup at least as high, so the search did not pick the model's own best."))
    return out


def render(result: dict[str, Any]) -> str:
    rec: Recommendation = result["rec"]
    rows: list[Row] = result["rows"]
    s = summary(result)
    cpu = rec.hardware.cpu
    best = s["best"]
    lines = [
        "# train_cpu: recommended setup vs a measured grid", "",
        f"Regenerate: `{COMMAND}` (about 1 minute on 2 idle cores, several on a shared machine; run it on a quiet one).", "",
        f"Machine: {platform.machine()}, {cpu.model_name}, {cpu.physical_cores} physical / {cpu.logical_cores} logical cores, "
        f"native bf16: {cpu.native_bf16} ({'AMX' if cpu.amx else 'AVX512-BF16' if cpu.avx512_bf16 else 'none'}).",
        f"Model: Llama from config, {rec.model.total_params / 1e6:.1f}M parameters; seq_len {rec.request.seq_len}, "
        f"global batch {rec.request.global_batch_size} (fixed: micro-batch x accumulation).",
        f"Each setup: fresh model, real `Trainer` from `rec.training_args(...)`, {result['warmup']} warm-up step(s) excluded, "
        f"tokens/s from the fastest of {result['steps']} measured optimizer steps (all listed); all setups in one process, one after another "
        f"({result['seconds']:.0f} s in all).", "",
        f"Recommended: `{rec.setup.label}`, threads={s['rec_row'].point.threads}. "
        f"1-min load average before / after: {result['load'][0]:.1f} / {result['load'][1]:.1f}.", "",
        *([busy, ""] if (busy := busy_machine(result)) else []),
        "## Headline", "",
        f"- recommended / best measured throughput: **{s['ratio']:.2f}** "
        f"({s['rec_tps']:,.0f} vs {best.tokens_per_s:,.0f} tokens/s, best = {best.point.label}"
        f"{' = the recommended setup' if s['best_is_recommended'] else ''})",
        f"- predicted step time of the recommended setup: {s['predicted_step_s']:.3f} s; measured: {s['measured_step_s']:.3f} s "
        f"(measured / predicted = {s['measured_step_s'] / s['predicted_step_s']:.2f})",
        f"- setup perfguide's speed model ranks fastest among the grid: {s['predicted_best'].point.label}", "",
        *_finding(s), "",
        "## Knob effects (grid pairs that differ in one knob only; medians)", "",
        "| change | measured speed-up | predicted speed-up | pairs |", "|---|---|---|---|",
        *[f"| {name} | x{m:.2f} | x{p:.2f} | {n} |" for name, m, p, n in knob_effects(rows)], "",
        "## All setups", "",
        "| setup | threads | micro-batch x accum | precision | tokens/s | relative to best | predicted tokens/s | step times (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = "**recommended**" if r.recommended else ("grid (= recommended)" if r.point == s["rec_row"].point else "grid")
        lines.append(f"| {name} | {r.point.threads} | {r.point.micro_batch} x {r.accumulation} | {r.point.precision} | "
                     f"{r.tokens_per_s:,.0f} | {r.tokens_per_s / best.tokens_per_s:.2f} | {r.predicted_tokens_per_s:,.0f} | "
                     f"{', '.join(f'{t:.3f}' for t in r.step_times)} |")
    if result["skipped"]:
        lines += ["", "Skipped:", *[f"- {why}" for why in result["skipped"]]]
    lines += ["", "bf16 here means the Trainer's `bf16=True` on CPU: accelerate's `torch.autocast('cpu', torch.bfloat16)` over "
              "fp32 weights (what perfguide recommends as true AMP)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=1, help="optimizer steps excluded from timing (default 1)")
    ap.add_argument("--steps", type=int, default=3, help="measured optimizer steps per setup (default 3)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"markdown report (default {OUT.relative_to(ROOT)})")
    a = ap.parse_args(argv)
    result = run(warmup=a.warmup, steps=a.steps)
    text = render(result)
    return publish(text, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
