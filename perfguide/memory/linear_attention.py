"""What a hybrid model's gated-DeltaNet layers keep for backward, beyond the full-attention block its family table prices.

Qwen3.5 and Qwen3-Next run three gated-DeltaNet (linear-attention) layers to one full-attention layer. A DeltaNet block
keeps other tensors than an attention block: the short convolution's input, the L2-normalised q and k, the decay and
beta per value head, the gated RMSNorm's fp32 copies. How many depends on which code runs the layer, and transformers 5
picks it at import (``integrations/hub_kernels.use_kernel_func_from_hub_with_fallback``):

* ``fla``: flash-linear-attention's ``chunk_gated_delta_rule`` and causal-conv1d's ``causal_conv1d_fn``, when both
  packages import. The chunk states are recomputed in backward; a 9B-wide layer keeps about what an attention layer
  does.
* ``torch``: transformers' own reference code, when they do not. It loops over 64-token chunks in fp32 and keeps every
  chunk's recurrent state and score matrices: at Qwen3.5-9B's widths about twice an attention layer's bytes.

So ``Setup.linear_attention_kernels`` names the path, and this module prices its difference per token: the linear form
data/activations.json ``linear_attention`` holds (scripts/fit_linear_attention.py: fake-tensor traces of transformers'
Qwen3.5 blocks, a DeltaNet block minus a full-attention block of the same model, the packages' kernels as stand-ins that
save what their autograd Functions save). ``layer_bytes`` is a per-block mean (activation totals multiply it by the
depth), so the difference enters at the share of layers that run DeltaNet.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._data import DataModel
from ..model.shape import decoder_config
from ..model.types import ModelSpec
from ..setup import Setup

LinearDim = Literal["h", "q", "kv", "lk", "lkr", "lv", "lh", "lkh", "ls", "1"]
#: the config keys of a gated-DeltaNet layer (Qwen3-Next and Qwen3.5 spell them alike)
_KEYS = ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim")


class DeltaNetRegime(DataModel):
    per_token: dict[LinearDim, float]


class DeltaNetTable(DataModel):
    source: str = Field(min_length=10)
    #: kernel path -> dtype regime -> terms; fla refuses fp32 inputs, so its path has no fp32 entry
    paths: dict[Literal["torch", "fla"], dict[Literal["fp32", "amp", "half"], DeltaNetRegime]]


class LinearAttentionTables(DataModel):
    gated_deltanet: DeltaNetTable


def deltanet_dims(spec: ModelSpec) -> dict[str, int] | None:
    """The linear form's dims for one of ``spec``'s DeltaNet layers; None: the model has none this module sizes.

    ``lk`` key heads x key dim (q and k each), ``lkr`` value heads x key dim (q and k repeated to the value heads, the
    reference code's grouped-value layout), ``lv`` value heads x value dim, ``lh`` value heads, ``lkh`` key heads, ``ls``
    value heads x key dim x value dim (one recurrent state)."""
    config = decoder_config(spec.config or {})
    values = [config.get(k) for k in _KEYS]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        return None
    hk, dk, hv, dv = (int(v) for v in values)  # type: ignore[arg-type]
    return {"h": spec.hidden_size, "q": spec.num_attention_heads * spec.head_dim,
            "kv": spec.num_key_value_heads * spec.head_dim, "lk": hk * dk, "lkr": hv * dk, "lv": hv * dv, "lh": hv,
            "lkh": hk, "ls": hv * dk * dv, "1": 1}


def deltanet_share(spec: ModelSpec) -> float:
    """The share of ``spec``'s layers that run gated DeltaNet (0 for a model without)."""
    kinds = spec.layer_types
    if deltanet_dims(spec) is None or not kinds:
        return 0.0
    return sum(k == "linear_attention" for k in kinds) / len(kinds)


def deltanet_extra_bytes(spec: ModelSpec, setup: Setup, regime: Literal["fp32", "amp", "half"]) -> int:
    """Bytes one block keeps beyond its family table's full-attention block, averaged over the layers: the DeltaNet
    difference per token at the share of DeltaNet layers, one micro-batch."""
    share = deltanet_share(spec)
    dims = deltanet_dims(spec)
    if not share or dims is None:
        return 0
    from .activations_data import activations_data

    paths = activations_data().linear_attention.gated_deltanet.paths[setup.linear_attention_kernels]
    if regime not in paths:
        from ..errors import InvalidSetupError

        raise InvalidSetupError(f"linear_attention_kernels={setup.linear_attention_kernels!r} has no {regime} pricing: "
                                "flash-linear-attention refuses fp32 inputs; train in bf16 (weights or autocast) or "
                                "use linear_attention_kernels='torch'")
    per_token = sum(v * dims[k] for k, v in paths[regime].per_token.items())
    return int(share * setup.micro_batch_size * setup.seq_len * per_token)


def deltanet_block_excess(spec: ModelSpec, setup: Setup, regime: Literal["fp32", "amp", "half"]) -> int:
    """What the depth's largest block keeps beyond the mean ``layer_bytes`` prices (a recomputed block's peak is one
    block's, not the mean's): the DeltaNet block where it keeps more than the attention block, else the attention block."""
    share = deltanet_share(spec)
    mean_extra = deltanet_extra_bytes(spec, setup, regime)
    if not share or not mean_extra:
        return 0
    return int((1 - share) * mean_extra / share) if mean_extra > 0 else -mean_extra
