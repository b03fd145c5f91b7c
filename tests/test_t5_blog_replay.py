"""The 2021 ZeRO blog's t5 DDP step and the 2022 FSDP blog's GPT-2 DDP step as replayed (scripts/trace_t5_blog_replay.py,
scripts/trace_gpt2_fsdp_blog_replay.py), checked against bytes counted by hand from the code they run: torch 1.x
DDP's bucket assignment, the broadcast of ``state_dict().values()`` at construction, the bytes one T5 encoder +
decoder block pair keeps for backward (transformers' eager T5 in fp32 with dropout, on a tiny config of the
installed release; 4.2.0, which the rows ran, gives the same saved tensors in fp32), and accelerate's fp32 output
conversion. The full-size replays need the old wheels and minutes (docs/validation.md 32); their results are in
bench/data/allocator_max_batch.csv."""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

import trace_t5_blog_replay as t5  # noqa: E402
from allocation_log import live_at, live_peak  # noqa: E402

#: the tiny T5: d_model 64, d_ff 256, 4 heads of 16 (inner 64), vocabulary 128; batch 4, source 32, target 24
H, FF, HEADS, INNER, V = 64, 256, 4, 64, 128
B, S, T = 4, 32, 24


def _config(layers: int) -> object:
    return t5.t5_config("google-t5/t5-small", layers=layers, d_model=H, d_ff=FF, num_heads=HEADS, d_kv=INNER // HEADS,
                        vocab_size=V)


def test_bucket_assignment_by_size() -> None:
    # 1 MiB first bucket (262,144 fp32 elements), then 25 MiB (6,553,600): a bucket closes once it reaches its limit
    assert t5.bucket_sizes([100_000, 200_000, 7_000_000, 7_000_000, 3]) == [300_000, 7_000_000, 7_000_000, 3]
    assert t5.bucket_sizes([200_000, 100]) == [200_100]   # never reaches 1 MiB: one open bucket
    # the 250 MiB broadcast buckets over 1 MiB uint8 masks (GPT-2 4.18's attn.bias): the 250th closes the first
    assert t5.bucket_sizes([1 << 20] * 300, (250 * 2**20,), 1) == [250 << 20, 50 << 20]


def test_broadcast_keeps_two_flats_in_flight() -> None:
    """c10d ``broadcast_coalesced``: ten 1 KiB fp32 tensors in 1 KiB buckets make ten flats, at most two alive."""
    from allocation_log import AllocationLog

    tensors = [torch.zeros(256) for _ in range(10)]
    log = AllocationLog()
    with log.mode():
        t5.broadcast_coalesced(tensors, limit=1024)
    made = [n for kind, _, n in log.events if kind == "a"]
    assert made == [1024] * 10
    assert live_peak(log.events)[0] == 2048 and not live_at(log.events, len(log.events))


