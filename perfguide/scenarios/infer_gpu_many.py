"""infer_gpu_many: one replica per GPU, tensor parallel (tp_plan="auto" under torchrun), or layers split
across GPUs (device_map="auto"); each priced for per-GPU memory and speed, chosen by the preference."""

from __future__ import annotations

from .. import sources
from ..decisions import Alternative, Decision
from ..errors import ConflictingConstraintsError
from ..setup import Setup
from . import inference_rules as R
from . import serving_plan
from .infer_gpu_one import base_setup, offload_option, tune
from .search import gib
from .types import Candidate, Plan, Request

LAYOUT_WHY = {
    "single": "one full replica per GPU, independent processes: throughput x GPUs, latency of one GPU",
    "tp": "tensor parallel: every GPU reads 1/n of the weights per token, so latency drops; needs torchrun",
    "device_map": "layers split in order across GPUs: fits big models, but only one GPU works at a time (no speed-up)",
}


def tp_size(request: Request, gpus: int) -> int:
    """Largest TP degree <= gpus that divides both the query and the KV heads (transformers shards whole heads)."""
    spec = request.model
    return max((t for t in range(2, gpus + 1)
                if spec.num_attention_heads % t == 0 and spec.num_key_value_heads % t == 0), default=1)


def layouts(request: Request, base: Setup, gpus: int) -> list[Setup]:
    forced = request.constraints.strategy
    options = [base.replace(strategy="single", num_gpus=gpus)]
    if any(g.mig for g in request.hardware.gpus):  # one MIG slice per process: only independent replicas (applicable.py)
        return options
    t = tp_size(request, gpus)
    if t > 1:
        options.append(base.replace(strategy="tp", num_gpus=t))
    options.append(base.replace(strategy="device_map", num_gpus=gpus))
    if forced is None:
        return options
    kept = [s for s in options if s.strategy == forced]
    if not kept:  # only 'tp' can be missing: no degree > 1 divides the heads (or one GPU)
        spec = request.model
        raise ConflictingConstraintsError(
            f"strategy={forced!r} is not possible with {gpus} GPU(s): no degree > 1 divides {spec.num_attention_heads} query "
            f"and {spec.num_key_value_heads} KV heads; use one of {', '.join(s.strategy for s in options)}")
    return kept


def score(request: Request, c: Candidate) -> float:
    if request.constraints.prefer == "latency":
        ms = c.throughput.time_per_output_token_ms
        return -(ms if ms is not None else c.throughput.step_time_s * 1000)  # an encoder: the forward's latency
    return c.throughput.tokens_per_s


def _row(c: Candidate) -> str:
    return (f"{c.setup.strategy} x{c.setup.num_gpus}: {gib(c.memory.device_total)}/GPU, "
            + (f"{ms:.1f} ms/token" if (ms := c.throughput.time_per_output_token_ms) is not None else
               f"{c.throughput.step_time_s * 1000:.1f} ms/forward") + f", {c.throughput.tokens_per_s:.0f} tok/s at batch {c.setup.micro_batch_size}")


def strategy_decision(request: Request, chosen: Candidate, priced: list[Candidate]) -> Decision:
    alts = tuple(Alternative(value=c.setup.strategy, number=float(c.memory.device_total), unit="bytes per GPU",
                             why_not=("does not fit: " if c.verdict != "fits" else "slower for the preference: ") + _row(c))
                 for c in priced if c.setup.strategy != chosen.setup.strategy)
    return Decision(setting="strategy", value=chosen.setup.strategy, number=float(score(request, chosen)),
                    unit="ms/token (negative)" if request.constraints.prefer == "latency" else "tokens/s",
                    reason=f"{LAYOUT_WHY[chosen.setup.strategy]}; best fitting layout for {request.constraints.prefer}: {_row(chosen)}",
                    source=f"{sources.INFER_GPU_MANY}; {sources.BIG_MODEL_INFERENCE}", alternatives=alts)


