"""Train on the CPU (transformers perf_train_cpu and perf_train_cpu_many): bf16 only with native support, one process per socket (DDP over
gloo), threads = physical cores per process.

Memory is host RAM (what is available now, minus the headroom); the ladder is the GPU one. QLoRA is not
offered: bitsandbytes' 4-bit training path targets CUDA.
"""

from __future__ import annotations

from ..setup import Setup
from .gpu_hint import gpu_hint
from .host import cpu_dataloader, cpu_processes, cpu_threads
from .rules_linear_attention import decide_linear_kernels
from .rules_precision import cpu_precision
from .search import SearchResult, gib, least_memory
from .training import attention, check_optimizer, objective_fields, plan_training
from .types import Plan, Request


def plan(request: Request) -> Plan:
    hw, cons = request.hardware, request.constraints
    check_optimizer(cons.optimizer)
    prec = cpu_precision(hw.cpu, cons.precision)
    impl, attn_dec = attention(cons, prec, None, request.model, request.hardware.source == "probe", request.seq_len)
    linear, linear_decs = decide_linear_kernels(request.model, cons.linear_attention_kernels, None, local=True,
                                                seq_len=request.seq_len, cpu=True)
    processes, proc_dec = cpu_processes(hw.cpu, cons.num_gpus, request.global_batch_size)
    threads, threads_dec = cpu_threads(hw.cpu, processes=processes)
    workers, pin, host_decs = cpu_dataloader(hw.cpu)
    per_rank = request.global_batch_size // processes
    base = Setup(task="train", avg_seq_len=request.constraints.avg_seq_len, target_len=request.constraints.target_len, **objective_fields(request.constraints), device="cpu", seq_len=request.seq_len, attn_implementation=impl, **linear, cpu_threads=threads,
                 num_gpus=processes, strategy="ddp" if processes > 1 else "single",
                 dataloader_num_workers=workers, dataloader_pin_memory=pin, gradient_accumulation_steps=per_rank)
    return plan_training(request, base, prec, (*prec.decisions, attn_dec, *linear_decs, proc_dec, threads_dec, *host_decs),
                         per_rank_batch=per_rank, adapter_kinds=("lora",), suggest=_what_would_fit)


def _what_would_fit(request: Request, result: SearchResult, adapters: dict[str, SearchResult], mode: str) -> tuple[str, ...]:
    """Nothing fits in RAM: LoRA if it does, else how much RAM the leanest setup needs, or a GPU plan."""
    out = [f"finetune='lora' fits in RAM: {gib(r.chosen.memory.device_total)}, {r.chosen.step_time:.3g} s/step ({r.chosen.setup.label})"
           for r in adapters.values() if r.chosen is not None]
    lean = least_memory(result)
    out.append(f"the leanest {mode} setup ({lean.setup.label}) needs {gib(lean.memory.device_total)} of RAM; "
               f"{gib(request.hardware.cpu.ram_available)} is available")
    from .train_gpu_one import plan_without_suggestions

    out.append(gpu_hint(request, plan_without_suggestions))
    return tuple(out)
