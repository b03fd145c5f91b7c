"""Train on the CPU (rules.md 3.24, 4.3): bf16 only with native support, threads = physical cores.

Memory is host RAM (what is available now, minus the headroom); the ladder is the GPU one. QLoRA is not
offered: bitsandbytes' 4-bit training path targets CUDA.
"""

from __future__ import annotations

from ..setup import Setup
from .host import cpu_dataloader, cpu_threads
from .precision import cpu_precision
from .search import SearchResult, gib, least_memory
from .train_gpu_one import attention, check_optimizer, plan_training
from .types import Plan, Request


def plan(request: Request) -> Plan:
    hw, spec, cons = request.hardware, request.model, request.constraints
    check_optimizer(cons.optimizer)
    prec = cpu_precision(spec, hw.cpu, cons.precision)
    impl, attn_dec = attention(cons, prec, None)
    threads, threads_dec = cpu_threads(hw.cpu)
    workers, pin, host_decs = cpu_dataloader(hw.cpu)
    base = Setup(task="train", device="cpu", seq_len=request.seq_len, attn_implementation=impl, cpu_threads=threads,
                 dataloader_num_workers=workers, dataloader_pin_memory=pin, gradient_accumulation_steps=request.global_batch_size)
    return plan_training(request, base, prec, (*prec.decisions, attn_dec, threads_dec, *host_decs),
                         per_rank_batch=request.global_batch_size, adapter_kinds=("lora",), suggest=_what_would_fit)


def _what_would_fit(request: Request, result: SearchResult, adapters: dict[str, SearchResult], mode: str) -> tuple[str, ...]:
    """Nothing fits in RAM: LoRA if it does, else how much RAM the leanest setup needs, or a GPU plan."""
    out = [f"finetune='lora' fits in RAM: {gib(r.chosen.memory.device_total)}, {r.chosen.step_time:.3g} s/step ({r.chosen.setup.label})"
           for r in adapters.values() if r.chosen is not None]
    lean = least_memory(result)
    out.append(f"the leanest {mode} setup ({lean.setup.label}) needs {gib(lean.memory.device_total)} of RAM; "
               f"{gib(request.hardware.cpu.ram_available)} is available")
    out.append("a GPU plan: scenario='train_gpu_one' with hardware='a100-80gb' (or your GPU)")
    return tuple(out)
