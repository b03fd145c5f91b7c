"""Attention bytes beyond the saved activations: the 4-D masks gradient checkpointing keeps alive, and the s x s
gradients one eager block's backward holds on top of what its forward saved.

Masks. transformers builds one b x 1 x s x s mask per attention kind (masking_utils: a full causal one, a
sliding-window one) before the decoder loop and hands it to every block. Without checkpointing nothing saves it
(``scores + mask`` keeps neither operand) and it dies when the base model returns, before the head. Checkpointed
blocks keep their inputs for the recompute, the mask among them, so each distinct mask lives through the loss peak
and the whole backward. Traced on real CPU tensors (transformers 5.24, tiny Llama / Mistral / Gemma2, b 2 x s 96,
window 16, gc scan of b x 1 x s x s tensors at the head's forward):

* eager: one float mask per attention kind in the hidden states' dtype (bf16 model: bf16; fp32 weights under
  autocast: fp32): Llama and Mistral 1, Gemma 2 (alternating sliding / full) 2; none without checkpointing;
* sdpa: no mask for plain causal attention (``is_causal``); a sliding window it cannot express that way is a bool
  mask (1 B per element): Mistral 1;
* flash_attention_2: none (it takes the window and the padding as arguments).

BERT's bidirectional mask is not kept (same trace: none alive at the head, eager or sdpa); encoders are charged nothing.
transformers 4.42-4.47's Gemma2 built only the full mask up front and each sliding block its own inside the block
(freed with it), so those releases kept one; this module prices the installed release's two.

Eager backward. The block's backward turns the 16-bit probability gradient into fp32 and builds the score gradient
while the fp32 softmax output is still held (data/activations.json ``eager_backward``, traced): the bytes beyond the
saved ones exist for one block at a time, when its backward (or, checkpointed, its recompute and backward) starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._data import DataModel
from ..model.types import ModelSpec
from ..setup import Setup


class EagerBackward(DataModel):
    """data/activations.json ``eager_backward``: bytes per b x heads x s^2 one eager block's backward holds beyond
    what its forward saved, by family, regime and attention dropout ("off" / "on")."""

    source: str = Field(min_length=10)
    transient_per_head_s2: dict[str, dict[str, dict[Literal["off", "on"], float]]]


def checkpointed_mask_bytes(spec: ModelSpec, setup: Setup) -> int:
    """Bytes of the masks checkpointed blocks keep alive at the loss peak and through backward (call it only when
    the blocks are checkpointed)."""
    from .activations import stream_regime

    if not spec.generates or spec.is_encoder_decoder:
        return 0
    b, s = setup.micro_batch_size, setup.seq_len
    kinds = set(spec.cache_layer_types())
    window = spec.sliding_window
    if setup.attn_implementation == "eager":
        masks = len(kinds & {"full_attention", "sliding_attention"})
        return masks * b * s * s * (2 if stream_regime(setup) == "half" else 4)
    if setup.attn_implementation == "sdpa" and "sliding_attention" in kinds and window is not None and s > window:
        return b * s * s
    return 0


def eager_backward_transient_bytes(spec: ModelSpec, setup: Setup) -> int:
    """Bytes one eager block's backward holds beyond the s x s tensors its forward saved (0 for other attention and
    for families without a traced entry)."""
    if setup.attn_implementation != "eager":
        return 0
    from .activations import activations_data, dropout_rates, family_name, regime

    table = activations_data().eager_backward.transient_per_head_s2.get(family_name(spec.family, spec.model_type))
    if table is None:
        return 0
    extra = table[regime(setup)]["on" if dropout_rates(spec)[1] > 0 else "off"]
    return int(setup.micro_batch_size * spec.num_attention_heads * setup.seq_len ** 2 * extra)
