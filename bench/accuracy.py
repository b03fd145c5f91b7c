"""Accuracy of perfguide's analytic memory model against published measurements.

Run: ``.venv/bin/python bench/accuracy.py`` (writes bench/results/accuracy.md). Every row of
bench/data/published_measurements.csv is either compared (in the metric and unit it reports), judged on its
fits / does-not-fit verdict (OOM and max-fit rows), checked as an anchor formula (tool outputs), or listed
with the reason it cannot be expressed. Anchors computed in the same run: accelerate estimate-memory's
formula and DeepSpeed's ZeRO model-states formula, each on the same rows.
"""

from __future__ import annotations

import csv
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from accuracy_anchors import accelerate_anchor, deepspeed_anchor
from accuracy_context import torch_era
from accuracy_gauge import gauge_bytes, gauge_fits, gauge_note, gauged, host_ram_fits
from accuracy_hardware import _hardware
from accuracy_litgpt import litgpt_inference
from accuracy_loss import _block_code_bytes, _bnb_version, _loss_bytes, _resident_bytes, _transformers_version
from accuracy_prefill import with_previous_cache, with_prompt_logits
from accuracy_replay import replayed_max_batch, replayed_max_context, with_replayed_reserve
from accuracy_report import MAX_SEQ_LEN, Result, report
from accuracy_reserved import RESERVED_LINE, boundary_note, reserved_line_fits
from accuracy_runtime import checkpoint_release, deepspeed_runtime, t5_release
from accuracy_setup import PAGED, Skip, _infer_setup, _nf4_library, _pre_torch2, _precision, _train_setup
from accuracy_spec import _spec, trained_spec
from accuracy_trl import trl_release

from perfguide._data import load
from perfguide.errors import PerfGuideError
from perfguide.hardware.types import Hardware
from perfguide.memory.analytic import training_memory
from perfguide.memory.index_limits import index_overflow
from perfguide.memory.inference import estimate_inference
from perfguide.memory.types import MemoryEstimate
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

CSV = ROOT / "bench" / "data" / "published_measurements.csv"
OUT = ROOT / "bench" / "results" / "accuracy.md"

UNITS = {"GB": 1e9, "MB": 1e6, "GiB": 2**30, "MiB": 2**20}
#: a metric that adds the CUDA context (and any other non-PyTorch device memory) to the allocator's peak
ALLOCATED_PLUS_CONTEXT = "allocated_plus_context"


def estimate_memory(spec: ModelSpec, setup: Setup, hw: Hardware | None, *, loss_bytes: int | None = None,
                    bnb_version: str | None = None, grads_persist: bool = False,
                    nf4_library: str = "bitsandbytes", resident_bytes: int = 0, block_code_bytes: int = 0,
                    accelerate_version: str | None = None) -> MemoryEstimate:
    """The memory model for a row: training with the row's loss path, bitsandbytes and accelerate releases,
    zero_grad behaviour and 4-bit library, or inference."""
    if setup.task == "infer":
        return estimate_inference(spec, setup, hw)
    return training_memory(spec, setup, hw, loss_bytes=loss_bytes, bnb_version=bnb_version, grads_persist=grads_persist,
                           nf4_library=nf4_library, resident_bytes=resident_bytes, block_code_bytes=block_code_bytes,
                           accelerate_version=accelerate_version)


#: a row's accelerate release, where its notes state one ("accelerate 1.10.0"); None: the installed one
ACCELERATE_RELEASE = re.compile(r"\baccelerate (\d+\.\d+(?:\.\d+)?)\b")


def _accelerate_version(row: dict[str, str]) -> str | None:
    """The release, for rows that ran FSDP2 itself: the HF + peft FSDP1 rows priced with per-parameter units
    (accuracy_parallelism) accumulated through FSDP1's own no_sync, whatever their accelerate."""
    found = ACCELERATE_RELEASE.search(row["notes"])
    return found.group(1) if found and "FSDP2" in row["parallelism"] else None


def _unit(unit: str) -> float:
    if "MiB*1.048576" in unit:
        return 1e6
    for key in ("GiB", "MiB", "GB", "MB"):
        if key in unit:
            return UNITS[key]
    raise Skip(f"unit {unit!r} not understood")


