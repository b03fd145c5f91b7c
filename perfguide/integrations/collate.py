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
SEPARATES_SAMPLES = ("flash_attention_2", "flash_attention_3", "sdpa", "eager")


def data_collator(rec: Recommendation, tokenizer: Any = None) -> Any:
    """``DataCollatorWithFlattening`` for padding-free plans, None (the Trainer's default collator) otherwise; a plan that
    splits each sequence gets its collator wrapped in ``SplitBatches``."""
    s = rec.setup
    # under a split the flash kwargs (cu_seq_lens, not [batch, length] tensors) would fail DeepSpeed's adapter, which
    # gathers every tensor along the length; FA2 reads the samples' bounds from the position_ids instead
    inner = _flattening(s, flash_kwargs=s.sequence_ranks == 1) if s.padding_free else None
    if s.sequence_ranks == 1:
        return inner
    if inner is None:
        from transformers import DataCollatorForLanguageModeling, default_data_collator

        inner = DataCollatorForLanguageModeling(tokenizer, mlm=False) if tokenizer is not None else default_data_collator
    pad_id = getattr(tokenizer, "pad_token_id", None)
    return SplitBatches(inner, s.sequence_ranks, 0 if pad_id is None else int(pad_id))


def _flattening(s: Any, flash_kwargs: bool) -> Any:
    if s.attn_implementation not in SEPARATES_SAMPLES:
        raise ConflictingConstraintsError(f"padding_free needs attn_implementation in {SEPARATES_SAMPLES}, not {s.attn_implementation!r}")
    from transformers import DataCollatorWithFlattening

    return DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs and s.flash_attention)


class SplitBatches:
    """A collator whose batches split evenly over the ranks that share each sequence, with the ``position_ids``
    DeepSpeed's Ulysses dataloader adapter requires (runtime/sequence_parallel/ulysses_sp.py raises without them, and on a
    length the ranks do not divide). TRL's SFTTrainer does both itself (``pad_to_multiple_of``, ``return_position_ids``);
    the plain Trainer's default collator does neither. Padding is masked out of the loss (labels -100, attention 0);
    a packed row (position_ids already restarting per sample) gets its padding as one more short segment."""

    def __init__(self, inner: Any, multiple: int, pad_id: int = 0) -> None:
        self.inner, self.multiple, self.pad_id = inner, multiple, pad_id

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        batch = dict(self.inner(features))
        rows, length = batch["input_ids"].shape
        extra = -length % self.multiple
        fills = {"input_ids": self.pad_id, "labels": -100, "attention_mask": 0}
        for key, value in fills.items():
            if key in batch and extra:
                batch[key] = torch.nn.functional.pad(batch[key], (0, extra), value=value)
        if "position_ids" in batch:
            tail = torch.arange(extra, dtype=batch["position_ids"].dtype).expand(rows, -1)
            batch["position_ids"] = torch.cat([batch["position_ids"], tail], dim=1)
        else:
            batch["position_ids"] = torch.arange(length + extra).expand(rows, -1).clone()
        return batch

