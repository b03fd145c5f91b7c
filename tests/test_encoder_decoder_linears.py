"""An encoder-decoder's decoder cross-attention is block Linears too (model/linears.decoder_only_linears): the ledger,
LoRA's targets and ZeRO-3's parameter walk see them, where they were once priced as a pile of 1-D tensors (T5-XL:
402,653,184 parameters as 196,731 vectors of 2048, each under ZeRO-3's persistence threshold, so kept whole on every
rank). Counted by hand from the shapes, and against peft on a real tiny T5."""

from __future__ import annotations

import pytest

from perfguide.memory.ledger import full_groups, ledger
from perfguide.memory.zero3_window import zero3_trace
from perfguide.model.linears import linear_params, linear_shapes
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

TINY_T5 = dict(model_type="t5", architectures=["T5ForConditionalGeneration"], d_model=32, d_ff=64, d_kv=8, num_heads=4,
               num_layers=2, num_decoder_layers=3, vocab_size=128, feed_forward_proj="gated-gelu",
               tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)


def test_t5_xl_linears_and_the_rest_by_hand() -> None:
    spec = ModelSpec.from_any("google/flan-t5-xl")   # 2048 x 24 + 24 layers, 32 heads of 64, gated FFN 5120
    d, ff = 2048, 5120
    encoder, decoder = 24 * (4 * d * d + 3 * d * ff), 24 * (8 * d * d + 3 * d * ff)
    assert linear_params(spec) == encoder + decoder == spec.linear_params
    cross = [s for s in linear_shapes(spec) if "EncDecAttention" in s[0]]
    assert sum(i * o * n for _, i, o, n in cross) == 24 * 4 * d * d == 402_653_184
    # what is left are the RMSNorm weights (2 per encoder layer, 3 per decoder layer, one final per stack) and the two
    # 32-bucket relative biases
    rest = sum(g.total for g in full_groups(spec) if g.kind == "other")
    assert rest == (24 * 2 + 24 * 3 + 2) * d + 2 * 32 * 32 == 251_904


def test_lora_on_q_v_adapts_the_cross_attention_as_peft_does() -> None:
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    config = {k: v for k, v in TINY_T5.items() if k not in ("model_type", "architectures")}
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**config))
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q", "v"]))
    real = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # q and v of 2 encoder self-attentions, 3 decoder self-attentions and 3 cross-attentions: 16 Linears of 32 x 32
    assert real == (2 + 3 + 3) * 2 * 4 * (32 + 32) == 4096
    led = ledger(ModelSpec.from_any(TINY_T5), Setup(lora=LoraSpec(r=4, target_modules=("q", "v"))))
    assert led.trainable_params == real


def test_zero3_walk_gathers_the_cross_attention_in_decoder_blocks_only() -> None:
    spec = ModelSpec.from_any(TINY_T5)
    trace, backward_from = zero3_trace(spec, checkpointed=False, embedding_trainable=True)
    forward = [name for name, _ in trace[:backward_from]]
    cross = [i for i, name in enumerate(forward) if "EncDecAttention" in name]
    assert len(cross) == 3 * 4                                   # 3 decoder blocks x q, k, v, o
    last_encoder = max(i for i, name in enumerate(forward) if name.startswith("1."))   # blocks 0-1 are the encoder
    assert min(cross) > last_encoder
