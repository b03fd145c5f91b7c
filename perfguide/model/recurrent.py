"""Recurrent layers of hybrid models: which layers keep a fixed state instead of a growing K/V cache, and its size.

Qwen3-Next and Qwen3.5 interleave gated-DeltaNet linear attention with full attention (three to one), IBM's Granite-4.0-H,
Bamba and NVIDIA's Nemotron-H interleave Mamba-2 mixers, LFM2 short convolutions. transformers 5 caches such a layer
as a ``LinearAttentionLayer`` (cache_utils.py): a conv state of ``[batch, channels, kernel]`` in the activation dtype
and, for linear attention and Mamba-2, a recurrent state kept in fp32, whatever the prompt length. Traced on tiny
random models after a CPU ``generate`` (tests/test_model_families.py):

* gated DeltaNet: conv channels ``2 x key heads x key dim + value heads x value dim`` over ``linear_conv_kernel_dim``;
  recurrent ``value heads x key dim x value dim``;
* Mamba-2: conv channels ``heads x head dim + 2 x groups x state`` over the conv kernel; recurrent ``heads x head dim
  x state``;
* LFM2's short convolution: ``hidden x conv_L_cache``, no recurrent state.

Also read here, for the memory model (memory/linear_attention.py): each Mamba-2 hybrid's key spelling and default chunk
(``MAMBA2_TYPES``), Nemotron-H's four layer kinds (``nemotron_kinds``), and the Mamba-2 out-projection LoRA cannot adapt
(``FUSED_OUT_PROJ``).

* Jamba's Mamba-1: conv channels ``mamba_expand x hidden`` over ``mamba_d_conv``; recurrent ``channels x mamba_d_state``.

A config whose recurrent layers this module cannot size (Kimi-Linear, MiniMax's lightning attention) gets no layer types
from it: every layer is then priced as full attention, an upper bound at long context. Plain dict reading.
"""

from __future__ import annotations

from typing import Any

#: cache layer kinds that keep a fixed state and no per-token K/V; "hybrid" keeps both (Falcon-H1's parallel mixers)
STATE_ONLY = frozenset({"linear_attention", "conv"})
STATEFUL = STATE_ONLY | {"hybrid"}
_ALIASES = {"mamba": "linear_attention", "attention": "full_attention", "mlp": "dummy", "moe": "dummy"}
_DELTANET = ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim",
             "linear_conv_kernel_dim")
#: Mamba-2 keys per spelling: (heads, head dim, state, groups, conv kernel, chunk)
_GRANITE_SPELLING = ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv", "mamba_chunk_size")
_NEMOTRON_SPELLING = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel", "chunk_size")
_MAMBA2 = (_GRANITE_SPELLING, _NEMOTRON_SPELLING)
#: Jamba's Mamba-1 keys: (expand, hidden, state, conv kernel)
_MAMBA1 = ("mamba_expand", "hidden_size", "mamba_d_state", "mamba_d_conv")
#: the Mamba-2 hybrids' spelling and their config class's default chunk (transformers 5.24)
MAMBA2_TYPES: dict[str, tuple[tuple[str, ...], int]] = {
    "granitemoehybrid": (_GRANITE_SPELLING, 256), "bamba": (_GRANITE_SPELLING, 256),
    "falcon_h1": (_GRANITE_SPELLING, 256), "nemotron_h": (_NEMOTRON_SPELLING, 128)}
#: Nemotron-H's layer kinds as its config spells them: ``hybrid_override_pattern`` characters, ``layers_block_type``
#: names (transformers 5 writes the mixers' legacy names as ``linear_attention`` / ``full_attention``)
NEMOTRON_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe", "mamba": "mamba", "attention": "attention",
                  "mlp": "mlp", "moe": "moe", "linear_attention": "mamba", "full_attention": "attention"}


def positive_ints(config: dict[str, Any], keys: tuple[str, ...]) -> list[int] | None:
    """The values of ``keys`` in ``config`` when every one is a positive int (not a bool); None otherwise."""
    values = [config.get(k) for k in keys]
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)
    return [int(v) for v in values] if ok else None  # type: ignore[arg-type]


def state_shape(config: dict[str, Any]) -> tuple[int, int, int] | None:
    """(conv channels, conv kernel, recurrent-state elements) of one recurrent layer per sequence; None: not sized.
    transformers keeps ``channels x kernel`` conv elements, vLLM ``channels x (kernel - 1)`` (engines/vllm.py)."""
    delta = positive_ints(config, _DELTANET)
    if delta:
        key_heads, key_dim, value_heads, value_dim, kernel = delta
        return 2 * key_heads * key_dim + value_heads * value_dim, kernel, value_heads * key_dim * value_dim
    for keys in _MAMBA2:
        mamba = positive_ints(config, keys[:5])
        if mamba:
            heads, head_dim, state, groups, kernel = mamba
            return heads * head_dim + 2 * groups * state, kernel, heads * head_dim * state
    mamba1 = positive_ints(config, _MAMBA1)
    if mamba1:   # Jamba's Mamba-1 mixer: conv and state over expand x hidden channels (JambaMambaMixer)
        expand, hidden, state, kernel = mamba1
        return expand * hidden, kernel, expand * hidden * state
    conv = positive_ints(config, ("hidden_size", "conv_L_cache"))
    return (conv[0], conv[1], 0) if conv else None


