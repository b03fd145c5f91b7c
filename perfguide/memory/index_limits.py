"""Attention kernels that index with 32-bit offsets: a length past their reach crashes, whatever memory is free.

flash-attn 2 computes its offsets into q, k, v and the output as 32-bit integers, so an attention call whose q holds
2^31 elements or more reads and writes out of bounds: CUDA reports "an illegal memory access", not an OOM, and no
amount of free memory helps. A long-context plan meets this before it meets the card's memory: Llama-3.1-8B's q is
4,096 wide, so flash_attention_2 stops at 524,287 tokens per attention call, where an H100 with ALST's offloads still
has room (ArcticTraining's single-H100 recipe runs 500,000 and crashes at 555,000). FlashAttention-3 and PyTorch's
SDPA are not limited here. The limits are calibration.json's ``attention_index_limit_elements`` (each with its
source); what one call holds is the rank's share of the sequence's queries: Ulysses gives each rank the whole
sequence for heads / sp heads, ring attention its slice for every head, the same count either way.
"""

from __future__ import annotations

from .._data import fact_value
from ..model.types import ModelSpec
from ..setup import Setup
from .types import MemoryEstimate


def _limit(setup: Setup) -> int | None:
    """Elements of q one call of the setup's attention kernel can index (None: not limited here)."""
    limits: dict[str, int] = fact_value("calibration", "attention_index_limit_elements")
    return limits.get(setup.attn_implementation) if setup.device == "cuda" else None


def q_width(spec: ModelSpec) -> int:
    """Elements of q per token: every query head's width (MLA's queries carry the rope and the no-rope parts)."""
    head = (spec.qk_nope_head_dim or 0) + (spec.qk_rope_head_dim or 0) if spec.is_mla else spec.head_dim
    return spec.num_attention_heads * head


def q_elements(spec: ModelSpec, setup: Setup) -> int:
    """Elements of q in one attention call on one rank: the micro-batch's tokens (a packed row's too) x q's width,
    over the ranks that split the sequence."""
    return setup.micro_batch_size * setup.seq_len * q_width(spec) // setup.sequence_ranks


def longest_indexed(spec: ModelSpec, setup: Setup) -> int | None:
    """The longest ``seq_len`` the setup's attention kernel can index at its micro-batch and split (None: no limit)."""
    limit = _limit(setup)
    if limit is None:
        return None
    return (limit - 1) * setup.sequence_ranks // (setup.micro_batch_size * q_width(spec))


def index_overflow(spec: ModelSpec, setup: Setup) -> str | None:
    """One line on why the setup's attention kernel cannot index its q (None: it can)."""
    limit = _limit(setup)
    if limit is None or (n := q_elements(spec, setup)) < limit:
        return None
    split = f" / {setup.sequence_ranks} ranks" if setup.sequence_ranks > 1 else ""
    return (f"{setup.attn_implementation} indexes q with 32-bit offsets: {setup.micro_batch_size} x {setup.seq_len:,} tokens "
            f"x {q_width(spec):,}{split} = {n:,} elements >= 2^31 crashes with 'an illegal memory access' whatever memory "
            f"is free (longest here {longest_indexed(spec, setup):,} tokens); use flash_attention_3 (Hopper) or sdpa, "
            "or split the sequence over more ranks")


def with_index_limit(spec: ModelSpec, setup: Setup, est: MemoryEstimate) -> MemoryEstimate:
    """``est`` judged not to fit where the attention kernel cannot index the setup's q (a serving engine runs its own)."""
    if setup.serving is not None or (why := index_overflow(spec, setup)) is None:
        return est
    return est.model_copy(update={"fits": False, "kernel_limit": why, "notes": (*est.notes, why)})
