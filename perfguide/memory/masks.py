"""The 4-D attention masks that gradient checkpointing keeps alive from the forward through the backward.

transformers builds one b x 1 x s x s mask per attention kind (masking_utils: a full causal one, a sliding-window
one) before the decoder loop and hands it to every block. Without checkpointing nothing saves it (``scores + mask``
keeps neither operand) and it dies when the base model returns, before the head. Checkpointed blocks keep their
inputs for the recompute, the mask among them, so each distinct mask lives through the loss peak and the whole
backward. Traced on real CPU tensors (transformers 5.24, tiny Llama / Mistral / Gemma2, b 2 x s 96, window 16,
gc scan of b x 1 x s x s tensors at the head's forward):

* eager: one float mask per attention kind in the hidden states' dtype (bf16 model: bf16; fp32 weights under
  autocast: fp32): Llama and Mistral 1, Gemma 2 (alternating sliding / full) 2; none without checkpointing;
* sdpa: no mask for plain causal attention (``is_causal``); a sliding window it cannot express that way is a bool
  mask (1 B per element): Mistral 1;
* flash_attention_2: none (it takes the window and the padding as arguments).

BERT's bidirectional mask is not kept (same trace: none alive at the head, eager or sdpa); encoders are charged nothing.

transformers 4.42-4.47's Gemma2 built only the full mask up front and each sliding block its own inside the block
(freed with it), so those releases kept one; this module prices the installed release's two.
"""

from __future__ import annotations

from ..model.types import ModelSpec
from ..setup import Setup


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