def state_dtype(config: dict[str, Any]) -> str | None:
    """The dtype a config names for its recurrent state (Qwen3.5's ``mamba_ssm_dtype``), which vLLM's state cache takes
    where its own setting is "auto"; None: unnamed."""
    value = config.get("mamba_ssm_dtype")
    return value if value in ("float32", "bfloat16", "float16") else None


def _from_indices(layers: int, attention: Any) -> list[str] | None:
    if not isinstance(attention, list) or not all(isinstance(i, int) for i in attention):
        return None
    full = set(attention)
    return ["full_attention" if i in full else "linear_attention" for i in range(layers)]


def derived_types(config: dict[str, Any], model_type: str, layers: int) -> list[str] | None:
    """The cache layer kinds a hybrid family's config class computes when ``layer_types`` is absent (transformers 5.24)."""
    if model_type.startswith(("qwen3_next", "qwen3_5")):
        interval = config.get("full_attention_interval", 4)
        interval = interval if isinstance(interval, int) and interval > 0 else 4
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if model_type == "falcon_h1":   # every layer runs attention and a Mamba-2 mixer side by side
        return ["hybrid"] * layers
    if model_type == "bamba":   # BambaConfig.layers_block_type: no attn_layer_indices, every layer Mamba-2
        return _from_indices(layers, config.get("attn_layer_indices") or [])
    if model_type == "granitemoehybrid":   # GraniteMoeHybridConfig: no layer_types, every layer Mamba-2
        return ["linear_attention"] * layers
    if model_type.startswith("lfm2"):
        found = _from_indices(layers, config.get("full_attn_idxs"))
        return None if found is None else ["conv" if t == "linear_attention" else t for t in found]
    if model_type == "jamba":   # JambaConfig.layers_block_type: attention where i % period == offset, else Mamba-1
        period, offset = config.get("attn_layer_period", 8), config.get("attn_layer_offset", 4)
        if not (isinstance(period, int) and isinstance(offset, int) and period > 0):
            return None
        return ["full_attention" if i % period == offset else "linear_attention" for i in range(layers)]
    if model_type == "nemotron_h":
        kinds = nemotron_kinds(config, layers)
        return None if kinds is None else [_ALIASES[k] for k in kinds]
    return None


def nemotron_kinds(config: dict[str, Any], layers: int) -> list[str] | None:
    """Nemotron-H's layer kinds in order (``mamba``, ``attention``, ``mlp``, ``moe``): ``layers_block_type``
    (NemotronHConfig.to_dict's spelling; ``layer_types`` its attribute_map's), else ``hybrid_override_pattern``; None
    where none spells ``layers``."""
    spelled = config.get("layers_block_type") or config.get("layer_types") or config.get("hybrid_override_pattern")
    if not isinstance(spelled, (list, str)) or len(spelled) != layers:
        return None
    kinds = [NEMOTRON_KINDS.get(str(k)) for k in spelled]
    return None if None in kinds else kinds  # type: ignore[return-value]


def hybrid_types(config: dict[str, Any], model_type: str, layers: int) -> tuple[list[str], tuple[int, int, int]] | None:
    """The per-layer cache kinds and the state size of a hybrid model this module can size; None otherwise (plain
    attention models, or recurrent layers of unknown size)."""
    types = config.get("layer_types")
    kinds = ([_ALIASES.get(str(t), str(t)) for t in types] if isinstance(types, list) and len(types) == layers
             else derived_types(config, model_type, layers))
    if not kinds or not STATEFUL & set(kinds):
        return None
    shape = state_shape(config)
    return (kinds, shape) if shape else None


#: a Mamba-2 mixer's out-projection, by model type: transformers hands its weight straight to mamba-ssm's fused kernel
#: (``mamba_split_conv1d_scan_combined(outproj_weight=self.out_proj.weight)``), so the module's forward never runs on
#: that path and a LoRA adapter on it trains nothing; peft refuses LoRA on it outright for some types
#: (tuners_utils._check_lora_target_modules_mamba: falcon_h1, mamba2, nemotron_h among them), NVIDIA's Automodel recipes
#: exclude it ("mamba layers use custom kernels that take in the out_proj.weight directly")
FUSED_OUT_PROJ = {"granitemoehybrid": "mamba.out_proj", "bamba": "mamba.out_proj", "falcon_h1": "mamba.out_proj",
                  "nemotron_h": "mixer.out_proj", "mamba2": "mixer.out_proj"}
#: the types among them for which peft raises on an out_proj target (peft 0.18-0.19)
PEFT_REFUSES_OUT_PROJ = frozenset({"falcon_h1", "mamba2", "nemotron_h"})


def fused_out_proj(model_type: str) -> str | None:
    """The block path of the Mamba-2 out-projection LoRA cannot adapt in ``model_type``; None for other types."""
    return FUSED_OUT_PROJ.get(model_type)
