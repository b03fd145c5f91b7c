"""DeBERTa-v2's disentangled attention: position scores that grow with the position span, not only the sequence.

``DisentangledSelfAttention.disentangled_attention_bias`` (transformers models/deberta_v2) projects the 2k relative
position embeddings (k = ``position_buckets``, else ``max_relative_positions``, else ``max_position_embeddings``) with
the block's own query and key projections (``share_att_key``) or its ``pos_query_proj`` / ``pos_key_proj``, repeats them
over the batch, and scores every token against every position: content-to-position ``bmm(query, pos_key^T)`` and
position-to-content ``bmm(key, pos_query^T)``, b x heads x s x 2k each, of which it then gathers the s x s it adds to the
scores. Autograd keeps, per block and per kind in ``pos_att_type``:

* the repeated position projection ``bmm`` saves: b x heads x 2k x head_dim = b x 2k x q elements;
* the whole b x heads x s x 2k score ``gather`` saves as its input (derivatives.yaml: gather's backward takes ``self``),

both in the dtype the block computes in (autocast's bmm returns 16-bit). The rest of the block keeps what a BERT block
keeps (activations.json aliases deberta-v2 to bert). At DeBERTa-v2-xlarge's width (24 heads of 64, 256 buckets) and
s = 128 in fp32 that is 147 KB per token per block, beside BERT's 129.

Per block and independent of the batch (``position_table_bytes``; transformers 4.22 and 5.x read alike): each kind's
``gather`` keeps its int64 s x s position index (the ``clamp`` of the relative positions, expanded as a view); the block's
``pos_dropout`` of the 2k x h table keeps a 1-byte mask and hands the projections a fresh table when its rate is above 0
(the encoder's shared table when 0); under autocast each projection (query and key with ``share_att_key``, else one per
kind) keeps its own 16-bit cast of the table instead (autocast caches only leaf weights). 4.2 MB per block at
DeBERTa-v2-xlarge's width, 128 tokens, fp16 AMP, dropout 0.1 (docs/validation.md 35).
"""

from __future__ import annotations

from typing import Any

from ..model.types import ModelSpec
from ..setup import Setup

#: the position-score kinds DeBERTa-v2 computes; any other entry of pos_att_type adds nothing
KINDS = frozenset({"c2p", "p2c"})


def position_span(config: dict[str, Any]) -> int:
    """k of the 2k relative positions each block scores against (DisentangledSelfAttention.pos_ebd_size)."""
    buckets = int(config.get("position_buckets", -1))
    if buckets > 0:
        return buckets
    most = int(config.get("max_relative_positions", -1))
    return most if most >= 1 else int(config.get("max_position_embeddings", 512))


def score_kinds(config: dict[str, Any]) -> int:
    """How many of c2p / p2c the config turns on (``pos_att_type``: a list, or "p2c|c2p" in older configs)."""
    kinds = config.get("pos_att_type") or ()
    if isinstance(kinds, str):
        kinds = kinds.lower().split("|")
    return len(KINDS & {str(k).strip() for k in kinds})


def relative_position_bytes(spec: ModelSpec, setup: Setup, nbytes: int) -> int:
    """Bytes one DeBERTa-v2 block keeps for its position scores at ``nbytes`` per element (0 for other models and
    without ``relative_attention``)."""
    config = spec.config or {}
    if spec.model_type != "deberta-v2" or not config.get("relative_attention"):
        return 0
    two_k = 2 * position_span(config)
    q = spec.num_attention_heads * spec.head_dim
    b, s = setup.micro_batch_size, setup.seq_len
    return score_kinds(config) * nbytes * b * two_k * (spec.num_attention_heads * s + q)


def position_table_bytes(spec: ModelSpec, setup: Setup, nbytes: int, autocast: bool, dropout: float) -> int:
    """Bytes one DeBERTa-v2 block keeps whatever the batch: the int64 position index per kind, the position table's
    dropout mask and the table its projections save (``nbytes`` per element without autocast; 16-bit casts under it)."""
    config = spec.config or {}
    if spec.model_type != "deberta-v2" or not config.get("relative_attention"):
        return 0
    kinds = score_kinds(config)
    if not kinds:
        return 0
    table = 2 * position_span(config) * spec.hidden_size
    index = kinds * 8 * setup.seq_len * setup.seq_len
    mask = table if dropout > 0 else 0
    if autocast:
        saved = (2 if config.get("share_att_key") else kinds) * 2 * table
    else:
        saved = nbytes * table if dropout > 0 else 0
    return index + mask + saved
