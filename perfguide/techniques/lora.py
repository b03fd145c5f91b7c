"""LoRA: train low-rank adapters (r x d and d x r per target matrix) on a frozen base.

Gradients and optimizer states exist only for the adapters (well under 1% of the weights at r=16), and the
frozen base can be stored in 16 bit. Offered when full fine-tuning does not fit, or when asked for. The PEFT
``LoraConfig`` (and so the prepare step) is built by the PEFT adapter, integrations/lora.py.
"""

from __future__ import annotations

from typing import Any

from .base import LadderContext, Requires, Rung, Technique

SOURCES = (
    "Hu et al. 2021, LoRA: Low-Rank Adaptation of Large Language Models (arXiv:2106.09685)",
    "https://huggingface.co/docs/peft/main/en/developer_guides/lora",
)


class Lora(Technique):
    name = "lora"
    fields = ("lora",)
    summary = "train low-rank adapters on a frozen base"
    sources = SOURCES
    requires = Requires(tasks=("train",), packages=("peft",), finetune=("lora", "qlora"))
    order = 50
    ladder_order = 40

    def active(self, setup: Any) -> bool:
        return setup.task == "train" and setup.lora is not None

    def label_word(self, setup: Any) -> str | None:
        return f"lora-r{setup.lora.r}" if setup.lora is not None else None

    def rungs(self, ctx: LadderContext) -> list[Rung]:
        if ctx.finetune != "lora":
            return []
        from .optimizers import chosen_optimizer

        template = ctx.base.replace(weights_dtype=ctx.half or "fp32", autocast=ctx.autocast, lora=ctx.lora, optimizer=chosen_optimizer(ctx))
        return [Rung("LoRA", "trains low-rank adapters on a frozen base", (template,))]


TECHNIQUES = (Lora(),)
