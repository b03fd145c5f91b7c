"""Attention bytes beyond the saved activations: the 4-D masks gradient checkpointing keeps alive, the additive bias
SDPA makes of a bool mask and saves, and the s x s gradients one eager block's backward holds on top of what its
forward saved.

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
* flash_attention_2 / flash_attention_3: none (they take the window and the padding as arguments).

BERT's bidirectional mask is not kept (same trace: none alive at the head, eager or sdpa); encoders are charged nothing.
transformers 4.42-4.47's Gemma2 built only the full mask up front and each sliding block its own inside the block
(freed with it), so those releases kept one; this module prices the installed release's two.

SDPA's additive bias. ``F.scaled_dot_product_attention`` turns a bool mask into an additive one of the query's
dtype before it picks a kernel (ATen attention.cpp ``convert_boolean_attn_mask``: ``at::where(mask, 0, -inf)``;
torch 2.1-2.4 ``where(mask.logical_not(), -inf, 0)``), expands it over the heads as a view (``preprocess_mask``,
padded only when s is not a multiple of 8) and the memory-efficient kernel, the one CUDA takes for a masked bf16 call,
saves it for backward (derivatives.yaml ``_scaled_dot_product_efficient_attention``: ``attn_bias``). So every
sliding layer holds b x s x s x 2 bytes (bf16 / autocast queries; 4 in fp32) from its forward to its backward:
without checkpointing all of them at the loss peak; checkpointed, one block's from its recompute to its backward
(the forward's copy dies with the block). Traced (tiny Gemma 3, 5 sliding + 1 full layer, window 16, bf16, s 512-2048,
b 1, CUDA kernel choice emulated): s^2 coefficient 10.0 bytes without checkpointing (5 x 2) and, with it, 3: the
bool mask plus the recomputed block's bias. Real CPU SDPA saves the bf16 bias, not the bool mask (tests/test_masks.py).
The bool mask is b x 1 x s x s when the batch carries a 2-D attention mask (collators pass one); without one
transformers builds it for one row and expands it (the trace's inputs), while the bias is b x s x s either way.
A real TRL step (trl 1.16 SFTTrainer and DPOTrainer, scripts/trace_trl_gemma.py, tests/test_trl_gemma_trace.py) holds
the same at every recompute: the bool mask, plus the bias in a sliding block, 3 B per row x s^2 (DPO: 2 rows a pair).
A DPO pair padded to the longer completion carries zeros in its 2-D mask, so the full-attention layers get a bool mask
too (1 B per row x s^2 until the last full layer is back-propagated): not priced, a Setup says nothing of padding.

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
    kinds = set(spec.attention_layer_types())
    if setup.attn_implementation == "eager":
        masks = len(kinds & {"full_attention", "sliding_attention"})
        return masks * b * s * s * (2 if stream_regime(setup) == "half" else 4)
    return b * s * s if _sdpa_sliding_mask(spec, setup) else 0


def _sdpa_sliding_mask(spec: ModelSpec, setup: Setup) -> bool:
    """SDPA gets a materialised (bool) mask: a sliding window shorter than the sequence, which ``is_causal`` cannot say."""
    window = spec.sliding_window
    return (setup.attn_implementation == "sdpa" and spec.generates and not spec.is_encoder_decoder
            and "sliding_attention" in spec.attention_layer_types() and window is not None and setup.seq_len > window)


def sdpa_bias_bytes(spec: ModelSpec, setup: Setup, *, checkpointed: bool) -> int:
    """Bytes of the additive biases SDPA makes of the sliding mask and keeps for backward: one layer's while its
    checkpointed block is recomputed and back-propagated, every sliding layer's at the loss peak otherwise."""
    if not _sdpa_sliding_mask(spec, setup):
        return 0
    from .activations import stream_regime

    query = 2 if setup.autocast or stream_regime(setup) == "half" else 4   # autocast runs SDPA in 16 bits
    layers = 1 if checkpointed else spec.attention_layer_types().count("sliding_attention")
    return layers * setup.micro_batch_size * setup.seq_len ** 2 * query


def no_grad_forward_mask_bytes(spec: ModelSpec, setup: Setup) -> int:
    """Peak mask bytes of a no-grad forward (DPO's reference): its own bool sliding mask for the whole pass plus one
    layer's SDPA bias at a time (nothing is saved, so each layer's dies with it)."""
    if not _sdpa_sliding_mask(spec, setup):
        return 0
    return setup.micro_batch_size * setup.seq_len ** 2 + sdpa_bias_bytes(spec, setup, checkpointed=True)


def eager_backward_transient_bytes(spec: ModelSpec, setup: Setup) -> int:
    """Bytes one eager block's backward holds beyond the s x s tensors its forward saved (0 for other attention and
    for families without a traced entry)."""
    if setup.attn_implementation != "eager":
        return 0
    from .activations import attention_family, dropout_rates, regime
    from .activations_data import activations_data

    table = activations_data().eager_backward.transient_per_head_s2.get(attention_family(spec.family, spec.model_type))
    if table is None:
        return 0
    extra = table[regime(setup)]["on" if dropout_rates(spec)[1] > 0 else "off"]
    return int(setup.micro_batch_size * spec.num_attention_heads * setup.seq_len ** 2 * extra)