def _metric(metric: str) -> str:
    if "NVML peak - torch peak reserved" in metric:   # optimum's benchmark_gptq.py: the allocator's peak + the rest
        return ALLOCATED_PLUS_CONTEXT
    if "nvidia-smi" in metric:
        return "device_total"
    if "reserved" in metric:
        return "peak_reserved"
    if "allocated" in metric or "Max GPU RAM" in metric:
        return "peak_allocated"
    raise Skip(f"metric {metric!r} is not a torch/nvidia-smi peak")


def _pct(pred: float, pub: float) -> float:
    return abs(pred - pub) / pub * 100


def evaluate(row: dict[str, str], timings: list[float]) -> Result:
    kind = row["value_kind"]
    if kind == "estimate_tool_output":
        return Result(row, "skip", "tool output: checked as a formula in tests/test_sharding.py and the anchor table")
    if kind in ("not_supported", "error"):
        return Result(row, "skip", f"value_kind={kind}: no memory number ({row['notes'] or row['value_kind']})")
    try:
        spec = _spec(row["model_hf_id"])
        if "SequenceClassification" in row["method"]:  # a 2-label classifier on the pooled token, not the MLM head
            spec = spec.model_copy(update={"head": "sequence_classification", "num_labels": 2})
        task = row["task"]
        if task.startswith("load"):
            raise Skip("load-only rows are not a training/inference step")
        setup = _infer_setup(row, spec) if task.startswith("infer") else _train_setup(row, spec)
        spec = trained_spec(row, spec)   # FSDP1 size-based auto-wrap: a tied head trained as a second weight
        hw = _hardware(row["gpu_type"], setup.num_gpus)
        loss, bnb = _loss_bytes(row, spec, setup), _bnb_version(row)
        t0 = time.perf_counter()
        est = estimate_memory(spec, setup, hw, loss_bytes=loss, bnb_version=bnb, grads_persist=_pre_torch2(row),
                              accelerate_version=_accelerate_version(row),
                              nf4_library=_nf4_library(row), resident_bytes=_resident_bytes(row, spec, setup),
                              block_code_bytes=_block_code_bytes(row, spec, setup))
        timings.append(time.perf_counter() - t0)
        if setup.task == "infer" and setup.strategy != "tp" and row["source_group"].startswith("litgpt"):  # litgpt layout
            compute = str(_precision(row["precision"])["weights_dtype"])
            # litgpt lays out its weights and bitsandbytes' load / matmul copies itself (accuracy_litgpt.py): it takes the
            # rest (KV cache, prefill activations, logits) from the 16-bit plan, which has no bitsandbytes copies
            plain = estimate_memory(spec, setup.replace(weights_dtype=compute), hw) if setup.weights_dtype in ("int8", "nf4") else est
            est = litgpt_inference(spec, est, row["quantization"], compute, setup.num_gpus, rest=plain.peak_allocated - plain.weights)
        release = _transformers_version(row)
        if setup.task == "infer" and release is not None:  # generate's prefill logits as the row's release ran it
            est = with_previous_cache(with_prompt_logits(est, spec, setup, release), spec, setup, release)
        est = with_replayed_reserve(row, setup, est)   # reserved from the allocator replayed over the row's own step
    except Skip as exc:
        return Result(row, "skip", str(exc))
    except (PerfGuideError, NotImplementedError, ValueError) as exc:
        # a Setup pydantic rejects: its first line only counts the errors ("1 validation error for Setup"); show the reason
        errors = getattr(exc, "errors", None)
        reason = str(errors()[0]["msg"]) if callable(errors) else str(exc).splitlines()[0]
        return Result(row, "skip", f"not expressible: {reason[:160]}")
    if kind in ("oom", "fits", "max_batch_fit", "max_seq_fit"):
        if hw is None:
            return Result(row, "skip", f"verdict row without a known GPU ({row['gpu_type']!r})")
        note = "" if RESERVED_LINE not in row["mem_metric"] else (
            f"{boundary_note(est, spec, setup, hw)}; a plan on this card fits {max_context(row, spec, setup, hw, False):,} tokens")
        if gauged(row) and kind == "max_seq_fit":   # the recipes' NVML reading (bench/accuracy_gauge.py)
            note = gauge_note(_verdict_estimate(row, spec, setup, hw), spec, setup, max_context(row, spec, setup, hw, False))
        return _boundary(row, spec, setup, hw, _fits(row, spec, setup, hw), note)
    try:
        scale, metric = _unit(row["peak_mem_unit"]), _metric(row["mem_metric"])
        published = float(re.match(r"[\d.]+", row["peak_mem_value"]).group())  # type: ignore[union-attr]
    except (Skip, AttributeError) as exc:
        return Result(row, "skip", str(exc) or "value not a number")
    # bitsandbytes' paged optimizers allocate their state with cudaMallocManaged, outside PyTorch's caching
    # allocator (the model keeps only a working set on the device): the allocator's peak may be below the states
    paged = est.optimizer_states if setup.optimizer in PAGED else 0
    states = est.weights + est.gradients + est.optimizer_states - paged
    if setup.task == "train" and metric == "peak_allocated" and published * scale < states:
        return Result(row, "skip", f"published {published:g} is below the model states of the stated setup "
                                   f"({states / scale:.2f}: weights + grads + optimizer state, no activations); "
                                   "the setup fields cannot be what ran")
    if metric == ALLOCATED_PLUS_CONTEXT:
        pred = (est.peak_allocated + est.cuda_context) / scale
    else:
        pred = (gauge_bytes(est, spec, setup) if gauged(row) and metric == "device_total" else getattr(est, metric)) / scale
    anchors = {}
    if setup.task == "train" or metric == "peak_allocated":
        anchors["accelerate"] = _pct(accelerate_anchor(spec, setup) / scale, published)
        if setup.task == "train":
            anchors["deepspeed"] = _pct(deepspeed_anchor(spec, setup) / scale, published)
    return Result(row, "value", predicted=pred, published=published, err_pct=_pct(pred, published), anchors=anchors)


