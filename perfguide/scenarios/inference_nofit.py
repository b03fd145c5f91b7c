"""When no serving layout fits: say which number failed and price what would fit instead.

A generic list ("use a bigger GPU, allow offload") misleads when offload is already on, or when the failing
number is host RAM rather than GPU memory; the user needs the limit that was hit and a target that holds it.
"""

from __future__ import annotations

from ..errors import PerfGuideError
from ..hardware.types import Hardware
from . import inference_rules as R
from .gpu_hint import gpu_hint
from .registry import find
from .search import _named_gpus, fits_ram, gib, usable_ram  # _named_gpus: single-GPU named targets, smallest first
from .types import Candidate, Request


def _gb(n: float) -> str:
    return gib(n)


def what_would_fit(request: Request, best: Candidate) -> tuple[str, ...]:
    """The limit that was hit, a named GPU that holds the leanest layout, and only the hints that still apply."""
    mem, cons, hw, s = best.memory, request.constraints, request.hardware, best.setup
    on_gpu = s.device == "cuda"
    out: list[str] = []
    if on_gpu and not fits_ram(mem, hw, cons.headroom):
        out.append(f"the leanest layout ({s.label}) offloads {_gb(mem.cpu_ram)} to CPU RAM but {_gb(usable_ram(hw, cons.headroom))} "
                   f"is usable ({cons.headroom:.0%} headroom kept free)")
    else:
        usable = R.usable_bytes(mem, cons.headroom) or 0
        where = "per GPU" if on_gpu else "of RAM"
        out.append(f"the leanest layout ({s.label}) needs {_gb(mem.device_total)} {where}; {_gb(usable)} is usable "
                   f"({cons.headroom:.0%} headroom kept free)")
    if on_gpu:
        out += _bigger_gpu(request, best)
        out += _more_gpus(request)
    else:
        from .infer_gpu_one import plan

        out.append(gpu_hint(request, plan))
    if mem.kv_cache > mem.weights / 4:
        out.append(f"the KV cache ({_gb(mem.kv_cache)}) grows with prompt_len, max_new_tokens and batch_size: lower them")
    if on_gpu and not cons.allow_offload:
        out.append("allow_offload=True lets device_map='auto' keep part of the weights in CPU RAM (slow)")
    return tuple(out)


def _more_gpus(request: Request) -> list[str]:
    """The fewest GPUs of this kind (one node) over which the multi-GPU scenario's own plan fits, priced: a bare
    'use several GPUs' pointed DeepSeek-V3 on 8 x A100 at a scenario that does not hold it either."""
    many, gpu = find(request.info.task, "cuda", True), request.hardware.smallest_gpu
    if request.info.multi_gpu or many is None or gpu is None:
        return []
    for n in (2, 4, 8):
        try:
            hw = Hardware.from_name(f"{gpu.name}:{n}")
        except PerfGuideError:
            return []   # not a named GPU: no target to price
        cons = request.constraints.model_copy(update={"num_gpus": None})
        p = many.plan(request.model_copy(update={"scenario": many.name, "hardware": hw, "constraints": cons}))
        if p.fits:
            return [f"hardware='{gpu.name}:{n}' with scenario='{many.name}' fits ({p.setup.label}): {_gb(p.memory.device_total)} per GPU"]
    return []


def _bigger_gpu(request: Request, best: Candidate) -> list[str]:
    """The smallest named GPU with more memory on which the leanest layout fits whole, on one GPU."""
    lean = best.setup.replace(offload_params=False, strategy="single", num_gpus=1)
    current = request.hardware.smallest_gpu.memory_total if request.hardware.smallest_gpu else 0
    for name, hw in _named_gpus():
        if hw.gpus[0].memory_total <= current:
            continue
        priced = R.candidate(request.model_copy(update={"hardware": hw}), lean)
        if priced.verdict == "fits":
            return [f"hardware={name!r} holds it on one GPU ({lean.label}): {_gb(priced.memory.device_total)}"]
    return []
