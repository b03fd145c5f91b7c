"""Serving engines: perfguide's vLLM predictions against published serving numbers -> bench/results/serving.md.

Every row is a public measurement (a vLLM start-up log, a benchmark post, an MLPerf submission) with the setup
its source states; perfguide predicts the same number from the model shape and the GPU's datasheet only. Nothing
here was fitted to these rows beyond what is marked: the constants in perfguide/data/serving.json carry their own
sources, and the two taken from rows below (the 0.80 decode bandwidth efficiency from the batch-1 row, half the
driver reserve from the RTX 3090 log's CUDA total) mark those rows in-sample.

    .venv/bin/python bench/serving.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import publish

from perfguide import Hardware, engines
from perfguide.model.types import ModelSpec
from perfguide.setup import ServingSetup

GiB = 1024**3
OUT = Path(__file__).parent / "results" / "serving.md"


def kv_rows() -> list[tuple[str, str, float, float, str]]:
    """vLLM's own profiler logs: KV cache bytes after weights and the profiled peak."""
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    hw = Hardware.from_name("rtx3090")
    rows = []
    for length, published in ((20000, 3.81), (29000, 2.89)):
        # vLLM 0.6 (the log's version) profiled at max_num_batched_tokens = max_model_len and did not deduct CUDA
        # graphs from the KV budget (graphs were captured afterwards); enforce_eager=True prices the same account.
        s = ServingSetup(engine="vllm", max_model_len=length, max_num_batched_tokens=length, max_num_seqs=256, gpu_memory_utilization=0.9, enforce_eager=True)
        m = engines.server("vllm").memory(spec, s, hw)
        rows.append((f"Llama-3.1-8B bf16, RTX 3090, util 0.90, max_model_len {length} (in-sample: its 23.58 GiB total sets half the driver reserve)", "KV cache GiB", published,
                     m.kv_cache_bytes / GiB, "github.com/vllm-project/vllm/issues/10517 (vLLM 0.6 profiler log)"))
    return rows


def speed_rows() -> list[tuple[str, str, float, float, str]]:
    rows = []
    spec8 = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    a100 = Hardware.from_name("a100-40gb")
    s = ServingSetup(engine="vllm", max_model_len=1152, max_num_seqs=64, gpu_memory_utilization=0.9)
    one = engines.server("vllm").speed(spec8, s, a100, 1024, 128, 1)
    eight = engines.server("vllm").speed(spec8, s, a100, 1024, 128, 8)
    src = "johnmusgrave.com/p/vllm-throughput-latency-sweep-on (vLLM 0.23, random 1024 in / 128 out)"
    rows.append(("Llama-3.1-8B bf16, A100-40GB, concurrency 1 (in-sample: sets decode efficiency)", "decode tok/s", 75.0,
                 1000 / one.time_per_output_token_ms, src))
    rows.append(("Llama-3.1-8B bf16, A100-40GB, concurrency 8 vs 1", "throughput gain x", 6.6,
                 eight.output_tokens_per_s / one.output_tokens_per_s, src))
    h100 = Hardware.from_name("h100-80gb")
    fp8 = ServingSetup(engine="vllm", weight_format="fp8", max_model_len=2048, max_num_seqs=1024, max_num_batched_tokens=16384, gpu_memory_utilization=0.9)
    mem = engines.server("vllm").memory(spec8, fp8, h100)
    batch = min(1024, mem.kv_cache_tokens // (870 + 128))
    offline = engines.server("vllm").speed(spec8, fp8, h100, 870, 128, batch)
    rows.append((f"Llama-3.1-8B FP8, H100, MLPerf v5.1 offline (CNN-DailyMail, ~870 in / <=128 out; batch {batch})", "tokens/s",
                 5777.0, offline.output_tokens_per_s,
                 "Red Hat MLPerf Inference v5.1 submission, vLLM 0.10 (redhat.com blog 'efficient and reproducible LLM inference')"))
    return rows


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
    rows = kv_rows() + speed_rows()
    lines = ["# Serving engines: predicted vs published", "",
             "perfguide's vLLM memory and speed model (perfguide/memory/serving.py, perfguide/speed/serving.py) on the",
             "setups public sources report; predictions use the model shape and the GPU datasheet only.", "",
             "| setup | metric | published | predicted | error | source |", "|---|---|---|---|---|---|"]
    errors = []
    for setup, metric, published, predicted, source in rows:
        err = predicted / published - 1
        errors.append(abs(err))
        lines.append(f"| {setup} | {metric} | {published:,.2f} | {predicted:,.2f} | {err:+.0%} | {source} |")
    out_of_sample = [e for (setup, *_), e in zip(rows, errors) if "in-sample" not in setup]
    if not out_of_sample:
        out_of_sample = [0.0]
    lines += ["", f"Median |error| out of sample: {sorted(out_of_sample)[len(out_of_sample) // 2]:.0%} over {len(out_of_sample)} rows "
              f"(max {max(out_of_sample):.0%}).", "",
              "Notes: the KV rows are vLLM 0.6 logs (no CUDA-graph deduction then); the pinned vLLM 0.33 also subtracts",
              "its CUDA graph estimate, which perfguide adds for plans. The MLPerf row is a throughput-tuned submission",
              "(offline scenario, mean lengths), so the prediction uses the mean input/output and the largest batch the",
              "predicted KV cache holds.", "",
              "## Replicas vs tensor parallel (published ordering)", "",
              "Lambda's vLLM benchmark (github.com/LambdaLabsML/vllm-benchmark, benchmark_v0.md): data parallelism outperforms",
              "tensor parallelism when the model fits within the system. Predicted throughput order of the layouts priced:", "",
              "| model, GPUs, format | predicted order (TP x replicas) | replicas first, as published |", "|---|---|---|",
              *layout_rows(), ""]
    return publish("\n".join(lines), OUT)


if __name__ == "__main__":
    raise SystemExit(main())
