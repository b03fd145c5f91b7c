"""DeBERTa-v2's position scores (memory/relative_positions.py): b x heads x s x 2k per kind, plus the repeated position
projections, checked against traces of the real transformers DebertaV2 blocks on fake tensors and by hand.

What a block keeps beyond a BERT block grows with the position span k (``position_buckets``): tracing the same block
at two spans isolates it, and the difference must be the hand count, at two lengths (the s x 2k part) and two
batch sizes (per-block constants cancel), in fp32 and bf16.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfguide.memory.activations import layer_bytes
from perfguide.memory.relative_positions import position_span, relative_position_bytes, score_kinds
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup


def _deberta(layers: int, buckets: int, kinds: Any = ("p2c", "c2p")) -> dict[str, Any]:
    return dict(model_type="deberta-v2", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=layers,
                vocab_size=4096, max_position_embeddings=512, relative_attention=True, position_buckets=buckets,
                max_relative_positions=-1, pos_att_type=list(kinds), share_att_key=True, norm_rel_ebd="layer_norm",
                position_biased_input=False, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, type_vocab_size=0,
                architectures=["DebertaV2ForMaskedLM"])


def _block_per_row(buckets: int, seq: int, regime: dict[str, Any]) -> float:
    """One block's bytes per batch row: two-block minus one-block traces at batches 2 and 4."""
    from perfguide.memory.tracing.step import run_step

    def acts(layers: int, batch: int) -> int:
        setup = Setup(micro_batch_size=batch, seq_len=seq, optimizer="sgd", attn_implementation="eager", **regime)
        return run_step(_deberta(layers, buckets), setup).phases["head"].parts.get("activations", 0)

    return ((acts(2, 4) - acts(1, 4)) - (acts(2, 2) - acts(1, 2))) / 2


@pytest.mark.parametrize("regime, nbytes", [({}, 4), ({"weights_dtype": "bf16"}, 2)])
@pytest.mark.parametrize("seq", [64, 128])
def test_span_dependent_bytes_match_the_hand_count(regime: dict[str, Any], nbytes: int, seq: int) -> None:
    traced = _block_per_row(64, seq, regime) - _block_per_row(32, seq, regime)
    heads, q, kinds = 4, 64, 2
    # per kind: gather's saved input (heads x s x 2k) and bmm's repeated position projection (2k x q), 2k: 64 -> 128
    by_hand = kinds * nbytes * (128 - 64) * (heads * seq + q)
    assert traced == by_hand
    spec = lambda k: ModelSpec.from_any(_deberta(2, k))  # noqa: E731
    one = Setup(micro_batch_size=1, seq_len=seq, **regime)
    assert relative_position_bytes(spec(64), one, nbytes) - relative_position_bytes(spec(32), one, nbytes) == by_hand


def test_layer_bytes_carry_the_position_scores() -> None:
    """DeBERTa-v2-xlarge's width (24 heads of 64, 256 buckets, c2p and p2c) at s = 128 in fp32: 98,304 B per token of
    scores (2 x 24 x 512 x 4) and 49,152 of repeated projections (2 x 512 x 1536 x 4 / 128) over the BERT block."""
    config = dict(_deberta(24, 256), hidden_size=1536, intermediate_size=6144, num_attention_heads=24)
    setup = Setup(micro_batch_size=1, seq_len=128, optimizer="sgd", attn_implementation="eager")
    deberta = ModelSpec.from_any(config)
    plain = ModelSpec.from_any(dict(config, relative_attention=False))
    assert layer_bytes(deberta, setup) - layer_bytes(plain, setup) == 128 * (98_304 + 49_152)


def test_config_readings() -> None:
    assert position_span({"position_buckets": 256, "max_relative_positions": 512}) == 256
    assert position_span({"position_buckets": -1, "max_relative_positions": 128}) == 128
    assert position_span({"max_relative_positions": -1, "max_position_embeddings": 512}) == 512
    assert score_kinds({"pos_att_type": "p2c|c2p"}) == 2
    assert score_kinds({"pos_att_type": ["c2p"]}) == 1
    assert score_kinds({}) == 0
