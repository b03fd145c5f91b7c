"""Tiled MLP (DeepSpeed's ``TiledMLP``: Arctic Long Sequence Training's ``tiled_mlp_compute``, axolotl's ``tiled_mlp``):
each block's MLP runs over the rank's tokens in shards, without autograd in forward, and again shard by shard in
backward, so its FFN-wide intermediates (gate, up, the activation, their product, and their gradients) exist for one
shard at a time instead of for the whole sequence.

Memory, read in DeepSpeed's code (``deepspeed/runtime/sequence_parallel/ulysses_sp.py`` ``TiledMLP``): the forward
saves only the MLP's input ``x`` (the block's normed hidden state, which the checkpointed block's recompute already
prices among its hidden-wide tensors) and concatenates the shards' outputs; the backward allocates ``x``'s gradient
(hidden-wide, as the untiled MLP's backward does) and, per shard, re-runs the MLP with autograd on and back-propagates
it. So in the block a checkpointed backward recomputes, the FFN-wide saved tensors (``MemoryContext.
mlp_shares``: the coefficients' terms per FFN unit per token) and the FFN-wide gradients in flight
(memory/block_backward.py, told through ``MemoryTerms.mlp_tokens``) are one shard's. How many tokens a shard holds
is the implementation's: ALST's patch (ArcticTraining ``model/tiled_compute.py``) takes ``ceil(s / hidden)``
shards, at most ``hidden_size`` tokens each; axolotl's (``monkeypatch/tiled_mlp/patch.py``) 32,768-token shards unless
``tiled_mlp_num_shards`` is set; the readers write the shard's tokens (``Setup.tiled_mlp_shard_tokens``).

Not priced: the forward's concatenation (the shards' outputs and their hidden-wide concatenated copy live together
for a moment, as wide as the untiled MLP's output), and a LoRA adapter's own FFN-wide input (down_proj's lora_A
input), which stays priced over the whole sequence: an upper bound. Without checkpointing every block keeps its
MLP's input alone (the FFN-wide share of every block goes). Other MLPs (MoE blocks, which axolotl tiles too;
two-matrix MLPs) are priced whole, with a note: an upper bound.

Speed: the MLP's forward runs once more per micro-step (in backward, per shard): ``2 x tokens x 3 h i`` FLOPs per
block at the step's GEMM rate; ALST's paper counts the same extra forward.
"""

from __future__ import annotations

from typing import Any

from .base import Requires, Technique
from .effects import MemoryContext, MemoryTerms, SpeedContext, StepSeconds

SOURCES = (
    "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/sequence_parallel/ulysses_sp.py (TiledMLP)",
    "Bekman et al. 2025, Arctic Long Sequence Training: Scalable And Efficient Training For Multi-Million Token Sequences (arXiv:2506.13996)",
    "https://github.com/snowflakedb/ArcticTraining/blob/main/projects/sequence-parallelism/USAGE.md (tiled_mlp_compute)",
    "https://github.com/axolotl-ai-cloud/axolotl/blob/main/src/axolotl/monkeypatch/tiled_mlp/patch.py",
)

#: axolotl's default shard when tiled_mlp_num_shards is unset (monkeypatch/tiled_mlp/patch.py target_tokens_per_shard)
AXOLOTL_SHARD_TOKENS = 32_768


def alst_shard_tokens(spec: Any) -> int:
    """ALST's patch (ArcticTraining model/tiled_compute.py) runs ``ceil(s / hidden)`` shards: at most hidden_size tokens each."""
    return int(spec.hidden_size)


def tiles_mlp(setup: Any) -> bool:
    """The MLP runs tiled: HF's MLP in the shards, not Liger's SwiGLU (ALST's Liger factory passes ``swiglu=False`` under
    ``tiled_mlp_compute``, ArcticTraining model/liger_factory.py; axolotl refuses ``liger_glu_activation`` with
    ``tiled_mlp`` unless the original MLP runs, integrations/liger/args.py); the norms, RoPE and the loss stay Liger's."""
    return bool(setup.tiled_mlp_shard_tokens)


class TiledMLP(Technique):
    name = "tiled_mlp"
    fields = ("tiled_mlp_shard_tokens",)
    summary = "each block's MLP run in sequence shards and recomputed per shard in backward (FFN-wide tensors for one shard)"
    sources = SOURCES
    requires = Requires(tasks=("train",), binding=True, model_codes=("transformers",))
    order = 35   # after checkpointing (30), which sets the recompute it shrinks
    label_order = 63

    def active(self, setup: Any) -> bool:
        return setup.task == "train" and tiles_mlp(setup)

    def label_word(self, setup: Any) -> str | None:
        return "tiled-mlp" if self.active(setup) else None

    def off(self) -> dict[str, Any]:
        return {"tiled_mlp_shard_tokens": 0}

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not self.active(ctx.setup):
            return terms
        if not prices(ctx.spec):
            return terms.changed("tiled MLP not priced for this model's MLP (a dense gated MLP is): its MLP is priced "
                                 "whole over the rank's tokens, an upper bound")
        s = ctx.shape.seq_len
        shard = min(s, ctx.setup.tiled_mlp_shard_tokens)
        saved_less = ctx.mlp_shares()[0] * (s - shard) // max(1, s)
        if not terms.recompute:   # no checkpointing: every block keeps its MLP's input only (one shard in backward)
            kept_less = saved_less * ctx.spec.total_layers
            return terms.changed(f"tiled MLP: every block keeps its MLP's FFN-wide tensors for one {shard:,}-token shard "
                                 f"(-{kept_less / 1e9:.2f} GB)", activations=max(0, terms.activations - kept_less), mlp_tokens=shard)
        note = (f"tiled MLP: the recomputed block's FFN-wide tensors for one {shard:,}-token shard of {s:,} "
                f"(-{saved_less / 1e9:.2f} GB saved, and their gradients in flight)")
        return terms.changed(note, recompute=max(0, terms.recompute - saved_less), mlp_tokens=shard)

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        if not self.active(ctx.setup) or not prices(ctx.spec):
            return StepSeconds()
        spec = ctx.spec
        flops = 2.0 * ctx.tokens * 3 * spec.hidden_size * spec.active_intermediate_size * spec.total_layers
        return StepSeconds(compute=flops / ctx.rate)


def prices(spec: Any) -> bool:
    """A dense gated MLP (``down(act(gate(x)) * up(x))``, the form ALST's patch requires and the traced FFN
    coefficients describe); axolotl also tiles MoE blocks (scattermoe), whose routed buffers are not priced here."""
    return bool(spec.gated_mlp) and not spec.is_encoder_decoder and spec.num_experts <= 1


TECHNIQUES = (TiledMLP(),)
