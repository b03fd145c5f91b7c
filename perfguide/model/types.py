"""The shape of a model, as far as memory and speed are concerned. Never holds weights."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .._base import Model
from ..setup import LoraSpec

Dtype = Literal["fp32", "bf16", "fp16"]
Linears = dict[str, tuple[int, int]]


def linear_weight_count(linears: Linears, experts: int = 1) -> int:
    """Weights of one block's Linears; entries named ``experts.*`` describe one expert, so they count ``experts`` times."""
    dense = sum(i * o for k, (i, o) in linears.items() if not k.startswith("experts."))
    expert = sum(i * o for k, (i, o) in linears.items() if k.startswith("experts."))
    return dense + expert * experts


class ModelSpec(Model):
    """Architecture numbers plus exact parameter counts.

    ``block_linears`` maps each Linear inside one transformer block to ``(in_features, out_features)``
    so that LoRA targets and 8-bit optimizer coverage can be counted exactly rather than guessed.
    Keys are the module paths inside one block as transformers names them (``self_attn.q_proj``), so PEFT's
    suffix matching of ``target_modules`` applies to them. Encoder-decoder models describe the encoder block in
    ``block_linears`` and the decoder block (which adds cross-attention) in ``decoder_block_linears``.
    """

    name: str
    model_type: str = "unknown"            # HF config.model_type, e.g. "llama"
    architecture: str | None = None        # e.g. "LlamaForCausalLM"
    family: str = "generic"                # key into activation coefficients (data/calibration.json)
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    gated_mlp: bool = True                 # SwiGLU/GeGLU (3 matrices) vs classic 2-matrix MLP
    num_experts: int = 1                   # MoE experts per layer (1 = dense)
    num_experts_per_tok: int = 1
    is_encoder_decoder: bool = False
    num_decoder_layers: int = 0            # encoder-decoder only; num_layers counts the encoder then
    sliding_window: int | None = None
    # exact counts
    total_params: int = Field(gt=0)
    embedding_params: int = Field(ge=0)    # input (and position) embeddings
    lm_head_params: int = Field(ge=0)      # 0 when tied to the embedding
    block_linears: Linears = Field(default_factory=dict)
    decoder_block_linears: Linears = Field(default_factory=dict)  # encoder-decoder only; empty = same as block_linears
    trainable_params: int | None = Field(default=None, ge=0)  # from a module's requires_grad; None = not known
    native_dtype: Dtype = "fp32"
    source: str = "unknown"                # "catalog", "config", "module", "size", "path", "hub"
    config: dict[str, Any] | None = Field(default=None, repr=False)  # raw HF config dict, for tracing
    # what a live module arrives with (model/adapted.py): planned as it is
    adapter: LoraSpec | None = None        # the LoRA adapter of a PeftModel (the counts above are its base's)
    quantization: Literal["int8", "nf4"] | None = None  # bitsandbytes-quantized Linears of a loaded model

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def total_layers(self) -> int:
        return self.num_layers + self.num_decoder_layers

    def _linear_params(self, experts: int) -> int:
        """Linear weights of all blocks with ``experts`` experts per MoE layer."""
        decoder = self.decoder_block_linears or self.block_linears
        return (linear_weight_count(self.block_linears, experts) * self.num_layers
                + linear_weight_count(decoder, experts) * self.num_decoder_layers)

    @property
    def linear_params(self) -> int:
        """Parameters in the blocks' Linear weights (what LoRA targets and bnb quantizes)."""
        return self._linear_params(self.num_experts)

    @property
    def active_params(self) -> int:
        """Parameters touched per token (less than total for MoE); drives FLOPs."""
        return self.total_params - (self._linear_params(self.num_experts) - self._linear_params(self.num_experts_per_tok))

    @classmethod
    def from_any(cls, model: Any, **kwargs: Any) -> ModelSpec:
        """Build from an nn.Module, PretrainedConfig, dict, local path, hub id, catalog name or size ("7b")."""
        from .resolve import spec_from_any

        return spec_from_any(model, **kwargs)
