"""Document-masked packs (Setup.packed_doc_len): the score tiles FlexAttention computes, counted by hand, and its
speed relative to FlashAttention-2 weighted by hand; packs without a document mask stay full causal.

Hand counts: a pack of 512 tokens in 128-token tiles holds documents [0, 200), [200, 400), [400, 512). The four
diagonal tiles are computed; below the diagonal, document 0 reaches tiles 0-1 (tile (1, 0)), document 1 reaches
tiles 1-3 ((2, 1), (3, 1), (3, 2)), document 2 lies in tile 3 only: 8 of the 16 tiles. No wall-clock time is asserted.
"""

from __future__ import annotations

import pytest
from helpers import load_bench
from test_speed import A100, llama7b

from perfguide._data import load
from perfguide.errors import InvalidSetupError
from perfguide.setup import Setup
from perfguide.speed import rates, terms


def _const(name: str):
    return load("efficiency")[name]["value"]


def test_document_tiles_by_hand() -> None:
    assert rates.document_block_fraction(512, 200, 128) == 8 / 16
    assert rates.document_block_fraction(512, 128, 128) == 4 / 16           # documents on tile edges: the diagonal only
    assert rates.document_block_fraction(4096, 4096, 128) == 528 / 1024     # one document: causal, 32 * 33 / 2 tiles
    assert rates.document_block_fraction(300, 300, 128) == 6 / 9           # a partial last tile counts whole


def test_causal_fraction_reads_the_document_mask() -> None:
    packed = Setup(seq_len=512, weights_dtype="bf16", packed_doc_len=200)
    assert _const("flex_block_size") == 128
    assert rates.causal_fraction(llama7b(), packed) == 8 / 16
    four_k = packed.model_copy(update={"seq_len": 4096})
    assert rates.causal_fraction(llama7b(), four_k) == rates.document_block_fraction(4096, 200, 128) < 0.1
    # HF / TRL packing without padding_free: no document mask, causal attention over the whole sequence
    assert rates.causal_fraction(llama7b(), four_k.model_copy(update={"packed_doc_len": None})) == 0.5
    # eager builds the full s x s scores whatever the mask
    assert rates.causal_fraction(llama7b(), four_k.model_copy(update={"attn_implementation": "eager"})) == 1.0


def test_flex_speed_weighted_by_hand() -> None:
    speed = _const("flex_attention_speed")
    assert (speed["forward"], speed["backward"]) == (0.9, 0.85)
    plain = Setup(seq_len=4096, weights_dtype="bf16", packed_doc_len=200)
    # 1 forward + 2.5 backward: time 1/0.9 + 2.5/0.85 for 3.5 units of work
    assert terms.flex_attention_speed(plain) == pytest.approx(3.5 / (1 / 0.9 + 2.5 / 0.85))
    ckpt = plain.model_copy(update={"gradient_checkpointing": True})       # + one recomputed forward
    assert terms.flex_attention_speed(ckpt) == pytest.approx(4.5 / (2 / 0.9 + 2.5 / 0.85))


def test_fused_attention_seconds_of_a_document_masked_pack() -> None:
    setup = Setup(seq_len=4096, weights_dtype="bf16")
    packed = setup.model_copy(update={"packed_doc_len": 200})
    counted = 3 * 4.0 * 32 * 4096 * 4096 * 4096
    full = terms.fused_attention_seconds(llama7b(), setup, A100, 312, counted)
    docs = terms.fused_attention_seconds(llama7b(), packed, A100, 312, counted)
    tiles = rates.document_block_fraction(4096, 200, 128)
    assert docs == pytest.approx(full * (tiles / 0.5) / (3.5 / (1 / 0.9 + 2.5 / 0.85)))


def test_bad_packed_doc_len_is_one_line() -> None:
    with pytest.raises(InvalidSetupError, match="packed_doc_len=5000 .* at most seq_len") as err:
        Setup.parse({"seq_len": 4096, "packed_doc_len": 5000})
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidSetupError, match="padding_free"):
        Setup.parse({"seq_len": 4096, "packed_doc_len": 200, "padding_free": True, "avg_seq_len": 200})


def test_bench_reads_document_masks_from_the_torchtune_2024_11_rows_only() -> None:
    cases, _ = load_bench("throughput").load()
    torchtune = {c.row_id: c.setup.packed_doc_len for c in cases if c.group == "torchtune-readme"}
    assert {r: torchtune[r] for r in map(str, range(404, 413))} == dict.fromkeys(map(str, range(404, 413)), 118)
    assert all(v is None for r, v in torchtune.items() if int(r) < 404)   # 2024-09 rows: no flex_attention evidence
    assert all(c.setup.packed_doc_len is None for c in cases if c.group != "torchtune-readme")
