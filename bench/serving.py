"""Serving engines: perfguide's vLLM predictions against published serving numbers -> bench/results/serving.md.

Every row is a public measurement (a vLLM start-up log, a benchmark post, an MLPerf submission) with the setup
its source states; perfguide predicts the same number from the model shape and the GPU's datasheet only. Nothing
here was fitted to these rows beyond what is marked: the constants in perfguide/data/serving.json carry their own
sources, and those taken from rows below (the decode bandwidth efficiency, vLLM's per-step host cost, the routed-expert
read efficiency and the per-MoE-layer latency of a software-dequantized format from one speed row each, half the driver reserve from the RTX 3090 log's CUDA total, the sampler's 38 bytes per
logit counted with the llm-d peaks in view) mark those rows in sample. Start-up log rows: bench/serving_log_rows.py.

    .venv/bin/python bench/serving.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import SourceSummary, publish
from serving_logs import report_lines as log_lines
from serving_speed_rows import DISAGREEMENTS
from serving_speed_rows import ROWS as SPEED_ROWS
from serving_speed_rows import predict as predict_speed

GiB = 1024**3
OUT = Path(__file__).parent / "results" / "serving.md"


def decode_lines() -> list[str]:
    """Every published speed row, then the error per source (median of per-source medians), out of sample, and each
    miss over 20% with who is right."""
    lines = ["## Decode and throughput (vLLM, SGLang)", "",
             "Published serving benchmarks with their stated setups (bench/serving_speed_rows.py: engine version, model, GPU,",
             "TP, lengths, requests in flight, what each row infers); perfguide predicts the metric with the engine's speed rule.",
             "Rows marked in sample set one constant of perfguide/data/serving.json each (step overhead, decode bandwidth",
             "efficiency, routed-expert read efficiency, per-MoE-layer latency of software-dequantized MXFP4) and are left out of",
             "the summary.", "",
             "| setup | engine | metric | published | predicted | error | source |", "|---|---|---|---|---|---|---|"]
    by_source: dict[str, list[float]] = {}
    misses = []
    for row in SPEED_ROWS:
        predicted = predict_speed(row)
        err = predicted / row.published - 1
        mark = " (in sample)" if row.in_sample else ""
        lines.append(f"| {row.label}{mark} | {row.engine} {row.version} | {row.metric} | {row.published:,.2f} | {predicted:,.2f} | "
                     f"{err:+.1%} | {row.source} |")
        if not row.in_sample:
            by_source.setdefault(row.source, []).append(abs(err))
            if abs(err) > 0.20:
                misses.append((row.label, err))
    summary = SourceSummary.of(by_source)
    rows = sum(len(e) for e in by_source.values())
    lines += ["", f"Out of sample: {rows} rows from {len(by_source)} sources; median of per-source medians {summary.median_of_medians:.1%} "
                  f"(worst source {summary.worst[1]:.1%}).", "", "| source | rows | median abs error |", "|---|---|---|"]
    lines += [f"| {src} | {len(by_source[src])} | {med:.1%} |" for src, med in summary.medians.items()]
    lines += ["", "Every out-of-sample row off by more than 20%, and who is right:", ""]
    lines += [f"- {label} ({err:+.0%}): {DISAGREEMENTS.get(label, 'not yet explained')}" for label, err in misses]
    return [*lines, ""]


def layout_rows() -> list[str]:
    """Published orderings, not numbers: Lambda's vLLM benchmark found data parallel beating tensor parallel
    whenever the model fits one GPU; the plan's predicted throughput per layout should rank them the same way."""
    import perfguide

    lines = []
    for model in ("meta-llama/Llama-3.1-8B", "mistralai/Mistral-7B-v0.1"):
        r = perfguide.recommend(model, scenario="infer_gpu_many", hardware="h100-80gb:8", engine="vllm")
        s = r.setup.serving
        ranked = sorted((c for c in r.candidates if c.verdict in ("fits", "chosen") and c.setup.serving.weight_format == s.weight_format),
                        key=lambda c: -c.throughput.tokens_per_s)
        order = " > ".join(f"TP{c.setup.serving.tensor_parallel_size}x{c.setup.serving.data_parallel_size}" for c in ranked)
        agrees = ranked[0].setup.serving.tensor_parallel_size == 1
        lines.append(f"| {model}, 8x H100, {s.weight_format} | {order} | {'yes' if agrees else 'no'} |")
    return lines


def main() -> int:
    lines = ["# Serving engines: predicted vs published", "",
             "perfguide's vLLM / SGLang memory and speed model (perfguide/memory/serving.py, perfguide/speed/serving.py) on the",
             "setups public sources report; predictions use the model shape and the GPU datasheet only.", "",
             *decode_lines(),
             "## Replicas vs tensor parallel (published ordering)", "",
             "Lambda's vLLM benchmark (github.com/LambdaLabsML/vllm-benchmark, benchmark_v0.md): data parallelism outperforms",
             "tensor parallelism when the model fits within the system. Predicted throughput order of the layouts priced:", "",
             "| model, GPUs, format | predicted order (TP x replicas) | replicas first, as published |", "|---|---|---|",
             *layout_rows(), "", *log_lines()]
    return publish("\n".join(lines), OUT)


if __name__ == "__main__":
    raise SystemExit(main())
