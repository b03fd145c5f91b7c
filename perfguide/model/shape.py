"""Reading what a config says about experts, latent attention, the attention pattern and the head, for any family.

transformers spells the same fact differently per family (``num_local_experts`` in Mixtral and GPT-OSS,
``num_experts`` in Qwen-MoE and OLMoE, ``n_routed_experts`` in DeepSeek and GLM-MoE); the alias tables here are
the one place perfguide knows those spellings. Everything is plain dict reading: no torch, no transformers.
"""

from __future__ import annotations

from typing import Any

from . import fields
from .recurrent import STATEFUL, hybrid_types, state_dtype
from .types import LayerType

EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "moe_k", "top_k_experts")   # the last: Gemma-4
SHARED_KEYS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")   # the last: ERNIE-4.5, Aria
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
_LAYER_TYPES: frozenset[str] = frozenset({"full_attention", "sliding_attention", "chunked_attention", "dummy"})
#: every ``sliding_window_pattern``-th layer is global, the others slide (the config classes' __post_init__)
_PATTERN_DEFAULTS = {"gemma2": 2, "gpt_oss": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}


#: keys a family keeps in nested dicts under its own names, read as the names every other family uses, by model type:
#: DBRX's ``attn_config`` (DbrxAttentionConfig) and ``ffn_config`` (DbrxFFNConfig: each expert's width, the routed
#: experts and their top-k; transformers 5.24 models/dbrx/configuration_dbrx.py). MPT also nests an ``attn_config``,
#: whose llm-foundry keys transformers' MptAttention does not read (no grouped K/V), so it is not listed
NESTED_KEYS = {"dbrx": {"attn_config": {"kv_n_heads": "num_key_value_heads", "rope_theta": "rope_theta"},
                        "ffn_config": {"ffn_hidden_size": "intermediate_size", "moe_num_experts": "num_local_experts",
                                       "moe_top_k": "num_experts_per_tok"}}}


def decoder_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's own config: ``text_config`` of a multimodal wrapper (Gemma-3, Llama-4), else itself;
    a family's nested keys (NESTED_KEYS) read at the top level, where a top-level key of the same name wins."""
    text = config.get("text_config")
    base = text if isinstance(text, dict) and text else config
    nested = NESTED_KEYS.get(str(base.get("model_type")), {})
    flat = {new: sub[old] for key, names in nested.items() if isinstance(sub := base.get(key), dict)
            for old, new in names.items() if old in sub}
    return {**flat, **base} if flat else base


