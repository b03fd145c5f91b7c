"""T5's attention before transformers 5.15: an fp32 softmax in 16-bit models, beyond the installed release's traces.

Up to 5.14.1 (and in every 4.x release) ``T5Attention.forward`` runs ``softmax(scores.float(), dim=-1).type_as(scores)``
(read in the 4.57.1, 5.0.0, 5.13.0 and 5.14.1 wheels); from 5.15.0 T5 goes through ``eager_attention_forward``, whose
softmax stays in the score dtype (5.15.0, 5.18.0, 5.24.0 wheels), and the family's traced coefficients
(data/activations.json ``t5``, scripts/fit_t5.py) are that code's. So in a 16-bit model an older release keeps, per
score map, the fp32 softmax output (4 B per element) where the traced code keeps a 16-bit one (2 B); without attention
dropout its matmul also keeps the 16-bit ``type_as`` copy (2 B), with dropout that copy only feeds the dropout, whose
output the matmul keeps in both releases. Under autocast the scores are already fp32 (the fp32 position bias promotes
them), so the releases agree; in fp32 ``.float()`` is a no-op. A T5 block has 1.5 score maps on average (encoder self;
decoder self and cross).
"""

from __future__ import annotations

from ..model.types import ModelSpec
from ..setup import Setup
from .activations import dropout_rates, regime
from .loss_path import version_tuple

#: first release whose T5 softmax keeps the score dtype
SOFTMAX_IN_SCORE_DTYPE_SINCE = (5, 15, 0)
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
