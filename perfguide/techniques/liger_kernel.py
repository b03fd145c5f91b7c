"""Liger kernels (``TrainingArguments(use_liger_kernel=True)``, also TRL): Triton kernels that fuse the LM head
with the cross-entropy (no full-vocabulary logits: one chunk of rows at a time), plus RMSNorm, RoPE and SwiGLU.

Memory: the loss path shrinks from ~b*s*V*16 bytes to one [chunk, V] tile (memory/techniques.py). Speed: the
head GEMMs run on smaller chunks (lower efficiency at small batch, where Liger's own issues report slowdowns)
but the fp32 logits never stream through memory (speed/techniques.py); both are priced, so the search takes it
only where it pays or where it is what fits. Liger patches only the model types in its dispatch table
(liger_kernel/transformers/monkey_patch.py ``MODEL_TYPE_TO_APPLY_LIGER_FN``); for any other type it logs and
does nothing, so perfguide never counts its savings there. The fused RMSNorm/SwiGLU activation savings are not
priced (a conservative estimate).
"""

from __future__ import annotations

from typing import Any

from .base import EmitContext, LadderContext, Requires, Technique

SOURCES = (
    "https://github.com/linkedin/Liger-Kernel (src/liger_kernel/ops/fused_linear_cross_entropy.py, transformers/monkey_patch.py)",
    "Hsu et al. 2024, Liger Kernel: Efficient Triton Kernels for LLM Training (arXiv:2410.10989)",
    "https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments.use_liger_kernel",
)

#: HF model types Liger patches (MODEL_TYPE_TO_APPLY_LIGER_FN, linkedin/Liger-Kernel @ 00218a0635f3b6285ab478b631618346f9ad5ce7)
MODEL_TYPES = frozenset({
    "deepseek_v3", "gemma", "gemma2", "gemma3_text", "gemma3", "glm4", "gpt_oss", "llama", "llama4_text", "llama4", "granite",
    "mllama", "ministral", "mistral", "mixtral", "nemotron", "olmo2", "olmo3", "qwen2", "qwen3", "qwen3_moe", "qwen2_vl",
    "qwen2_5_vl", "qwen3_next", "smollm3", "phi3", "paligemma", "falcon_h1", "exaone4",
})


def supported(model_type: str) -> bool:
    return model_type in MODEL_TYPES


class LigerKernel(Technique):
    name = "liger_kernel"
    fields = ("liger_kernel",)
    summary = "fused linear cross-entropy (no full logits) and fused RMSNorm/RoPE/SwiGLU Triton kernels"
    sources = SOURCES
    requires = Requires(devices=("cuda",), tasks=("train",), packages=("liger-kernel",))
    order = 36
    axis = True

    def active(self, setup: Any) -> bool:
        return bool(setup.liger_kernel)

    def why_not(self, setup: Any, hardware: Any = None, model: Any = None) -> str | None:
        base = super().why_not(setup, hardware, model)
        if base:
            return base
        if model is not None and not supported(model.model_type):
            return f"liger-kernel has no kernels for model type {model.model_type!r} (it patches {', '.join(sorted(MODEL_TYPES)[:8])}, ...)"
        return None

    def axis_values(self, ctx: LadderContext) -> list[dict[str, Any]]:
        wanted = ctx.wants.get("liger_kernel")
        if wanted is False or ctx.base.device != "cuda" or ctx.base.task != "train" or (ctx.model is None and not wanted):
            return [{}]
        problem = self.why_not(ctx.base, ctx.hardware, ctx.model)
        if problem:
            if wanted:
                from ..errors import ConflictingConstraintsError

                raise ConflictingConstraintsError(f"liger_kernel=True cannot run here: {problem}; use liger_kernel=False")
            return [{}]
        return [{"liger_kernel": True}] if wanted else [{}, {"liger_kernel": True}]

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"use_liger_kernel": True} if self.active(ctx.setup) else {}


TECHNIQUES = (LigerKernel(),)
