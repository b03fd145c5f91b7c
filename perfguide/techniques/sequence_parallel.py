"""Sequence parallelism: ``sequence_parallel`` ranks split each sequence, so each holds and computes one slice.

What runs it: DeepSpeed Ulysses (Arctic Long Sequence Training, ``sequence_parallel_size``; accelerate's
``ParallelismConfig(sp_size=...)``; ms-swift's ``--sequence_parallel_size``) and ring attention (axolotl's
``context_parallel_size`` through ring-flash-attn; accelerate's ``cp_size`` and torchtune's ``context_parallel_dim``
through torch's context_parallel). Every rank runs the embedding, the Linears, the norms, the loss
and the LM head on its ``seq_len / sequence_parallel`` tokens only, so memory and the non-attention work are those
of the slice (``per_rank``). Attention is where the ranks meet: Ulysses exchanges q, k, v and the output with
all-to-alls so that each rank attends over the whole sequence for ``heads / sequence_parallel`` heads; ring
attention passes the k / v slices around the ranks. Either way a rank executes ``1 / sequence_parallel`` of the
whole sequence's attention FLOPs (``s^2 / sp``), ``sp`` times what its slice alone would (speed/sequence_split.py
adds the difference and the all-to-alls). The model states are sharded over every rank as before: the
data-parallel degree is the world size over ``sequence_parallel``, and a step's tokens are counted once per group.

Memory of the exchange itself: an all-to-all's output replaces its input (the local q / k / v slices are freed
once sent; attention saves the exchanged ones, the same bytes), so no term is added; a layer's all-to-all buffers
are transient and smaller than the MLP's intermediate at the same tokens.
"""

from __future__ import annotations

from typing import Any

from .base import EmitContext, Requires, Technique

SOURCES = (
    "Jacobs et al. 2023, DeepSpeed Ulysses (arXiv:2309.14509)",
    "Bekman et al. 2025, Arctic Long Sequence Training (arXiv:2506.13996)",
    "https://huggingface.co/docs/accelerate/concept_guides/sequence_parallelism",
    "https://docs.axolotl.ai/docs/sequence_parallelism.html",
    "https://huggingface.co/docs/trl/distributing_training (ALST/Ulysses: accelerate parallelism_config, pad_to_multiple_of)",
)


class SequenceParallel(Technique):
    name = "sequence_parallel"
    fields = ("sequence_parallel",)
    summary = "each sequence split over several ranks: activations, logits and Linears of one slice per rank"
    sources = SOURCES
    requires = Requires(devices=("cuda",), tasks=("train",), binding=True)
    order = 36
    label_order = 66
    own_decision = True

    def active(self, setup: Any) -> bool:
        return int(setup.sequence_parallel) > 1

    def off(self) -> dict[str, Any]:
        return {"sequence_parallel": 1}

    def label_word(self, setup: Any) -> str | None:
        return f"sp{setup.sequence_parallel}" if self.active(setup) else None

    def conflict(self, setup: Any) -> str | None:
        if not self.active(setup):
            return None
        sp, world = setup.sequence_parallel, setup.world_size
        if world % sp:
            return self._refused(f"sequence_parallel={sp} must divide the world size ({world} process(es)): each group "
                                 "of that many ranks splits one sequence")
        if setup.attn_implementation == "eager":
            return self._refused("sequence parallelism runs through flash_attention_2/3 or sdpa (the all-to-all or ring wraps "
                                 "the fused kernel), not eager attention")
        if setup.objective != "sft" or setup.target_len is not None or setup.packed_doc_len is not None:
            return self._refused("sequence parallelism is priced for a decoder's next-token step (no DPO pair, no "
                                 "encoder-decoder lengths, no document-masked packs)")
        return super().conflict(setup)

    def accelerate_config(self, ctx: EmitContext) -> dict[str, Any]:
        """accelerate's parallelism_config as TRL's ALST example writes it: DeepSpeed is accelerate's only SP backend
        (commands/launch.py exports these as PARALLELISM_CONFIG_*; the Trainer's Accelerator reads them), variable
        lengths, and the attention kernel the model runs (UlyssesSPAttentionHF wraps it and refuses a mismatch)."""
        s = ctx.setup
        if not self.active(s) or not s.is_deepspeed:
            return {}
        sp = s.sequence_parallel
        return {"parallelism_config": {
            "parallelism_config_dp_replicate_size": 1, "parallelism_config_dp_shard_size": s.world_size // sp,
            "parallelism_config_tp_size": 1, "parallelism_config_sp_size": sp, "parallelism_config_sp_backend": "deepspeed",
            "parallelism_config_sp_seq_length_is_variable": True, "parallelism_config_sp_attn_implementation": s.attn_implementation}}

    def deepspeed_top(self, ctx: EmitContext) -> dict[str, Any]:
        """With a split, DeepSpeed reduces gradients in ``seq_parallel_communication_data_type`` (runtime/engine.py), fp32
        by default (runtime/constants.py): the compute dtype, as the ALST recipes and TRL's example set it (bf16), the 16-bit reduce priced."""
        s = ctx.setup
        dtype = {"bf16": "bf16", "fp16": "fp16"}.get(s.autocast or "")
        return {"seq_parallel_communication_data_type": dtype} if self.active(s) and dtype else {}

    def trl_args(self, ctx: EmitContext) -> dict[str, Any]:
        """Every sequence must split evenly over the ranks (DeepSpeed's dataloader adapter raises otherwise)."""
        return {"pad_to_multiple_of": ctx.setup.sequence_parallel} if self.active(ctx.setup) else {}

    def sequence_ranks(self, setup: Any) -> int:
        return int(setup.sequence_parallel)

    def per_rank(self, setup: Any) -> Any:
        if not self.active(setup):
            return setup
        sp = setup.sequence_parallel
        return setup.replace(seq_len=local_length(setup.seq_len, sp), sequence_parallel=1,
                             avg_seq_len=None if setup.avg_seq_len is None else local_length(setup.avg_seq_len, sp))


def local_length(length: int, ranks: int) -> int:
    """Tokens of one rank's slice: the sequence padded to a multiple of the ranks (ALST's and ring-flash-attn's
    collators pad it so), then divided."""
    return -(-length // ranks)


TECHNIQUES = (SequenceParallel(),)
