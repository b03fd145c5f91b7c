"""infer_gpu_one: serve on one GPU. dtype by compute capability, quantize only if 16-bit does not fit,
offload as the last resort, then batch and cache rules (scenarios/inference_rules.py)."""

from __future__ import annotations

from .. import sources
from ..decisions import Decision
from ..setup import Setup
from . import inference_rules as R
from . import serving_plan
from .idle_gpus import with_idle_gpus
from .types import Candidate, Plan, Request


def base_setup(request: Request, dtype: str, attn: str, device: str = "cuda") -> Setup:
    c = request.constraints
    return Setup(task="infer", device=device, micro_batch_size=c.batch_size or 1, seq_len=R.prompt_len(request),
                 new_tokens=c.max_new_tokens if request.model.generates else 0, weights_dtype=dtype, attn_implementation=attn, num_gpus=1)


def tune(request: Request, chosen: Candidate, on_gpu: bool) -> tuple[Candidate, list[Decision]]:
    """Batch (largest that fits, reported) and cache implementation for a layout that already fits."""
    max_b = R.largest_batch(request, chosen.setup)
    b, d_batch = R.choose_batch(request, max_b)
    setup = chosen.setup.replace(micro_batch_size=b)
    speed = R.price(request, setup)[1]
    setup, d_cache = R.cache_decision(request, setup, speed, on_gpu)
    return R.candidate(request, setup, chosen.why), [R.kv_decision(request, setup, max_b), d_batch, d_cache]


def offload_option(base: Setup) -> Setup:
    """When no quantization fits: accelerate's device_map='auto' spills weights to CPU RAM (slow, but it runs)."""
    return base.replace(strategy="device_map", offload_params=True)


def plan(request: Request) -> Plan:
    from . import infer_gpu_many

    return with_idle_gpus(request, serving_plan.dispatch(request, transformers_plan), "infer_gpu_many", infer_gpu_many.plan, "serves")


def transformers_plan(request: Request) -> Plan:
    dtype, d_dtype, warnings = R.gpu_dtype(request)
    d_attn = R.attention(request, dtype, on_gpu=True)
    base = base_setup(request, dtype, d_attn.value)
    chosen, tried = R.first_fit(request, R.quant_ladder(request, base, dtype))
    decisions = [d_dtype, d_attn]
    # a forced quantization is honoured (and may not fit), never swapped for 16-bit weights streamed from the CPU
    if chosen is None and request.constraints.allow_offload and R.keeps_16bit_weights(request):
        off = R.candidate(request, offload_option(base), "device_map='auto' with CPU offload")
        tried.append(off)
        if off.verdict == "fits":
            chosen = off
            decisions.append(Decision(setting="device_map", value="auto", number=float(off.memory.cpu_ram), unit="bytes offloaded",
                                        reason="even 4-bit weights do not fit: accelerate keeps what fits on the GPU and streams the "
                                               f"rest from CPU RAM every forward ({off.throughput.time_per_output_token_ms or off.throughput.step_time_s * 1000:.0f} ms/token)",
                                        source=sources.BIG_MODEL_INFERENCE))
            decisions.append(R.max_memory_decision(request, off.setup, off.memory,
                                                   "GPU budget leaves room for the KV cache and prefill transients"))
            warnings.append("CPU offload moves offloaded weights over PCIe for every token: expect seconds per token")
    if chosen is None:
        best = min(tried, key=lambda c: c.memory.device_total)
        return R.finish(request, best, decisions, tried, warnings, ok=False)
    decisions.append(R.quant_decision(request, chosen.setup, tried))
    final, more = tune(request, chosen, on_gpu=True) if chosen.setup.strategy == "single" else (chosen, [])
    return R.finish(request, final, decisions + more, tried, warnings, ok=final.verdict == "fits")
