"""What a checkpoint's ``quantization_config`` says about its stored weights: the one reader of that key.

Training, ``generate`` and the serving engines all read the format from here, the same way: a checkpoint saved
quantized (bitsandbytes 4-bit or 8-bit, GPTQ, AWQ, compressed-tensors, FP8 per tensor or per block, MXFP4,
ModelOpt) keeps its quantized Linears when loaded, so its weights take the bytes its format stores, it cannot be
fully fine-tuned (transformers refuses: "You cannot perform fine-tuning on purely quantized models",
trainer.py), and ``from_pretrained`` must not be handed another quantization config (transformers 5.24
``merge_quantization_configs`` raises "The model is quantized with GPTQConfig but you are passing a
BitsAndBytesConfig config").

Field names as transformers' quantizers and the hub checkpoints write them (transformers
utils/quantization_config.py; compressed-tensors ``config_groups[*].weights {num_bits, type, block_structure}``).
A config that is not a dict at some level is read as absent, never as a crash; a format perfguide cannot
price is refused in one line.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidModelError
from ..setup import CheckpointFormat
from .shape import decoder_config

_SIMPLE: dict[str, CheckpointFormat] = {"awq": "awq", "mxfp4": "mxfp4"}

#: stored formats transformers dequantizes to bf16 at load for training, and the config class that asks it to
#: (``Mxfp4Config(dequantize=True)``; the published gpt-oss fine-tunes train the upcast bf16 weights)
TRAINING_DEQUANTIZE_CONFIG: dict[str, str] = {"mxfp4": "Mxfp4Config"}
_MODELOPT: dict[str, CheckpointFormat] = {"fp8": "fp8", "nvfp4": "nvfp4"}
ACCEPTED = ("bitsandbytes 4/8-bit, gptq 4-bit, awq, fp8 (per tensor or block), mxfp4, compressed-tensors fp8/w4a16/nvfp4, "
            "modelopt fp8/nvfp4")


def _compressed_tensors(q: dict[str, Any]) -> CheckpointFormat | None:
    """The format of a compressed-tensors checkpoint from its first config group's weight scheme."""
    groups = q.get("config_groups")
    for group in (groups.values() if isinstance(groups, dict) else ()):
        w = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(w, dict):
            continue
        bits, kind = w.get("num_bits"), w.get("type")
        if bits == 8 and kind == "float":
            return "fp8_block" if w.get("block_structure") else "fp8"
        if bits == 4 and kind == "int":
            return "w4a16"
        if bits == 4 and kind == "float":
            return "nvfp4"
    return None


def _bitsandbytes(q: dict[str, Any]) -> CheckpointFormat | None:
    """bitsandbytes writes both ``load_in_4bit`` and ``_load_in_4bit`` (BitsAndBytesConfig.to_dict); older
    checkpoints carry no ``quant_method`` at all, so the flags decide."""
    if q.get("load_in_4bit") is True or q.get("_load_in_4bit") is True:
        return "nf4"
    if q.get("load_in_8bit") is True or q.get("_load_in_8bit") is True:
        return "int8"
    return None


def quantization_config(config: Any) -> dict[str, Any] | None:
    """The raw ``quantization_config`` dict (top level, else the language model's ``text_config``), or None."""
    if not isinstance(config, dict):
        return None
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        q = decoder_config(config).get("quantization_config")
    return q if isinstance(q, dict) and q else None


def ignored_modules(config: Any) -> list[str]:
    """The module names a checkpoint's quantization_config keeps unquantized: ``modules_to_not_convert``
    (fbgemm_fp8, bitsandbytes, AWQ, MXFP4), ``ignore`` (compressed-tensors) or ``ignored_layers`` (FP8 block)."""
    q = quantization_config(config) or {}
    names = q.get("modules_to_not_convert") or q.get("ignore") or q.get("ignored_layers") or []
    return [str(n) for n in names] if isinstance(names, list) else []


def checkpoint_format(config: Any) -> CheckpointFormat | None:
    """The format the checkpoint's weights are stored in; None for a plain 16/32-bit checkpoint.

    ``"nf4"`` / ``"int8"`` are bitsandbytes 4-bit / 8-bit; the others name the serving formats
    (setup.CheckpointFormat). Raises InvalidModelError for a quantization_config perfguide cannot price.
    """
    q = quantization_config(config)
    if q is None:
        return None
    raw = q.get("quant_method")
    method = str(getattr(raw, "value", raw) or "").strip().lower()[:40]   # transformers' QuantizationMethod enum too
    found: CheckpointFormat | None = None
    if method in ("", "bitsandbytes"):
        found = _bitsandbytes(q)
    elif method in _SIMPLE:
        found = _SIMPLE[method]
    elif method == "gptq":
        found = "gptq" if q.get("bits", 4) == 4 else None
    elif method == "fp8":
        found = "fp8_block" if q.get("weight_block_size") else "fp8"
    elif method == "compressed-tensors":
        found = _compressed_tensors(q)
    elif method == "modelopt":
        found = _MODELOPT.get(str(q.get("quant_algo", "")).lower())
    if found is None:
        raise InvalidModelError(f"the checkpoint's quantization_config (quant_method={method!r}) is not a format perfguide "
                                f"prices; accepted: {ACCEPTED}")
    return found
