"""Train on one GPU: the fastest setup that fits, the global batch kept fixed.

Order: precision (from the GPU and the checkpoint's dtype) -> for each rung of the memory ladder, the
micro-batch and checkpointing that fit with headroom -> rank what fits by predicted step time (the shared
planner, training.py). When nothing fits, the plan says so and prices what would: LoRA, QLoRA, a bigger
named GPU, or N GPUs with FSDP.
"""

from __future__ import annotations

from ..errors import ConflictingConstraintsError, PerfGuideError
from ..hardware.types import Hardware
from ..setup import Setup
from .host import gpu_dataloader
from .idle_gpus import with_idle_gpus
from .moe_targets import expert_free_lora
from .nofit_training import freed_knobs, longest_sequence, precomputed_reference
from .rules_linear_attention import decide_linear_kernels
from .rules_precision import gpu_precision
from .search import SearchResult, bigger_gpu, fits, gib, least_memory, price, sharded_gpus_needed
from .strategies import layout_search
from .train_gpu_many import add_layout
from .training import Suggest, attention, check_optimizer, objective_fields, plan_training
from .types import Plan, Request


def plan(request: Request) -> Plan:
    p = _plan(request, what_would_fit)
    if request.global_batch_size % (request.hardware.gpu_count * request.hardware.nodes):
        return p   # the many-GPU planner keeps the global batch fixed: it must divide over the GPUs
    from . import train_gpu_many

    return with_idle_gpus(request, p, "train_gpu_many", train_gpu_many.plan, "trains")


def plan_without_suggestions(request: Request) -> Plan:
    """The plan alone, for hints that only need the verdict, the setup and its numbers (plan_training's
    ``verdict_only``: nothing priced for what would fit instead, no adapter alternatives, no candidate table)."""
    return _plan(request, lambda *_: (), verdict_only=True)


def _plan(request: Request, suggest: Suggest, verdict_only: bool = False) -> Plan:
    hw, spec, cons = request.hardware, request.model, request.constraints
    gpu = hw.smallest_gpu
    if gpu is None:
        raise ConflictingConstraintsError("train_gpu_one needs a GPU; use scenario='train_cpu'")
    check_optimizer(cons.optimizer)
    prec = gpu_precision(spec, gpu, cons.precision)
    impl, attn_dec = attention(cons, prec, gpu, spec, request.hardware.source == "probe", request.seq_len)
    linear, linear_decs = decide_linear_kernels(request.model, cons.linear_attention_kernels, prec.autocast or prec.half,
                                                local=request.hardware.source == "probe", seq_len=request.seq_len)
    workers, pin, host_decs = gpu_dataloader(hw.cpu, 1)
    base = Setup(task="train", avg_seq_len=request.constraints.avg_seq_len, target_len=request.constraints.target_len, **objective_fields(request.constraints), device="cuda", seq_len=request.seq_len, tf32=prec.tf32, attn_implementation=impl, **linear,
                 dataloader_num_workers=workers, dataloader_pin_memory=pin, gradient_accumulation_steps=request.global_batch_size)
    if cons.strategy in (None, "single"):
        p = plan_training(request, base, prec, (*prec.decisions, attn_dec, *linear_decs, *host_decs), per_rank_batch=request.global_batch_size,
                          suggest=suggest, verdict_only=verdict_only)
    else:   # a ZeRO stage asked for: its one-GPU layouts (on the GPU, offloaded) searched and decided as train_gpu_many does
        p = plan_training(request, base, prec, (*prec.decisions, attn_dec, *linear_decs, *host_decs), per_rank_batch=request.global_batch_size,
                          suggest=suggest, verdict_only=verdict_only, **layout_search(1, cons.allow_offload, cons.strategy))
        p = add_layout(request, p, request.global_batch_size)
    return p


