"""An encoder-decoder's two lengths (``Setup.target_len``): each stack priced at its own, against traces of the real
HF T5 on fake tensors at source != target and hand counts of what the cross-attention keeps per source token.

The T5 coefficients' decoder split (scripts/fit_t5.py) was fitted at h 64 / 128, 8 heads, (source, target) in
{(64, 32), (128, 32), (64, 64)}; the traces here use another shape (h 96, d_ff 256, 6 heads) and other lengths.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import block_pair_per_row

from perfguide import Setup, estimate
from perfguide.errors import InvalidSetupError
from perfguide.memory.activations import family_coefficients, logits_bytes
from perfguide.memory.seq2seq import block_bytes, stack_activation_bytes
from perfguide.model.types import ModelSpec

T5 = dict(model_type="t5", d_model=96, d_ff=256, num_heads=6, d_kv=16, vocab_size=4096, feed_forward_proj="relu",
          tie_word_embeddings=True, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
          architectures=["T5ForConditionalGeneration"])


def _t5(layers: int, drop: float = 0.0) -> dict[str, Any]:
    return {**T5, "num_layers": layers, "num_decoder_layers": layers, "dropout_rate": drop}


@pytest.mark.parametrize("source, target, regime, attn, drop", [
    (160, 32, {}, "sdpa", 0.0),                          # a summarizer: long source, short labels
    (32, 128, {"weights_dtype": "bf16"}, "eager", 0.1),   # labels longer than the source, score maps and dropout
    (160, 32, {"autocast": "bf16"}, "eager", 0.0),
])
def test_blocks_match_a_trace_at_two_lengths(source: int, target: int, regime: dict[str, Any], attn: str, drop: float) -> None:
    """One encoder + one decoder block (a two-pair trace minus a one-pair trace, at two batch sizes so per-block
    constants cancel) against the analytic encoder block at the source plus decoder block at (target, source)."""
    spec = ModelSpec.from_any(_t5(2, drop))
    per_row_traced, per_row_priced = block_pair_per_row(lambda pairs: _t5(pairs, drop), spec, source, target, attn, **regime)
    assert per_row_priced == pytest.approx(per_row_traced, rel=0.005)
    # pricing both stacks at the source (no target_len) misses by far more than that
    same = [sum(block_bytes(spec, Setup(micro_batch_size=b, seq_len=source, optimizer="sgd", attn_implementation=attn, **regime)))
            for b in (2, 4)]
    assert abs((same[1] - same[0]) / 2 / per_row_traced - 1) > 0.1


def test_logits_and_loss_run_over_the_target() -> None:
    """The head's logits and the fp32 loss buffers at the loss peak, traced, over b x target x vocab, not the source."""
    from perfguide.memory.tracing.step import run_step

    setup = Setup(micro_batch_size=4, seq_len=160, target_len=32, optimizer="sgd")
    traced = run_step(_t5(1), setup).phases["backward_head"].parts["logits"]
    assert logits_bytes(ModelSpec.from_any(_t5(1)), setup) == pytest.approx(traced, rel=0.001)
    assert traced < 4 * 160 * 4096 * 4   # one fp32 copy of source-length logits would already exceed it


@pytest.mark.parametrize("regime, nbytes, cast", [("fp32", 4, 0), ("half", 2, 0), ("amp", 2, 2)])
def test_cross_attention_keeps_k_and_v_per_source_token(regime: str, nbytes: int, cast: int) -> None:
    """By hand: each decoder block's cross-attention projects the encoder output to K and V (q = heads x d_kv
    elements each per source token), which the attention's backward keeps in the compute dtype; under autocast the
    k and v Linears each also keep their own bf16 cast of the fp32 encoder output (h elements at 2 B). Nothing else in
    a decoder block grows with the source under SDPA."""
    coef = family_coefficients("t5", "t5")[regime]
    expected = {"q": 2 * nbytes, **({"h": 2 * cast} if cast else {})}
    assert coef.cross_per_source_token == expected


def test_hand_count_of_a_t5_step_at_500_to_129() -> None:
    """t5-base (ReLU FFN, dropout_rate 0.1) at a summarizer's source 500 / target 129, bf16, SDPA: a decoder block from
    the traced split per target token plus K and V per source token, an encoder block as twice the pair's mean
    minus the decoder's (dropout alike), each stack at its own length."""
    spec = ModelSpec.from_any("google-t5/t5-base")
    setup = Setup(micro_batch_size=1, seq_len=500, target_len=129, weights_dtype="bf16", optimizer="sgd")
    q = spec.num_attention_heads * spec.head_dim
    c = family_coefficients("t5", "t5")["half"]
    dims = {"h": spec.hidden_size, "i": spec.intermediate_size, "q": q, "kv": q, "1": 1}

    def per_token(coef: dict[str, float]) -> float:
        return sum(v * dims[k] for k, v in coef.items())

    dec = per_token(c.decoder_per_token) + per_token(c.decoder_dropout_per_token)
    cross = 2 * q * 2   # K and V, bf16 (test_cross_attention_keeps_k_and_v_per_source_token)
    enc = 2 * (per_token(c.per_token) + per_token(c.dropout_per_token)) - dec - cross
    total, largest = stack_activation_bytes(spec, setup)
    assert total == pytest.approx(spec.num_layers * 500 * enc + spec.num_decoder_layers * (129 * dec + 500 * cross), rel=1e-6)
    assert largest == pytest.approx(max(500 * enc, 129 * dec + 500 * cross), rel=1e-6)


def test_target_len_is_refused_where_it_means_nothing() -> None:
    with pytest.raises(InvalidSetupError, match="target_len=16 is the decoder length of an encoder-decoder.*drop target_len"):
        estimate("gpt2", {"seq_len": 128, "target_len": 16})
    with pytest.raises(InvalidSetupError, match="generation's decoder length is new_tokens"):
        Setup.parse({"task": "infer", "target_len": 16})
    with pytest.raises(InvalidSetupError, match="target_len"):
        Setup.parse({"target_len": 0})


def test_a_shorter_target_prices_less_and_none_means_seq_len() -> None:
    base = {"seq_len": 512, "micro_batch_size": 8, "weights_dtype": "bf16"}
    full, short, same = (estimate("google/flan-t5-base", {**base, **extra}) for extra in ({}, {"target_len": 64}, {"target_len": 512}))
    assert same.peak_allocated == full.peak_allocated
    assert short.activations < full.activations and short.logits * 8 == pytest.approx(full.logits, rel=0.01)


def test_recommend_and_cli_carry_target_len() -> None:
    from perfguide import recommend
    from perfguide.errors import ConflictingConstraintsError

    rec = recommend("google/flan-t5-base", "train_gpu_one", hardware="a100-80gb", seq_len=512, target_len=64)
    assert rec.setup.target_len == 64
    with pytest.raises(ConflictingConstraintsError, match="drop target_len"):
        recommend("gpt2", "train_gpu_one", hardware="a100-80gb", seq_len=512, target_len=64)
    from perfguide.cli import main

    assert main(["estimate", "google/flan-t5-base", "--seq-len", "512", "--target-len", "64", "--json"]) == 0
