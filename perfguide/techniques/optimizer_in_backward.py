"""Optimizer step inside backward: each parameter steps as soon as its gradient is complete and the gradient is
freed, so the full set of gradients never exists (saves ~all gradient bytes: 2 B/param in pure bf16).

Routes: transformers' own ``optim="lomo"/"adalomo"`` and the ``*_layerwise`` GaLore/APOLLO optimizers (their
optimizers fuse the update into backward), and for every other ``optim`` perfguide's hooks for the plain Trainer /
accelerate loop (integrations/optim_in_backward.py: ``Trainer(optimizers=rec.optimizers(model, args))``), the
pattern of torchtune's ``optimizer_in_bwd``. Gradient accumulation and global-norm clipping cannot work with it
(a parameter would step every micro-batch; no moment holds all gradients), nor fp16 loss scaling; the Setup
refuses those. The rung comes after pure bf16: it gives up clipping and accumulation, so the micro-batch must
be the whole per-device batch; activation offloading is tried with it, since that micro-batch is large.

Memory: each gradient is stepped and freed as it completes, so only the largest exists at once, with one
tensor's step temporaries (``memory``).

Speed (``kernel_factors``): ``step()`` runs once per parameter tensor, so what an optimizer pays per call (a
bitsandbytes paged optimizer's end-of-step synchronize) is paid per tensor (speed/terms.optimizer_sync_seconds).
"""

from __future__ import annotations

from typing import Any

from .base import EmitContext, LadderContext, Requires, Rung, Technique
from .effects import KernelFactors, MemoryContext, MemoryTerms

SOURCES = (
    "https://pytorch.org/tutorials/intermediate/optimizer_step_in_backward_tutorial.html",
    "https://pytorch.org/torchtune/main/tutorials/memory_optimizations.html#fusing-optimizer-step-into-backward-pass",
    "https://github.com/pytorch/torchtune/blob/main/recipes/configs/llama3_1/8B_full_single_device.yaml (optimizer_in_bwd, PagedAdamW8bit)",
)
#: optimizers tried in the rung, lightest state first: paged 8-bit state can even leave the GPU under pressure
RUNG_OPTIMIZERS = ("paged_adamw_8bit", "adamw_bnb_8bit", "adamw_torch_fused")


class OptimizerInBackward(Technique):
    name = "optimizer_in_backward"
    fields = ("optimizer_in_backward",)
    summary = "each parameter steps as its gradient is ready: gradients are never all held"
    sources = SOURCES
    requires = Requires(tasks=("train",), finetune=("full",), binding=True)
    order = 22
    label_order = 61
    ladder_order = 35
    switch = "optimizer_in_backward"

    def active(self, setup: Any) -> bool:
        return bool(setup.optimizer_in_backward)

    def conflict(self, setup: Any) -> str | None:
        problem = super().conflict(setup)
        if problem or not self.active(setup):
            return problem
        if setup.optimizer is None:
            return "optimizer_in_backward needs an optimizer (optimizer='adamw_torch_fused', 'paged_adamw_8bit', ...)"
        if setup.gradient_accumulation_steps != 1:
            return ("optimizer_in_backward steps each parameter as its gradient arrives, so gradient_accumulation_steps must be 1 "
                    f"(got {setup.gradient_accumulation_steps}); use a larger micro_batch_size instead")
        if setup.world_size > 1 or setup.strategy != "single":
            return ("optimizer_in_backward runs on one process without sharding: use strategy='single' and num_gpus=1, "
                    f"not {setup.strategy!r} x {setup.world_size}")
        if setup.autocast == "fp16":
            return "optimizer_in_backward cannot use fp16 loss scaling (GradScaler checks all gradients before one step); use bf16 or fp32"
        return None

    def label_word(self, setup: Any) -> str | None:
        return "optim-in-bwd" if self.active(setup) else None

    def rungs(self, ctx: LadderContext) -> list[Rung]:
        wanted = ctx.wants.get("optimizer_in_backward")
        if ctx.finetune != "full" or wanted is False or ctx.autocast == "fp16" or ctx.base.world_size > 1:
            return []
        per_rank = ctx.base.micro_batch_size * ctx.base.gradient_accumulation_steps
        weights = ("bf16",) if ctx.pure_half_allowed and ctx.wants.get("master_weights") != "fp32" else ("fp32",)
        if ctx.wants.get("master_weights") == "bf16" and not ctx.pure_half_allowed:
            return []
        optimizers = (ctx.optimizer,) if ctx.optimizer else RUNG_OPTIMIZERS
        templates = tuple(   # activation offloading is an axis of every rung (techniques/activation_offloading.py)
            ctx.base.replace(weights_dtype=w, autocast=ctx.autocast, optimizer=o, optimizer_in_backward=True,
                             micro_batch_size=per_rank, gradient_accumulation_steps=1)
            for w in weights for o in optimizers)
        return [Rung("step in backward", "each parameter steps inside backward: no gradient accumulation, no global-norm clipping", templates)]

    def off(self) -> dict[str, Any]:
        return {"optimizer_in_backward": False}

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not self.active(ctx.setup):
            return terms
        largest = ctx.largest_trainable
        return terms.changed("optimizer step inside backward: at most one gradient alive",
                             grads=min(terms.grads, largest * ctx.grad_elem_bytes), step_temp=min(terms.step_temp, largest * 4 * 2))

    def kernel_factors(self, setup: Any) -> KernelFactors:
        # one optimizer per parameter, stepped from its gradient hook: step() runs once per tensor
        return KernelFactors(step_per_tensor=True) if self.active(setup) else KernelFactors()

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        # no moment holds every gradient, so the Trainer's default clipping (max_grad_norm=1.0) must be off
        return {"max_grad_norm": 0.0} if self.active(ctx.setup) else {}


TECHNIQUES = (OptimizerInBackward(),)
