"""What is alive as a checkpointed backward starts to recompute a block, beyond the blocks' inputs and the block's own
terms (memory/block_backward.py ``recompute_start_bytes``, ``before_recompute_per_token``; analytic.py's
``backward_start`` and ``backward_end``). Hand counts from the shapes, then every storage of a real CPU step named
(scripts/trace_backward_phases.py) at a shape the terms were not traced on.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest
from test_block_backward import _trace_script

from perfguide.memory import activations as act
from perfguide.memory import analytic
from perfguide.memory.block_backward import block_backward_bytes, first_step_pending_params, recompute_start_bytes, step_input_bytes
from perfguide.memory.seq2seq import boundary_bytes
from perfguide.memory.top_of_stack import final_norm_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def llama(h: int = 4096, i: int = 14336, heads: int = 32, kv: int = 8, layers: int = 32, vocab: int = 32000) -> ModelSpec:
    """Mistral-7B's shape by default (h 4096, head_dim 128)."""
    return ModelSpec.from_any({"model_type": "llama", "hidden_size": h, "intermediate_size": i, "num_attention_heads": heads,
                               "num_key_value_heads": kv, "head_dim": h // heads, "num_hidden_layers": layers,
                               "vocab_size": vocab, "max_position_embeddings": 32768, "tie_word_embeddings": False})


def setup(case: str, seq: int, batch: int = 1) -> Setup:
    """The traced cases (scripts/trace_models.py CASES / FULL_CASES), checkpointed, SDPA."""
    lora = LoraSpec(r=8, alpha=16, target_modules=ALL)
    cases: dict[str, dict[str, Any]] = {"fp32_stream": dict(weights_dtype="nf4", autocast="bf16", kbit_upcast=True, lora=lora),
                          "half": dict(weights_dtype="bf16", lora=lora), "full_half": dict(weights_dtype="bf16"),
                          "full_fp32_autocast": dict(weights_dtype="fp32", autocast="bf16")}
    kw = cases[case]
    return Setup(task="train", micro_batch_size=batch, seq_len=seq, optimizer="adamw_torch", gradient_checkpointing=True,
                 attn_implementation="sdpa", **kw)


def test_hand_count_at_mistral_7b() -> None:
    """QLoRA in peft's fp32 stream, 2 rows of 4096 tokens: the top block's incoming gradient is an fp32 h-wide
    tensor (4 x 4096 B per token), the rotary cos and sin one [1, s, 128] fp32 pair per sequence, the batch's
    input ids, labels and attention mask int64 per token and the position ids int64 per sequence; block 0 adds its
    own fp32 input. A bf16 base: 2-byte gradient and rotary pair."""
    spec, s = llama(), 4096
    rotary, batch = 2 * 128 * 4 * s, 8 * 3 * 2 * s + 8 * s
    grad = 2 * s * 4096 * 4
    assert recompute_start_bytes(spec, setup("fp32_stream", s, 2), first_block=False) == grad + rotary + batch
    assert recompute_start_bytes(spec, setup("fp32_stream", s, 2), first_block=True) == 2 * grad + rotary + batch
    assert recompute_start_bytes(spec, setup("half", s, 2), first_block=True) == grad + rotary // 2 + batch
    t5 = spec.model_copy(update={"is_encoder_decoder": True})
    assert recompute_start_bytes(t5, setup("half", s), first_block=True) == 0   # not traced


def test_non_reentrant_gradients_before_the_recompute_by_hand() -> None:
    """Non-reentrant checkpointing recomputes on down_proj's first unpack; before it, LoRA on a bf16 base has made the
    base path's bf16 gradient of the MLP output (2 B) and the fp32 adapter path's after its scaling (4 B), an fp32
    full fine-tune under autocast the bf16 MLP output's gradient cast from the fp32 residual's (2 B). Reentrant
    recomputes before any of the block's nodes run: nothing."""
    spec, s = llama(), 1024
    for case, early in (("half", 2 + 4), ("fp32_stream", 2), ("full_half", 0), ("full_fp32_autocast", 2)):
        gap = block_backward_bytes(spec, setup(case, s), "5.24.0") - block_backward_bytes(spec, setup(case, s), "4.39.3")
        data = act.activations_data().block_backward
        table = data.full_finetune_per_token["hf"] if case.startswith("full") else data.in_flight_per_token
        key = case.removeprefix("full_")
        coef = {mode: table[key][mode]["h"] * 4096 + table[key][mode]["i"] * 14336 for mode in ("reentrant", "non_reentrant")}   # type: ignore[index]
        assert gap - s * (coef["non_reentrant"] - coef["reentrant"]) == pytest.approx(s * early * 4096, abs=2)   # int()


def test_both_backward_phases_carry_the_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    """A QLoRA Mistral-7B at 16k tokens peaks at the top block's recompute: the peak rises by the incoming fp32
    gradient, the rotary pair and the batch, to the byte."""
    spec, s = llama(), 16384
    qlora = setup("fp32_stream", s)
    with_terms = analytic.training_memory(spec, qlora)
    monkeypatch.setattr(analytic, "recompute_start_bytes", lambda *a, **k: 0)
    without = analytic.training_memory(spec, qlora)
    assert with_terms.notes[0] == without.notes[0] == "peak in checkpoint recompute"
    assert with_terms.peak_allocated - without.peak_allocated == s * 4096 * 4 + 2 * 128 * 4 * s + 8 * 4 * s


