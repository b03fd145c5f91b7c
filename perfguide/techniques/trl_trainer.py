"""trainer='trl': the step runs in TRL's SFTTrainer, whose loss by TRL release builds no full logits.

HF Trainer computes the model's own loss on the full ``[b, s, V]`` logits (memory/loss_path.py prices its copies by
transformers release). SFTTrainer's loss, read in the released wheels (data/trl.json eras, memory/fused_head.py):
the model's loss on full logits before 1.7; 256-position ``chunked_nll`` chunks 1.7-1.14; the fused LM head from
1.15 (``add_fused_lm_head``, ``ChunkedLogProbFunction``, on by default). Priced here for an SFT step: the loss
path's bytes in place of the full-logits term (``memory``) and the head GEMM either loss re-runs in backward
(``speed``). DPO always runs in TRL (techniques/dpo.py prices its fused head). The TRL release is the installed one;
with none installed, the newest era (what ``pip install 'perfguide[trl]'`` installs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..memory import fused_head
from .base import Requires, Technique
from .effects import MemoryContext, MemoryTerms, SpeedContext, StepSeconds

if TYPE_CHECKING:
    from ..model.types import ModelSpec
    from ..setup import Setup

SOURCES = (
    "https://github.com/huggingface/trl/releases/tag/v1.15.0 (fused LM head, on by default)",
    "https://github.com/huggingface/trl/blob/main/trl/kernels/chunked_logprob.py (ChunkedLogProbFunction)",
    "https://github.com/huggingface/trl/blob/v1.14.2/trl/trainer/sft_trainer.py (chunked_nll, _chunked_cross_entropy_loss)",
    "https://huggingface.co/docs/trl/sft_trainer",
)


class TrlTrainer(Technique):
    name = "trl_trainer"
    fields = ("trainer",)
    summary = "TRL's SFTTrainer: its loss builds no full [b, s, V] logits (chunked_nll in TRL 1.7-1.14, a fused LM head from 1.15)"
    sources = SOURCES
    requires = Requires(tasks=("train",))
    switch = "trainer"
    order = 37   # after Liger (36): TRL 1.15+ switches Liger's fused cross-entropy off and runs its own head

    def active(self, setup: Any) -> bool:
        return bool(setup.trainer == "trl")

    def off(self) -> dict[str, Any]:
        return {}   # the training loop is the user's, not a trade the plan makes

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        path = sft_loss_bytes(ctx.spec, ctx.setup, ctx.shape, ctx.grad_elem_bytes) if ctx.setup.task == "train" else None
        return terms if path is None else terms.changed(sft_loss_note(ctx.setup, path, terms.logits), logits=path)

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        flops = trl_head_recompute_flops(ctx.spec, ctx.setup, ctx.tokens)
        return StepSeconds(compute=flops / ctx.rate) if flops else StepSeconds()


def sft_loss_kind(setup: Setup) -> fused_head.SftLoss:
    """The loss path a plan's SFT step runs: HF Trainer always builds full logits; SFTTrainer's by TRL release."""
    if setup.trainer != "trl" or setup.objective != "sft":
        return "full"
    return fused_head.trl_era(fused_head.installed_trl()).sft_loss


def model_loss_runs(setup: Setup) -> bool:
    """Whether the step calls the model's own loss: not under TRL's DPO or an SFT release whose loss scores tokens with
    a head of its own (a patch of that loss, Cut Cross-Entropy's or axolotl's chunked one, would never run)."""
    return setup.trainer != "trl" or (setup.objective == "sft" and sft_loss_kind(setup) == "full")


def trl_loss_kind(spec: ModelSpec, setup: Setup) -> fused_head.SftLoss:
    """``sft_loss_kind`` where TRL's own loss runs: a decoder LM. Under Liger, TRL 1.7-1.14 fall back to 'nll' (Liger's
    fused cross-entropy, priced by its technique); 1.15+ switch Liger's off (``fused_linear_cross_entropy: False``)
    and run the fused head."""
    kind = sft_loss_kind(setup)
    if (kind == "chunked" and setup.liger_kernel) or not spec.generates or spec.is_encoder_decoder:
        return "full"
    return kind


def sft_loss_bytes(spec: ModelSpec, setup: Setup, shape: Setup, grad_elem_bytes: int) -> int | None:
    """The loss-path bytes of ``setup``'s SFT step, counted on the micro-batch ``shape`` the activations are
    (padding-free: one row of real tokens), where TRL's trainer builds no full logits; else None (HF's loss path)."""
    kind = trl_loss_kind(spec, setup)
    if kind == "full":
        return None
    if kind == "chunked":
        return fused_head.chunked_loss_bytes(spec, shape, grad_elem_bytes, fused_head.trl_era(fused_head.installed_trl()).fp32_head_copy)
    parts = fused_head.fused_head_parts(spec, shape, fused_head.sft_positions(shape), grad_elem_bytes, fused_head.trl_data().sft_fp32_per_token)
    return parts.saved + max(parts.forward, parts.backward)


def sft_loss_note(setup: Setup, trl_bytes: int, full_bytes: int) -> str:
    """The report's line: which trainer and release the loss path was priced for, against full logits."""
    release = fused_head.installed_trl()
    kind = sft_loss_kind(setup)
    where = f"TRL {release}" if release else f"TRL not installed here: priced as TRL >= {fused_head.trl_data().eras[-1].since}"
    what = "fused LM head (no [b, s, V] logits)" if kind == "fused" else f"chunked_nll ({fused_head.trl_data().chunked_tokens}-token chunks)"
    return (f"loss path priced for TRL's SFTTrainer ({where}): {what}, {trl_bytes / 1e9:.2f} GB at its peak "
            f"instead of {full_bytes / 1e9:.2f} GB for full logits (trainer='transformers')")


def trl_head_recompute_flops(spec: ModelSpec, setup: Setup, tokens: int) -> float:
    """Head GEMM FLOPs TRL's SFT loss adds to a step: the fused head's backward recomputes every logits tile, and
    1.7-1.14's chunked_nll re-runs each checkpointed chunk's projection: one more 2 V H per position either way."""
    return 0.0 if trl_loss_kind(spec, setup) == "full" else head_recompute_flops(spec, tokens)


def head_recompute_flops(spec: ModelSpec, tokens: int) -> float:
    """One more forward of the LM head over ``tokens`` positions, which a loss that never keeps the logits re-runs in
    backward (TRL's chunked / fused heads, Cut Cross-Entropy): 2 V H FLOPs a position."""
    return 2.0 * spec.vocab_size * spec.hidden_size * tokens


TECHNIQUES = (TrlTrainer(),)