def _verdict_estimate(row: dict[str, str], spec: ModelSpec, setup: Setup, hw: Hardware) -> MemoryEstimate:
    """The estimate a verdict row is judged on: the row's loss path, bitsandbytes release and gradient lifetime."""
    return estimate_memory(spec, setup, hw, loss_bytes=_loss_bytes(row, spec, setup), bnb_version=_bnb_version(row),
                           accelerate_version=_accelerate_version(row),
                           grads_persist=_pre_torch2(row), nf4_library=_nf4_library(row),
                           resident_bytes=_resident_bytes(row, spec, setup))


def _fits(row: dict[str, str], spec: ModelSpec, setup: Setup, hw: Hardware, on_line: bool = True) -> bool:
    """The row's verdict; ``on_line=False``: a plan's own (reserved + CUDA context within the card) for a line or gauge row.
    A length the attention kernel cannot index crashes at any memory (perfguide/memory/index_limits.py): not a fit."""
    if index_overflow(spec, setup) is not None:
        return False
    est = _verdict_estimate(row, spec, setup, hw)
    if not host_ram_fits(row, est):   # a recipe node's stated host RAM (bench/accuracy_gauge.py)
        return False
    if on_line and gauged(row):   # a recipe's length: where its authors' NVML reading meets the card
        return gauge_fits(est, spec, setup)
    return reserved_line_fits(est, spec, setup, hw) if on_line and RESERVED_LINE in row["mem_metric"] else est.fits


def max_context(row: dict[str, str], spec: ModelSpec, setup: Setup, hw: Hardware, on_line: bool = True) -> int:
    """The longest sequence (to 16 tokens) the model says fits at the row's batch, up to Setup's 10,000,000; 0 when
    none of 64 does. The bracket doubles from 2^21 while its top still fits (multi-million-token ALST recipes)."""
    lo, hi = 64, 1 << 21
    if not _fits(row, spec, setup.replace(seq_len=lo), hw, on_line):
        return 0
    while hi < MAX_SEQ_LEN and _fits(row, spec, setup.replace(seq_len=hi), hw, on_line):
        lo, hi = hi, min(2 * hi, MAX_SEQ_LEN + 1)
    if hi > MAX_SEQ_LEN:
        return MAX_SEQ_LEN
    while hi - lo > 16:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(row, spec, setup.replace(seq_len=mid), hw, on_line) else (lo, mid)
    return lo


def max_batch(row: dict[str, str], spec: ModelSpec, setup: Setup, hw: Hardware) -> int:
    """The largest micro-batch the model says fits (0 when batch 1 does not), searched to 4x the published one."""
    largest = 0
    for b in range(1, 4 * setup.micro_batch_size + 9):
        if not _fits(row, spec, setup.replace(micro_batch_size=b), hw):
            break
        largest = b
    return largest


