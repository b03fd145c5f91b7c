"""Padding-free batches: transformers' ``DataCollatorWithFlattening`` concatenates a micro-batch into one row and
restarts ``position_ids`` at every sample, so no token is padding.

Which attention keeps samples apart (no cross-sample contamination): flash_attention_2 reads the sequence
boundaries (``cu_seq_lens``) from the position ids; in transformers 5.x SDPA and eager detect the packed
``position_ids`` too and build a block-diagonal causal mask (masking_utils.find_packed_sequence_indices),
at the price of a [T, T] mask. That detection runs only without a KV cache (masking_utils: ``position_ids is
not None and attention_mask is None and cache is None``), and a 5.x decoder builds a ``DynamicCache`` whenever
``use_cache`` is on, in training mode too: with the config default (``use_cache=True``) the flattened samples
attend to each other. ``prepare_model`` therefore turns ``use_cache`` off for padding-free plans (tested).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConflictingConstraintsError

if TYPE_CHECKING:
    from ..recommendation import Recommendation

#: attention implementations that keep flattened samples apart in transformers 5.x
SEPARATES_SAMPLES = ("flash_attention_2", "sdpa", "eager")


def data_collator(rec: Recommendation, tokenizer: Any = None) -> Any:
    """``DataCollatorWithFlattening`` for padding-free plans, None (the Trainer's default collator) otherwise."""
    s = rec.setup
    if not s.padding_free:
        return None
    if s.attn_implementation not in SEPARATES_SAMPLES:
        raise ConflictingConstraintsError(f"padding_free needs attn_implementation in {SEPARATES_SAMPLES}, not {s.attn_implementation!r}")
    from transformers import DataCollatorWithFlattening

    return DataCollatorWithFlattening(return_flash_attn_kwargs=s.attn_implementation == "flash_attention_2")

