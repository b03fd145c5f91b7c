"""A live module's training state, read once: the LoRA adapter a PeftModel carries and bnb-quantized Linears.

A model that arrives adapted or quantized is planned as it is: pricing a PeftModel as a full fine-tune (or a
4-bit model as 16-bit) describes a run that cannot happen with that object, and ``prepare_model`` would then
have to keep an adapter the plan does not describe.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import InvalidModelError
from ..setup import LoraSpec
from .types import ModelSpec

logger = logging.getLogger("perfguide.model")

#: parameter-name parts of PEFT's LoRA tensors (peft/tuners/lora/layer.py adapter_layer_names) and of the trainable
#: head copies ``modules_to_save`` adds: none of them is a weight of the base model
ADAPTER_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector", "modules_to_save")
#: bitsandbytes Linear classes -> the Setup weights_dtype they store
BNB_LINEARS = {"Linear4bit": "nf4", "Linear8bitLt": "int8"}


def is_adapter_param(name: str) -> bool:
    return any(f".{part}." in f".{name}." for part in ADAPTER_PARTS)


def is_param_wrapper(module: Any) -> bool:
    """peft's ``lora.ParamWrapper``: LoRA on a module's parameter (target_parameters), not on the module as a Linear."""
    return type(module).__name__ == "ParamWrapper"


def is_adapter_module(name: str, module: Any) -> bool:
    """A module PEFT added or moved inside a block: its LoRA factors, the ``base_layer`` it wrapped (the wrapper keeps
    the name and shape), and a ``ParamWrapper`` (target_parameters: it wraps a module that holds the 3-D expert
    tensors, no Linear of the model, though it carries in_features / out_features)."""
    return is_param_wrapper(module) or any(f".{part}." in f".{name}." for part in (*ADAPTER_PARTS, "base_layer"))


def quantization(module: Any) -> str | None:
    """'nf4' / 'int8' when the module holds bitsandbytes Linears, else None."""
    found = {BNB_LINEARS[type(m).__name__] for m in module.modules() if type(m).__name__ in BNB_LINEARS}
    if len(found) > 1:
        raise InvalidModelError(f"{type(module).__name__} mixes 4-bit and 8-bit bitsandbytes Linears; perfguide prices one weight format")
    return found.pop() if found else None


def _block_path(name: str, paths: list[str]) -> str | None:
    """The block-relative path (``self_attn.q_proj``) an adapted module's full name ends with, longest first."""
    return next((p for p in sorted(paths, key=len, reverse=True) if name == p or name.endswith("." + p)), None)


#: module names PEFT's ``modules_to_save`` can wrap that the memory model prices: the token embedding and the LM head
#: of the catalog's families (Llama / Mistral / Qwen2 embed_tokens, GPT-2 and Qwen-1 wte, GPT-NeoX embed_in / embed_out,
#: BLOOM word_embeddings, T5 shared; lm_head / embed_out / output heads). PEFT's own additions for classification
#: tasks (classifier, score: a few thousand parameters) are left out, as before.
SAVED_EMBEDDINGS = ("embed_tokens", "wte", "embed_in", "word_embeddings", "shared", "tok_embeddings")
SAVED_HEADS = ("lm_head", "embed_out", "output")


#: torch dtype names -> perfguide's dtype words (LoraSpec.adapter_dtype, Setup.weights_dtype)
TORCH_DTYPE_NAMES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def lora_adapter(module: Any, block_paths: list[str]) -> LoraSpec | None:
    """The active LoRA adapter of a PeftModel as a LoraSpec (its rank, alpha, options and the block Linears it adapts)."""
    configs = getattr(module, "peft_config", None)
    active = getattr(module, "active_adapter", None)
    if not isinstance(configs, dict) or active not in configs:
        return None
    cfg = configs[active]
    kind = type(cfg).__name__
    if kind != "LoraConfig":
        raise InvalidModelError(f"the model carries a {kind} adapter; perfguide plans LoRA adapters only: merge it "
                                "(merge_and_unload()) or pass the base model")
    if getattr(cfg, "rank_pattern", None) or getattr(cfg, "alpha_pattern", None):
        raise InvalidModelError("the model's LoRA adapter uses rank_pattern/alpha_pattern (per-module ranks); perfguide prices "
                                "one rank: pass the base model and plan lora={'r': ...}")
    adapted = [n for n, m in module.named_modules()
               if hasattr(m, "lora_A") and hasattr(m, "base_layer") and not is_param_wrapper(m)]
    targets = sorted({p for p in (_block_path(n, block_paths) for n in adapted) if p})
    outside = [n for n in adapted if _block_path(n, block_paths) is None]
    if outside:
        logger.warning("LoRA adapters outside the transformer blocks are not priced: %s", ", ".join(outside[:3]))
    if not targets:
        raise InvalidModelError("the model's LoRA adapter adapts no Linear inside the transformer blocks; perfguide prices block adapters")
    alpha = cfg.lora_alpha
    # adapters left in a 16-bit base's dtype (peft before 0.12, or get_peft_model(autocast_adapter_dtype=False))
    # the adapters' dtype as the module holds them (a trainer's own cast included: TRL's bf16 on a quantized base)
    held = {TORCH_DTYPE_NAMES.get(str(p.dtype)) for n, p in module.named_parameters() if ".lora_A." in n or ".lora_B." in n}
    sixteen = bool(held & {"bf16", "fp16"})
    return LoraSpec(r=cfg.r, alpha=int(alpha) if float(alpha).is_integer() else max(1, round(alpha)), target_modules=tuple(targets),
                    dropout=float(cfg.lora_dropout), use_dora=bool(cfg.use_dora), use_rslora=bool(cfg.use_rslora),
                    autocast_adapter_dtype=not sixteen, adapter_dtype=held.pop() if len(held) == 1 else None,
                    modules_to_save=tuple(n for n in getattr(cfg, "modules_to_save", None) or ()
                                          if n.rsplit(".", 1)[-1] in SAVED_EMBEDDINGS + SAVED_HEADS),
                    target_parameters=tuple(sorted(getattr(cfg, "target_parameters", None) or ())))


def with_module_state(spec: ModelSpec, module: Any) -> ModelSpec:
    """``spec`` of a live module with its adapter and weight format; a PeftModel's counts become its base's."""
    adapter = lora_adapter(module, spec.linear_paths)
    quant = quantization(module)
    if adapter is None and quant is None:
        return spec
    update: dict[str, Any] = {"adapter": adapter, "quantization": quant}
    if adapter is not None:
        extra = [p for n, p in module.named_parameters() if is_adapter_param(n)]
        update["total_params"] = spec.total_params - sum(p.numel() for p in extra)
        if spec.trainable_params is not None:
            update["trainable_params"] = spec.trainable_params - sum(p.numel() for p in extra if p.requires_grad)
    return spec.model_copy(update=update)
