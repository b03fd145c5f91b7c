"""T5 bytes that depend on the transformers release (and fp16 vs bf16) beyond the family's traced coefficients.

data/activations.json ``t5`` (scripts/fit_t5.py) is traced on the installed 5.24 code in bf16. Two things differ:

* Softmax: up to 5.14.1 (and in every 4.x release) ``T5Attention.forward`` runs ``softmax(scores.float(), dim=-1)
  .type_as(scores)`` (read in the 4.57.1, 5.0.0, 5.13.0 and 5.14.1 wheels); from 5.15.0 T5 goes through
  ``eager_attention_forward``, whose softmax stays in the score dtype (5.15.0, 5.18.0, 5.24.0 wheels). So in a 16-bit
  model an older release keeps, per score map, the fp32 softmax output (4 B per element) where the traced code keeps a
  16-bit one (2 B); without attention dropout its matmul also keeps the 16-bit ``type_as`` copy (2 B), with dropout
  that copy only feeds the dropout, whose output the matmul keeps in both releases. Under autocast the scores are
  already fp32 (the fp32 position bias promotes them), so the releases agree; in fp32 ``.float()`` is a no-op. A T5
  block has 1.5 score maps on average (encoder self; decoder self and cross).
* fp16 clamp: from 4.28.0 (absent in 4.27.0; present in 4.28.0, 4.30.0, 5.14.1, 5.24.0) ``T5Block`` clamps the hidden
  states after each sublayer whenever they are fp16 (``clamp_value = torch.where(torch.isinf(hidden_states).any(),
  ...)``; before, only ``if torch.isinf(hidden_states).any()``), and ``clamp`` keeps its fp16 input for backward: 2 B x h
  per token for each of the 2.5 sublayers of a block (traced: fp16 minus bf16 = 5.0 x h B per token per block). bf16
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
#: clamped sublayer outputs per block of total_layers: (encoder 2 + decoder 3) / 2 blocks
CLAMPS_PER_BLOCK = 2.5
#: score maps per block of total_layers: (encoder self + decoder self + decoder cross) / 2 blocks
MAPS_PER_BLOCK = 1.5


def t5_fp32_softmax_bytes(spec: ModelSpec, setup: Setup, release: str, *, checkpointed: bool = False) -> int:
    """Bytes transformers ``release``'s T5 attention keeps beyond the traced coefficients (0 from 5.15.0 on, for other
    models, outside the 16-bit regime and for SDPA, which T5 only gained in 5.15). ``checkpointed``: only the block
    being recomputed holds them."""
    if spec.model_type != "t5" or setup.attn_implementation != "eager" or regime(setup) != "half":
        return 0
    if version_tuple(release) >= SOFTMAX_IN_SCORE_DTYPE_SINCE:
        return 0
    per_element = 2 if dropout_rates(spec)[1] > 0 else 4   # fp32 softmax output instead of 16-bit (+ type_as copy)
    b, s = setup.micro_batch_size, setup.seq_len
    per_block = MAPS_PER_BLOCK * per_element * b * spec.num_attention_heads * s * s
    return int(per_block * (1 if checkpointed else spec.total_layers))


def t5_fp16_clamp_bytes(spec: ModelSpec, setup: Setup, release: str, *, checkpointed: bool = False) -> int:
    """Bytes the fp16 clamps of transformers ``release``'s T5Block keep (0 before 4.28.0, for bf16, autocast and other
    models). ``checkpointed``: only the block being recomputed holds them."""
    fp16 = setup.weights_dtype == "fp16" or (engine_casts_to_16bit(setup) and setup.autocast == "fp16")
    if spec.model_type != "t5" or not fp16 or version_tuple(release) < FP16_CLAMP_SINCE:
        return 0
    per_block = CLAMPS_PER_BLOCK * 2 * spec.hidden_size * setup.micro_batch_size * setup.seq_len
    return int(per_block * (1 if checkpointed else spec.total_layers))


def t5_release_bytes(spec: ModelSpec, setup: Setup, release: str, *, checkpointed: bool = False) -> int:
    """Both terms: what ``release``'s T5 keeps beyond the traced (5.24, bf16) coefficients."""
    return (t5_fp32_softmax_bytes(spec, setup, release, checkpointed=checkpointed)
            + t5_fp16_clamp_bytes(spec, setup, release, checkpointed=checkpointed))
