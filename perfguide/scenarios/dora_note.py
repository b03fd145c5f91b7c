"""What DoRA costs a plan, said in its fine-tuning decision: the plan's Setup priced again with plain LoRA, and, where
the adapter's dropout is on, with dropout 0 (peft >= 0.14 then reuses the base layer's output: no second base matmul,
no weight copy kept for backward; speed/dora.py, memory/lora_activations.py)."""

from __future__ import annotations

from .. import sources
from ..memory.lora_activations import dora_reruns_base
from ..speed.dora import fp32_rerun
from .search import Priced, gib, price
from .types import Request


def dora_note(request: Request, chosen: Priced) -> str:
    """A clause for the fine-tuning decision's reason; empty without DoRA."""
    setup = chosen.setup
    if setup.lora is None or not setup.lora.use_dora:
        return ""

    def cost(other: Priced) -> str:
        """``other`` against the plan: its memory per device and step time, the differences in words."""
        memory = chosen.memory.device_total - other.memory.device_total
        seconds = chosen.step_time - other.step_time
        return (f"{gib(abs(memory))} {'less' if memory >= 0 else 'more'} per device, "
                f"{abs(seconds):.3g} s {'less' if seconds >= 0 else 'more'} per step")

    def priced(**lora: object) -> Priced:
        return price(request.model, setup.replace(lora=setup.lora.model_copy(update=lora)), request.hardware,  # type: ignore[union-attr]
                     request.calibration)

    note = (f"; DoRA recomputes each adapted weight's norm ||W + s*B@A|| every forward and rescales both branches "
            f"(plain LoRA: {cost(priced(use_dora=False))})")
    if dora_reruns_base(setup):
        why = (f"lora_dropout={setup.lora.dropout} makes peft run each base matmul again on the dropped input"
               if setup.lora.dropout > 0 else "this peft release (< 0.14) runs each base matmul again")
        fp32 = " in fp32 (x and the weight cast to the fp32 adapters, no autocast)" if fp32_rerun(setup) else ""
        note += f"; {why}{fp32} and keeps the weight it ran with for backward"
        if setup.lora.dropout > 0:
            note += f" (lora_dropout=0: {cost(priced(dropout=0.0))})"
    return note + f" ({sources.PEFT_DORA})"
