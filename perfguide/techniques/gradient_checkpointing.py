"""Gradient (activation) checkpointing: keep only each layer's input, re-run its forward during backward.

Activations shrink to one tensor per layer plus one layer's working set; the price is one more forward
(+1/3 of the matmul FLOPs of a step). Memory (``memory``): the blocks keep only their inputs, one block's
activations come back during backward, and autocast's 16-bit weight copies exist for the recomputed block only.
Speed (``kernel_factors``): one recomputed forward per micro-step, which the speed model prices like a forward
(GEMM FLOPs, weight reads, memory-bound passes, launches, dequantization). The search tries it inside every rung (off and on), so it is used
before the optimizer or the weights change. Under FSDP the plugin checkpoints (TrainingArguments'
flag would add a redundant all-gather, and both at once raise in the Trainer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..memory.seq2seq import boundary_bytes, stack_activation_bytes
from .base import EmitContext, LadderContext, Requires, Technique
from .effects import KernelFactors, MemoryContext, MemoryTerms

if TYPE_CHECKING:
    from ..model.types import ModelSpec
    from ..setup import Setup

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

    def label_word(self, setup: Any) -> str | None:
        return "ckpt" if setup.gradient_checkpointing else None

    def axis_values(self, ctx: LadderContext) -> list[dict[str, Any]]:
        values = [ctx.checkpointing] if ctx.checkpointing is not None else [False, True]
        return [{"gradient_checkpointing": v} for v in values]

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not self.active(ctx.setup):
            return terms
        layers = ctx.spec.total_layers
        return terms.changed(activations=boundary_bytes(ctx.spec, ctx.shape),
                             recompute=ctx.layer_activations, weight_casts=terms.weight_casts // layers)

    def kernel_factors(self, setup: Any) -> KernelFactors:
        return KernelFactors(recompute=1.0) if self.active(setup) else KernelFactors()

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"activation_checkpointing": True} if self.active(ctx.setup) and not ctx.setup.is_fsdp else {}

    def fsdp_config(self, ctx: EmitContext) -> dict[str, Any]:
        return {"activation_checkpointing": ctx.setup.gradient_checkpointing} if ctx.setup.is_fsdp else {}

    def prepare(self, ctx: EmitContext, model: Any) -> Any:
        if self.active(ctx.setup) and not ctx.setup.is_fsdp:
            enable(model)  # under FSDP the plugin checkpoints; both at once raises in the Trainer
        return model

    def trace_model(self, setup: Any, model: Any) -> Any:
        if self.active(setup):
            enable(model)  # transformers 5 default: non-reentrant torch.utils.checkpoint per block
        return model


def held_activations(spec: ModelSpec, setup: Setup) -> int:
    """Bytes the blocks keep between forward and backward: their inputs when checkpointed, else everything."""
    if GRADIENT_CHECKPOINTING.active(setup):
        return boundary_bytes(spec, setup)
    return stack_activation_bytes(spec, setup)[0]


def enable(model: Any) -> None:
    """The transformers 5.x method (``gradient_checkpointing_enable`` is a deprecated alias); no-op when on."""
    if getattr(model, "is_activation_checkpointing", False):
        return
    model.activation_checkpointing_enable()


GRADIENT_CHECKPOINTING = GradientCheckpointing()
TECHNIQUES = (GRADIENT_CHECKPOINTING,)
