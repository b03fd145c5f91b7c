"""``sync_grads_each_micro_step`` (accelerate's ``sync_each_batch``): FSDP reduce-scatters on every accumulation
micro-step instead of holding the whole unsharded gradient set until the last one.

HF Trainer enters ``Accelerator.no_sync`` on every micro-step but the last (transformers trainer.py), and under FSDP
that keeps every rank's unsharded gradients until the last micro-step's backward: FSDP1's ``no_sync``, and FSDP2's
``set_requires_gradient_sync(False)`` from accelerate 1.11 (memory/sharding.py ``no_sync_grads``). That is 2 B per
trained parameter under bf16 autocast, on every GPU: 16 GB for an 8B full fine-tune, whatever the GPU count.
accelerate's ``GradientAccumulationPlugin(sync_each_batch=True)`` (TrainingArguments
``accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}``, which the Trainer checks before it
enters ``no_sync``) runs the reduce-scatter on every micro-step, so only the 1/N shard is held.

Memory: the accumulated gradients are the sharded ones (``memory``). Speed: the reduce-scatters no_sync would have
skipped on the micro-steps before the last are paid (speed/training.py ``communication``, memory/sharding.py
``defers_grad_sync``). perfguide's training search prices each FSDP layout both ways (scenarios/strategies.py
``with_synced_variant``) and keeps the faster that fits; a plan that sets it emits the TrainingArguments key
(``training_args``), and ``perfguide check`` reads it back.
"""

from __future__ import annotations

from typing import Any

from .base import EmitContext, Requires, Technique
from .effects import MemoryContext, MemoryTerms, SpeedContext, StepSeconds

SOURCES = (
    "https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation (sync_each_batch)",
    "https://github.com/huggingface/accelerate/blob/main/src/accelerate/utils/dataclasses.py (GradientAccumulationPlugin.sync_each_batch)",
    "https://github.com/huggingface/transformers/blob/main/src/transformers/trainer.py (the training loop's no_sync context)",
)


class SyncGradsEachMicroStep(Technique):
    name = "sync_grads_each_micro_step"
    fields = ("sync_grads_each_micro_step",)
    summary = "FSDP reduce-scatters on every accumulation micro-step: no unsharded gradients held between micro-steps"
    sources = SOURCES
    requires = Requires(devices=("cuda",), tasks=("train",), strategies=("fsdp", "fsdp_shard_grad_op"), binding=True)
    order = 55
    label_order = 64

    def active(self, setup: Any) -> bool:
        return bool(setup.sync_grads_each_micro_step)

    def label_word(self, setup: Any) -> str | None:
        return "sync-each-micro-step" if self.active(setup) else None

    def off(self) -> dict[str, Any]:
        return {"sync_grads_each_micro_step": False}

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        # transformers' AcceleratorConfig passes gradient_accumulation_kwargs to accelerate's GradientAccumulationPlugin
        return {"accelerator_config": {"gradient_accumulation_kwargs": {"sync_each_batch": True}}} if self.active(ctx.setup) else {}

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        return StepSeconds(grads_synced_each_micro_step=self.active(ctx.setup))

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not (self.active(ctx.setup) and ctx.setup.gradient_accumulation_steps > 1):
            return terms
        return terms.changed("gradients reduce-scattered on every accumulation micro-step (sync_each_batch): only the "
                             "1/N shard is held between micro-steps", grads_synced_each_micro_step=True)


TECHNIQUES = (SyncGradsEachMicroStep(),)
