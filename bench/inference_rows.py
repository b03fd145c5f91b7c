"""Estimate the inference rows of shared/groundtruth/published_measurements.csv with perfguide's inference model.

``estimate_row(row)`` takes one csv row (a dict) and returns predicted and measured bytes in the row's own
metric (torch allocated, or nvidia-smi device total), or None when the row cannot be priced here (model not
in the offline catalog, GPTQ, no measured value). bench/accuracy.py can call it; running this file prints
the median / p90 relative error.
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from perfguide.errors import PerfGuideError
from perfguide.memory.inference import estimate_inference, weight_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

CSV = Path("/work/shared/groundtruth/published_measurements.csv")
SHORT_PROMPT = 10  # litgpt's "short prompt" (a one-sentence instruction) in tokens
UNITS = {"GB": 1e9, "MB (1e6": 1e6, "MB (MiB": 2**20, "GiB": 2**30, "MiB": 2**20}


def _unit(text: str) -> float | None:
    return next((v for k, v in UNITS.items() if text.startswith(k)), None)


def _dtype(row: dict[str, str]) -> str | None:
    q, p = row["quantization"], row["precision"]
    if q.startswith("GPTQ") or "fp4" in q:
        return None
    if "nf4" in q:
        return "nf4"
    if "int8" in q:
        return "int8"
    if "mixed" in p or "32" in p:
        return "fp32"
    return "bf16" if "bf16" in p else "fp16"


def _lengths(row: dict[str, str]) -> tuple[int, int] | None:
    text = row["seq_len"]
    if m := re.search(r"prompt (\d+) \+ (\d+) generated", text):
        return int(m[1]), int(m[2])
    if m := re.search(r"prompt (\d+)$", text):
        return int(m[1]), 1
    if m := re.search(r"short prompt \+ (\d+) new tokens", text):
        return SHORT_PROMPT, int(m[1])
    if text.isdigit():  # fxmarty rows: prompt length given, generation length not stated
        return int(text), 1
    if row["source_group"].startswith("litgpt"):
        return SHORT_PROMPT, 50
    return None


def _strategy(row: dict[str, str]) -> tuple[str, int]:
    n = int(row["num_gpus"] or 1)
    if "tp" in row["method"]:
        return "tp", n
    return ("device_map", n) if n > 1 else ("single", 1)


def setup_for(row: dict[str, str]) -> Setup | None:
    dtype, lengths = _dtype(row), _lengths(row)
    if dtype is None or lengths is None:
        return None
    strategy, n = _strategy(row)
    batch = int(row["micro_batch"] or 1)
    if "num_samples 2" in row["seq_len"]:
        batch = 1  # litgpt draws samples one after another
    attn = row["attn_impl"] if row["attn_impl"] in ("eager", "sdpa") else "sdpa"
    return Setup(task="infer", weights_dtype=dtype, micro_batch_size=batch, seq_len=lengths[0], new_tokens=lengths[1],
                 attn_implementation=attn, strategy=strategy, num_gpus=n)


def _adjust(row: dict[str, str], spec: ModelSpec, setup: Setup, allocated: int, transient: int) -> int:
    """What the measured stack did differently from transformers 5.24 defaults, priced explicitly."""
    if row["quantization"] == "bnb.nf4":  # no double quantization: fp32 absmax per 64 weights
        allocated += weight_bytes(spec, "nf4", double_quant=False) - weight_bytes(spec, "nf4")
    if "mixed" in row["precision"]:  # fp32 weights under bf16 autocast: the autocast cache keeps a bf16 copy
        allocated += weight_bytes(spec, "bf16")
    if row["source_group"] == "transformers_model_doc_sdpa":
        # 2024 transformers (before logits_to_keep) computed every prompt position's fp16 logits after the last layer
        full = setup.micro_batch_size * setup.seq_len * spec.vocab_size * 2
        allocated += max(0, full - transient)
    return allocated


def estimate_row(row: dict[str, str]) -> dict[str, Any] | None:
    """Predicted vs measured bytes for one inference row, in the row's metric; None when not priceable."""
    if "infer" not in row["task"] or row["value_kind"] != "measured" or "load" in row["task"]:
        return None
    unit = _unit(row["peak_mem_unit"])
    setup = setup_for(row)
    if unit is None or setup is None:
        return None
    try:
        measured = float(row["peak_mem_value"]) * unit
        spec = ModelSpec.from_any(row["model_hf_id"])
    except (ValueError, PerfGuideError):
        return None
    if spec.is_encoder_decoder or spec.model_type in ("bert", "distilbert"):
        return None
    mem = estimate_inference(spec, setup, None)
    allocated = _adjust(row, spec, setup, mem.peak_allocated, mem.activations)
    device = "nvidia-smi" in row["mem_metric"]
    predicted = mem.device_total - mem.peak_allocated + allocated if device else allocated
    return {"row_id": row["row_id"], "model": row["model_hf_id"], "setup": setup.label, "metric": "device_total" if device else "allocated",
            "predicted": predicted, "measured": measured, "rel_error": (predicted - measured) / measured}


def evaluate(path: Path = CSV) -> list[dict[str, Any]]:
    with path.open(newline="") as f:
        return [r for r in (estimate_row(row) for row in csv.DictReader(f)) if r is not None]


def main() -> None:
    results = evaluate(Path(sys.argv[1]) if len(sys.argv) > 1 else CSV)
    for r in results:
        print(f"{r['row_id']:>4} {r['model']:<34} {r['setup']:<28} {r['metric']:<12} pred {r['predicted'] / 1e9:7.2f} GB "
              f"meas {r['measured'] / 1e9:7.2f} GB  {r['rel_error']:+.1%}")
    errors = sorted(abs(r["rel_error"]) for r in results)
    if errors:
        p90 = errors[min(len(errors) - 1, int(0.9 * len(errors)))]
        print(f"{len(errors)} rows: median |error| {statistics.median(errors):.1%}, p90 {p90:.1%}")


if __name__ == "__main__":
    main()
