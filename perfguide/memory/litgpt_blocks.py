"""What one block of litgpt's own GPT keeps for backward, where it differs from transformers' classes of the same model
(Setup.model_code == "litgpt"; the table is data/litgpt.json, fitted by scripts/fit_litgpt.py on real CPU tensors).

litgpt runs one ``Block`` for every model (litgpt/model.py), so a model's saved bytes follow litgpt's code, not its
transformers class: one fused qkv Linear whose q and k pass through ``apply_rope`` against the fp32 rope cache
``fit`` rebuilds (``model.max_seq_length = ...``) and are concatenated back, k and v expanded to the query heads for
SDPA wherever there are fewer groups than heads, ``F.gelu(approximate=...)`` in one kernel (transformers' Phi runs
``gelu_new``, a chain of eager ops that keeps several i-wide tensors), and no dropout anywhere in the block. Traced,
b 2 x s 128, h 256 / i 1024: phi full fine-tuning keeps 4 h + 4 i + 14.05 q bytes per token against 14.25 h + 10 i
(+ 2 h with phi-2's resid_pdrop) for transformers' PhiDecoderLayer; a GQA Llama 20 h + 8 i + 10.06 q + 8 kv against
16 h + 8 i + 4.25 q + 4 kv. Only the half regime (bf16-true, 16-true) is traced; litgpt's other precisions keep
transformers' coefficients.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._data import DataModel, validated
from ..model.types import ModelSpec
from ..setup import Setup

LitgptDim = Literal["h", "i", "q", "kv", "1"]


class LitgptFamily(DataModel):
    per_token: dict[LitgptDim, float]
    frozen_linear_inputs_per_token: dict[LitgptDim, float]
    #: the block Linears' distinct 16-bit inputs, the part of the frozen form a bitsandbytes matmul that keeps its
    #: input (before 0.43.2, bnb_inputs.quantized_matmul_keeps_inputs) still keeps; the rest is what the norms keep
    #: for their trained weights (litgpt's RMSNorm multiplies by ``weight.float()``: an fp32 product)
    linear_inputs_per_token: dict[LitgptDim, float]
    #: bytes per b x heads x s^2 (full fine-tuning and LoRA alike): Gemma 2's attention soft-capping takes litgpt off
    #: SDPA (``CausalSelfAttention.scaled_dot_product_attention``: "with softcapping we cannot use SDPA") onto its own
    #: scores, which keep the tanh output (2 B), the fp32 softmax (4 B) and its 16-bit copy for ``scores @ v`` (2 B);
    #: the sliding window is a mask added to full scores, so every block keeps all s^2
    per_head_s2: float = 0.0


class LitgptBlocks(DataModel):
    """data/litgpt.json."""

    format_version: Literal[1]
    source: str = Field(min_length=10)
    #: HF model_type -> the litgpt family fitted for its code path
    model_types: dict[str, str]
    families: dict[str, LitgptFamily]


def litgpt_blocks() -> LitgptBlocks:
    return validated("litgpt", LitgptBlocks)


def litgpt_family(spec: ModelSpec, setup: Setup) -> LitgptFamily | None:
    """The traced litgpt block of ``spec`` (half regime: the caller checks it), None where transformers'
    coefficients apply (another model code, or a model type the table lacks). A multi-head model of a GQA
    family takes the ``_mha`` fit: litgpt expands k and v only when there are fewer groups than heads."""
    if setup.model_code != "litgpt":
        return None
    data = litgpt_blocks()
    family = data.model_types.get(spec.model_type)
    if family is None:
        return None
    mha = f"{family}_mha"
    if spec.num_key_value_heads == spec.num_attention_heads and mha in data.families:
        family = mha
    return data.families.get(family)
