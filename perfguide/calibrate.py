"""Calibration: measured runs refine later estimates on the same machine.

A small JSON file (``$PERFGUIDE_CACHE_DIR`` or ``~/.cache/perfguide``/calibration.json) keeps, per machine, the
measured/predicted ratios of verified runs. Later ``recommend`` calls on that machine (probed hardware only:
a named target is somebody else's machine) scale the peak memory and step time by the median ratio and use the
measured CUDA context, so the search itself becomes more accurate, not just the report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from functools import lru_cache
from pathlib import Path

from ._base import Model
from ._cache import cache_root
from .hardware.types import Hardware
from .measure.types import Verification
from .memory.types import MemoryEstimate
from .recommendation import Recommendation
from .setup import Setup
from .speed.types import Throughput

#: Ratios outside this band are treated as broken measurements, not as calibration.
SANE_RATIO = (0.33, 3.0)


class Factors(Model):
    """What a machine's calibration changes: multiply predictions by these."""

    memory: float = 1.0
    step_time: float = 1.0
    cuda_context_bytes: int | None = None
    samples: int = 0


def cache_path() -> Path:
    return cache_root() / "calibration.json"


def machine_key(hw: Hardware) -> str:
    """Same GPU model and memory (or same CPU and core count) = same machine for calibration."""
    gpu = hw.smallest_gpu
    if gpu is not None:
        return f"gpu:{gpu.name}:{gpu.memory_total}"
    return f"cpu:{hw.cpu.model_name}:{hw.cpu.physical_cores}"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"machines": {}}


def record(rec: Recommendation, verification: Verification, path: Path | None = None) -> Path:
    """Append this run's ratios to the machine's entry."""
    path = path or cache_path()
    data = _read(path)
    entry = data.setdefault("machines", {}).setdefault(machine_key(rec.hardware), {"runs": []})
    run = {c.quantity: c.ratio for c in verification.comparisons}
    m = verification.measured
    if m and m.device_total and m.peak_reserved:
        run["cuda_context_bytes"] = m.device_total - m.peak_reserved
    run.update(model=rec.model.name, setup=rec.setup.label, time=time.time())
    entry["runs"].append(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    _factors_cached.cache_clear()
    return path


def _median(values: list[float]) -> float | None:
    sane = [v for v in values if SANE_RATIO[0] <= v <= SANE_RATIO[1]]
    return statistics.median(sane) if sane else None


def factors(hw: Hardware, path: Path | None = None) -> Factors | None:
    """The calibration for this machine, or None (named hardware, or nothing recorded)."""
    if hw.source != "probe":
        return None
    path = path or cache_path()
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    return _factors_cached(str(path), mtime, machine_key(hw))


@lru_cache(maxsize=8)
def _factors_cached(path: str, mtime: float, key: str) -> Factors | None:
    runs = _read(Path(path)).get("machines", {}).get(key, {}).get("runs", [])
    if not runs:
        return None
    mem = _median([r[k] for r in runs for k in ("peak_allocated", "rss_growth") if k in r])
    step = _median([r["step_time_s"] for r in runs if "step_time_s" in r])
    contexts = [r["cuda_context_bytes"] for r in runs if r.get("cuda_context_bytes", 0) > 0]
    return Factors(memory=mem or 1.0, step_time=step or 1.0,
                   cuda_context_bytes=int(statistics.median(contexts)) if contexts else None, samples=len(runs))


# --- applying a calibration ----------------------------------------------------------------------
def _clamp(x: float) -> float:
    return min(max(x, SANE_RATIO[0]), SANE_RATIO[1])


def apply_memory(est: MemoryEstimate, setup: Setup, hw: Hardware | None) -> MemoryEstimate:
    """Scale what the verified runs measured on this machine: the whole peak on CUDA (max_memory_allocated),
    the part above the resident weights on CPU (RSS growth); use the measured CUDA context."""
    f = factors(hw) if hw is not None and setup.task == "train" else None
    if f is None or f.samples == 0:
        return est
    from .memory.overhead import reserved_from_allocated

    if setup.device == "cpu":
        alloc = est.weights + int((est.peak_allocated - est.weights) * _clamp(f.memory))
        reserved, context = alloc, est.cuda_context
    else:
        alloc = int(est.peak_allocated * _clamp(f.memory))
        reserved, context = reserved_from_allocated(alloc), f.cuda_context_bytes or est.cuda_context
    total = reserved + context
    note = f"calibrated on this machine ({f.samples} verified run(s)): memory x{f.memory:.2f}"
    return est.model_copy(update={"peak_allocated": alloc, "peak_reserved": reserved, "cuda_context": context,
                                  "device_total": total, "fits": est.capacity is None or total <= est.capacity,
                                  "notes": (*est.notes, note)})


def apply_speed(tp: Throughput, setup: Setup, hw: Hardware | None) -> Throughput:
    """Scale step time by the measured/predicted ratio of this machine's verified runs."""
    f = factors(hw) if hw is not None and setup.task == "train" else None
    if f is None or f.samples == 0 or f.step_time == 1.0:
        return tp
    k = _clamp(f.step_time)
    return tp.model_copy(update={"step_time_s": tp.step_time_s * k, "tokens_per_s": tp.tokens_per_s / k,
                                 "achievable_tflops": tp.achievable_tflops / k, "mfu": tp.mfu / k})


# --- CLI: `perfguide calibrate` ------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default="gpt2", help="catalog name, config path or hub id (built from its config with random weights)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps to measure (default 3)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch-size", type=int, default=4)


def main(args: argparse.Namespace) -> int:
    """Plan for this machine, run it for a few steps, record the measured/predicted ratios."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .api import recommend
    from .hardware import probe
    from .measure.verify import verify

    hw = probe()
    scenario = "train_gpu_one" if hw.has_gpu else "train_cpu"
    rec = recommend(args.model, scenario, hardware=hw, seq_len=args.seq_len, global_batch_size=args.global_batch_size)
    if not rec.model.config:
        from .errors import PerfGuideError

        raise PerfGuideError(f"{args.model!r} has no config to build a model from; pass a catalog name or a config path")
    config = AutoConfig.for_model(**rec.model.config)
    model = AutoModelForCausalLM.from_config(config, **{k: v for k, v in rec.model_kwargs().items() if k == "dtype"})
    if hw.has_gpu:
        model = model.to("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the comparisons are printed below; the callback's warnings would repeat them
        result = verify(model, rec, steps=args.steps)
    if result.oom:
        print(f"out of memory: {result.error}; nothing recorded")
        return 1
    path = record(rec, result)
    for c in result.comparisons:
        used = "" if SANE_RATIO[0] <= c.ratio <= SANE_RATIO[1] else (
            "  (ignored: outside 0.33-3x; fixed per-step overheads dominate a model this small, calibrate a larger one)")
        print(f"{c.quantity:>15}: predicted {c.predicted:.4g} {c.unit}, measured {c.measured:.4g} {c.unit} (x{c.ratio:.2f}){used}")
    print(f"recorded in {path}")
    return 0
