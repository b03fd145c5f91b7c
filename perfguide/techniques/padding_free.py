"""Padding-free batches: ``DataCollatorWithFlattening`` (plain Trainer, ``rec.data_collator()``) or TRL
``padding_free=True`` (with ``packing`` for BFD packing): the micro-batch becomes one row of real tokens, so
with ``avg_seq_len`` = N the step pays for N tokens per sample instead of ``seq_len``.

Which attention keeps samples apart: flash_attention_2 (cu_seq_lens from the position ids); SDPA and eager
through transformers' packed-sequence mask (a [T, T] block-diagonal mask, priced), which transformers builds
only without a KV cache, so the plan turns ``use_cache`` off (integrations/collate.py, tested on CPU). The search
tries it whenever ``avg_seq_len`` is below ``seq_len`` and takes it when it is faster.
"""

from __future__ import annotations

from typing import Any

from .base import EmitContext, LadderContext, Requires, Technique

SOURCES = (
    "https://huggingface.co/blog/packing-with-FA2",
    "Kundu et al. 2024, Enhancing Training Efficiency Using Packing with Flash Attention (arXiv:2407.09105)",
    "https://huggingface.co/docs/trl/reducing_memory_usage#padding-free",
    "https://github.com/huggingface/transformers/blob/main/src/transformers/masking_utils.py (find_packed_sequence_indices)",
)


class PaddingFree(Technique):
    name = "padding_free"
    fields = ("padding_free", "avg_seq_len")
    summary = "samples concatenated without padding; the step pays for real tokens only"
    sources = SOURCES
    requires = Requires(tasks=("train",))
    order = 34
    axis = True

    def active(self, setup: Any) -> bool:
        return bool(setup.padding_free)

    def axis_values(self, ctx: LadderContext) -> list[dict[str, Any]]:
        wanted = ctx.wants.get("padding_free")
        avg = ctx.base.avg_seq_len
        if wanted is True:
            return [{"padding_free": True}]
        if wanted is False or avg is None or avg >= ctx.base.seq_len or ctx.base.task != "train":
            return [{}]
        return [{}, {"padding_free": True}]

    def trl_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"padding_free": True} if self.active(ctx.setup) else {}

    def model_kwargs(self, ctx: EmitContext) -> dict[str, Any]:
        # with a KV cache transformers 5.x skips the packed-sequence mask and flattened samples attend to each other
        return {"use_cache": False} if self.active(ctx.setup) else {}

    def prepare(self, ctx: EmitContext, model: Any) -> Any:
        if self.active(ctx.setup):
            disable_cache(model)
        return model


def disable_cache(model: Any) -> None:
    """Training needs no KV cache, and with one the packed-sequence mask is never built (module docstring)."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        config.use_cache = False


TECHNIQUES = (PaddingFree(),)
