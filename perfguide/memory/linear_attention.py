"""What a hybrid model's recurrent layers keep for backward, beyond the full-attention block its family table prices.

Two kinds of recurrent mixer are priced, each against the attention block of its own model:

* **gated DeltaNet** (Qwen3.5, Qwen3.6, Qwen3-Next: three linear-attention layers to one full-attention layer). A
  DeltaNet block keeps the short convolution's input, the L2-normalised q and k, the decay and beta per value head, the
  gated RMSNorm's fp32 copies;
* **Mamba-2** (IBM's Granite-4.0-H and Bamba: a Mamba-2 mixer in most layers, attention in a few, the same FFN in
  each). A Mamba block keeps the in-projection's output and the scan's.

How many bytes depends on which code runs the mixer, and transformers 5 picks it at import
(``integrations/hub_kernels.use_kernel_func_from_hub_with_fallback``):

* the packages' kernels when they import: flash-linear-attention's ``chunk_gated_delta_rule`` with causal-conv1d's
  ``causal_conv1d_fn`` (``fla``), or mamba_ssm's fused ``mamba_split_conv1d_scan_combined`` (``mamba_ssm``). They
  recompute the chunk states in backward;
* transformers' own PyTorch reference code (``torch``) when they do not. It works in fp32 and keeps every chunk's state
  and score matrices: a DeltaNet block at Qwen3.5-9B's widths about twice an attention block's bytes, a Mamba-2 block at
  Granite-4.0-H-Small's about eight times.

So ``Setup.linear_attention_kernels`` names the path, and this module prices its difference per token: the linear forms
data/activations.json ``linear_attention`` holds (scripts/fit_linear_attention.py and scripts/fit_mamba.py: fake-tensor
traces of transformers' Qwen3.5 and Granite-4.0-H blocks, a recurrent block minus an attention block of the same model,
the kernels as stand-ins that save what their autograd Functions save). ``layer_bytes`` is a per-block mean (activation
totals multiply it by the depth), so the difference enters at the share of recurrent layers.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from pydantic import Field

from .._data import DataModel
from ..model.recurrent import MAMBA2_TYPES, nemotron_kinds, positive_ints
from ..model.shape import decoder_config
from ..model.types import ModelSpec
from ..setup import Setup

Kind = Literal["gated_deltanet", "mamba2"]
Kernels = Literal["torch", "fla", "mamba_ssm"]
LinearDim = Literal["h", "q", "kv", "lk", "lkr", "lv", "lh", "lkh", "ls",
                    "ah", "md", "mh", "mgn", "mhn", "mhl", "mdnl", "i", "hk", "ir", "si", "e", "k", "ml", "1"]
Regime = Literal["fp32", "amp", "half"]
LayerKind = Literal["attention", "mlp", "moe", "mamba", "hybrid"]
#: the config keys of a gated-DeltaNet layer (Qwen3-Next and Qwen3.5 spell them alike)
_KEYS = ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim")


class KernelPath(NamedTuple):
    """A recurrent kind's kernel path (``torch``, transformers' reference code, is every kind's other one)."""
    value: Kernels                  # its Setup.linear_attention_kernels value
    layers: str                     # what the layers are called in a reason
    packages: tuple[str, ...]       # import names
    install: str                    # pip names
    names: str                      # the packages in prose
    keeps: str                      # what the reference code keeps instead
    fp32_refused_by: str | None     # the package that refuses fp32 inputs; None: the kernels take them


KERNEL_PATHS: dict[Kind, KernelPath] = {
    "gated_deltanet": KernelPath("fla", "gated-DeltaNet", ("fla", "causal_conv1d"), "flash-linear-attention causal-conv1d",
                                 "flash-linear-attention and causal-conv1d",
                                 "every 64-token chunk's state and fp32 copies", "flash-linear-attention"),
    "mamba2": KernelPath("mamba_ssm", "Mamba-2", ("mamba_ssm", "causal_conv1d"), "mamba-ssm causal-conv1d",
                         "mamba-ssm and causal-conv1d", "every chunk's score matrices and state in fp32", None),
}


