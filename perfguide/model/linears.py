"""The block Linears of a model, by shape: what quantization packs, LoRA adapts, fp8 casts and the memory ledger
stores. A fact about the model's shapes, so the cost model and the techniques read it from here."""

from __future__ import annotations

import math

from .types import ModelSpec, derived


def linear_shapes(spec: ModelSpec) -> list[tuple[str, int, int, int]]:
    """(name, in, out, count over the model) for every block Linear, a name once per shape it takes (Gemma-4's wider
    global-attention projections); a fallback when the spec has none."""
    return list(derived(spec, "linear_shapes", lambda: tuple(_linear_shapes(spec))))


def _linear_shapes(spec: ModelSpec) -> list[tuple[str, int, int, int]]:
    layers = spec.total_layers
    if spec.block_linears:
        # an encoder-decoder's encoder block stands for both stacks' shapes but the decoder's cross-attention
        stacks = spec.linear_stacks() if spec.block_kinds else [(spec.block_linears, layers)]
        counts: dict[tuple[str, int, int], int] = {}
        for linears, n in stacks:
            for k, (i, o) in linears.items():
                counts[(k, i, o)] = counts.get((k, i, o), 0) + n * (spec.num_experts if k.startswith("experts.") else 1)
        shapes = [(k, i, o, n) for (k, i, o), n in counts.items()] + decoder_only_linears(spec)
        share = spec.stored_share(sum(i * o * n for _, i, o, n in shapes))  # ALBERT's one shared layer: counted once
        stored = [(k, i, o, math.floor(n * share)) for k, i, o, n in shapes if math.floor(n * share) > 0]
        if stored:
            return stored
    rest = max(0, spec.total_params - spec.embedding_params - spec.lm_head_params - 2 * spec.hidden_size * layers)
    return [("block", spec.hidden_size, max(1, rest // (layers * spec.hidden_size)), layers)]


def decoder_only_linears(spec: ModelSpec) -> list[tuple[str, int, int, int]]:
    """An encoder-decoder's decoder-block Linears the encoder block has no counterpart of (its cross-attention:
    T5's ``EncDecAttention.q/k/v/o``, BART's ``encoder_attn.*_proj``), once per decoder layer. The encoder block's
    Linears stand for the decoder's self-attention and MLP of the same shapes in every layer of both stacks; matched by
    the module's own two-part name (``SelfAttention.q``, ``DenseReluDense.wo``), since the block index in front differs."""
    if not (spec.is_encoder_decoder and spec.decoder_block_linears):
        return []
    encoder = {".".join(k.split(".")[-2:]) for k in spec.block_linears}
    return [(k, i, o, spec.num_decoder_layers) for k, (i, o) in spec.decoder_block_linears.items()
            if ".".join(k.split(".")[-2:]) not in encoder]


def block_linear_shapes(spec: ModelSpec) -> list[tuple[int, int, int]]:
    """(in, out, count over the model) of every block Linear: what fp8 / quantization act on."""
    return [(i, o, n) for _, i, o, n in linear_shapes(spec)]


def linear_params(spec: ModelSpec) -> int:
    """Parameters in the block Linears over the whole model."""
    return derived(spec, "block_linear_params", lambda: sum(i * o * n for _, i, o, n in linear_shapes(spec)))
