"""An encoder-decoder's two lengths: the encoder runs the source (``seq_len``), the decoder the labels (``target_len``).

A seq2seq batch pads sources and labels apart (transformers' ``DataCollatorForSeq2Seq``; the model shifts ``labels``
into ``decoder_input_ids``), so a summarizer's 500-token article trains a 129-token decoder and a classifier's
64-token prompt a 3-token label. Pricing both stacks at ``seq_len`` counts the decoder's self-attention, FFN, logits
and loss over the source's length. Here each stack is priced at its own length:

* an encoder block keeps its bytes per source token;
* a decoder block keeps its bytes per target token, plus what its cross-attention keeps per source token: the K and
  V projections of the encoder output (traced, scripts/fit_t5.py: 8 B x q per source token in fp32 = K and V at 4 B);
* eager attention keeps one score map per attention: b x heads x S^2 in an encoder block, b x heads x (T^2 + T x S)
  in a decoder block (self and cross), where a T5 family's ``eager_per_head_s2`` is their mean over a pair of blocks
  at equal lengths (3 maps over 2 blocks).

A family whose coefficients split the decoder from the encoder (``Regime.decoder_per_token`` and friends, traced by
scripts/fit_t5.py on T5 and BlenderBot) is priced exactly so; one borrowed from an encoder-only family (BART takes
BERT's block) keeps that block at each stack's own length, its cross-attention's K/V not counted (as before the split).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..model.types import ModelSpec
from ..setup import Setup
from .activations import (
    Dim,
    Regime,
    activation_bytes,
    block_dims,
    checkpoint_boundary_bytes,
    dropout_rates,
    family_coefficients,
    frozen_linear_inputs,
    regime,
    spec_family,
)

#: score maps per pair of blocks (encoder self; decoder self and cross) over which a split family's s^2 terms average
MAPS_PER_PAIR = 3


def _split(c: Regime) -> bool:
    return bool(c.decoder_per_token)


def _per_token(coef: Mapping[Dim, float] | Mapping[str, float], dims: dict[str, int]) -> float:
    return sum(float(v) * dims[k] for k, v in coef.items())


def block_bytes(spec: ModelSpec, setup: Setup, lora_extra_per_layer: int = 0,
                keeps_frozen_inputs: bool = False) -> tuple[int, int]:
    """(bytes one encoder block keeps, bytes one decoder block keeps) for one micro-batch, nothing recomputed.

    ``lora_extra_per_layer`` is the adapters' bytes of a block at ``seq_len`` (lora_activations.lora_layer_bytes); a decoder
    block's adapters see its target tokens (a cross-attention K/V adapter's input, the source, is counted at the target
    length: a small undercount where the labels are shorter)."""
    c = family_coefficients(spec_family(spec))[regime(setup)]
    dims = block_dims(spec)
    b, source, target = setup.micro_batch_size, setup.seq_len, setup.decoder_len
    hidden_p, attn_p = dropout_rates(spec)
    mean = _per_token(c.per_token, dims)
    drop = _per_token(c.dropout_per_token, dims) if hidden_p > 0 else 0.0
    if _split(c):
        dec, cross = _per_token(c.decoder_per_token, dims), _per_token(c.cross_per_source_token, dims)
        dec_drop = _per_token(c.decoder_dropout_per_token, dims) if hidden_p > 0 else 0.0
        enc, dec = 2 * mean - dec - cross + 2 * drop - dec_drop, dec + dec_drop
    else:
        enc, dec, cross = mean + drop, mean + drop, 0.0
    if setup.lora is not None and not keeps_frozen_inputs:
        frozen = _per_token(c.frozen_linear_inputs_per_token or frozen_linear_inputs(setup), dims)
        enc, dec = enc - frozen, dec - frozen
    enc_bytes, dec_bytes = b * source * enc, b * (target * dec + source * cross)
    if setup.attn_implementation == "eager":
        extra = _per_token(c.eager_per_token, dims)
        per_map = (c.eager_per_head_s2 + (c.eager_dropout_per_head_s2 if attn_p > 0 else 0.0)) * (
            2 / MAPS_PER_PAIR if _split(c) else 1.0)
        heads = b * spec.num_attention_heads * per_map
        enc_bytes += b * source * extra + heads * source * source
        dec_bytes += b * target * extra + heads * (target * target + target * source)
    lora_per_token = lora_extra_per_layer / (b * source)
    return int(enc_bytes + lora_per_token * b * source), int(dec_bytes + lora_per_token * b * target)


def stack_activation_bytes(spec: ModelSpec, setup: Setup, lora_extra_per_layer: int = 0,
                           keeps_frozen_inputs: bool = False) -> tuple[int, int]:
    """(bytes every block keeps at the end of forward, bytes of the largest block): activations.activation_bytes
    for one stack, each stack at its own length for an encoder-decoder."""
    if not spec.is_encoder_decoder:
        return activation_bytes(spec, setup, lora_extra_per_layer, keeps_frozen_inputs)
    enc, dec = block_bytes(spec, setup, lora_extra_per_layer, keeps_frozen_inputs)
    return enc * spec.num_layers + dec * spec.num_decoder_layers, max(enc, dec)


def boundary_bytes(spec: ModelSpec, setup: Setup) -> int:
    """Bytes every checkpointed block keeps between forward and backward: its input, over its own stack's tokens."""
    per_block = checkpoint_boundary_bytes(spec, setup)   # at seq_len
    if not spec.is_encoder_decoder:
        return per_block * spec.total_layers
    return int(per_block * block_tokens(spec, setup) / setup.seq_len)


def block_tokens(spec: ModelSpec, setup: Setup) -> int:
    """Block-tokens per batch row: blocks x the tokens each runs (``total_layers x seq_len`` with one stack)."""
    if not spec.is_encoder_decoder:
        return spec.total_layers * setup.seq_len
    return spec.num_layers * setup.seq_len + spec.num_decoder_layers * setup.decoder_len
