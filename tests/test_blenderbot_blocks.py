"""BlenderBot's own activation coefficients (activations.json ``blenderbot``, scripts/fit_t5.py --family blenderbot),
against traces of the real HF BlenderbotForConditionalGeneration on fake tensors at a shape and lengths the fit did
not use. Before them BlenderBot fell back to the generic (llama) block: a gated FFN it does not have, no dropout masks
and no cross-attention K/V.

The fit ran at h 64 / 128, heads of 16, (source, target) in {(64, 32), (128, 32), (64, 64)}; here h 96, FFN 256,
6 heads, other lengths, dropout 0.1 on hidden states as facebook/blenderbot-400M-distill's config sets it. Eager
attention, as the 2022 rows ran it: under SDPA each block keeps a small s^2 mask term the format has no slot for
(noted in the family's source, not priced).
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import block_pair_per_row

from perfguide.memory.activations import spec_family
from perfguide.model.types import ModelSpec

BB = dict(model_type="blenderbot", architectures=["BlenderbotForConditionalGeneration"], is_encoder_decoder=True,
          d_model=96, encoder_ffn_dim=256, decoder_ffn_dim=256, encoder_attention_heads=6, decoder_attention_heads=6,
          vocab_size=4096, attention_dropout=0.0, activation_dropout=0.0, activation_function="gelu",
          max_position_embeddings=256, scale_embedding=True, decoder_start_token_id=1, pad_token_id=0, bos_token_id=1,
          eos_token_id=2)


def _bb(layers: int, drop: float = 0.0) -> dict[str, Any]:
    return {**BB, "encoder_layers": layers, "decoder_layers": layers, "dropout": drop}


def test_blenderbot_takes_its_own_block() -> None:
    assert spec_family(ModelSpec.from_any(_bb(2, 0.1))) == "blenderbot"


@pytest.mark.parametrize("source, target, regime, attn, drop", [
    (160, 32, {}, "eager", 0.0),                          # a long source, short labels
    (32, 128, {"weights_dtype": "bf16"}, "eager", 0.1),   # labels longer than the source, score maps and dropout
    (128, 64, {"autocast": "bf16"}, "eager", 0.1),        # the blog's lengths under autocast
])
def test_blocks_match_a_trace(source: int, target: int, regime: dict[str, Any], attn: str, drop: float) -> None:
    """One encoder + one decoder block (a two-pair trace minus a one-pair trace, at two batch sizes so per-block
    constants cancel) against the analytic encoder block at the source plus decoder block at (target, source)."""
    spec = ModelSpec.from_any(_bb(2, drop))
    traced, priced = block_pair_per_row(lambda pairs: _bb(pairs, drop), spec, source, target, attn, **regime)
    # within 3%: the fitted per-token constants (the 4-D masks each stack builds) do not scale exactly to this shape
    assert priced == pytest.approx(traced, rel=0.03)
