"""Cut Cross-Entropy (apple/ml-cross-entropy, ``cce_patch``; axolotl's ``CutCrossEntropyPlugin``): the LM head and
the cross-entropy in one Triton kernel pair that never writes a logit to global memory.

Read in the package's own code (apple/ml-cross-entropy @ d42911f, cut_cross_entropy/cce.py, cce_lse_forward.py,
cce_backward.py), a step's loss allocates:

* forward: an fp32 log-sum-exp per scored position (``lse``, saved for backward), the fp32 target logit per position
  (``neg_dot``, turned into the loss in place), and, because the default ``filter_eps="auto"`` filters the gradient,
  an fp32 running logit average per vocabulary entry (``logit_avg``, saved); with ``shift=True`` (the transformers
  patch) the scored positions' int32 indices (``valids``, saved; built from an int64 ``nonzero``);
* backward: ``de = zeros_like(e)``, the hidden states' gradient in their (autocast) dtype, ``dc = zeros_like(c)``
  when the head trains, and the vocabulary ordering (``argsort(logit_avg)``: int64, then int32).

So the loss path is a few bytes per position plus the hidden states' gradient, where HF's loss holds 12 B per
position per vocabulary entry (memory/loss_path.py). An fp32 head under autocast is cast to 16 bits and that copy is
saved, as HF's head matmul saves its autocast copy (``head_cast_bytes``, unchanged here). The head's gradient is
the ledger's gradient on a first micro-step; from the second micro-step of an accumulation ``dc`` is a second buffer
beside ``.grad`` until autograd adds it in (Liger's ``accumulating_head_grad_bytes``, the same zeros_like mechanism).

Checked against the package's own benchmark table (README, A100, gemma-2-2b's head, 8,192 positions, bf16,
``loss-fw`` 1.1 MiB and ``loss-bw`` 1,163.0 MiB: tests/test_cut_cross_entropy.py). Speed: the backward recomputes
the logits tile by tile (one more ``2 V H`` FLOPs per position) and no fp32 logits stream through memory; the
gradient filtering, which skips tiles whose softmax is below bf16 precision, is not priced (a saving left out).

Not an axis of the search: Liger's fused linear cross-entropy is the searched fused loss (a TrainingArguments flag);
Cut Cross-Entropy is priced where a config runs it (``perfguide check`` of an axolotl YAML) or where it is forced
(``recommend(..., cut_cross_entropy=True)``), and ``prepare_model`` then applies ``cce_patch``. Beside Liger, Liger
keeps its norm and SwiGLU kernels and its fused cross-entropy is switched off (``liger_kernel_config``), as axolotl's
docs pair the two plugins.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..memory.autocast_copies import head_cast_bytes
from .base import HF_TRAINERS, EmitContext, LadderContext, Requires, Technique
from .effects import MemoryContext, MemoryTerms, SpeedContext, StepSeconds
from .liger_kernel import accumulating_head_grad_bytes

SOURCES = (
    "https://github.com/apple/ml-cross-entropy (cut_cross_entropy/cce.py, cce_backward.py, cce_lse_forward.py, transformers/patch.py)",
    "Wijmans et al. 2025, Cut Your Losses in Large-Vocabulary Language Models (ICLR 2025, arXiv:2411.09009)",
    "https://docs.axolotl.ai/docs/custom_integrations.html#cut-cross-entropy",
)

#: model types apple/ml-cross-entropy's ``cce_patch`` patches (transformers/patch.py PATCH_FNS @ d42911f); axolotl's
#: fork patches any llama-like causal LM, so a checked axolotl config is priced for every decoder LM
MODEL_TYPES = frozenset({"llama", "phi3", "gemma2", "mistral", "qwen2"})


class CceParts(NamedTuple):
    """Bytes of one Cut Cross-Entropy call, per phase (``forward``: allocated by the forward and alive at its end;
    ``saved``: of those, kept for backward; ``backward``: allocated by the backward beyond them, the head's
    gradient apart)."""

    forward: int
    saved: int
    backward: int
    head_grad: int


def cce_parts(positions: int, hidden: int, vocab: int, hidden_bytes: int, head_trains: bool, shifted: bool = True) -> CceParts:
    """The allocations of cce.py's forward and backward for ``positions`` scored tokens (``hidden_bytes``: the
    16-bit width the kernels run in). ``shifted``: the transformers patch's ``shift=True``, which always builds the
    int32 ``valids`` (an int64 ``nonzero`` first, of the 2-D targets)."""
    per_position = 4 + 4 + (4 if shifted else 0)   # lse, neg_dot, valids
    forward = max(per_position * positions, (16 + 8) * positions if shifted else 0) + 4 * vocab   # + logit_avg
    saved = (4 + (4 if shifted else 0)) * positions + 4 * vocab
    ordering = (8 + 4) * vocab   # argsort's int64 indices, then their int32 copy
    backward = positions * hidden * hidden_bytes + ordering
    head_grad = vocab * hidden * hidden_bytes if head_trains else 0
    return CceParts(forward, saved, backward, head_grad)


def supported(spec: Any) -> bool:
    """A decoder LM with a vocabulary head (the patches replace a ``*ForCausalLM.forward``)."""
    return bool(spec.generates and not spec.is_encoder_decoder and spec.head == "lm")


def loss_bytes(spec: Any, setup: Any, shape: Any, grad_elem_bytes: int) -> int:
    """The loss path's peak under Cut Cross-Entropy on the computed ``shape``: the larger of its forward and its
    backward (what the backward allocates beside the saved tensors). The head's gradient is the ledger's, plus the
    second buffer an accumulating micro-step holds; a trained fp32 head under autocast gets ``dc`` in the cast's 16
    bits, which autograd's engine casts to the weight's fp32 before accumulating (validate_outputs), so that 16-bit
    buffer sits beside the fp32 one: the size of the head's autocast copy (``head_cast_bytes``)."""
    positions = shape.micro_batch_size * shape.seq_len
    parts = cce_parts(positions, spec.hidden_size, spec.vocab_size, 2, head_trains=False)
    accumulating = accumulating_head_grad_bytes(spec, setup, grad_elem_bytes)
    cast_grad = head_cast_bytes(spec, setup) if setup.lora is None else 0
    return max(parts.forward, parts.saved + parts.backward + accumulating + cast_grad)