class KernelRegime(DataModel):
    per_token: dict[LinearDim, float]


class KernelTable(DataModel):
    source: str = Field(min_length=10)
    #: kernel path -> dtype regime -> terms; fla refuses fp32 inputs, so its path has no fp32 entry
    paths: dict[Kernels, dict[Regime, KernelRegime]]


class LayerKindsTable(DataModel):
    source: str = Field(min_length=10)
    #: layer kind -> kernel path (``torch`` for the kinds without a recurrent mixer) -> dtype regime -> terms: the whole
    #: layer's bytes per token, not a difference
    kinds: dict[LayerKind, dict[Kernels, dict[Regime, KernelRegime]]]


class LinearAttentionTables(DataModel):
    gated_deltanet: KernelTable
    mamba2: KernelTable
    nemotron_h: LayerKindsTable
    falcon_h1: LayerKindsTable


def deltanet_dims(spec: ModelSpec) -> dict[str, int] | None:
    """The linear form's dims for one of ``spec``'s DeltaNet layers; None: the model has none this module sizes.

    ``lk`` key heads x key dim (q and k each), ``lkr`` value heads x key dim (q and k repeated to the value heads, the
    reference code's grouped-value layout), ``lv`` value heads x value dim, ``lh`` value heads, ``lkh`` key heads, ``ls``
    value heads x key dim x value dim (one recurrent state)."""
    found = positive_ints(decoder_config(spec.config or {}), _KEYS)
    if found is None:
        return None
    hk, dk, hv, dv = found
    return {"h": spec.hidden_size, "q": spec.num_attention_heads * spec.head_dim,
            "kv": spec.num_key_value_heads * spec.head_dim, "lk": hk * dk, "lkr": hv * dk, "lv": hv * dv, "lh": hv,
            "lkh": hk, "ls": hv * dk * dv, "1": 1}


