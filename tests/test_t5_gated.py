"""T5 v1.1 / Flan-T5 / T0 / mT5's gated-GELU FFN (``feed_forward_proj: gated-gelu``) has coefficients of its own
(activations.json ``t5-gated``, scripts/fit_t5.py), checked here against a hand count of the tensors its FFN saves.

transformers' ``T5DenseGatedActDense.forward``: ``gelu = act(wi_0(x)); linear = wi_1(x); h = gelu * linear;
h = dropout(h); h = h.to(wo.weight.dtype) if the dtypes differ; wo(h)``, with ``act`` = ``NewGELUActivation``:
``0.5 * x * (1.0 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3.0))))``, a chain of Python ops whose autograd
nodes save, per d_ff unit per token: ``pow``'s input x, ``tanh``'s output t, the product's two factors ``0.5 x``
and ``1 + t``; then the gated product's two factors (the GELU output and wi_1's output) and wo's input. T5 v1.0's
``T5DenseActDense`` (ReLU) saves only the ReLU output, which is also wo's input.
"""

from __future__ import annotations

import pytest

from perfguide.memory.activations import family_coefficients, spec_family
from perfguide.model.types import ModelSpec

#: bytes per d_ff unit per token, by hand, per regime
GATED_BY_HAND = {
    # seven fp32 tensors: pow's x, tanh's t, 0.5x, 1+t, the GELU output, wi_1's output, wo's input (the product)
    "fp32": 7 * 4,
    # the same seven in bf16
    "half": 7 * 2,
    # autocast runs pow in fp32 (its fp32-list), so the chain from there is fp32: pow's fp32 cast of x (4), t (4),
    # 0.5x in bf16 (2), 1+t (4), the fp32 GELU output (4) times wi_1's bf16 output (2); the fp32 product meets an
    # fp32 wo weight (no .to), and autocast's bf16 cast of it is what wo keeps (2)
    "amp": 4 + 4 + 2 + 4 + 4 + 2 + 2,
}
#: T5 v1.0's ReLU FFN by the same count: the ReLU output (wo's input); under autocast the bf16 ReLU output is cast
#: to fp32 for wo (``.to(wo.weight.dtype)``) and wo keeps its bf16 cast back, so two bf16 tensors
RELU_BY_HAND = {"fp32": 4, "half": 2, "amp": 2 + 2}


@pytest.mark.parametrize("regime", ["fp32", "half", "amp"])
def test_gated_ffn_coefficient_is_the_hand_count(regime: str) -> None:
    assert family_coefficients("t5-gated")[regime].per_token["i"] == GATED_BY_HAND[regime]
    assert family_coefficients("t5")[regime].per_token["i"] == RELU_BY_HAND[regime]


@pytest.mark.parametrize("regime", ["fp32", "half", "amp"])
def test_dropout_adds_only_its_mask_in_the_gated_block(regime: str) -> None:
    """With dropout on, the product's dropout keeps a one-byte mask (CUDA native_dropout) and wo keeps the dropped
    product instead of the product, which nothing else saved: +1 B per d_ff unit (under autocast wo's cast of it
    stays 2 B). The ReLU block's ReLU output stays saved for the ReLU's backward, so there the dropped copy is extra."""
    assert family_coefficients("t5-gated")[regime].dropout_per_token["i"] == 1


@pytest.mark.parametrize("name, gated", [("google-t5/t5-base", False), ("google/flan-t5-xl", True)])
def test_selected_by_feed_forward_proj(name: str, gated: bool) -> None:
    spec = ModelSpec.from_any(name)
    assert spec_family(spec) == ("t5-gated" if gated else "t5")
    config = dict(spec.config or {}, feed_forward_proj="gated-gelu" if not gated else "relu")
    assert spec_family(ModelSpec.from_any(config)) == ("t5" if gated else "t5-gated")
