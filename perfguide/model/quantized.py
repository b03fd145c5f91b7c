"""What a checkpoint's ``quantization_config`` says about its stored weights: the one reader of that key.

A checkpoint saved quantized (bitsandbytes 4-bit or 8-bit, GPTQ, AWQ, compressed-tensors, ...) keeps its
quantized Linears when loaded: it cannot be fully fine-tuned (transformers refuses to train a quantized model
without adapters: "You cannot perform fine-tuning on purely quantized models", trainer.py), and its weights
take the bytes its format stores. Planning reads the format from here.
"""

from __future__ import annotations

from typing import Any

from .shape import decoder_config


def checkpoint_quantization(config: dict[str, Any] | None) -> str | None:
    """``"nf4"`` (bitsandbytes 4-bit), ``"int8"`` (bitsandbytes 8-bit), the ``quant_method`` of any other format
    ("gptq", "awq", "fp8", ...), or None for an unquantized checkpoint."""
    if not isinstance(config, dict):
        return None
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        qc = decoder_config(config).get("quantization_config")
    if not isinstance(qc, dict) or not qc:
        return None
    method = str(qc.get("quant_method") or "").strip().lower()
    if qc.get("load_in_4bit") is True or qc.get("_load_in_4bit") is True:
        return "nf4"
    if qc.get("load_in_8bit") is True or qc.get("_load_in_8bit") is True:
        return "int8"
    return method or "unknown"