def mamba2_dims(spec: ModelSpec) -> dict[str, int] | None:
    """The linear form's dims for one of ``spec``'s Mamba-2 layers; None: the model has none this module sizes.

    ``ah`` attention heads, ``md`` the mixer's inner width (heads x head dim), ``mh`` its heads, ``mgn`` groups x
    state (B and C each), ``mhn`` heads x state (B and C repeated to the heads, the reference code's layout), ``mhl``
    heads x chunk (its chunk-by-chunk score matrices per token), ``mdnl`` inner x state / chunk (a chunk's state per
    token)."""
    config = decoder_config(spec.config or {})
    if spec.model_type not in MAMBA2_TYPES:
        return None
    keys = MAMBA2_TYPES[spec.model_type][0]
    if config.get("mamba_d_head", "auto") == "auto" and isinstance(config.get("mamba_n_heads"), int):
        # GraniteMoeHybridConfig's and FalconH1Config's default: the inner width (mamba_d_ssm, else expand x hidden)
        # over the heads
        inner = config.get("mamba_d_ssm") or int(config.get("mamba_expand", 2) * spec.hidden_size)
        config = {**config, "mamba_d_head": int(inner) // config["mamba_n_heads"]}
    found = positive_ints(config, keys[:4])
    if found is None:
        return None
    heads, head_dim, state, groups = found
    inner = heads * head_dim
    chunk_size = mamba2_chunk(spec)
    return {"h": spec.hidden_size, "kv": spec.num_key_value_heads * spec.head_dim, "ah": spec.num_attention_heads,
            "md": inner, "mh": heads, "mgn": groups * state, "mhn": heads * state, "mhl": heads * chunk_size,
            "mdnl": inner * state // chunk_size, "1": 1}


def mamba2_chunk(spec: ModelSpec) -> int:
    """The reference code's chunk length (the config's, else its class's default)."""
    keys, default = MAMBA2_TYPES.get(spec.model_type, ((), 256))
    chunk = positive_ints(decoder_config(spec.config or {}), keys[5:]) if keys else None
    return chunk[0] if chunk else default


def _reference_length(spec: ModelSpec, kind: Kind, kernels: str, seq_len: int) -> int:
    """The length the path's per-token bytes are paid at: transformers' Mamba-2 reference code pads the sequence to a
    whole number of chunks before its scan (``pad_tensor_by_size``), so a shorter last chunk costs a whole one. Every
    term is paid at the padded length, an upper bound for the few tensors made before the padding (the in-projection's
    output, the convolution's)."""
    if kind != "mamba2" or kernels != "torch":
        return seq_len
    chunk = mamba2_chunk(spec)
    return -(-seq_len // chunk) * chunk


def linear_kind(spec: ModelSpec) -> Kind | None:
    """Which recurrent mixer ``spec``'s recurrent layers run, where this module prices it."""
    return "gated_deltanet" if deltanet_dims(spec) else "mamba2" if mamba2_dims(spec) else None


def linear_share(spec: ModelSpec) -> float:
    """The share of ``spec``'s layers that run a recurrent mixer this module prices (0 for a model without); Falcon-H1's
    ``hybrid`` layers run one beside their attention."""
    kinds = spec.layer_types
    if not kinds or linear_kind(spec) is None:
        return 0.0
    return sum(k in ("linear_attention", "hybrid") for k in kinds) / len(kinds)


def deltanet_share(spec: ModelSpec) -> float:
    """The share of ``spec``'s layers that run gated DeltaNet (0 for a model without)."""
    return linear_share(spec) if linear_kind(spec) == "gated_deltanet" else 0.0


def _checked_kernels(spec: ModelSpec, setup: Setup, kind: Kind) -> Kernels:
    from ..errors import InvalidSetupError

    kernels = setup.linear_attention_kernels
    path = KERNEL_PATHS[kind]
    if kernels not in ("torch", path.value):
        raise InvalidSetupError(f"linear_attention_kernels={kernels!r} does not run {spec.name}'s {path.layers} layers; "
                                f"accepted: 'torch' or {path.value!r}")
    return kernels


def _terms(table: dict[Regime, KernelRegime], regime: Regime, kernels: str, dims: dict[str, int]) -> float:
    if regime not in table:
        from ..errors import InvalidSetupError

        raise InvalidSetupError(f"linear_attention_kernels={kernels!r} has no {regime} pricing: "
                                "flash-linear-attention refuses fp32 inputs; train in bf16 (weights or autocast) or "
                                "use linear_attention_kernels='torch'")
    return sum(v * dims[k] for k, v in table[regime].per_token.items())


def linear_extra_bytes(spec: ModelSpec, setup: Setup, regime: Regime) -> int:
    """Bytes one block keeps beyond its family table's full-attention block, averaged over the layers: the recurrent
    mixer's difference per token at the share of its layers, one micro-batch. 0 for Nemotron-H and Falcon-H1, whose
    layers are priced whole (``kind_mean_per_token``)."""
    kind = linear_kind(spec)
    share = linear_share(spec)
    if kind is None or not share or layer_kinds(spec):
        return 0
    from .activations_data import activations_data

    kernels = _checked_kernels(spec, setup, kind)
    paths = getattr(activations_data().linear_attention, kind).paths[kernels]
    dims = (deltanet_dims if kind == "gated_deltanet" else mamba2_dims)(spec) or {}
    per_token = _terms(paths, regime, kernels, dims)
    return int(share * setup.micro_batch_size * _reference_length(spec, kind, kernels, setup.seq_len) * per_token)


def layer_kinds(spec: ModelSpec) -> list[LayerKind] | None:
    """The kinds of ``spec``'s layers in order where each is priced whole: Nemotron-H's from its config
    (``layers_block_type``, else ``hybrid_override_pattern``), Falcon-H1's all ``hybrid``; None for any other model, or
    a pattern this module cannot read (then every layer is priced as a family block)."""
    if spec.model_type not in ("nemotron_h", "falcon_h1") or mamba2_dims(spec) is None:
        return None
    if spec.model_type == "falcon_h1":
        return ["hybrid"] * spec.num_layers
    return nemotron_kinds(decoder_config(spec.config or {}), spec.num_layers)  # type: ignore[return-value]


def kind_dims(spec: ModelSpec) -> dict[str, int]:
    """The kinds' linear-form dims: the Mamba-2 mixer's (``mamba2_dims``), attention's ``q`` and ``kv``, the dense
    MLP's ``i``, and the MoE block's ``hk`` (the routed width x top-k: hidden, or ``moe_latent_size`` where the experts
    run in a latent space), ``ir`` (top-k x expert width), ``si`` (the shared experts' width), ``e`` (routed experts),
    ``k`` (top-k), ``ml`` (the latent width, 0 without)."""
    k = spec.num_experts_per_tok
    expert = spec.moe_intermediate_size or spec.intermediate_size
    shared = spec.shared_expert_intermediate_size or spec.num_shared_experts * expert   # summed over shared experts
    latent = positive_ints(decoder_config(spec.config or {}), ("moe_latent_size",))
    routed_width = latent[0] if latent else spec.hidden_size   # Nemotron-3 Super / Ultra route in a latent space
    return {**(mamba2_dims(spec) or {}), "q": spec.num_attention_heads * spec.head_dim, "i": spec.intermediate_size,
            "hk": routed_width * k, "ir": k * expert, "si": shared, "e": spec.num_experts, "k": k,
            "ml": latent[0] if latent else 0}


def _kind_bytes(spec: ModelSpec, setup: Setup, regime: Regime) -> dict[LayerKind, float]:
    """Bytes per token one layer of each kind the model has keeps (the Mamba kind at the reference code's padded
    length, per real token)."""
    from .activations_data import activations_data

    kinds = layer_kinds(spec) or []
    table = getattr(activations_data().linear_attention, spec.model_type).kinds
    kernels = _checked_kernels(spec, setup, "mamba2")
    dims = kind_dims(spec)
    out: dict[LayerKind, float] = {}
    padded = _reference_length(spec, "mamba2", kernels, setup.seq_len) / setup.seq_len
    for kind in set(kinds):
        mixer = kind in ("mamba", "hybrid")   # the kinds with a Mamba-2 mixer take the kernel path and its padding
        path: Kernels = kernels if mixer else "torch"
        out[kind] = (padded if mixer else 1.0) * _terms(table[kind][path], regime, path, dims)
    return out


def _kind_mean(kinds: list[LayerKind], per_kind: dict[LayerKind, float]) -> float:
    return sum(per_kind[k] for k in kinds) / len(kinds)


def kind_mean_per_token(spec: ModelSpec, setup: Setup, regime: Regime) -> float | None:
    """Bytes per token of Nemotron-H's or Falcon-H1's mean layer, each kind priced whole at its share of the depth;
    None for any other model (its family table prices the block)."""
    kinds = layer_kinds(spec)
    return _kind_mean(kinds, _kind_bytes(spec, setup, regime)) if kinds else None


def linear_block_excess(spec: ModelSpec, setup: Setup, regime: Regime) -> int:
    """What the depth's largest block keeps beyond the mean ``layer_bytes`` prices (a recomputed block's peak is one
    block's, not the mean's): the recurrent block where it keeps more than the attention block, else the attention
    block; for Nemotron-H the largest of its kinds."""
    if kinds := layer_kinds(spec):
        per_kind = _kind_bytes(spec, setup, regime)
        return int(setup.micro_batch_size * setup.seq_len * (max(per_kind.values()) - _kind_mean(kinds, per_kind)))
    share = linear_share(spec)
    mean_extra = linear_extra_bytes(spec, setup, regime)
    if not share or not mean_extra:
        return 0
    return int((1 - share) * mean_extra / share) if mean_extra > 0 else -mean_extra
