"""Time the exact memory mode on a Llama-2-7B-shaped step and check extrapolation against a full trace.

Run: ``.venv/bin/python bench/trace_speed.py`` (writes bench/results/trace.md). Each case runs in a fresh
subprocess so that import time is measured the way a user's first ``estimate(..., method="trace")`` pays it;
the disk cache points at a temporary directory so nothing is reused between cases.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LLAMA7B = dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=4096)
CASES = [
    ("fp32, adamw_torch (foreach)", dict(micro_batch_size=4, seq_len=512, optimizer="adamw_torch")),
    ("amp bf16, adamw_torch_fused", dict(micro_batch_size=4, seq_len=512, autocast="bf16", optimizer="adamw_torch_fused")),
    ("bf16 weights, ckpt, seq 4096", dict(micro_batch_size=1, seq_len=4096, weights_dtype="bf16", gradient_checkpointing=True)),
    ("bf16 LoRA r16 q,v", dict(micro_batch_size=4, seq_len=512, weights_dtype="bf16", lora={"r": 16, "target_modules": ["q_proj", "v_proj"]})),
]

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from perfguide import ModelSpec, Setup
from perfguide.memory.trace import trace_memory, traced_step
from perfguide.memory.tracing.step import run_step
t_import = time.perf_counter() - t0
config, setup, full = json.loads(sys.argv[1]), Setup(**json.loads(sys.argv[2])), sys.argv[3] == "1"
spec = ModelSpec.from_any(config)
t1 = time.perf_counter()
est = trace_memory(spec, setup)
t_trace = time.perf_counter() - t1
out = {"import_s": t_import, "trace_s": t_trace, "total_s": time.perf_counter() - t0, "peak": est.peak_allocated,
       "parts": {k: getattr(est, k) for k in ("weights", "gradients", "optimizer_states", "activations", "logits", "other")},
       "notes": list(est.notes)}
if full:
    t2 = time.perf_counter()
    step = run_step(config, setup)
    out["full_s"] = time.perf_counter() - t2
    out["full_peak"] = max(p.total for p in step.phases.values())
print(json.dumps(out))
"""


def run_case(setup: dict, full: bool) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PERFGUIDE_CACHE_DIR": tempfile.mkdtemp(prefix="pg-trace-")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(LLAMA7B), json.dumps(setup), "1" if full else "0"],
                          capture_output=True, text=True, env=env, check=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_s"] = time.perf_counter() - t0
    return res


def main() -> None:
    gib = 2**30
    rows = []
    for label, setup in CASES:
        res = run_case(setup, full=True)
        err = (res["peak"] - res["full_peak"]) / res["full_peak"] * 100
        first = res["process_s"] - res["full_s"]
        rows.append(f"| {label} | {first:.1f} | {res['import_s']:.1f} | {res['trace_s']:.1f} | {res['full_s']:.1f} | "
                    f"{res['peak'] / gib:.2f} | {res['full_peak'] / gib:.2f} | {err:+.2f}% | "
                    f"{res['parts']['activations'] / gib:.2f} | {res['parts']['logits'] / gib:.2f} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        "# Trace mode speed and depth extrapolation (Llama-2-7B shape)",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs; timings vary +-30%).",
        "Each row is a fresh process with an empty trace cache. *first call* = subprocess wall time minus the comparison",
        "full trace (interpreter start, imports, spec, 1+2 block traces); *trace* = `trace_memory` alone, including the",
        "lazy torch/transformers import it triggers (~4 s) and building on meta;",
        "*full* = one full 32-block trace for comparison. Peaks are tensor bytes (`max_memory_allocated`-like), GiB.",
        "",
        "| setup | first call s | import perfguide s | trace s | full trace s | peak (1+2 block extrapolation) | peak (full trace) | error | activations | logits |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Target: < 20 s for a 7B-shaped step on the 2-core machine (first call, empty cache). A cached call costs the",
        "imports only.",
        "",
    ])
    out = Path(__file__).parent / "results" / "trace.md"
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