@pytest.mark.parametrize(("case", "reentrant"), [("full_half", True), ("half", False), ("full_fp32_autocast", False)])
def test_every_storage_alive_as_a_recompute_starts(case: str, reentrant: bool) -> None:
    """Real CPU tensors, h 96 (head_dim 24; the terms came from h 128), three blocks: the live bytes per token as
    the top block's and block 0's recompute start (every storage, two lengths differenced) are the blocks' inputs
    still kept (boundary_bytes at the top; block 0's own at the end is in the term) plus recompute_start_bytes plus,
    under non-reentrant checkpointing, the block's gradients made before its recompute."""
    if case == "half":
        pytest.importorskip("peft")
    trace = _trace_script("trace_backward_phases")
    h, s1, s2 = 96, 128, 256
    one, two = (trace.live_at_recompute(case, reentrant, s, h=h, i=256) for s in (s1, s2))
    per_token = {k: (sum(two[k].values()) - sum(one[k].values())) / (s2 - s1) for k in one}
    spec, priced = llama(h=h, i=256, heads=4, kv=1, layers=3, vocab=256), setup(case, 1000)
    key: Literal["full", "lora"] = "full" if case.startswith("full") else "lora"
    stream_key = case.removeprefix("full_")
    early = 0.0 if reentrant else act.activations_data().block_backward.before_recompute_per_token[key][stream_key] * h
    top = (boundary_bytes(spec, priced) + recompute_start_bytes(spec, priced, first_block=False)) / 1000 + early
    end = recompute_start_bytes(spec, priced, first_block=True) / 1000 + early
    assert (per_token[2], per_token[0]) == (pytest.approx(top, abs=1e-6), pytest.approx(end, abs=1e-6))


def gemma3(h: int = 1152, i: int = 6912, heads: int = 4, kv: int = 1, layers: int = 26, vocab: int = 262144,
           head_dim: int = 256) -> ModelSpec:
    """Gemma-3-1b's text shape by default (h 1152, head_dim 256, tied head), five local layers to one global."""
    kinds = ["full_attention" if (k + 1) % 6 == 0 else "sliding_attention" for k in range(layers)]
    return ModelSpec.from_any({"model_type": "gemma3_text", "hidden_size": h, "intermediate_size": i,
                               "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
                               "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": 32768,
                               "tie_word_embeddings": True, "sliding_window": 512, "query_pre_attn_scalar": head_dim,
                               "layer_types": kinds})


def test_step_inputs_by_hand() -> None:
    """Gemma 3 computes a rotary pair for its local layers and one for its global ones: at Gemma-3-1b's shape, bf16,
    8192 tokens, 2 pairs x (cos, sin) x 256 x 2 B per token, plus the int64 input ids, labels, attention mask and
    position ids. At block 0 (local) non-reentrant checkpointing holds only the local pair (transformers 5.24),
    reentrant both (4.39.3); Mistral-7B's shape, one pair."""
    s = 8192
    full = Setup(task="train", micro_batch_size=1, seq_len=s, optimizer="adamw_torch", gradient_checkpointing=True,
                 attn_implementation="sdpa", weights_dtype="bf16")
    pair, batch, grad = 2 * 256 * 2 * s, 8 * 4 * s, 2 * 1152 * s
    assert step_input_bytes(gemma3(), full) == 2 * pair + batch
    assert recompute_start_bytes(gemma3(), full, first_block=False, release="5.24.0") == grad + 2 * pair + batch
    assert recompute_start_bytes(gemma3(), full, first_block=True, release="5.24.0") == 2 * grad + pair + batch
    assert recompute_start_bytes(gemma3(), full, first_block=True, release="4.39.3") == 2 * grad + 2 * pair + batch
    assert step_input_bytes(llama(), setup("half", s)) == 2 * 128 * 2 * s + batch
    gemma2 = gemma3().model_copy(update={"model_type": "gemma2"})   # one pair for both kinds (modeling_gemma2.py)
    assert step_input_bytes(gemma2, full) == pair + batch