class CutCrossEntropy(Technique):
    name = "cut_cross_entropy"
    fields = ("cut_cross_entropy",)
    summary = "Cut Cross-Entropy: the LM head and cross-entropy in Triton kernels that never write the logits"
    sources = SOURCES
    requires = Requires(devices=("cuda",), tasks=("train",), packages=("cut-cross-entropy",), gpu_capability="supports_bf16",
                        binding=True, trainers=HF_TRAINERS, model_codes=("transformers",))
    order = 38   # after Liger (36) and TRL (37): the patched forward computes the loss the step runs
    label_order = 63
    axis = True
    switch = "cut_cross_entropy"

    def active(self, setup: Any) -> bool:
        return bool(setup.cut_cross_entropy)

    def label_word(self, setup: Any) -> str | None:
        return "cce" if self.active(setup) else None

    def why_not(self, setup: Any, hardware: Any = None, model: Any = None) -> str | None:
        """Where it cannot run at all; priced (estimate, check) for every decoder LM, which axolotl's fork patches."""
        base = super().why_not(setup, hardware, model)
        if base:
            return base
        if model is not None and not supported(model):
            return f"cut-cross-entropy replaces a causal LM's next-token loss; {model.model_type!r} is not a causal LM here"
        return None

    def not_emitted(self, model: Any) -> str | None:
        """Why a plan cannot apply it itself: ``prepare_model`` calls the package's ``cce_patch``, which knows a few
        model types (axolotl's fork, which patches any llama-like model, is axolotl's to apply)."""
        if model is not None and model.model_type not in MODEL_TYPES:
            return (f"cut-cross-entropy's cce_patch, which prepare_model applies, has no patch for model type "
                    f"{model.model_type!r} (it patches {', '.join(sorted(MODEL_TYPES))})")
        return None

    def off(self) -> dict[str, Any]:
        return {"cut_cross_entropy": False}

    def conflict(self, setup: Any) -> str | None:
        """TRL's own loss (DPO's log-probs, SFT's chunked or fused head from TRL 1.7) scores tokens with a head of its
        own, so the patched forward's loss never runs: refused rather than priced as if it did."""
        if self.active(setup):
            from .trl_trainer import model_loss_runs

            if not model_loss_runs(setup):
                return self._refused("cut_cross_entropy patches the model's own loss, which TRL's trainer does not run here "
                                     "(its loss scores tokens with a head of its own); use trainer='transformers'")
        return super().conflict(setup)

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not self.runs_loss(ctx.spec, ctx.setup):
            return terms
        path = loss_bytes(ctx.spec, ctx.setup, ctx.shape, ctx.grad_elem_bytes)
        before = "Liger's fused linear cross-entropy (switched off beside it)" if ctx.setup.liger_kernel else "HF's loss on full logits"
        note = (f"loss path priced for Cut Cross-Entropy: {path / 1e9:.3f} GB at its peak (no logits written) "
                f"instead of {terms.logits / 1e9:.2f} GB for {before}")
        return terms.changed(note, logits=path)

    def runs_loss(self, spec: Any, setup: Any) -> bool:
        """Whether the patched forward computes the step's loss: a causal LM's training step (TRL's own loss, which
        would bypass it, is refused by ``conflict``)."""
        return self.active(setup) and setup.task == "train" and supported(spec)

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        if not self.runs_loss(ctx.spec, ctx.setup):
            return StepSeconds()
        from ..speed import traffic
        from .trl_trainer import head_recompute_flops

        recompute = head_recompute_flops(ctx.spec, ctx.tokens) / ctx.rate
        return StepSeconds(compute=recompute - traffic.seconds(traffic.head_bytes(ctx.spec, ctx.setup), ctx.bandwidth))

    def axis_values(self, ctx: LadderContext) -> list[dict[str, Any]]:
        if not ctx.wants.get("cut_cross_entropy"):
            return [{}]   # priced where a config runs it or the user forces it; Liger is the searched fused loss
        problem = self.why_not(ctx.base, ctx.hardware, ctx.model) or self.not_emitted(ctx.model)
        if problem:
            from ..errors import ConflictingConstraintsError

            raise ConflictingConstraintsError(f"cut_cross_entropy=True cannot run here: {problem}; use cut_cross_entropy=False")
        return [{"cut_cross_entropy": True}]

    def prepare(self, ctx: EmitContext, model: Any) -> Any:
        if not self.active(ctx.setup):
            return model
        from cut_cross_entropy.transformers import cce_patch  # absent: prepare_model names the pip install

        return cce_patch(model)


TECHNIQUES = (CutCrossEntropy(),)
