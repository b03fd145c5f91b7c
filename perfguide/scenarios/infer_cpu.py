"""infer_cpu: dtype by instruction set (bf16 only with AVX512-BF16/AMX), threads = physical cores,
RAM check, bnb quantization only if RAM is short."""

from __future__ import annotations

from ..decisions import Alternative, Decision
from . import inference_rules as R
from .infer_gpu_one import base_setup, tune
from .types import Plan, Request


def threads_decision(request: Request) -> Decision:
    cpu = request.hardware.cpu
    return Decision(setting="cpu_threads", value=cpu.physical_cores, number=float(cpu.physical_cores), unit="physical cores",
                    reason="one thread per physical core (torch.set_num_threads / OMP_NUM_THREADS): hyper-threads share the "
                           "FMA units and only add contention", source="rules.md 3.32",
                    alternatives=(Alternative(value=cpu.logical_cores, why_not="hyper-threads slow GEMM down"),))


def plan(request: Request) -> Plan:
    dtype, d_dtype = R.cpu_dtype(request)
    d_attn = R.attention(request, dtype, on_gpu=False)
    d_threads = threads_decision(request)
    base = base_setup(request, dtype, d_attn.value, device="cpu").model_copy(update={"cpu_threads": d_threads.value})
    chosen, tried = R.first_fit(request, R.quant_ladder(request, base, dtype))
    decisions = [d_dtype, d_attn, d_threads]
    warnings: list[str] = []
    if request.constraints.precision == "fp16":
        warnings.append("precision='fp16' runs as fp32 on the CPU (fp16 matmuls there are slow conversions); "
                        "use precision='bf16' on CPUs with AVX512-BF16/AMX")
    if chosen is None:
        best = min(tried, key=lambda c: c.memory.device_total)
        return R.finish(request, best, decisions, tried, warnings, ok=False)
    decisions.append(R.quant_decision(request, chosen.setup, tried))
    if chosen.setup.weights_dtype in ("int8", "nf4"):
        warnings.append("bitsandbytes on CPU saves RAM but is not faster; Optimum ONNX Runtime / OpenVINO are the production paths")
    final, more = tune(request, chosen, on_gpu=False)
    return R.finish(request, final, decisions + more, tried, warnings, ok=final.verdict == "fits")