def launcher(setup: Setup) -> Decision:
    if setup.strategy == "tp":
        return Decision(setting="launcher", value=f"torchrun --nproc-per-node {setup.num_gpus}", number=float(setup.num_gpus), unit="processes",
                        reason="tp_plan='auto' needs one process per TP rank", source="transformers perf_infer_gpu_multi.md")
    if setup.strategy == "single" and setup.num_gpus > 1:
        return Decision(setting="launcher", value=f"accelerate launch --multi_gpu --num_processes {setup.num_gpus}",
                        number=float(setup.num_gpus), unit="processes",
                        reason="one full replica per GPU: split the prompts with accelerator.split_between_processes "
                               "(or run independent servers behind a load balancer)",
                        source="accelerate usage_guides/distributed_inference.md")
    return Decision(setting="launcher", value="python", number=1.0, unit="processes", source=sources.BIG_MODEL_INFERENCE,
                    reason="device_map='auto' is single-process; do not use torchrun")


def plan(request: Request) -> Plan:
    return serving_plan.dispatch(request, transformers_plan)


def transformers_plan(request: Request) -> Plan:
    gpus = min(request.constraints.num_gpus or request.hardware.gpu_count, request.hardware.gpu_count)
    dtype, d_dtype, warnings = R.gpu_dtype(request)
    d_attn = R.attention(request, dtype, on_gpu=True)
    base = base_setup(request, dtype, d_attn.value)
    priced: list[Candidate] = []
    chosen: Candidate | None = None
    for precision, _why in R.quant_ladder(request, base, dtype):
        batch = [R.candidate(request, s, _why) for s in layouts(request, precision, gpus)]
        priced += batch
        ok = [c for c in batch if c.verdict == "fits"]
        if ok:
            chosen = max(ok, key=lambda c: score(request, c))
            break
    decisions = [d_dtype, d_attn]
    # offload is a device_map layout of 16-bit weights: a request for another strategy or a quantization is honoured
    # (and may not fit), never swapped
    if (chosen is None and request.constraints.allow_offload and request.constraints.strategy in (None, "device_map")
            and R.keeps_16bit_weights(request)):
        split = 1 if any(g.mig for g in request.hardware.gpus) else gpus  # a MIG slice offloads alone
        off = R.candidate(request, offload_option(base).replace(num_gpus=split), "offload")
        priced.append(off)
        if off.verdict == "fits":
            chosen = off
            decisions.append(R.max_memory_decision(request, off.setup, off.memory,
                                                   "every GPU filled up to capacity less KV cache and transients; the rest in CPU RAM"))
            warnings.append("weights do not fit all GPUs even in 4-bit: CPU offload, seconds per token")
    if chosen is None:
        return R.finish(request, min(priced, key=lambda c: c.memory.device_total), decisions, priced, warnings, ok=False)
    decisions += [R.quant_decision(request, chosen.setup, [c for c in priced if c.setup.strategy == chosen.setup.strategy]),
                  strategy_decision(request, chosen, [c for c in priced if c.setup.weights_dtype == chosen.setup.weights_dtype])]
    if chosen.setup.strategy == "device_map" and not chosen.setup.offload_params:
        decisions.append(R.max_memory_decision(request, chosen.setup, chosen.memory,
                                               "per-GPU weight budget leaving room for the KV cache and prefill transients"))
    if chosen.setup.strategy in ("single", "tp"):
        chosen, more = tune(request, chosen, on_gpu=True)
        decisions += more
    decisions.append(launcher(chosen.setup))
    if request.hardware.nodes > 1:
        warnings.append(f"the target has {request.hardware.nodes} nodes; this plan uses the {chosen.setup.num_gpus} GPU(s) of one: "
                        f"run it on each node ({request.hardware.nodes}x the tokens/s shown), or serve with engine='vllm' to span them")
    return R.finish(request, chosen, decisions, priced, warnings, ok=chosen.verdict == "fits")
