"""Counters for the encoder families: BERT/RoBERTa (post-norm encoders with MLM heads) and T5 (encoder-decoder)."""

from __future__ import annotations

from typing import Any

from .counting import Counted, _lm_head
from .fields import need, optional
from .types import Linears


def count_bert(config: dict[str, Any], head: str) -> Counted:
    """BERT and RoBERTa: word + position + token-type tables, biased Linears, post-LayerNorms.

    Heads: ``lm`` (ForMaskedLM: transform dense + LayerNorm + output bias, decoder tied by default),
    ``base`` (the bare model keeps its pooler), ``pretraining`` (BertForPreTraining: pooler, MLM and NSP).
    """
    h, layers = need(config, "hidden_size"), need(config, "num_hidden_layers")
    heads, vocab, inter = need(config, "num_attention_heads"), need(config, "vocab_size"), need(config, "intermediate_size")
    pos, types = need(config, "max_position_embeddings"), optional(config, "type_vocab_size", 2)
    lin = {"attention.self.query": (h, h), "attention.self.key": (h, h), "attention.self.value": (h, h),
           "attention.output.dense": (h, h), "intermediate.dense": (h, inter), "output.dense": (inter, h)}
    extra = 4 * h + inter + h + 2 * 2 * h
    pooler = h * h + h
    mlm = h * h + h + 2 * h + vocab
    other = 2 * h + {"lm": mlm, "base": pooler, "pretraining": pooler + mlm + 2 * h + 2}.get(head, mlm)
    dims = dict(hidden_size=h, num_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                head_dim=h // heads, intermediate_size=inter, vocab_size=vocab, max_position_embeddings=pos,
                gated_mlp=False)
    heads_known = frozenset({"lm", "base", "pretraining"} if config.get("model_type") == "bert" else {"lm", "base"})
    return Counted(dims, embedding=(vocab + pos + types) * h, lm_head=_lm_head(config, head, vocab, h, True),
                   other=other, blocks=[(lin, extra, layers)], heads=heads_known)


def _t5_attention(prefix: str, d: int, inner: int) -> Linears:
    return {f"{prefix}.q": (d, inner), f"{prefix}.k": (d, inner), f"{prefix}.v": (d, inner), f"{prefix}.o": (inner, d)}


def _t5_ff(prefix: str, d: int, d_ff: int, gated: bool) -> Linears:
    wi = {f"{prefix}.wi_0": (d, d_ff), f"{prefix}.wi_1": (d, d_ff)} if gated else {f"{prefix}.wi": (d, d_ff)}
    return wi | {f"{prefix}.wo": (d_ff, d)}


def count_t5(config: dict[str, Any], head: str) -> Counted:
    """T5 / mT5: bias-free Linears, weight-only LayerNorms, a relative-position bias in each stack's first layer.

    The LM head is untied for T5 v1.1 / Flan-T5 / mT5 (``tie_word_embeddings: false`` in their config.json; a
    transformers 5 ``T5Config`` forces that flag to True and keeps the fact as ``scale_decoder_outputs=False``).
    """
    d, d_kv, d_ff = need(config, "d_model"), need(config, "d_kv"), need(config, "d_ff")
    layers, heads, vocab = need(config, "num_layers"), need(config, "num_heads"), need(config, "vocab_size")
    dec_layers = optional(config, "num_decoder_layers", layers)
    buckets = optional(config, "relative_attention_num_buckets", 32)
    gated = str(config.get("feed_forward_proj", "relu")).startswith("gated-")
    inner = heads * d_kv
    encoder = _t5_attention("layer.0.SelfAttention", d, inner) | _t5_ff("layer.1.DenseReluDense", d, d_ff, gated)
    decoder = (_t5_attention("layer.0.SelfAttention", d, inner) | _t5_attention("layer.1.EncDecAttention", d, inner)
               | _t5_ff("layer.2.DenseReluDense", d, d_ff, gated))
    untied = config.get("tie_word_embeddings") is False or config.get("scale_decoder_outputs") is False
    dims = dict(hidden_size=d, num_layers=layers, num_attention_heads=heads, num_key_value_heads=heads, head_dim=d_kv,
                intermediate_size=d_ff, vocab_size=vocab, gated_mlp=gated, is_encoder_decoder=True,
                num_decoder_layers=dec_layers)
    return Counted(dims, embedding=vocab * d, lm_head=_lm_head({"tie_word_embeddings": not untied}, head, vocab, d, True),
                   other=2 * buckets * heads + 2 * d, blocks=[(encoder, 2 * d, layers), (decoder, 3 * d, dec_layers)])
