"""Padding-free batches: ``DataCollatorWithFlattening`` (plain Trainer, ``rec.data_collator()``) or TRL
``padding_free=True`` (with ``packing`` for BFD packing): the micro-batch becomes one row of real tokens, so
with ``avg_seq_len`` = N the step pays for N tokens per sample instead of ``seq_len``.

Which attention keeps samples apart: flash_attention_2 (cu_seq_lens from the position ids); SDPA and eager
through transformers' packed-sequence mask (a [T, T] block-diagonal mask, priced), which transformers builds
only without a KV cache, so the plan turns ``use_cache`` off (integrations/collate.py, tested on CPU). The search
tries it whenever ``avg_seq_len`` is below ``seq_len`` and takes it when it is faster.

Memory: activations follow the real tokens (``shape``: one row of ``micro_batch x avg_seq_len`` tokens, the shape
``DataCollatorWithFlattening`` returns), plus for SDPA / eager the one bool [T, T] mask (transformers' masking_utils
detects packed ``position_ids``); flash_attention_2 takes ``cu_seq_lens`` and needs none. Speed: the Linears pay for
real tokens only; flash_attention_2 runs attention per sample (sum of l^2), SDPA / eager over the flattened row
with a block mask (T^2, nothing skipped).
"""

from __future__ import annotations

from typing import Any

from ..memory.linear_attention import KERNEL_PATHS, linear_kind, linear_share
from .base import HF_TRAINERS, EmitContext, LadderContext, Requires, Technique
from .effects import MemoryContext, MemoryTerms, StepShape

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
    requires = Requires(tasks=("train",), binding=True, trainers=HF_TRAINERS, model_codes=("transformers",))
    order = 34
    label_order = 64
    axis = True
    switch = "padding_free"

    def active(self, setup: Any) -> bool:
        return bool(setup.padding_free)

    def conflict(self, setup: Any) -> str | None:
        if setup.avg_seq_len is not None and setup.avg_seq_len > setup.seq_len:
            return f"avg_seq_len={setup.avg_seq_len} exceeds seq_len={setup.seq_len}; the mean real length of a sample is at most seq_len"
        if setup.padding_free and setup.packed_doc_len is not None:
            return (f"padding_free (flattened samples, avg_seq_len) and packed_doc_len={setup.packed_doc_len} (document-masked "
                    "packs) are two packings of the same batch; set one of them")
        return super().conflict(setup)

    def why_not(self, setup: Any, hardware: Any = None, model: Any = None) -> str | None:
        """Packed rows through a hybrid's recurrent layers (Qwen3.5's gated DeltaNet, Granite-4.0-H's Mamba-2) need the
        kernels that keep the sequences apart: transformers hands the layer ``cu_seqlens`` / ``seq_idx``, which only
        flash-linear-attention or mamba-ssm take (its reference code raises on them, integrations/hub_kernels.py), and
        without which the recurrent state would run on across them."""
        base = super().why_not(setup, hardware, model)
        kind = linear_kind(model) if model is not None else None
        if base or not self.active(setup) or kind is None or setup.linear_attention_kernels != "torch" \
                or not linear_share(model):
            return base
        path = KERNEL_PATHS[kind]
        return (f"padding-free packing through {path.layers} layers needs {path.names}, which keep the packed sequences "
                f"apart (transformers' reference code refuses them); install them and pass "
                f"linear_attention_kernels={path.value!r}, or padding_free=False")

    def label_word(self, setup: Any) -> str | None:
        return "padding-free" if self.active(setup) else None

    def axis_values(self, ctx: LadderContext) -> list[dict[str, Any]]:
        wanted = ctx.wants.get("padding_free")
        avg = ctx.base.avg_seq_len
        if wanted is True:
            return [{"padding_free": True}]
        if wanted is False or avg is None or avg >= ctx.base.seq_len or ctx.base.task != "train":
            return [{}]
        return [{}, {"padding_free": True}]

    def off(self) -> dict[str, Any]:
        return {"padding_free": False}

    def shape(self, setup: Any) -> Any:
        if not setup.padding_free:
            return setup
        return setup.model_copy(update={"micro_batch_size": 1, "seq_len": real_tokens(setup), "padding_free": False, "avg_seq_len": None})

    def step_shape(self, setup: Any, shape: StepShape) -> StepShape:
        if not setup.padding_free:
            return shape
        length = setup.avg_seq_len or setup.seq_len   # as real_tokens: without avg_seq_len every sample fills seq_len
        tokens = setup.micro_batch_size * length
        if setup.flash_attention:
            attention = (setup.micro_batch_size, length)   # varlen: each sample attends to itself only
        else:
            attention = (1, tokens)                                     # one row with a block-diagonal mask
        return StepShape(tokens, attention, shape.real_tokens)

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        return terms.changed(extra_activations=terms.extra_activations + packed_mask_bytes(ctx.setup))

    def trl_args(self, ctx: EmitContext) -> dict[str, Any]:
        # TRL refuses padding_free without packing unless max_length is None (sft_trainer.py: "max_length is not
        # enforced"), so a padding-free plan's rows must arrive truncated (sft_config_dict warns)
        return {"padding_free": True, "max_length": None} if self.active(ctx.setup) else {"padding_free": False}

    def model_kwargs(self, ctx: EmitContext) -> dict[str, Any]:
        # with a KV cache transformers 5.x skips the packed-sequence mask and flattened samples attend to each other
        return {"use_cache": False} if self.active(ctx.setup) else {}

    def prepare(self, ctx: EmitContext, model: Any) -> Any:
        if self.active(ctx.setup):
            disable_cache(model)
        return model


def real_tokens(setup: Any) -> int:
    """Real (non-padding) tokens of one micro-batch; without ``avg_seq_len`` every sample fills ``seq_len``."""
    return int(setup.micro_batch_size * (setup.avg_seq_len or setup.seq_len))


def packed_mask_bytes(setup: Any) -> int:
    """The [T, T] bool block-diagonal mask SDPA / eager need for a flattened row; none for flash-attn (2 or 3)."""
    if not setup.padding_free or setup.flash_attention:
        return 0
    return real_tokens(setup) ** 2


def disable_cache(model: Any) -> None:
    """Training needs no KV cache, and with one the packed-sequence mask is never built (module docstring)."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        config.use_cache = False


TECHNIQUES = (PaddingFree(),)
