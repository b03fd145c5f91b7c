"""infer_cpu: dtype by instruction set (bf16 only with AVX512-BF16/AMX), threads = physical cores,
RAM check, bnb quantization only if RAM is short."""

from __future__ import annotations

from .. import sources
from . import inference_rules as R
from .host import cpu_threads
from .infer_gpu_one import base_setup, tune
from .types import Plan, Request


def plan(request: Request) -> Plan:
    dtype, d_dtype, warnings = R.cpu_dtype(request)
    d_attn = R.attention(request, dtype, on_gpu=False)
    _, d_threads = cpu_threads(request.hardware.cpu, source=sources.INFER_CPU)
    base = base_setup(request, dtype, d_attn.value, device="cpu").replace(cpu_threads=d_threads.value)
    chosen, tried = R.first_fit(request, R.quant_ladder(request, base, dtype))
    decisions = [d_dtype, d_attn, d_threads]
    if chosen is None:
        best = min(tried, key=lambda c: c.memory.device_total)
        return R.finish(request, best, decisions, tried, warnings, ok=False)
    decisions.append(R.quant_decision(request, chosen.setup, tried))
    if chosen.setup.weights_dtype in ("int8", "nf4"):
        warnings.append("bitsandbytes on CPU saves RAM but is not faster; Optimum ONNX Runtime / OpenVINO are the production paths")
    final, more = tune(request, chosen, on_gpu=False)
    return R.finish(request, final, decisions + more, tried, warnings, ok=final.verdict == "fits")
