"""Turn a raw HF config dict and a Setup into the exact modules a Trainer would train, built on ``meta``.

Building on ``meta`` allocates nothing and takes well under a second even for 70B shapes; the tracer then moves
the modules onto fake tensors. Depth is a parameter so that 1- and 2-block models can stand in for the full stack.
"""

from __future__ import annotations

import copy
from typing import Any

from ...errors import InvalidModelError
from ...model.types import AUDIO_MODEL_TYPES
from ...setup import Setup
from ...techniques import traced_model

#: Config keys holding the number of blocks, per stack. Encoder-decoder models list both stacks.
DEPTH_KEYS: tuple[tuple[str, ...], ...] = (
    ("num_layers", "num_decoder_layers"),      # t5, mt5, umt5
    ("encoder_layers", "decoder_layers"),      # bart, marian, whisper
    ("num_hidden_layers",), ("n_layer",), ("num_layers",), ("n_layers",),
)
#: Keys that make blocks differ along depth in a way a prefix of the stack cannot represent.
HETEROGENEOUS_KEYS: tuple[str, ...] = ("first_k_dense_replace", "mlp_only_layers", "moe_layer_freq", "decoder_sparse_step", "no_rope_layers")
#: Per-layer lists that must be cut to the traced depth.
PER_LAYER_KEYS: tuple[str, ...] = ("layer_types", "mlp_layer_types", "intermediate_size", "activation_sparsity_pattern")   # the last two: Gemma 3n

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "bfloat16", "nf4": "bfloat16"}
LM_SUFFIXES = ("ForCausalLM", "ForMaskedLM", "ForConditionalGeneration", "LMHeadModel", "ForPreTraining")


def depth_keys(config: dict[str, Any]) -> tuple[str, ...]:
    """The keys that set depth in this config (both stacks for encoder-decoders)."""
    for keys in DEPTH_KEYS:
        if all(isinstance(config.get(k), int) for k in keys):
            return keys
    raise InvalidModelError(f"cannot find the number of layers in config of model_type {config.get('model_type')!r}; "
                            f"expected one of {', '.join(k for ks in DEPTH_KEYS for k in ks)}")


def depth_period(config: dict[str, Any]) -> int | None:
    """Smallest block pattern that repeats along depth, or None when a prefix cannot stand for the stack.

    Uniform stacks have period 1; alternating sliding/full attention (``layer_types``) has its pattern length.
    """
    keys = depth_keys(config)
    depths = {config[k] for k in keys}
    if len(depths) != 1 or any(config.get(k) not in (None, 0, 1, [], ()) for k in HETEROGENEOUS_KEYS if k != "decoder_sparse_step") \
            or (config.get("decoder_sparse_step") or 1) > 1:
        return None
    depth = depths.pop()
    types = config.get("layer_types")
    if not types:
        return 1
    for p in range(1, depth + 1):
        if depth % p == 0 and all(types[i] == types[i % p] for i in range(len(types))):
            return p
    return None


def with_depth(config: dict[str, Any], depth: int) -> dict[str, Any]:
    """A copy of the config with every stack cut to ``depth`` blocks."""
    out = copy.deepcopy(config)
    for k in depth_keys(config):
        out[k] = depth
    for k in PER_LAYER_KEYS:
        if isinstance(out.get(k), list):
            out[k] = out[k][:depth]
    if isinstance(out.get("per_layer_config"), dict):   # Gemma-4's saved overrides, keyed by layer index
        out["per_layer_config"] = {k: v for k, v in out["per_layer_config"].items() if int(k) < depth}
    return out


def _hf_config(config: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    cfg = dict(config)
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise InvalidModelError("config dict has no 'model_type'; tracing needs the HF architecture (e.g. 'llama')")
    for k in ("transformers_version", "_name_or_path", "auto_map", "quantization_config", "torch_dtype", "dtype"):
        cfg.pop(k, None)
    if isinstance(cfg.get("per_layer_config"), dict):   # saved with string keys ("05"); the config class takes ints
        cfg["per_layer_config"] = {int(k): v for k, v in cfg["per_layer_config"].items()}
    try:
        return AutoConfig.for_model(model_type, **cfg)
    except ValueError as exc:
        raise InvalidModelError(f"transformers {__import__('transformers').__version__} does not know model_type {model_type!r}: {exc}") from None


def _model_class(hf_config: Any) -> Any:
    import transformers

    for name in getattr(hf_config, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if cls is not None and name.endswith(LM_SUFFIXES):
            return cls
    for auto in ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM"):
        mapping = getattr(transformers, auto)._model_mapping
        if type(hf_config) in mapping:
            return mapping[type(hf_config)]
    raise InvalidModelError(f"no language-model head class for model_type {hf_config.model_type!r}; tracing needs one")


def _speech_lengths(config: dict[str, Any], setup: Setup) -> dict[str, Any]:
    """Whisper's encoder takes exactly ``max_source_positions`` positions and its decoder at most
    ``max_target_positions``: a traced step at other lengths is the same model with position tables that fit them
    (a real run's lengths are the model's own, scenarios/speech.py)."""
    if config.get("model_type") not in AUDIO_MODEL_TYPES:
        return config
    return {**config, "max_source_positions": setup.seq_len,
            "max_target_positions": max(int(config.get("max_target_positions") or 0), setup.decoder_len)}


def build_on_meta(config: dict[str, Any], setup: Setup) -> Any:
    """The model a Trainer would train under ``setup``: dtype, attention, LoRA adapters, and what the techniques it
    uses change in the module graph (their ``trace_model`` hooks); on meta."""
    import torch

    hf_config = _hf_config(_speech_lengths(config, setup))
    cls = _model_class(hf_config)
    attn = "eager" if setup.attn_implementation == "eager" else "sdpa"  # flash_attention_2 is emulated on sdpa
    dtype = getattr(torch, DTYPES[setup.weights_dtype])
    with torch.device("meta"):
        model = cls._from_config(hf_config, attn_implementation=attn, dtype=dtype)
    model.train()
    if setup.lora is not None:
        model = _add_lora(model, setup)
    return traced_model(setup, model)


def _add_lora(model: Any, setup: Setup) -> Any:
    from peft import LoraConfig, get_peft_model

    lora = setup.lora
    assert lora is not None, "called only for LoRA setups"
    targets = lora.target_modules if lora.target_modules == "all-linear" else list(lora.target_modules)
    cfg = LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=targets, lora_dropout=0.0, task_type=None)
    return get_peft_model(model, cfg)
