"""T5's own activation bytes and DeepSpeed ZeRO's 16-bit engine, each against a hand count from the code that runs.

T5 (HF modeling_t5.py): T5LayerNorm keeps ``hidden.to(float32)`` for ``pow`` (4 B per element in a 16-bit model), its
fp32 ``rsqrt`` (4 B per token), the normalised tensor for the weight's gradient and the scaled output for the next
Linear; q and k are saved by ``q @ k^T``, v and the probabilities by ``probs @ v``, the attention output by ``o``,
the ReLU output by ``wo``; the decoder adds a cross-attention whose K/V come from the encoder output; dropout
(``dropout_rate``, also on the attention probabilities) keeps a 1-byte mask and, where a matmul follows, its output.

DeepSpeed (engine.py ``_configure_distributed_model``: ``module.half()`` / ``module.bfloat16()``; zero/stage2.py v0.3.10
and stage_1_and_2.py v0.14.4 ``step``: the fp32 gradient partition is built from the fp16 one and dropped after the
update; ``zero_grad`` sets every .grad to None).
"""

from __future__ import annotations

import pytest

from perfguide.memory.activations import dropout_rates, layer_bytes, regime
from perfguide.memory.analytic import training_memory
from perfguide.memory.t5_releases import t5_fp16_clamp_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

B, S = 4, 128


def _t5(name: str) -> ModelSpec:
    return ModelSpec.from_any(name)


def _hand_block_bytes(spec: ModelSpec, half: bool) -> float:
    """Mean of one encoder and one decoder block (the model counts total_layers = both stacks), dropout 0.1, eager."""
    h, i, q, heads = spec.hidden_size, spec.intermediate_size, spec.num_attention_heads * spec.head_dim, spec.num_attention_heads
    e = 2 if half else 4                     # activation element size
    # LayerNorm: normed and scaled output (e each) and the fp32 rsqrt per token; a 16-bit model also keeps the
    # fp32 copy pow() saves (in an fp32 model that copy is the input itself)
    ln = 2 * e * h + 4 + (4 * h if half else 0)
    sub_in = e * h                           # each sublayer's residual input (the LayerNorm's input)
    attn = 4 * e * q                         # q, k, v, attention output
    ffn = e * i + (1 + e) * i                # ReLU output; dropout mask + its output (wo's input)
    hidden_drop = h                          # 1-byte mask of the dropout before each residual add
    enc = 2 * (sub_in + ln + hidden_drop) + attn + ffn
    dec = 3 * (sub_in + ln + hidden_drop) + 2 * attn + ffn
    per_token = (enc + dec) / 2
    probs = 2 if half else 4                 # the 5.x softmax saves its output in the score dtype
    per_map = probs + 1 + e                  # softmax output, dropout mask, dropout output (probs @ v)
    maps = (1 + 2) / 2                       # encoder self; decoder self + cross
    return B * S * per_token + B * heads * S * S * maps * per_map


@pytest.mark.parametrize("name", ["google-t5/t5-large", "google-t5/t5-3b"])
@pytest.mark.parametrize("half", [False, True])
def test_t5_block_bytes_match_hand_count(name: str, half: bool) -> None:
    spec = _t5(name)
    setup = Setup(micro_batch_size=B, seq_len=S, weights_dtype="bf16" if half else "fp32", attn_implementation="eager")
    assert layer_bytes(spec, setup) == pytest.approx(_hand_block_bytes(spec, half), rel=1e-3)


def test_t5_attention_dropout_is_dropout_rate() -> None:
    spec = _t5("google-t5/t5-large")
    assert dropout_rates(spec) == (0.1, 0.1)   # T5Config default dropout_rate 0.1, used by T5Attention too
    off = spec.model_copy(update={"config": {**(spec.config or {}), "dropout_rate": 0.0}})
    assert dropout_rates(off) == (0.0, 0.0)


def _zero2(**kw: object) -> Setup:
    fields: dict[str, object] = dict(micro_batch_size=8, seq_len=128, strategy="zero2", num_gpus=2, optimizer="adamw_torch_fused",
                                     attn_implementation="eager")
    fields.update(kw)
    return Setup(**fields)


def test_deepspeed_fp16_runs_the_model_in_16_bit() -> None:
    spec = _t5("google-t5/t5-large")
    amp, cast = _zero2(weights_dtype="fp32", autocast="fp16"), _zero2(weights_dtype="fp16")
    assert regime(amp) == "half"
    assert regime(Setup(micro_batch_size=8, seq_len=128, strategy="ddp", num_gpus=2, autocast="fp16")) == "amp"
    # the engine's 16-bit module: the activations of a 16-bit model, and no per-op weight casts
    assert training_memory(spec, amp).activations == training_memory(spec, cast).activations