def test_loss_peak_carries_step_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A QLoRA Llama-3.1-8B at 16k tokens (128,256 logits) peaks at the loss: the peak rises by the fp32 rotary pair
    (peft's fp32 stream) and the batch, to the byte; without checkpointing nothing is added."""
    spec, s = llama(vocab=128256), 16384
    qlora = setup("fp32_stream", s)
    with_terms = analytic.training_memory(spec, qlora)
    monkeypatch.setattr(analytic, "step_input_bytes", lambda *a, **k: 0)
    without = analytic.training_memory(spec, qlora)
    assert with_terms.notes[0] == without.notes[0] == "peak in forward/loss"
    assert with_terms.peak_allocated - without.peak_allocated == 2 * 128 * 4 * s + 8 * 4 * s
    plain = qlora.replace(gradient_checkpointing=False)
    monkeypatch.undo()
    unchecked = analytic.training_memory(spec, plain).peak_allocated
    monkeypatch.setattr(analytic, "step_input_bytes", lambda *a, **k: 1 << 40)
    assert analytic.training_memory(spec, plain).peak_allocated == unchecked


def test_first_step_pending_gradients_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mistral-7B's blocks, bf16 full fine-tuning: at block 0's backward peak a first micro-step has not yet made block
    0's gradients but down_proj's (q, o 4096^2; k, v 4096 x 1024; gate, up 4096 x 14336; two norms) nor the untied
    embedding's (vocabulary x 4096), 2 B each. Eight blocks and a 1024-token vocabulary with SGD at 8192 tokens peak
    at the end of backward, lower by those gradients and reporting the rest. (Accumulating, every gradient exists,
    and the recompute of the top block, with every block's input beside the same gradients, is always the higher.)"""
    block = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 4096 * 14336 + 2 * 4096
    assert first_step_pending_params(llama(), Setup(task="train", weights_dtype="bf16")) == block + 32000 * 4096
    assert first_step_pending_params(gemma3(), Setup(task="train", weights_dtype="bf16")) == (
        2 * 1152 * 1024 + 2 * 1152 * 256 + 2 * 1152 * 6912 + 4 * 1152 + 2 * 256)   # tied: the head's gradient is alive
    assert first_step_pending_params(llama(), setup("half", 8192)) == 0   # LoRA: not priced
    spec, drop = llama(layers=8, vocab=1024), 2 * (block + 1024 * 4096)
    full = Setup(task="train", micro_batch_size=1, seq_len=8192, optimizer="sgd", gradient_checkpointing=True,
                 attn_implementation="sdpa", weights_dtype="bf16")
    with_terms = analytic.training_memory(spec, full)
    monkeypatch.setattr(analytic, "first_step_pending_params", lambda *a, **k: 0)
    without = analytic.training_memory(spec, full)
    assert with_terms.notes[0] == without.notes[0] == "peak in end of backward"
    assert without.peak_allocated - with_terms.peak_allocated == drop
    assert without.gradients - with_terms.gradients == drop == 2 * (8 * block + 8 * 4096 * 14336 + 2 * 1024 * 4096 + 4096) - with_terms.gradients


@pytest.mark.parametrize("reentrant", [True, False])
def test_every_storage_alive_at_the_loss_and_gemma_3s_pairs(reentrant: bool) -> None:
    """Real CPU tensors, h 96 (head_dim 24; the terms came from h 128), three blocks, bf16 full fine-tuning. Llama:
    the live bytes per token at the head's output (every storage, two lengths differenced) are the blocks' inputs,
    the final norm's saved tensors, the bf16 logits (2 B x 256), step_input_bytes and the norm's fp32 rsqrt (4 B per
    token, not priced). Gemma 3 (two local blocks, a global one): both rotary pairs named at the head's output, at the
    logits' gradient (the loss peak's moment, the forward returned) and at the top block's recompute; at block 0's, the local pair alone under non-reentrant checkpointing, both under reentrant."""
    trace = _trace_script("trace_backward_phases")
    h, s1, s2 = 96, 128, 256
    one, two = (trace.live_at_recompute("full_half", reentrant, s, h=h, i=256) for s in (s1, s2))
    loss = (sum(two[trace.LOSS].values()) - sum(one[trace.LOSS].values())) / (s2 - s1)
    spec, priced = llama(h=h, i=256, heads=4, kv=1, layers=3, vocab=256), setup("full_half", 1000)
    top = boundary_bytes(spec, priced) + final_norm_bytes(spec, priced, checkpointed=True) + step_input_bytes(spec, priced)
    assert loss == pytest.approx(top / 1000 + 2 * 256 + 4, abs=1e-6)
    one, two = (trace.live_at_recompute("full_half", reentrant, s, h=h, i=256, arch="gemma3") for s in (s1, s2))
    pairs = {k: sum(two[k][n] - one[k][n] for n in two[k] if n.startswith("rotary")) / (s2 - s1) for k in two}
    batch = {k: sum(two[k][n] - one[k][n] for n in ("input ids", "labels", "batch attention mask", "position ids")) / (s2 - s1)
             for k in two}
    pair = 2 * 24 * 2   # cos and sin, head_dim 24, bf16, per token
    assert pairs == {trace.LOSS: 2 * pair, trace.LOSS_BACKWARD: 2 * pair, 2: 2 * pair, 0: (2 if reentrant else 1) * pair}
    assert set(batch.values()) == {4 * 8}   # int64, at every moment
    small = gemma3(h=h, i=256, layers=3, vocab=256, head_dim=24).model_copy(
        update={"layer_types": ("sliding_attention", "full_attention", "sliding_attention")})
    release, block = ("4.39.3" if reentrant else "5.24.0"), 2 * h * 1000   # one block's bf16 input
    assert step_input_bytes(small, priced) == 1000 * (2 * pair + 32)
    assert recompute_start_bytes(small, priced, first_block=True, release=release) == 2 * block + 1000 * (pairs[0] + 32)