def _boundary(row: dict[str, str], spec: ModelSpec, setup: Setup, hw: Hardware, fits: bool, note: str = "") -> Result:
    """Fit boundaries: an OOM must not fit; a max batch must fit and one more must not; a max context is
    compared as a number (the longest sequence that fits), and its fits / does-not-fit verdict at the
    published length is judged like any other."""
    kind = row["value_kind"]
    est = _verdict_estimate(row, spec, setup, hw)  # by how much: the bytes the step needs against the card's usable bytes
    margin = "" if RESERVED_LINE in row["mem_metric"] or not est.capacity else f"{est.needed / 2**30:.1f} / {est.capacity / 2**30:.1f}"
    if kind == "oom":
        return Result(row, "verdict", verdict_ok=not fits, reason="published OOM", margin=margin)
    if kind == "fits":  # a run the source says trained at its stated setup (no claim that one more would not)
        return Result(row, "verdict", verdict_ok=fits, reason="published run that fits", margin=margin)
    if kind == "max_batch_fit":
        replayed = replayed_max_batch(row)   # the capped allocator over the row's own step, where it was replayed
        if replayed is not None:
            return Result(row, "verdict", verdict_ok=replayed == setup.micro_batch_size, reason="published max batch that fits",
                          predicted=replayed, published=setup.micro_batch_size,
                          err_pct=_pct(replayed, setup.micro_batch_size), margin=margin,
                          note=f"allocator replay; perfguide's plan: {max_batch(row, spec, setup, hw)}")
        bigger = _fits(row, spec, setup.replace(micro_batch_size=setup.micro_batch_size + 1), hw)
        largest = max_batch(row, spec, setup, hw)
        return Result(row, "verdict", verdict_ok=fits and not bigger, reason="published max batch that fits",
                      predicted=largest, published=setup.micro_batch_size, err_pct=_pct(largest, setup.micro_batch_size),
                      margin=margin)
    # the capped allocator replayed over the row's own step where it was (bench-only reading), else the plan's search
    longest = replayed_max_context(row) or max_context(row, spec, setup, hw)
    return Result(row, "context", predicted=longest, published=setup.seq_len, err_pct=_pct(longest, setup.seq_len),
                  verdict_ok=fits, reason="published max context (fits at that length)", note=note, margin=margin)


#: calibration.json constants read off rows of this CSV (or of bench/data/allocator_pairs.csv, whose pairs name the
#: CSV source they come from), and the value the OTHER sources give for each: a source's rows are priced with that
#: value (out of sample by source). reserved_over_allocated: a placeholder (1.040) that no row informs since stop 49
#: (optimum's GPTQ rows print the allocator's peak plus the memory outside it, not reserved bytes); hf_blog_pytorch_fsdp
#: row 647 gives 1.022, so its rows take the placeholder. reserved_over_allocated_training: the median of the
#: steady-state pairs without Answer.AI's is 1.109; reserved_at_oom_over_allocated: the median of the OOM messages
#: without row 647 is 1.010. Each number is in its constant's source text.
HELD_OUT: dict[str, dict[str, float]] = {
    "hf_blog_pytorch_fsdp": {"reserved_over_allocated": 1.040, "reserved_at_oom_over_allocated": 1.010},
    "answerai_fsdp_qlora": {"reserved_over_allocated_training": 1.109},
}


@contextmanager
def held_out(group: str) -> Iterator[None]:
    """Price ``group``'s rows with the calibration constants the other sources give (HELD_OUT)."""
    table = load("calibration")
    values = HELD_OUT.get(group, {})
    saved = {k: table[k]["value"] for k in values}
    try:
        for k, v in values.items():
            table[k]["value"] = v
        yield
    finally:
        for k, v in saved.items():
            table[k]["value"] = v


def evaluate_all(rows: list[dict[str, str]], timings: list[float]) -> list[Result]:
    out = []
    for row in rows:
        with held_out(row["source_group"]), t5_release(row), deepspeed_runtime(row), checkpoint_release(row), torch_era(row), \
                trl_release(row):
            out.append(evaluate(row, timings))
    return out


def main() -> int:
    with CSV.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    timings: list[float] = []
    results = evaluate_all(rows, timings)
    text = report(results, timings)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print("\n".join(text.splitlines()[:20]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
