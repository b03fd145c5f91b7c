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
from perfguide.memory.relative_positions import position_span, position_table_bytes, relative_position_bytes, score_kinds
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
    scores (2 x 24 x 512 x 4) and 49,152 of repeated projections (2 x 512 x 1536 x 4 / 128) over the BERT block, and
    per block the two int64 position indices (2 x 8 x 128 x 128; no dropout here: no mask, the shared table)."""
    config = dict(_deberta(24, 256), hidden_size=1536, intermediate_size=6144, num_attention_heads=24)
    setup = Setup(micro_batch_size=1, seq_len=128, optimizer="sgd", attn_implementation="eager")
    deberta = ModelSpec.from_any(config)
    plain = ModelSpec.from_any(dict(config, relative_attention=False))
    assert layer_bytes(deberta, setup) - layer_bytes(plain, setup) == 128 * (98_304 + 49_152) + 2 * 8 * 128 * 128


def test_config_readings() -> None:
    assert position_span({"position_buckets": 256, "max_relative_positions": 512}) == 256
    assert position_span({"position_buckets": -1, "max_relative_positions": 128}) == 128
    assert position_span({"max_relative_positions": -1, "max_position_embeddings": 512}) == 512
    assert score_kinds({"pos_att_type": "p2c|c2p"}) == 2
    assert score_kinds({"pos_att_type": ["c2p"]}) == 1
    assert score_kinds({}) == 0


def _block_constant(config: dict[str, Any], seq: int, regime: dict[str, Any]) -> int:
    """One block's bytes that do not grow with the batch: two-block minus one-block traces at batches 2 and 4."""
    from perfguide.memory.tracing.step import run_step

    def block(batch: int) -> int:
        def acts(layers: int) -> int:
            setup = Setup(micro_batch_size=batch, seq_len=seq, optimizer="sgd", attn_implementation="eager", **regime)
            return run_step(dict(config, num_hidden_layers=layers), setup).phases["head"].parts.get("activations", 0)

        return acts(2) - acts(1)

    return 2 * block(2) - block(4)


@pytest.mark.parametrize("regime, nbytes", [({}, 4), ({"weights_dtype": "bf16"}, 2)])
def test_per_block_position_constants_match_the_trace(regime: dict[str, Any], nbytes: int) -> None:
    """Per block, whatever the batch (h = 64, 2k = 64, s = 32): pos_dropout on (0.1 against 0) adds its 1-byte mask of
    the 64 x 64 table and the dropped table the projections read (the trace's other per-block constants cancel; the
    two int64 s x s indices each gather keeps are counted in tests/test_accds_blog_replay.py on the 4.22 block)."""
    config = lambda p: dict(_deberta(2, 32), hidden_dropout_prob=p)  # noqa: E731
    table = 64 * 64
    assert _block_constant(config(0.1), 32, regime) - _block_constant(config(0.0), 32, regime) == (1 + nbytes) * table
    spec = lambda p: ModelSpec.from_any(config(p))  # noqa: E731
    one = Setup(micro_batch_size=1, seq_len=32, **regime)
    assert position_table_bytes(spec(0.1), one, nbytes, False, 0.1) == 2 * 8 * 32**2 + (1 + nbytes) * table
    assert position_table_bytes(spec(0.0), one, nbytes, False, 0.0) == 2 * 8 * 32**2


def test_autocast_keeps_a_16bit_table_per_projection() -> None:
    """DeBERTa-v2-xlarge (2k = 512, h = 1536), 128 tokens, fp16 AMP, dropout 0.1 (rows 1159 / 1161's blog): the two
    int64 indices (2 x 8 x 128 x 128), the mask of the table (512 x 1536) and query_proj's and key_proj's fp16 casts of
    it (2 x 2 x 512 x 1536), 4,194,304 B; the blog's step replayed on transformers 4.22 keeps these three tensors per
    block (scripts/trace_accds_blog_replay.py, docs/validation.md 35)."""
    config = dict(_deberta(24, 256), hidden_size=1536, intermediate_size=6144, num_attention_heads=24, hidden_dropout_prob=0.1)
    setup = Setup(micro_batch_size=8, seq_len=128, autocast="fp16")
    by_hand = 2 * 8 * 128 * 128 + 512 * 1536 + 2 * 2 * 512 * 1536
    assert position_table_bytes(ModelSpec.from_any(config), setup, 2, True, 0.1) == by_hand == 4_194_304
    assert position_table_bytes(ModelSpec.from_any(dict(config, share_att_key=False, pos_att_type=["c2p"])), setup, 2,
                                True, 0.1) == 8 * 128 * 128 + 512 * 1536 + 2 * 512 * 1536