def what_would_fit(request: Request, result: SearchResult, adapters: dict[str, SearchResult], mode: str) -> tuple[str, ...]:
    """Nothing fits here: price LoRA/QLoRA, LoRA off the MoE experts, the smallest bigger named GPU, and a sharded N-GPU run."""
    hw, spec, h = request.hardware, request.model, request.constraints.headroom
    gpu = hw.smallest_gpu
    assert gpu is not None, "train_gpu_one plans only for machines with a GPU (plan() checked)"
    out = [*freed_knobs(request, plan_without_suggestions), *precomputed_reference(request, plan_without_suggestions)]
    for kind, r in adapters.items():
        if r.chosen is not None:
            c = r.chosen
            out.append(f"finetune={kind!r} fits on {gpu.name}: {gib(c.memory.device_total)} per device, "
                       f"{c.step_time:.3g} s/step ({c.setup.label})")
    out += expert_free_lora(request, result, adapters, plan_without_suggestions, "device")
    # what a bigger GPU or N GPUs would run: the leanest on-GPU setup (host offload already failed here)
    reference = least_memory(result).setup.replace(micro_batch_size=1, gradient_accumulation_steps=1, strategy="single",
                                                    offload_optimizer=False, offload_params=False, activation_offloading=False)
    out += longest_sequence(request, plan_without_suggestions)   # what this card runs, before what another would
    here = fits(price(spec, reference, hw).memory, hw, h)   # micro-batch 1 fits this card: no bigger one is the answer
    big = None if here else bigger_gpu(spec, reference, hw, h)
    if big:
        name, p = big
        out.append(f"hardware={name!r} fits this {mode} setup ({reference.label}): {gib(p.memory.device_total)} per device")
    sharded = None if here else sharded_gpus_needed(spec, reference, gpu, hw, h)
    if sharded:
        n, p = sharded
        out.append(f"{n} x {gpu.name} with FSDP full sharding (scenario='train_gpu_many'{_target(gpu.name, p.setup)}): "
                   f"{gib(p.memory.device_total)} per device")
    out += _smaller_global_batch(request, mode)
    if not out:  # nothing full fits anywhere near: the leanest adapter setup on the smallest bigger GPU
        out += _adapters_on_bigger_gpu(request, adapters)
    return tuple(out) or (f"{spec.name} does not fit on {gpu.name} in any setup perfguide knows; try more GPUs with offload",)


def _target(gpu_name: str, priced: Setup) -> str:
    """``, hardware='t4:8x4'``: the GPUs per node x nodes the sharded setup was priced on, as a name ``recommend``
    reads ('t4:32' is refused: no node holds 32 GPUs); empty when the GPU is not a named one."""
    name = f"{gpu_name}:{priced.num_gpus}" + (f"x{priced.nodes}" if priced.nodes > 1 else "")
    try:
        Hardware.from_name(name)
    except PerfGuideError:
        return ""
    return f", hardware={name!r}"


def _smaller_global_batch(request: Request, mode: str) -> list[str]:
    """The largest smaller global batch at which this setup fits here: without accumulation the optimizer step can
    run inside backward (no gradient buffer), which is how torchtune fits an 8B full fine-tune on one 24 GB card at
    batch 2 (README memory table). The global batch changes the training, so this is offered, never chosen."""
    micro = request.constraints.micro_batch_size or 1   # a forced micro-batch: only batches it divides are offered
    k = request.global_batch_size // 2
    while k >= micro:
        p = plan_without_suggestions(request.model_copy(update={"global_batch_size": k})) if k % micro == 0 else None
        if p is not None and p.fits:
            return [f"global_batch_size={k} fits this {mode} setup on one GPU ({p.setup.label}): "
                    f"{gib(p.memory.device_total)} per device, {p.throughput.step_time_s:.3g} s/step"]
        k //= 2
    return []


def _adapters_on_bigger_gpu(request: Request, adapters: dict[str, SearchResult]) -> list[str]:
    out = list(precomputed_reference(request, plan_without_suggestions))
    for kind, r in adapters.items():
        if r.chosen is None and r.options:
            lean = least_memory(r).setup.replace(micro_batch_size=1, gradient_accumulation_steps=1)
            big = bigger_gpu(request.model, lean, request.hardware, request.constraints.headroom)
            if big:
                name, p = big
                out.append(f"finetune={kind!r} on hardware={name!r} fits ({lean.label}): {gib(p.memory.device_total)} per device")
    return out