def ffn_width(config: dict[str, Any], written: int) -> int:
    """The FFN width a config's blocks build from the width it writes: LFM2's MLP (transformers Lfm2MLP) takes two thirds
    of ``intermediate_size`` (``block_ff_dim``) under ``block_auto_adjust_ff_dim``, then scales it by
    ``block_ffn_dim_multiplier`` and rounds it up to ``block_multiple_of``; every other config builds what it writes."""
    if not (str(config.get("model_type", "")).startswith("lfm2") and config.get("block_auto_adjust_ff_dim")):
        return written
    width = int(2 * written / 3)
    multiplier, multiple = config.get("block_ffn_dim_multiplier"), config.get("block_multiple_of") or 1
    if isinstance(multiplier, (int, float)) and not isinstance(multiplier, bool):
        width = int(multiplier * width)
        width = multiple * ((width + multiple - 1) // multiple)
    return width


def _first_int(config: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _moe_layer_count(config: dict[str, Any], layers: int) -> int:
    """Layers whose MLP is routed, by the family's rule (dense-first layers, sparse steps, interleaving; ERNIE-4.5's
    moe_layer_start_index / _interval / _end_index, the last inclusive)."""
    first_dense = _first_int(config, ("first_k_dense_replace", "num_dense_layers", "moe_layer_start_index")) or 0
    step = _first_int(config, ("decoder_sparse_step", "interleave_moe_layer_step", "moe_layer_freq", "moe_layer_interval")) or 1
    last = _first_int(config, ("moe_layer_end_index",))
    last = layers - 1 if last is None or last < 0 else last
    dense_only = set(config.get("mlp_only_layers") or ())
    moe_layers = [i for i in range(layers)
                  if first_dense <= i <= last and i not in dense_only and (i + 1) % max(step, 1) == 0]
    explicit = config.get("moe_layers")
    if isinstance(explicit, list) and explicit:
        return len(explicit)
    return len(moe_layers)


def listed_moe_layers(config: dict[str, Any]) -> int | None:
    """MoE layers a config lists by kind: a hybrid's (Nemotron-H: 'E' in ``hybrid_override_pattern``, "moe" in the
    ``layers_block_type`` its config class writes), or transformers 5's ``mlp_layer_types`` ("dense" or a routed kind
    per layer: "sparse" for DeepSeek-V3.2, GLM-4.7-Flash, HunYuan-v3 ..., "moe" / "hash_moe" for DeepSeek-V4, which
    their classes build from, over first_k_dense_replace); None where the config lists no layer kinds."""
    blocks = config.get("layers_block_type")
    if isinstance(blocks, list):
        return sum(b == "moe" for b in blocks)
    mlp = config.get("mlp_layer_types")
    if isinstance(mlp, list) and mlp:
        return sum(t != "dense" for t in mlp)
    pattern = config.get("hybrid_override_pattern")
    return pattern.count("E") if isinstance(pattern, str) else None


def moe_fields(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """ModelSpec MoE fields from the config; empty for a dense model (a listed pattern without MoE layers too: a dense
    Nemotron-H's config class still carries expert defaults)."""
    experts = _first_int(config, EXPERT_KEYS) or 1
    listed = listed_moe_layers(config)
    routed = listed if listed is not None else _moe_layer_count(config, layers)
    if experts <= 1 or routed == 0:   # a MoE type whose every layer is dense (num_dense_layers = depth) is dense
        return {}
    topk = _first_int(config, TOPK_KEYS) or 1
    shared = _first_int(config, SHARED_KEYS)
    # Qwen2-MoE: one wide shared expert; Nemotron-H spells it moe_shared_expert_intermediate_size (NemotronHMoE builds
    # its shared_experts MLP at that width)
    shared_width = _first_int(config, ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")) or None
    if shared is None and config.get("enable_moe_block"):
        # Gemma-4's MoE layers run their dense MLP (intermediate_size) beside the experts on every token
        # (Gemma4TextDecoderLayer): an always-on expert of that width
        shared, shared_width = 1, _first_int(config, ("intermediate_size",))
    if shared is None:  # Llama-4's MoE layer always has one shared expert of the routed width (Llama4TextMoe)
        shared = 1 if shared_width or str(config.get("model_type")).startswith("llama4") else 0
    return {"num_experts": experts, "num_experts_per_tok": min(topk, experts), "num_shared_experts": shared,
            "moe_intermediate_size": _first_int(config, ("moe_intermediate_size", "expert_intermediate_size")),
            "shared_expert_intermediate_size": shared_width if shared else None,
            "num_moe_layers": routed}


def mla_fields(config: dict[str, Any]) -> dict[str, Any]:
    """Latent-attention ranks and head dims; empty unless the config has ``kv_lora_rank``."""
    if not isinstance(config.get("kv_lora_rank"), int):
        return {}
    return {key: config.get(key) for key in MLA_KEYS}


def _sliding_window(config: dict[str, Any]) -> int | None:
    """Qwen2/Qwen3 name a window but switch it off with ``use_sliding_window: false``."""
    window = config.get("sliding_window")
    if window is None and isinstance(config.get("sliding_window_size"), int):   # MiMo-V2-Flash: the window plus the query
        window = config["sliding_window_size"] + 1
    if config.get("use_sliding_window") is False or not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    return window


def _derived_layer_types(config: dict[str, Any], model_type: str, layers: int, window: int | None) -> list[str] | None:
    """What the family's config class computes when ``layer_types`` is absent (transformers 5.24 __post_init__)."""
    if model_type in _PATTERN_DEFAULTS and window is not None:
        pattern = _first_int(config, ("sliding_window_pattern",)) or _PATTERN_DEFAULTS[model_type]
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and window is not None:
        first = _first_int(config, ("max_window_layers",)) or 28
        return ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    if model_type in ("llama4", "llama4_text"):
        chunk = config.get("attention_chunk_size", 8192)
        interval = _first_int(config, ("no_rope_layer_interval",)) or 4
        rope = config.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
        return ["chunked_attention" if r and chunk is not None else "full_attention" for r in rope]
    if model_type == "smollm3":
        interval = _first_int(config, ("no_rope_layer_interval",)) or 4
        rope = config.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
        slide = bool(config.get("use_sliding_window")) and window is not None
        return ["sliding_attention" if slide and not r else "full_attention" for r in rope]
    return None


def attention_fields(config: dict[str, Any], model_type: str, layers: int) -> dict[str, Any]:
    """Sliding window, Llama-4 chunk size, per-layer types and score soft-capping of the (decoder) config."""
    window = _sliding_window(config)
    chunk = config.get("attention_chunk_size") if model_type.startswith("llama4") else None
    if model_type.startswith("llama4") and "attention_chunk_size" not in config:
        chunk = 8192  # Llama4TextConfig's default
    types = config.get("layer_types")
    # accelerate big_modeling._refuse_recurrent_layers_under_sequence_parallelism's test, on the config's own names
    recurrent = tuple(sorted({t for t in types if isinstance(t, str) and "linear_attention" in t})) if isinstance(types, list) else ()
    hybrid = hybrid_types(config, model_type, layers)
    if hybrid is not None:
        types = hybrid[0]
        recurrent = recurrent or tuple(sorted(STATEFUL & set(types)))
    elif not (isinstance(types, list) and len(types) == layers and set(types) <= _LAYER_TYPES):
        types = _derived_layer_types(config, model_type, layers, window)
    if types is not None and "sliding_attention" in types and window is None:
        types = ["full_attention" if t == "sliding_attention" else t for t in types]
    cap = config.get("attn_logit_softcapping")
    layer_types: tuple[LayerType, ...] | None = tuple(types) if types else None  # type: ignore[arg-type]
    softcap = float(cap) if isinstance(cap, (int, float)) and cap else None
    from .catalog import catalog_file  # here: the catalog's schema imports this module

    sdpa = softcap is None and model_type not in catalog_file().no_sdpa_model_types.value
    channels, kernel, state = hybrid[1] if hybrid is not None else (0, 0, 0)
    return {"sliding_window": window, "attention_chunk_size": chunk if isinstance(chunk, int) else None,
            "layer_types": layer_types, "attn_logit_softcapping": softcap, "supports_sdpa": sdpa, "recurrent_layer_types": recurrent,
            "conv_state_elements": channels * kernel, "recurrent_state_elements": state, "conv_state_kernel": kernel,
            "recurrent_state_dtype": state_dtype(config) if hybrid is not None else None}


def layer_width_fields(config: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Layers that differ along depth (model/layer_widths.py): MiMo-V2-Flash's narrower values and wider sliding layers;
    Gemma 3n's and Gemma-4's last ``num_kv_shared_layers`` layers, which reuse earlier layers' K/V; Gemma 3n's sparse
    FFNs; Gemma-4's full-attention layers (Gemma4TextConfig.__post_init__, transformers 5.24), which take
    ``global_head_dim`` (512 where the config omits it) and, where ``attention_k_eq_v`` (keys double as values),
    ``num_global_key_value_heads``. A Gemma-4 config saved by ``to_dict`` carries the result instead, as
    ``per_layer_config`` entries of its full-attention layers."""
    if model_type.startswith("gemma3n"):   # the same K/V sharing (Gemma3nTextConfig.kv_sharing_modes), one head width
        layers = _first_int(config, ("num_hidden_layers",)) or 0
        pattern = config.get("activation_sparsity_pattern")
        # the class default: the first 10 layers at 0.95 where the model is deeper than 10
        sparse = sum(1 for p in pattern if p) if isinstance(pattern, list) else 10 if layers > 10 else 0
        shared = config.get("num_kv_shared_layers", 15)   # Gemma3nTextConfig's default
        return {"num_kv_shared_layers": shared if isinstance(shared, int) else 0, "sparse_ffn_layers": sparse}
    if model_type == "mimo_v2_flash":   # MiMoV2FlashAttention: values v_head_dim wide, sliding layers 2x the K/V heads
        kv = _first_int(config, ("num_key_value_heads",))
        return {"value_head_dim": _first_int(config, ("v_head_dim",)) or 128, "sliding_key_value_heads": 2 * kv if kv else None}
    if not model_type.startswith("gemma4"):
        return {}
    per_layer = config.get("per_layer_config")
    entry: dict[str, Any] = next(iter(per_layer.values()), {}) if isinstance(per_layer, dict) and per_layer else {}
    kv = _first_int(config, ("num_global_key_value_heads",)) if config.get("attention_k_eq_v") else None
    # a saved config that lists no override (its full layers as wide as the rest) keeps head_dim there
    default = _first_int(config, ("head_dim",)) if isinstance(per_layer, dict) else 512
    return {"global_head_dim": _first_int(config, ("global_head_dim",)) or entry.get("head_dim") or default,
            "num_global_key_value_heads": kv or entry.get("num_key_value_heads"),
            "num_kv_shared_layers": _first_int(config, ("num_kv_shared_layers",)) or 0,
            "hidden_size_per_layer_input": _first_int(config, ("hidden_size_per_layer_input",)) or 0,
            "double_wide_shared_mlp": bool(config.get("use_double_wide_mlp"))}


def head_fields(config: dict[str, Any]) -> dict[str, Any]:
    head = fields.head_kind(config)
    labels = fields.num_labels(config) if head in ("sequence_classification", "token_classification") else None
    return {"head": head, "num_labels": labels}


def read_all(config: dict[str, Any], model_type: str, layers: int) -> dict[str, Any]:
    """Every family-independent ModelSpec field this module reads, for ``layers`` decoder layers."""
    text = decoder_config(config)
    inner_type = str(text.get("model_type") or model_type)
    return {**moe_fields(text, layers), **mla_fields(text), **attention_fields(text, inner_type, layers),
            **layer_width_fields(text, inner_type), **head_fields(config)}