def test_t5_block_pair_and_ddp_bytes_by_hand() -> None:
    """Layers 2 minus 1 at the moment step 2's loss is made (its backward not begun): one encoder and one decoder
    block's saved tensors plus their parameters' five fp32 copies (weight, grad, exp_avg, exp_avg_sq, DDP bucket)."""
    alive = {}
    for layers in (1, 2):
        events = t5.events_of_run(B, S, T, steps=3, config=_config(layers))
        alive[layers] = sum(live_at(events, t5.AFTER_LOSS[1]).values())
        if layers == 1:   # DDP at construction: the state_dict broadcast (tied embedding 4x), one flat bucket
            made = {}
            for kind, key, nbytes in events:
                if kind == "a" and t5.OPS[key][3].startswith("ddp"):
                    made[t5.OPS[key][3]] = made.get(t5.OPS[key][3], 0) + nbytes
            rel = 32 * HEADS   # relative_attention_num_buckets x heads, in each stack's first block
            enc, dec = 4 * H * INNER + 2 * H * FF + 2 * H, 8 * H * INNER + 2 * H * FF + 3 * H
            params = V * H + enc + dec + 2 * rel + 2 * H
            trainable = params - V * H   # --freeze_embeds
            assert made == {"ddp broadcast": 4 * (params + 3 * V * H), "ddp buckets": 4 * trainable,
                            "ddp rebuild": 4 * trainable}
    # per source token, an encoder block: T5LayerNorm's x * rsqrt (4h), its weight * (4h) and rsqrt (4) twice; q, k,
    # v (12 inner; matmul keeps contiguous copies of the transposed views), the fp32 softmax output (4 per score),
    # the dropout's output (4) and 1-byte mask (1) per score: 9 x heads x source; the context copy (4 inner); the
    # sublayer dropout's mask (1h) and the residual sum (4h); the FFN's relu output (4 ff), its dropout output and
    # mask (5 ff), wo's dropout mask (h) and the residual (4h)
    enc_tok = 2 * (8 * H + 4) + 12 * INNER + 9 * HEADS * S + 4 * INNER + 2 * (H + 4 * H) + 9 * FF
    # per target token, a decoder block: the same self-attention over the target; the cross-attention's norm, q,
    # context, masks and residual, with 9 x heads x source per target token; three norms; the FFN
    dec_tok = 3 * (8 * H + 4) + 16 * INNER + 9 * HEADS * T + 8 * INNER + 9 * HEADS * S + 3 * (H + 4 * H) + 9 * FF
    # the cross-attention's K and V projections of the encoder output, per source token
    cross_kv = 8 * INNER
    saved = B * S * (enc_tok + cross_kv) + B * T * dec_tok
    block_params = 4 * H * INNER + 2 * H * FF + 2 * H + 8 * H * INNER + 2 * H * FF + 3 * H
    assert alive[2] - alive[1] == saved + 5 * 4 * block_params


def test_accelerate_output_conversion() -> None:
    """accelerate 0.7 ``convert_to_fp32``: fp16 tensors become fp32 copies (twice the bytes), nested tuples and dicts
    keep their shape, fp32 and integer tensors are the same objects."""
    import trace_gpt2_fsdp_blog_replay as g

    logits, k, v = (torch.zeros(2, 8, 16, dtype=torch.float16) for _ in range(3))
    loss, ids = torch.zeros(()), torch.zeros(2, 8, dtype=torch.long)
    out = g.to_fp32({"loss": loss, "logits": logits, "past_key_values": ((k, v),), "ids": ids})
    assert out["loss"] is loss and out["ids"] is ids
    assert out["logits"].dtype == torch.float32 and out["logits"].untyped_storage().nbytes() == 2 * 8 * 16 * 4
    assert [t.dtype for t in out["past_key_values"][0]] == [torch.float32, torch.float32]


def test_replayed_max_batches_are_the_replays_boundaries() -> None:
    """Each replayed largest batch is a max-batch row of the measurements and the batch its replay saw fit, one more
    being its OOM (as the table's own text records them); other rows keep the plan's search."""
    import csv
    import re

    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    sys.path.insert(0, bench)
    from accuracy_replay import MAX_BATCH, replayed_max_batch

    rows = {r["row_id"]: r for r in csv.DictReader(open(os.path.join(bench, "data", "published_measurements.csv")))}
    with MAX_BATCH.open(newline="") as f:
        table = list(csv.DictReader(f))
    assert {r["row_id"] for r in table} == {"640", "641", "642", "643", "644", "645", "646", "650", "651", "652", "761",
                                            "762",
                                            "1159", "1160", "1161", "1163", "1166"}
    for r in table:
        row = rows[r["row_id"]]
        assert row["value_kind"] == "max_batch_fit" and replayed_max_batch(row) == int(r["max_batch"])
        fits, oom = re.search(r"b=(\d+) fits", r["source"]), re.search(r"b=(\d+) OOM", r["source"])
        assert fits and oom and int(fits.group(1)) == int(r["max_batch"]) and int(oom.group(1)) == int(r["max_batch"]) + 1
    assert replayed_max_batch(rows["763"]) is None and replayed_max_batch(rows["765"]) is None