def test_zero2_runtime_holds_less_than_the_estimator_between_steps() -> None:
    spec = _t5("google-t5/t5-large")
    setup = _zero2(weights_dtype="fp32", autocast="fp16", micro_batch_size=32)
    est = training_memory(spec, setup)
    p = spec.total_params
    # the reported optimizer state is DeepSpeed's estimator's 16 B per parameter / 2 ranks (fp32 master 4, fp32
    # gradients 4, Adam m and v 8); between steps a rank holds 12 of them
    assert est.optimizer_states == pytest.approx(16 * p / 2, rel=1e-3)
    # backward() allocates the two 16-bit ipg buckets (min(P, 5e8) elements each): they meet every saved activation
    # at the start of backward, after the loss buffers are gone; the forward peak holds the loss buffers instead
    buckets = 2 * 2 * min(p, 500_000_000)
    assert est.notes[0] == "peak in checkpoint recompute" and est.other == buckets
    hand = est.weights + 12 * p // 2 + buckets + 2 * spec.embedding_params + est.activations   # + the tied head's grad
    assert est.peak_allocated == pytest.approx(hand, rel=1e-4)
    assert est.logits < buckets
    # zero_grad(set_to_none=False) of pre-2.0 torch does not keep ZeRO's gradients: the engine frees them itself
    assert training_memory(spec, setup, grads_persist=True).peak_allocated == est.peak_allocated


@pytest.mark.parametrize("p_attn,per_element", [(0.1, 2), (0.0, 4)])
def test_t5_before_5_15_keeps_an_fp32_softmax_in_16_bit(monkeypatch: pytest.MonkeyPatch, p_attn: float, per_element: int) -> None:
    # 4.x-5.14 T5Attention: softmax(scores.float()).type_as(scores): the fp32 output (4 B) where 5.15+ keeps the
    # 16-bit one (2 B); without dropout the matmul also keeps the 16-bit type_as copy (2 B). 1.5 maps per block.
    import perfguide.memory.analytic as analytic

    spec = _t5("google-t5/t5-large")
    spec = spec.model_copy(update={"config": {**(spec.config or {}), "dropout_rate": p_attn}})
    setup = Setup(micro_batch_size=B, seq_len=S, weights_dtype="bf16", attn_implementation="eager")
    new = training_memory(spec, setup).activations
    monkeypatch.setattr(analytic, "installed_transformers", lambda: "4.41.2")
    old = training_memory(spec, setup).activations
    assert old - new == pytest.approx(1.5 * per_element * B * spec.num_attention_heads * S * S * spec.total_layers, rel=1e-6)
    # autocast (fp32 scores either way), fp32 (.float() is a no-op) and SDPA (T5 gained it in 5.15): nothing
    for other in (setup.replace(weights_dtype="fp32", autocast="bf16"), setup.replace(weights_dtype="fp32"),
                  setup.replace(attn_implementation="sdpa")):
        monkeypatch.setattr(analytic, "installed_transformers", lambda: "5.24.0")
        a = training_memory(spec, other).activations
        monkeypatch.setattr(analytic, "installed_transformers", lambda: "4.41.2")
        assert training_memory(spec, other).activations == a


def test_t5_fp16_clamp_keeps_its_input_from_4_28(monkeypatch: pytest.MonkeyPatch) -> None:
    # T5Block clamps fp16 hidden states after each sublayer (2 in an encoder block, 3 in a decoder block) from 4.28.0;
    # clamp keeps its fp16 input for backward: 2.5 x 2 B x h per token per block (traced fp16 minus bf16: 5.0 h)
    import perfguide.memory.analytic as analytic

    spec = _t5("google-t5/t5-large")
    bf16 = Setup(micro_batch_size=B, seq_len=S, weights_dtype="bf16", attn_implementation="sdpa")
    fp16 = bf16.replace(weights_dtype="fp16")
    monkeypatch.setattr(analytic, "installed_transformers", lambda: "5.24.0")
    extra = 2.5 * 2 * spec.hidden_size * B * S * spec.total_layers
    assert training_memory(spec, fp16).activations - training_memory(spec, bf16).activations == pytest.approx(extra, rel=1e-6)
    # DeepSpeed's fp16 engine casts the module to fp16: the same clamps; autocast keeps an fp32 stream: none
    ds = _zero2(weights_dtype="fp32", autocast="fp16", micro_batch_size=B)
    assert t5_fp16_clamp_bytes(spec, ds, "5.24.0") == pytest.approx(extra, rel=1e-6)
    assert t5_fp16_clamp_bytes(spec, ds.replace(strategy="ddp"), "5.24.0") == 0
    monkeypatch.setattr(analytic, "installed_transformers", lambda: "4.27.4")   # before: only if the states held inf
    assert training_memory(spec, fp16).activations == training_memory(spec, bf16).activations
