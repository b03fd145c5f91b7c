"""A checkpoint's own weight format, read from its config.json ``quantization_config`` (what the engines read
to pick their kernels): bitsandbytes 4-bit, GPTQ, AWQ, compressed-tensors (FP8, W4A16, NVFP4), FP8 per
tensor or per block, MXFP4, ModelOpt. A plan serves the checkpoint as given, so its bytes come from here.

Field names as transformers' quantizers and the checkpoints write them (transformers/utils/quantization_config.py;
compressed-tensors QuantizationConfig.config_groups[*].weights {num_bits, type, group_size}).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidModelError

_SIMPLE = {"awq": "awq", "mxfp4": "mxfp4"}
_MODELOPT = {"fp8": "fp8", "nvfp4": "nvfp4"}


def _compressed_tensors(q: dict[str, Any]) -> str | None:
    """The format of a compressed-tensors checkpoint from its first config group's weight scheme."""
    for group in (q.get("config_groups") or {}).values():
        w = (group or {}).get("weights") or {}
        bits, kind = w.get("num_bits"), w.get("type")
        if bits == 8 and kind == "float":
            return "fp8_block" if w.get("block_structure") else "fp8"
        if bits == 4 and kind == "int":
            return "w4a16"
        if bits == 4 and kind == "float":
            return "nvfp4"
    return None


def checkpoint_format(config: dict[str, Any] | None) -> str | None:
    """The serving format of the weights a config describes; None for a plain 16/32-bit checkpoint."""
    q = (config or {}).get("quantization_config")
    if not isinstance(q, dict) or not q:
        return None
    method = str(q.get("quant_method", "")).lower()
    found: str | None = None
    if method in _SIMPLE:
        found = _SIMPLE[method]
    elif method == "gptq":
        found = "gptq" if q.get("bits", 4) == 4 else None
    elif method == "bitsandbytes":
        found = "nf4" if q.get("load_in_4bit") else "int8" if q.get("load_in_8bit") else None
    elif method == "fp8":
        found = "fp8_block" if q.get("weight_block_size") else "fp8"
    elif method == "compressed-tensors":
        found = _compressed_tensors(q)
    elif method == "modelopt":
        found = _MODELOPT.get(str(q.get("quant_algo", "")).lower())
    if found is None:
        raise InvalidModelError(f"the checkpoint's quantization_config (quant_method={method!r}) is not a format perfguide prices; "
                                "accepted: bitsandbytes 4/8-bit, gptq 4-bit, awq, fp8 (per tensor or block), mxfp4, "
                                "compressed-tensors fp8/w4a16/nvfp4, modelopt fp8/nvfp4")
    return found
