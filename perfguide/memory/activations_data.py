"""data/activations.json as validated models: the per-family coefficients the activation and logits pricing reads.

Format of ``perfguide/data/activations.json`` (``format_version`` 1; scripts/fit_activations.py regenerates it with the memory tracer)::

    {
      "format_version": 1,
      "families": {
        "<family>": {
          "source": "<where the numbers come from>",
          "regimes": {                      # one entry per precision regime, see ``regime()`` below
            "fp32" | "amp" | "half": {
              "per_token": {"h": a, "i": b, "q": c, "kv": d, "1": e},
                  # BYTES saved for backward per transformer block per token =
                  #   a*hidden_size + b*intermediate_size(active experts) + c*(heads*head_dim)
                  #   + d*(kv_heads*head_dim) + e          (flash/SDPA attention: no s^2 term)
              "eager_per_head_s2": f,        # extra BYTES per (batch * heads * seq^2) with eager attention
              "sdpa_per_head_s2": f2,        # BYTES per (batch * heads * seq^2) with SDPA on its math path (optional)
              "eager_per_token": {"h": ..., "1": ...},  # BYTES per token per block eager keeps beyond SDPA (its
                                             # contiguous q/k/v copies, no SDPA output or logsumexp); may be < 0
              "ckpt_per_token": {"h": g},    # BYTES per token per block kept under full checkpointing
              "logits_per_token_vocab": k,   # BYTES per (batch * seq * vocab) at the loss peak
              "frozen_linear_inputs_per_token": {"h": ..., "q": ..., "i": ...},
                  # BYTES per token per block that are saved ONLY for block Linears' weight gradients;
                  # dropped when the base is frozen (LoRA/QLoRA), where autograd keeps no input of a
                  # frozen Linear (adapted Linears' LoRA branches keep theirs, see lora_activations.lora_layer_bytes)
              "dropout_per_token": {"h": m},     # BYTES per token per block of hidden-state dropout masks,
                                                 # when the model's hidden dropout is > 0 (training mode)
              "eager_dropout_per_head_s2": n     # extra BYTES per (batch * heads * seq^2) of the attention-
                                                 # probability dropout (mask + output) with eager attention
            }
          }
        } | {"same_as": "<family>"},
      },
      "aliases": {"<HF model_type>": "<family>"},
      "dropout": {"keys": {"hidden": [...], "attention": [...]},   # HF config keys, first present wins
                  "defaults": {"<HF model_type>": {"hidden": p, "attention": p}}},  # config-class defaults
      "loss_paths": {"ce_bytes": 4, "eras": [{"since": "<transformers release>", "output_keeps": "fp32" | "head",
                                              "shift_copy": bool, "source": ...}]},  # memory/loss_path.py
      "training_cache": {"entries": [{"model_type": ..., "attn_implementation": ..., "since": "<release>",
                                      "hidden_elements": x, "source": ...}]},    # training_cache_bytes()
      "attention_eras": {"entries": [{"model_type": ..., "attn_implementation": ..., "since": "<release>",
                                      "per_head_s2_elements": x, "hidden_elements": y,
                                      "mask_buffer_bytes_per_position2": z (optional), "source": ...}]}
                                                  # attention_era_bytes(): what an older release's attention saves
      "softcap": {"attn_per_head_s2": {"<regime>": x}, "final_defaults": {...}, "attn_defaults": {...}, "source": ...}
                                                  # memory/softcap.py: tanh outputs a soft-cap keeps (Gemma 2)
    }

``per_token`` and ``eager_per_head_s2`` are traced with dropout off; the dropout terms are added only when the
model's config (or, when the key is absent, its HF config class) sets a dropout probability. On CUDA dropout
runs ``native_dropout``, which keeps a 1-byte bool mask (ATen Dropout.cpp); flash / memory-efficient SDPA apply
attention dropout inside the kernel from an RNG seed, so only eager attention keeps a probability-sized mask.

Regimes: ``fp32`` = fp32 weights without autocast; ``amp`` = fp32 weights with fp16/bf16 autocast (residual
stream and norms stay fp32, each Linear keeps its own 16-bit cast of its input); ``half`` = 16-bit weights
(pure bf16/fp16, and int8/nf4 bases whose non-quantized parts and compute are 16-bit). Coefficients are bytes,
not elements, because one block mixes dtypes (HF RMSNorm upcasts to fp32 even in a bf16 model).
"""


from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._data import DataModel, validated
from .block_backward import BlockBackward
from .linear_attention import LinearAttentionTables
from .loss_path import LossPaths
from .masks import EagerBackward
from .softcap import Softcap

DIMS = ("h", "i", "q", "kv", "1", "hk", "ir", "e", "k", "ql", "kvl", "vh", "r", "is")
#: beyond h / i / q / kv / 1 (the block widths): the MoE dims (activations.block_dims), MLA's ranks and value width,
#: and ``is``, the FFN width of the layers that sparsify their activation (Gemma 3n's first 10), mean over the depth
Dim = Literal["h", "i", "q", "kv", "1", "hk", "ir", "e", "k", "ql", "kvl", "vh", "r", "is"]
RegimeName = Literal["fp32", "amp", "half"]


