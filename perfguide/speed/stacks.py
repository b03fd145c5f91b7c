"""An encoder-decoder's two lengths in the speed model: the encoder runs the source (``seq_len``), the decoder the
labels (``Setup.decoder_len``), as the memory model prices them (memory/seq2seq.py).

Counting both stacks at the source length prices a summarizer's 512-token article with a 512-token decoder where the
batch carries 128 target tokens: the decoder's self-attention and FFN, its cross-attention's query and output
projections, the head and the loss run per target token; the cross-attention's K and V projections run on the
encoder's output, per source token. Attention scores: S x S in an encoder block, T x T (self) plus T x S (cross) in
a decoder block. Each function returns a factor on what the one-length count gives (``seq_len`` tokens through every
block, one S x S map per layer), 1.0 for single-stack models, so the callers' token counts (micro-batch, packing,
DPO's rows) compose with it unchanged.
"""

from __future__ import annotations

from ..model.linears import decoder_only_linears
from ..model.types import ModelSpec
from ..setup import Setup

#: the cross-attention projections that read the encoder's output (T5 ``EncDecAttention.k/v``, BART ``encoder_attn.k_proj/v_proj``)
_SOURCE_SIDE = ("k", "v", "k_proj", "v_proj")


def _lengths(spec: ModelSpec, setup: Setup) -> tuple[int, int] | None:
    """(source, target) where the two stacks run different lengths, else None."""
    source, target = setup.seq_len, setup.decoder_len
    return (source, target) if spec.is_encoder_decoder and spec.num_decoder_layers and target != source else None


def _decoder_target_params(spec: ModelSpec, head: int) -> int:
    """Matmul weights that run once per target token: the decoder blocks' self-attention and FFN (the encoder block's
    shapes, as the ledger counts them), the cross-attention's query and output projections, and the head."""
    per_block = sum(i * o for i, o in spec.block_linears.values())
    cross = sum(i * o * n for name, i, o, n in decoder_only_linears(spec) if name.rsplit(".", 1)[-1] not in _SOURCE_SIDE)
    return per_block * spec.num_decoder_layers + cross + head


def matmul_factor(spec: ModelSpec, setup: Setup, params: int, head: int) -> float:
    """Matmul FLOPs with each stack at its own length over ``params`` weights all run at ``seq_len`` (``head``: the
    head's weights among ``params``, 0 when counting the recomputed blocks only)."""
    lengths = _lengths(spec, setup)
    if lengths is None or params <= 0:
        return 1.0
    source, target = lengths
    at_target = min(params, _decoder_target_params(spec, head))
    return (params * source - at_target * (source - target)) / (params * source)


def layer_factor(spec: ModelSpec, setup: Setup) -> float:
    """Block-token count with the decoder's blocks at the target length over every block at ``seq_len``: the blocks'
    memory-bound passes scale with it."""
    lengths = _lengths(spec, setup)
    if lengths is None:
        return 1.0
    source, target = lengths
    return (spec.num_layers * source + spec.num_decoder_layers * target) / (spec.total_layers * source)


def score_factor(spec: ModelSpec, setup: Setup) -> float:
    """Attention-score elements (encoder S x S, decoder T x T self plus T x S cross) over one S x S map per layer.
    An encoder-decoder's decoder attends twice per layer, so the factor is above 1 when the lengths are equal."""
    if not (spec.is_encoder_decoder and spec.num_decoder_layers):
        return 1.0
    source, target = setup.seq_len, setup.decoder_len
    scores = spec.num_layers * source ** 2 + spec.num_decoder_layers * (target ** 2 + target * source)
    return scores / (spec.total_layers * source ** 2)
