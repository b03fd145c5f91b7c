"""T5 bytes that depend on the transformers release (and fp16 vs bf16) beyond the family's traced coefficients.

data/activations.json ``t5`` (scripts/fit_t5.py) is traced on the installed 5.24 code in bf16. Two things differ:

* Softmax: up to 5.14.1 (and in every 4.x release) ``T5Attention.forward`` runs ``softmax(scores.float(), dim=-1)
  .type_as(scores)`` (read in the 4.57.1, 5.0.0, 5.13.0 and 5.14.1 wheels); from 5.15.0 T5 goes through
  ``eager_attention_forward``, whose softmax stays in the score dtype (5.15.0, 5.18.0, 5.24.0 wheels). So in a 16-bit
  model an older release keeps, per score map, the fp32 softmax output (4 B per element) where the traced code keeps a
  16-bit one (2 B); without attention dropout its matmul also keeps the 16-bit ``type_as`` copy (2 B), with dropout
  that copy only feeds the dropout, whose output the matmul keeps in both releases. Under autocast the scores are
  already fp32 (the fp32 position bias promotes them), so the releases agree; in fp32 ``.float()`` is a no-op. An encoder
  block has one score map over the source, a decoder block two (self over the target, cross target x source).
* fp16 clamp: from 4.28.0 (absent in 4.27.0; present in 4.28.0, 4.30.0, 5.14.1, 5.24.0) ``T5Block`` clamps the hidden
  states after each sublayer whenever they are fp16 (``clamp_value = torch.where(torch.isinf(hidden_states).any(),
  ...)``; before, only ``if torch.isinf(hidden_states).any()``), and ``clamp`` keeps its fp16 input for backward: 2 B x h
  per token for each sublayer of a block (an encoder's 2 over the source, a decoder's 3 over the target) (traced: fp16 minus bf16 = 5.0 x h B per token per block). bf16
  and autocast (an fp32 residual stream) never clamp.
"""

from __future__ import annotations

from ..model.types import ModelSpec
from ..setup import Setup
from .activations import dropout_rates, engine_casts_to_16bit, regime
from .loss_path import version_tuple

#: first release whose T5 softmax keeps the score dtype
SOFTMAX_IN_SCORE_DTYPE_SINCE = (5, 15, 0)
#: first release whose T5Block clamps fp16 hidden states unconditionally
FP16_CLAMP_SINCE = (4, 28, 0)
#: clamped sublayer outputs per encoder block (attention, FFN) and decoder block (self attention, cross attention, FFN)
ENCODER_CLAMPS, DECODER_CLAMPS = 2, 3


def t5_fp32_softmax_bytes(spec: ModelSpec, setup: Setup, release: str, *, checkpointed: bool = False) -> int:
    """Bytes transformers ``release``'s T5 attention keeps beyond the traced coefficients (0 from 5.15.0 on, for other
    models, outside the 16-bit regime and for SDPA, which T5 only gained in 5.15). ``checkpointed``: only the block
    being recomputed holds them."""
    if spec.model_type != "t5" or setup.attn_implementation != "eager" or regime(setup) != "half":
        return 0
    if version_tuple(release) >= SOFTMAX_IN_SCORE_DTYPE_SINCE:
        return 0
    per_element = 2 if dropout_rates(spec)[1] > 0 else 4   # fp32 softmax output instead of 16-bit (+ type_as copy)
    source, target = setup.seq_len, setup.decoder_len
    # score maps per block: the encoder's self-attention over the source, the decoder's self and cross attention
    enc, dec = source * source, target * target + target * source
    maps = max(enc, dec) if checkpointed else enc * spec.num_layers + dec * spec.num_decoder_layers
    return int(per_element * setup.micro_batch_size * spec.num_attention_heads * maps)


def t5_fp16_clamp_bytes(spec: ModelSpec, setup: Setup, release: str, *, checkpointed: bool = False) -> int:
    """Bytes the fp16 clamps of transformers ``release``'s T5Block keep (0 before 4.28.0, for bf16, autocast and other
    models). ``checkpointed``: only the block being recomputed holds them."""
    fp16 = setup.weights_dtype == "fp16" or (engine_casts_to_16bit(setup) and setup.autocast == "fp16")
    if spec.model_type != "t5" or not fp16 or version_tuple(release) < FP16_CLAMP_SINCE:
        return 0
    # clamped sublayer outputs: an encoder block's 2 over the source, a decoder block's 3 over the target
    enc, dec = ENCODER_CLAMPS * setup.seq_len, DECODER_CLAMPS * setup.decoder_len
    clamped = max(enc, dec) if checkpointed else enc * spec.num_layers + dec * spec.num_decoder_layers
    return int(2 * spec.hidden_size * setup.micro_batch_size * clamped)


def t5_release_bytes(spec: ModelSpec, setup: Setup, release: str, *, checkpointed: bool = False) -> int:
    """Both terms: what ``release``'s T5 keeps beyond the traced (5.24, bf16) coefficients."""
    return (t5_fp32_softmax_bytes(spec, setup, release, checkpointed=checkpointed)
            + t5_fp16_clamp_bytes(spec, setup, release, checkpointed=checkpointed))
