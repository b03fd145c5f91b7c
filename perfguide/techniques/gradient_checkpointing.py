"""Gradient (activation) checkpointing: keep only each layer's input, re-run its forward during backward.

Activations shrink to one tensor per layer plus one layer's working set; the price is one more forward
(+1/3 of the matmul FLOPs of a step). The search tries it inside every rung (off and on), so it is used
before the optimizer or the weights change. Under FSDP the plugin checkpoints (TrainingArguments'
flag would add a redundant all-gather, and both at once raise in the Trainer).
"""

from __future__ import annotations

from typing import Any

from .base import EmitContext, LadderContext, Requires, Technique

SOURCES = (
    "Chen et al. 2016, Training Deep Nets with Sublinear Memory Cost (arXiv:1604.06174)",
    "https://huggingface.co/docs/transformers/perf_train_gpu_one#gradient-checkpointing",
)


class GradientCheckpointing(Technique):
    name = "gradient_checkpointing"
    fields = ("gradient_checkpointing",)
    summary = "recompute each layer's forward in backward instead of storing its activations"
    sources = SOURCES
    requires = Requires(tasks=("train",))
    order = 30
    axis = True

    def active(self, setup: Any) -> bool:
        return setup.task == "train" and setup.gradient_checkpointing

    def axis_values(self, ctx: LadderContext) -> list[dict[str, Any]]:
        values = [ctx.checkpointing] if ctx.checkpointing is not None else [False, True]
        return [{"gradient_checkpointing": v} for v in values]

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"activation_checkpointing": True} if self.active(ctx.setup) and not ctx.setup.is_fsdp else {}

    def fsdp_config(self, ctx: EmitContext) -> dict[str, Any]:
        return {"activation_checkpointing": ctx.setup.gradient_checkpointing} if ctx.setup.is_fsdp else {}

    def prepare(self, ctx: EmitContext, model: Any) -> Any:
        if self.active(ctx.setup) and not ctx.setup.is_fsdp:
            enable(model)  # under FSDP the plugin checkpoints; both at once raises in the Trainer
        return model


def enable(model: Any) -> None:
    """The transformers 5.x method (``gradient_checkpointing_enable`` is a deprecated alias); no-op when on."""
    if getattr(model, "is_activation_checkpointing", False):
        return
    model.activation_checkpointing_enable()


TECHNIQUES = (GradientCheckpointing(),)