class Regime(DataModel):
    """Bytes per token (linear forms over the block dims) one block keeps for backward in one dtype regime."""

    per_token: dict[Dim, float]
    eager_per_head_s2: float
    eager_per_token: dict[Dim, float] = Field(default_factory=dict)
    ckpt_per_token: dict[Dim, float]
    logits_per_token_vocab: float
    dropout_per_token: dict[Dim, float]
    eager_dropout_per_head_s2: float
    frozen_linear_inputs_per_token: dict[Dim, float]
    #: BYTES per (b x heads x s^2) under SDPA where the call gets no fused kernel (Falcon-7B's unexpanded K/V head: the
    #: math path); eager_per_head_s2 is then eager's whole s^2 term, not its excess over SDPA
    sdpa_per_head_s2: float = 0.0
    #: an encoder-decoder family's split of its per-block means (``per_token``, ``dropout_per_token``: one encoder and
    #: one decoder block at equal lengths, halved): what a decoder block keeps per target token and, through its
    #: cross-attention's K/V, per source token; empty: both stacks' blocks are priced at the mean, each at its length
    decoder_per_token: dict[Dim, float] = Field(default_factory=dict)
    cross_per_source_token: dict[Dim, float] = Field(default_factory=dict)
    decoder_dropout_per_token: dict[Dim, float] = Field(default_factory=dict)


class Family(DataModel):
    source: str = Field(min_length=10)
    regimes: dict[RegimeName, Regime] | None = None
    same_as: str | None = None
    #: a MoE family's dense family: the table its terms extend (its FFN aside, the block is that family's code), so
    #: the attention-side tables keyed by family (eager backward) are that family's (``attention_family``)
    dense: str | None = None
    #: the family a MoE release of this model type takes (Gemma-4 builds its 26B-A4B MoE and its 31B dense from one
    #: model_type, gemma4_text)
    moe: str | None = None
    #: the family a release with per-layer embeddings takes (Gemma-4's E2B / E4B: the 26B-A4B and 31B have none)
    per_layer_inputs: str | None = None


class Dropout(DataModel):
    source: str = Field(min_length=10)
    keys: dict[Literal["hidden", "attention"], tuple[str, ...]]
    defaults: dict[str, dict[Literal["hidden", "attention"], float]]


class CacheEntry(DataModel):
    """From ``since`` on, a training forward of ``model_type`` with this attention returns a cache that keeps
    ``hidden_elements`` x hidden_size elements per block per token alive beyond what autograd saves."""

    model_type: str
    attn_implementation: str
    since: str
    hidden_elements: float = Field(ge=0)
    source: str = Field(min_length=10)


class TrainingCache(DataModel):
    source: str = Field(min_length=10)
    entries: tuple[CacheEntry, ...]


class AttentionEra(DataModel):
    """From ``since`` on, ``model_type``'s attention saves this many elements per block beyond the installed
    release's traced coefficients: ``per_head_s2_elements`` per (b x heads x s^2), ``hidden_elements`` x h per token."""

    model_type: str
    attn_implementation: str
    since: str
    per_head_s2_elements: float = Field(ge=0)
    hidden_elements: float = Field(ge=0)
    #: bytes per max_position_embeddings^2 of a causal-mask buffer each block registers (GPT-NeoX before 4.49: a bool
    #: tril of max_positions^2); resident with the weights, so charged whatever the checkpointing
    mask_buffer_bytes_per_position2: float = Field(default=0.0, ge=0)
    #: bytes per h per token per block that fp32 rotary tables add where activations are 16-bit (GPT-NeoX before 4.45:
    #: its cos/sin buffers stay fp32 under from_pretrained(torch_dtype=...), so the rotated q and k are promoted)
    fp32_rope_bytes_per_h: float = Field(default=0.0, ge=0)
    #: the attention expands the grouped key and value heads to the query heads (``repeat_kv``) before casting them
    #: for the kernel, which saves the expanded 16-bit copies: (2 x q - k - v) elements per token per block more than
    #: the installed release's kernels, which take the grouped heads (Mistral's FlashAttention2 before 4.48)
    repeats_kv: bool = False
    source: str = Field(min_length=10)


class AttentionEras(DataModel):
    source: str = Field(min_length=10)
    entries: tuple[AttentionEra, ...]


class ActivationsData(DataModel):
    """data/activations.json; every family names all three regimes (or points at one that does)."""

    format_version: Literal[1]
    dims: tuple[Dim, ...]
    regimes: tuple[RegimeName, ...]
    families: dict[str, Family]
    aliases: dict[str, str]
    dropout: Dropout
    loss_paths: LossPaths
    training_cache: TrainingCache
    attention_eras: AttentionEras
    softcap: Softcap
    eager_backward: EagerBackward
    block_backward: BlockBackward
    linear_attention: LinearAttentionTables


def activations_data() -> ActivationsData:
    return validated("activations", ActivationsData)
