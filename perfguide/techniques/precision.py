"""Precision modes: mixed precision (autocast + TF32) and pure 16-bit weights.

True AMP keeps fp32 master weights, grads and optimizer states and runs the matmuls in bf16/fp16 (the
reference semantics, so the first rung of the ladder). Pure bf16 stores everything in bf16: less than half
the bytes, but updates below bf16's resolution are lost, so it is a later rung, only offered with bf16
(fp16 needs fp32 masters for its GradScaler).
"""

from __future__ import annotations

from typing import Any

from .base import EmitContext, LadderContext, Requires, Rung, Technique

AMP_DOCS = "https://huggingface.co/docs/transformers/perf_train_gpu_one#mixed-precision"
AMP_PAPER = "Micikevicius et al. 2018, Mixed Precision Training (arXiv:1710.03740)"
TF32_DOCS = "https://docs.pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices"
BF16_PAPER = "Kalamkar et al. 2019, A Study of BFLOAT16 for Deep Learning Training (arXiv:1905.12322)"
#: nearest rounding of bf16 weight updates cancels small updates; stochastic rounding / Kahan summation recover fp32 accuracy
BF16_UPDATE_PAPER = "Zamirai et al. 2020, Revisiting BFloat16 Training (arXiv:2010.06192)"
#: public full fine-tunes that store weights and AdamW states in bf16 (dtype: bf16, no fp32 master copy)
BF16_RECIPE = "https://github.com/pytorch/torchtune/blob/main/recipes/configs/llama3_1/8B_full_single_device.yaml (dtype: bf16)"
#: accelerate upcasts trainable low-precision params to fp32 only when mixed precision is set
FSDP2_UPCAST = "https://github.com/huggingface/accelerate/blob/main/src/accelerate/utils/fsdp_utils.py (fsdp2_prepare_model: upcast only if mixed_precision != 'no')"


def pure_half(setup: Any) -> bool:
    """bf16/fp16 weights, grads and optimizer states with no fp32 master copy (a full fine-tune, not a LoRA base)."""
    return setup.task == "train" and setup.lora is None and setup.weights_dtype in ("bf16", "fp16")


def accelerate_mixed_precision(setup: Any) -> str:
    """accelerate's ``mixed_precision`` word for a Setup: the autocast dtype, except for pure bf16 under FSDP2.

    accelerate's ``fsdp2_prepare_model`` upcasts every trainable low-precision parameter to fp32 when mixed
    precision is on (FSDP2_UPCAST), which would quietly turn pure bf16 back into fp32 masters. With "no" and a
    model loaded in bfloat16 the shards, their gradients and the optimizer states stay bf16; the matmuls run
    in bf16 because the weights are bf16, so no autocast is needed.
    """
    if pure_half(setup) and setup.is_fsdp:
        return "no"
    return setup.autocast or "no"


class MixedPrecision(Technique):
    name = "mixed_precision"
    fields = ("autocast", "tf32")
    summary = "autocast the matmuls to bf16/fp16 over fp32 master weights; TF32 for the matmuls left in fp32"
    sources = (AMP_DOCS, AMP_PAPER, TF32_DOCS)
    order = 10
    ladder_order = 10

    def active(self, setup: Any) -> bool:
        return setup.autocast is not None

    def label_word(self, setup: Any) -> str | None:
        return f"amp-{setup.autocast}" if setup.autocast else None

    def rungs(self, ctx: LadderContext) -> list[Rung]:
        if ctx.finetune != "full":
            return []
        from .optimizers import chosen_optimizer

        name = "exact AMP" if ctx.autocast else "fp32"
        template = ctx.base.replace(weights_dtype="fp32", autocast=ctx.autocast, optimizer=chosen_optimizer(ctx))
        return [Rung(name, "fp32 master weights, grads and AdamW states: the reference semantics", (template,))]

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        s = ctx.setup
        out: dict[str, Any] = {}
        if accelerate_mixed_precision(s) == "no":
            pass  # pure bf16 under FSDP2: bf16=True would make accelerate upcast the shards to fp32
        elif s.autocast == "bf16":
            out["bf16"] = True
        elif s.autocast == "fp16":
            out["fp16"] = True
        if s.tf32 and ctx.target_supports_tf32:
            out["tf32"] = True  # TrainingArguments raises without an Ampere+ GPU, so only for such targets
        return out


class PureHalf(Technique):
    name = "pure_bf16"
    fields = ("weights_dtype",)
    summary = "bf16 weights, grads and optimizer states (no fp32 master copy)"
    sources = (BF16_PAPER, BF16_UPDATE_PAPER, BF16_RECIPE, "https://huggingface.co/docs/transformers/perf_train_gpu_one#bf16")
    requires = Requires(tasks=("train",))
    order = 11
    ladder_order = 30
    switch = "master_weights"

    def active(self, setup: Any) -> bool:
        return bool(pure_half(setup))

    def rungs(self, ctx: LadderContext) -> list[Rung]:
        if ctx.finetune != "full" or not ctx.pure_half_allowed:
            return []
        from .optimizers import DEFAULT_OPTIMIZER

        optimizers = [ctx.optimizer] if ctx.optimizer else [DEFAULT_OPTIMIZER, "adamw_bnb_8bit"]
        templates = tuple(ctx.base.replace(weights_dtype="bf16", autocast="bf16", optimizer=o) for o in optimizers)
        return [Rung("pure bf16", "bf16 weights, grads and optimizer states: updates lose precision at small learning rates", templates)]

    def deepspeed_top(self, ctx: EmitContext) -> dict[str, Any]:
        """Pure bf16 under ZeRO: DeepSpeed's own switches keep its master copy, gradients and optimizer states in bf16
        (deepspeed runtime/precision_config.py); without them the engine builds fp32 masters whatever the load dtype."""
        s = ctx.setup
        if not (pure_half(s) and s.is_deepspeed and s.weights_dtype == "bf16"):
            return {}
        return {"bf16": {"enabled": "auto", "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}


TECHNIQUES = (MixedPrecision(), PureHalf())
