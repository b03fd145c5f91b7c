"""The 2022 accelerate + DeepSpeed blog's DDP steps as replayed (scripts/trace_accds_blog_replay.py: DeBERTa-v2-xlarge
on MRPC, BlenderBot-400M-distill on MuDoConv, accelerate's fp16 forward, torch 1.12's DDP and per-tensor Adam),
checked against bytes counted by hand from the code they run: torch 1.12's single-tensor Adam's temporaries and the
bytes one BlenderBot decoder block keeps for backward under CUDA's autocast lists (transformers' eager BlenderBot on a
tiny config of the installed release). The full-size replays need the 4.22 wheel and minutes (docs/validation.md 35);
their results are in bench/data/allocator_max_batch.csv."""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

import trace_accds_blog_replay as r  # noqa: E402
from allocation_log import live_at, live_peak  # noqa: E402

#: the tiny BlenderBot: d_model 64, FFN 256, 4 heads, vocabulary 128; batch 4, source 16, target 8 tokens
H, FF, HEADS, V = 64, 256, 4, 128
B, S, T = 4, 16, 8


def test_adam_112_keeps_the_previous_denom_through_the_next_parameters_temporaries() -> None:
    """torch 1.12 ``_single_tensor_adam``: per parameter two moments (made on the first step), then ``sqrt`` and its
    quotient by the bias correction alive together while the previous parameter's ``denom`` is still bound."""
    from allocation_log import AllocationLog

    n1, n2 = 1000, 3000
    params = [torch.zeros(n, requires_grad=True) for n in (n1, n2)]
    for p in params:
        p.grad = torch.ones_like(p)
    log = AllocationLog()
    log.existing(params + [p.grad for p in params])   # on the device before the step: not replayed
    state: dict[int, dict[str, object]] = {}
    with log.mode():
        r.adam_112(params, state)
    made = [n for kind, _, n in log.events if kind == "a"]
    assert made == [4 * n1] * 4 + [4 * n2] * 4   # exp_avg, exp_avg_sq, sqrt, quotient per parameter
    # at the second parameter's quotient: both moments of both, the first's denom, the second's sqrt and quotient
    assert live_peak(log.events)[0] == 4 * (3 * n1 + 4 * n2)
    alive = live_at(log.events, len(log.events))
    assert sorted(alive.values()) == sorted([4 * n1] * 2 + [4 * n2] * 2)   # the moments (state kept); every denom freed


def _config(layers: int) -> object:
    return r.config_of("blenderbot", d_model=H, encoder_ffn_dim=FF, decoder_ffn_dim=FF, encoder_attention_heads=HEADS,
                       decoder_attention_heads=HEADS, vocab_size=V, encoder_layers=1, decoder_layers=layers)


def test_blenderbot_decoder_block_bytes_by_hand() -> None:
    """Decoder layers 2 minus 1 when step 2's output is returned (its backward not begun), fp16 autocast: the block's
    saved tensors, its parameters' five fp32 copies (weight, grad, exp_avg, exp_avg_sq, DDP bucket) and the fp16 copies
    of its weight matrices the linears keep."""
    alive = {}
    for layers in (1, 2):
        events = r.events_of_run("blenderbot", B, S, T, steps=2, config=_config(layers))
        alive[layers] = sum(live_at(events, r.AFTER_FORWARD[1]).values())
    # per target token, each of the three pre-norm sublayers: layer_norm's fp32 mean and rstd (8), the fp16 mask of
    # the sublayer's dropout (1h) and the fp32 residual sum (4h). Self-attention: q, k and v each cast the fp32 norm
    # output to fp16 (autocast caches only leaf weights: 3 x 2h) and keep contiguous per-head copies (3 x 2h); the
    # scores plus the fp32 causal mask are fp32, softmax keeps its fp32 output (4) and bmm its fp16 cast (2) per head
    # and key (attention_dropout 0: no dropout); the context's contiguous copy (2h) for out_proj
    self_attn = 8 + 6 * H + 6 * H + 6 * HEADS * T + 2 * H + H + 4 * H
    # cross-attention: the query's cast and copy (4h), 6 per head and source token, the context copy (2h)
    cross = 8 + 4 * H + 6 * HEADS * S + 2 * H + H + 4 * H
    # FFN: fc1's fp16 input (2h), its output kept by gelu (2 ff), gelu's output kept by fc2 (2 ff; activation_dropout 0)
    ffn = 8 + 2 * H + 4 * FF + H + 4 * H
    # per source token: the fp32 encoder output cast to fp16 by k_proj and by v_proj, and their per-head copies
    per_source = 8 * H
    saved = B * T * (self_attn + cross + ffn) + B * S * per_source
    params = 8 * (H * H + H) + 2 * H * FF + FF + H + 3 * 2 * H
    weight_casts = 2 * (8 * H * H + 2 * H * FF)
    assert alive[2] - alive[1] == saved + 5 * 4 * params + weight_casts


def test_blenderbot_decoder_inputs_are_the_labels_shifted() -> None:
    """run_seq2seq_no_trainer.py builds decoder_input_ids from the labels: start token 0, the -100 pads as 0."""
    config = _config(1)
    batch = r.batch_of("blenderbot", config, 2, 5, 4)
    labels, dec = batch["labels"], batch["decoder_input_ids"]
    assert dec.shape == labels.shape == (2, 4) and (dec[:, 0] == 0).all() and (dec[:, 1:] == labels[:, :-1]).all()


def test_deberta_block_keeps_its_position_table_and_indices() -> None:
    """DeBERTa-v2 (h 64, 4 heads, 16 buckets: 2k = 32), batch 2, 24 tokens, fp16 autocast, dropout 0.1: per block, when
    step 2's output is returned, c2p's and p2c's int64 s x s index (the clamps gather keeps), query_proj's and
    key_proj's fp16 casts of the 2k x h position table and pos_dropout's 1-byte mask of it
    (perfguide/memory/relative_positions.py position_table_bytes)."""
    kept: dict[int, dict[tuple[str, tuple[int, ...], str], int]] = {}
    for layers in (1, 2):
        config = r.config_of("deberta", num_hidden_layers=layers, hidden_size=64, num_attention_heads=4,
                             intermediate_size=128, vocab_size=100, position_buckets=16)
        events = r.events_of_run("deberta", 2, 24, 0, steps=2, config=config)
        count: dict[tuple[str, tuple[int, ...], str], int] = {}
        for key in live_at(events, r.AFTER_FORWARD[1]):
            op, shape, dtype, phase = r.OPS[key]
            if phase == "step 2 forward":
                count[(op, shape, dtype)] = count.get((op, shape, dtype), 0) + 1
        kept[layers] = count
    block = {k: kept[2].get(k, 0) - kept[1].get(k, 0) for k in kept[2]}
    assert block[("aten.clamp.default", (1, 1, 24, 24), "int64")] == 2
    assert block[("aten._to_copy.default", (1, 32, 64), "float16")] == 2
    # the mask: XDropout's ``.to(torch.bool)`` in 4.22, the fused native_dropout of nn.Dropout in 5.x
    assert sum(n for (op, shape, dtype), n in block.items() if shape == (32, 64) and dtype == "bool") == 1
