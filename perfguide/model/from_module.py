"""ModelSpec from a live ``nn.Module`` (any device, meta included), and exact counts by meta instantiation.

Counts come from the module itself, so classification heads, resized vocabularies, PEFT adapters and
frozen parameters are exact; the shape comes from the module's config when it has one.
"""

from __future__ import annotations

import contextlib
import functools
import io
from typing import Any

from ..errors import InvalidModelError
from . import fields, shape
from .adapted import is_adapter_module, is_adapter_param
from .counting import analytic_count, build_spec
from .facts import ModuleFacts, spec_from_facts
from .inputs import reads_tokens
from .types import BlockKind, Linears, ModelSpec

_ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "vocab_size": ("vocab_size",),
}
_HEAD_ATTRS = ("num_attention_heads", "num_heads", "n_head", "n_heads")


def count_parameters(module: Any) -> tuple[int, int]:
    """(total, trainable) unique parameters; bitsandbytes 4-bit weights count their unpacked elements.

    ``parameters()`` already yields a tied Parameter once. A ``Params4bit`` stores two 4-bit values per byte
    of its quant_storage dtype, as transformers' own ``num_parameters`` accounts for.
    """
    total = trainable = 0
    for p in module.parameters():
        n = p.numel()
        if type(p).__name__ == "Params4bit":
            n *= 2 * getattr(getattr(p, "quant_storage", None), "itemsize", 1)
        total += n
        trainable += n if p.requires_grad else 0
    return total, trainable


def _block_lists(module: Any) -> list[tuple[str, Any]]:
    """(path, ModuleList) of every non-empty ModuleList, largest (by parameters) first."""
    import torch

    lists = [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    return sorted(lists, key=lambda nm: -sum(p.numel() for p in nm[1].parameters()))


def _blocks(module: Any) -> Any | None:
    """The ModuleList holding the most parameters: the transformer blocks in every HF architecture."""
    lists = _block_lists(module)
    return lists[0][1] if lists else None


def _stacks(module: Any) -> tuple[Any, Any] | None:
    """(encoder blocks, decoder blocks) of an encoder-decoder (BART, Whisper, T5...), by the lists' paths."""
    lists = _block_lists(module)
    enc = next((m for n, m in lists if "encoder" in n.split(".")), None)
    dec = next((m for n, m in lists if "decoder" in n.split(".")), None)
    return (enc, dec) if enc is not None and dec is not None and enc is not dec else None


def _experts(module: Any) -> tuple[int, int, bool]:
    """(routed-expert parameters, blocks that hold them, whether each expert is a module of its own).

    transformers 5 keeps each MoE layer's routed experts in one ``experts`` module (fused 3-D tensors; remote code
    and transformers 4 a ModuleList, ``experts.0.w1``); shared experts are named ``shared_expert(s)`` and count as
    always active.
    """
    total, layers, separate = 0, set(), False
    for name, p in module.named_parameters():
        parts = name.split(".")
        if "experts" in parts and not is_adapter_param(name):
            total += p.numel()
            at = parts.index("experts")
            # the block holding them: through the last layer index before 'experts' (``layers.3.mlp.experts``, and
            # Gemma-4's ``layers.3.experts`` beside its dense MLP)
            index = max((i for i in range(at) if parts[i].isdigit()), default=at - 1)
            layers.add(".".join(parts[: index + 1]))
            separate = separate or (at + 1 < len(parts) and parts[at + 1].isdigit())
    return total, len(layers), separate


_ATTENTION_NAMES = ("attn", "attention", "query", "qkv", "q_proj", "k_proj", "v_proj")


def _is_attention(name: str) -> bool:
    """A block Linear of the attention: a fused q/k/v projection is wider than the hidden size too (Falcon's
    query_key_value: 4,672 on falcon-7b), so it must not be read as the MLP's width."""
    return any(part in name.lower() for part in _ATTENTION_NAMES)


def _fused_kv_heads(linears: Linears, h: int, heads: int, head_dim: int) -> int | None:
    """Key/value heads read off a fused q/k/v projection, whose output is (heads + 2 x kv) x head_dim: Falcon's
    configs carry no num_key_value_heads (falcon-7b is multi-query: 4,672 = (71 + 2) x 64, one kv head; falcon-40b's
    new decoder architecture 9,216 = (128 + 2 x 8) x 64). None without a fused projection or when it does not divide."""
    for name, (i, o) in linears.items():
        if i == h and any(k in name.lower() for k in ("query_key_value", "qkv", "c_attn")) and o % head_dim == 0:
            kv2 = o // head_dim - heads
            if kv2 > 0 and kv2 % 2 == 0 and heads % (kv2 // 2) == 0:
                return kv2 // 2
    return None


def _linears(block: Any) -> Linears:
    """(in, out) of each Linear / GPT-2 Conv1D in one block, keyed by its path inside the block."""
    out: Linears = {}
    for name, sub in block.named_modules():
        if is_adapter_module(name, sub):   # a live PeftModel's LoRA factors and wrapped layers
            continue
        if hasattr(sub, "in_features") and hasattr(sub, "out_features"):
            out[name] = (int(sub.in_features), int(sub.out_features))
        elif type(sub).__name__ == "Conv1D" and hasattr(sub, "nx"):
            out[name] = (int(sub.nx), int(sub.nf))
    return out


def _kinds(blocks: Any) -> tuple[BlockKind, ...]:
    """The blocks grouped by their Linears (names and shapes), in order of first appearance; none when all are alike."""
    kinds: dict[tuple[tuple[str, tuple[int, int]], ...], list[int]] = {}
    for index, block in enumerate(blocks):
        kinds.setdefault(tuple(_linears(block).items()), []).append(index)
    if len(kinds) < 2:
        return ()
    return tuple(BlockKind(linears=dict(linears), layers=tuple(layers)) for linears, layers in kinds.items())


#: submodules of a multimodal model that hold its vision encoder and projector (transformers' names)
VISION_MODULES = frozenset({"vision_tower", "vision_model", "multi_modal_projector", "visual"})


def _vision(module: Any) -> list[Any]:
    """The vision encoder / projector submodules (outermost only): Gemma-3, Llama-4, LLaVA, Qwen-VL."""
    found = [m for n, m in module.named_modules() if n.rsplit(".", 1)[-1] in VISION_MODULES]
    inner = {id(s) for m in found for s in m.modules() if s is not m}
    return [m for m in found if id(m) not in inner]


def _vision_params(module: Any) -> int:
    return sum(p.numel() for m in _vision(module) for p in m.parameters())


def _embeddings(module: Any, blocks: Any) -> list[Any]:
    """The text model's embedding tables: not those inside the blocks, not a vision tower's position table."""
    import torch

    skip = [blocks] if blocks is not None else []
    inside = {id(m) for part in (*skip, *_vision(module)) for m in part.modules()}
    return [m for m in module.modules() if isinstance(m, torch.nn.Embedding) and id(m) not in inside]


def _find_heads(block: Any) -> int | None:
    for sub in block.modules():
        for attr in _HEAD_ATTRS:
            value = getattr(sub, attr, None)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _inferred_dims(module: Any, full_config: dict[str, Any]) -> tuple[dict[str, Any], Linears, int]:
    """Shape from config aliases (the language model's own config in a multimodal wrapper), else from the module
    tree; (dims, block linears, embedding params). Encoder-decoders count both stacks."""
    config = shape.decoder_config(full_config)
    stacks = _stacks(module) if full_config.get("is_encoder_decoder") else None
    blocks = stacks[0] if stacks else _blocks(module)
    embeddings = _embeddings(module, blocks)
    if blocks is None or not embeddings:
        raise InvalidModelError(f"cannot infer the shape of {type(module).__name__}: it has no "
                                f"{'block ModuleList' if blocks is None else 'nn.Embedding'} and no transformers "
                                "config; pass a transformers model, its config, a hub id or a size like '7b'.")
    linears = _linears(blocks[0])
    word = max(embeddings, key=lambda e: e.num_embeddings)
    found = {"hidden_size": word.embedding_dim, "num_layers": len(blocks), "vocab_size": word.num_embeddings,
             "num_attention_heads": _find_heads(blocks[0])}
    dims = {k: next((config[a] for a in aliases if isinstance(config.get(a), int)), found[k]) for k, aliases in _ALIASES.items()}
    if not dims["num_attention_heads"]:
        raise InvalidModelError(f"cannot infer the attention head count of {type(module).__name__}: no "
                                f"{'/'.join(_HEAD_ATTRS)} attribute or config key; pass its transformers config.")
    h, heads = dims["hidden_size"], dims["num_attention_heads"]
    wider = [o for name, (i, o) in linears.items() if i == h and o > h and not _is_attention(name)]
    mla = isinstance(config.get("kv_lora_rank"), int)
    head_dim = (config["qk_nope_head_dim"] + config["qk_rope_head_dim"]) if mla else (config.get("head_dim") or h // heads)
    dims |= dict(num_key_value_heads=config.get("num_key_value_heads") or _fused_kv_heads(linears, h, heads, head_dim)
                 or heads, head_dim=head_dim,
                 intermediate_size=shape.ffn_width(config, fields.widest(config.get("intermediate_size"))
                                                   or config.get("ffn_dim") or config.get("encoder_ffn_dim")
                                                   or (min(wider) if wider else 4 * h)),
                 gated_mlp=sum(1 for k in linears if "gate" in k or "wi_0" in k) > 0)
    if stacks:
        dims |= dict(is_encoder_decoder=True, num_layers=len(stacks[0]), num_decoder_layers=len(stacks[1]),
                     decoder_block_linears=_linears(stacks[1][0]))
    else:
        linears = _linears(blocks[-1])  # the last block: an MoE layer where the first ones are dense
        kinds = _kinds(blocks) if len(blocks) == dims["num_layers"] else ()
        dims |= dict(block_kinds=[kind.model_dump(mode="json") for kind in kinds]) if kinds else {}
    unique = {id(e.weight): e.weight.numel() for e in embeddings}   # BART-style stacks share one table: count it once
    return dims, linears, sum(unique.values())


def _output_head(module: Any) -> dict[str, Any]:
    """lm_head_params / tie_word_embeddings as the module really is (tying is decided at load time)."""
    get_out, get_in = getattr(module, "get_output_embeddings", None), getattr(module, "get_input_embeddings", None)
    with contextlib.suppress(Exception):
        out, inp = get_out(), get_in()  # type: ignore[misc]
        if out is not None and getattr(out, "weight", None) is not None:
            tied = inp is not None and out.weight is inp.weight
            return {"lm_head_params": 0 if tied else out.weight.numel(), "tie_word_embeddings": tied}
    return {"lm_head_params": 0, "tie_word_embeddings": False}


def _config_dict(module: Any) -> dict[str, Any]:
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return {}
    with contextlib.redirect_stdout(io.StringIO()):
        return config.to_dict()


def spec_from_module(module: Any, name: str | None = None, source: str = "module") -> ModelSpec:
    """Exact total/trainable counts from ``module``; shape from its config (analytic counters) or the module tree."""
    total, trainable = count_parameters(module)
    if total == 0:
        raise InvalidModelError(f"{type(module).__name__} has no parameters; pass the model itself, not a wrapper.")
    config = _config_dict(module)
    reads_tokens(module, config)
    name = name or str(config.get("_name_or_path") or type(module).__name__)
    counted = analytic_count(config, "lm") if isinstance(config.get("model_type"), str) else None
    if counted is not None:
        base = module.get_base_model() if callable(getattr(module, "get_base_model", None)) else module  # PEFT wrapper
        exact = dict(total_params=total, trainable_params=trainable, architecture=type(base).__name__,
                     separate_expert_modules=_experts(module)[2], vision_params=_vision_params(module),
                     **shape.head_fields({**config, "architectures": [type(base).__name__]}))
        return build_spec(config, counted, name, source, **exact, **_output_head(module))
    return spec_from_facts(config, module_facts(module, config), name, source)


def module_facts(module: Any, config: dict[str, Any]) -> ModuleFacts:
    """What ``module`` itself says beyond its config: exact counts, one block's Linears, tying, experts, vision."""
    total, trainable = count_parameters(module)
    base = module.get_base_model() if callable(getattr(module, "get_base_model", None)) else module  # PEFT wrapper
    dims, linears, embedding = _inferred_dims(module, config)
    expert_params, moe_layers, separate = _experts(module)
    return ModuleFacts(total_params=total, trainable_params=trainable, architecture=type(base).__name__, dims=dims,
                       block_linears=linears, embedding_params=embedding, **_output_head(module), expert_params=expert_params,
                       num_moe_layers=moe_layers, separate_expert_modules=separate, vision_params=_vision_params(module))


#: keys that set a parameter count or a cached tensor's shape: a config class's default for one of them is a
#: 7B-or-671B guess, never a fact about the user's model
SHAPE_KEYS = ("hidden_size", "d_model", "n_embd", "num_hidden_layers", "n_layer", "num_layers", "encoder_layers",
              "decoder_layers", "num_attention_heads", "n_head", "num_heads", "encoder_attention_heads",
              "decoder_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "ffn_dim",
              "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "d_kv", "vocab_size", *shape.EXPERT_KEYS, *shape.TOPK_KEYS,
              "moe_intermediate_size", "shared_expert_intermediate_size", *shape.SHARED_KEYS, "first_k_dense_replace",
              *shape.MLA_KEYS)


_EXPERT_SHAPE_KEYS = frozenset((*shape.EXPERT_KEYS, *shape.TOPK_KEYS, *shape.SHARED_KEYS, "moe_intermediate_size",
                                 "shared_expert_intermediate_size", "first_k_dense_replace"))


def missing_shape_keys(config: dict[str, Any], config_class: Any) -> list[str]:
    """Shape keys the config class would fill from its defaults because ``config`` lacks them (nested text configs too)."""
    parts: list[tuple[str, dict[str, Any], Any]] = [("", config, config_class)]
    text_class = (getattr(config_class, "sub_configs", None) or {}).get("text_config")
    if text_class is not None and hasattr(text_class, "model_type"):
        text = config.get("text_config")
        # a flat config (Qwen2-VL's hub files) gives the text model's keys at the top level: _hf_config checks that the
        # class read them there
        parts.append(("text_config.", text if isinstance(text, dict) else config, text_class))
    dense = shape.listed_moe_layers(config) == 0   # a pattern without MoE layers: the expert keys size nothing
    return [prefix + key for prefix, part, cls in parts for key in SHAPE_KEYS
            if not _given(key, part, cls) and isinstance(getattr(cls, key, None), int)  # a property (Falcon's head_dim) is derived
            and not (dense and key in _EXPERT_SHAPE_KEYS)]


#: config keys a config class still reads under an older name (BloomConfig.__init__: "Backward compatibility with
#: n_embed kwarg", which bigscience/bloom-560m's config.json still writes; Lfm2Config.__post_init__ pops LiquidAI's
#: ``block_ff_dim`` into ``intermediate_size``, the only width LFM2's config.json files write)
_LEGACY_NAMES = {"hidden_size": ("n_embed",), "intermediate_size": ("block_ff_dim",)}

@functools.cache
def _derives_head_dim(config_class: Any) -> bool:
    """Whether the config class sets ``head_dim`` to ``qk_rope_head_dim`` itself, the rope slice its rotary reads
    (transformers 5.24's DeepseekV3Config / DeepseekV32Config and kin: ``self.head_dim = self.qk_rope_head_dim``), so
    their config.json files write no head_dim (DeepSeek-V3.2's). Others with the same rope key keep a head_dim of their
    own (DeepSeek-V4's 512), which a missing key would take from the class default. Asked of the class itself, built
    from its defaults with an unusual rope width; a class that cannot be built so derives nothing."""
    from huggingface_hub.errors import StrictDataclassError

    try:
        return getattr(config_class(qk_rope_head_dim=18), "head_dim", None) == 18
    except (TypeError, ValueError, KeyError, AttributeError, StrictDataclassError):   # a class that refuses the defaults alone
        return False


def _given(key: str, part: dict[str, Any], config_class: Any) -> bool:
    """Whether ``part`` sets ``key`` itself, under a name the class maps onto it (``attribute_map``: Bloom's
    ``num_attention_heads`` is ``n_head``), under a legacy name its constructor still reads, or (``head_dim``) through
    the rope slice a latent-attention class derives it from."""
    mapped = getattr(config_class, "attribute_map", None) or {}
    names = {key, *(alias for alias, target in mapped.items() if target == key), *_LEGACY_NAMES.get(key, ())}
    if key == "head_dim" and "qk_rope_head_dim" in part and _derives_head_dim(config_class):
        names.add("qk_rope_head_dim")
    return any(name in part for name in names)


def _hf_config(config: dict[str, Any]) -> Any:
    """A transformers config object for ``config``, built from transformers' own classes only.

    A key that sets the model's shape and is missing is refused with the full list: transformers would fill it
    from its config class (DeepSeek-V3's 671B defaults for ``{"model_type": "deepseek_v3"}``).
    """
    import transformers

    model_type = str(config.get("model_type"))
    # the lazy mapping's .get() answers None for every key; indexing loads the class
    config_class = transformers.CONFIG_MAPPING[model_type] if model_type in transformers.CONFIG_MAPPING else None
    missing = missing_shape_keys(config, config_class) if config_class is not None else []
    if missing:
        raise InvalidModelError(f"config for model_type {model_type!r} is missing required keys {', '.join(map(repr, missing))}; "
                                "give them (the values in the checkpoint's config.json), or pass a hub id or local path.")
    try:
        hf = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidModelError(f"model_type {model_type!r} is not known to perfguide or transformers "
                                f"{transformers.__version__} ({str(exc).splitlines()[0][:120]}).") from None
    _check_flat_text_keys(config, hf, model_type)
    return hf


def _check_flat_text_keys(config: dict[str, Any], hf: Any, model_type: str) -> None:
    """A flat config's text keys must land in the built text_config: Qwen2-VL's config class moves them there
    (``__post_init__``: "Hub configs are saved as flat dicts"); a class that does not would build its defaults."""
    text = getattr(hf, "text_config", None)
    if text is None or isinstance(config.get("text_config"), dict):
        return
    ignored = [key for key in SHAPE_KEYS if key in config and getattr(text, key, config[key]) != config[key]]
    if ignored:
        raise InvalidModelError(f"config for model_type {model_type!r} gives {', '.join(map(repr, ignored))} at the top level, "
                                "where its config class does not read them; give them under 'text_config'.")


def _auto_class(transformers: Any, hf_config: Any, trust_remote_code: bool) -> Any:
    """AutoModelForCausalLM where the config has a causal-LM class, else AutoModel; an encoder-decoder's config
    (``is_encoder_decoder``) AutoModelForSeq2SeqLM first (Whisper: AutoModelForSpeechSeq2Seq), since BART, mBART, Pegasus, Marian and BlenderBot also have
    a decoder-only ForCausalLM class that would count one stack of the two (BART-large: 254M of 406M). Asked of the
    auto mapping first (a dict lookup): a failed ``from_config`` names every class in its error message, which imports
    all ~800 model modules (5.6 s for EvollaConfig the first time, the slowest input of bench/fuzz.py's model-type walk)."""
    remote = trust_remote_code and isinstance(getattr(hf_config, "auto_map", None), dict)
    speech = transformers.AutoModelForSpeechSeq2Seq
    text = type(hf_config) in transformers.AutoModelForSeq2SeqLM._model_mapping   # SeamlessM4T: its text-to-text model
    if type(hf_config) in speech._model_mapping and not remote and not text:
        # the whole model: WhisperForCausalLM is its decoder alone (an assistant model), 154M of whisper-small's 242M;
        # a speech front end perfguide does not price is then refused by what the class reads (model/inputs.py)
        return speech
    seq2seq = (transformers.AutoModelForSeq2SeqLM,) if getattr(hf_config, "is_encoder_decoder", False) else ()
    for auto in (*seq2seq, transformers.AutoModelForCausalLM, transformers.AutoModel):
        if type(hf_config) in auto._model_mapping or (remote and auto.__name__ in hf_config.auto_map):
            return auto
    # the words transformers' own error starts with; the caller turns it into the one-line refusal
    raise ValueError(f"Unrecognized configuration class {type(hf_config).__name__} for AutoModelForCausalLM or AutoModel")


def spec_via_meta_module(config: dict[str, Any], name: str, source: str, *, hf_config: Any = None,
                         trust_remote_code: bool = False) -> ModelSpec:
    """Count a config whose model type or head has no analytic counter by building it on the meta device.

    From a dict only classes shipped with transformers are used (``AutoConfig.for_model``), so no repository
    code runs; a remote-code ``hf_config`` the caller already trusted is built with ``trust_remote_code``.
    """
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise InvalidModelError(f"model_type {config.get('model_type')!r} needs transformers to be counted "
                                f"({exc}); pass a supported config or install transformers.") from None
    hf_config = hf_config if hf_config is not None else _hf_config(config)
    arch = fields.architecture(config)
    cls = getattr(transformers, arch, None) if arch else None
    with torch.device("meta"):
        if cls is not None:
            module = cls._from_config(hf_config)
        else:  # no head class transformers knows: the LM head, as for the analytic counters
            module = _auto_class(transformers, hf_config, trust_remote_code).from_config(hf_config, trust_remote_code=trust_remote_code)
    return spec_from_module(module, name, source)
