"""data/techniques.json: constants of the technique terms and per-family precision facts, validated once at load.

A missing constant or a misspelt key fails here, not as a KeyError deep inside a plan.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict

from ._data import load


class _Constant(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: float
    source: str


class _Fp16Families(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fine: dict[str, str]
    overflows: dict[str, str]
    source: str


class TechniqueConstants(BaseModel):
    """data/techniques.json, validated once: a missing constant or a misspelt key fails at load."""

    model_config = ConfigDict(extra="forbid")
    liger_flce_bytes_per_logit: _Constant
    fused_rmsnorm_bytes_per_element: _Constant
    fused_rope_bytes_per_element: _Constant
    fused_swiglu_bytes_per_element: _Constant
    fp8_cast_bytes_per_element: _Constant
    fp8_cast_bytes_per_element_eager: _Constant
    fp8_cast_kernels_per_linear: _Constant
    fp8_cast_kernels_per_linear_compiled: _Constant
    fp8_peak_fraction: _Constant
    compile_kernel_fraction: _Constant
    compile_seconds_per_layer_type: _Constant
    compile_seconds_base: _Constant
    paged_pcie_passes: _Constant
    activation_offload_pcie_passes: _Constant
    fp16_by_family: _Fp16Families


@cache
def constants() -> TechniqueConstants:
    data = {k: v for k, v in load("techniques").items() if not k.startswith("_")}
    return TechniqueConstants.model_validate(data)


def fp16_verdict(model_type: str) -> tuple[str, str]:
    """('fine' | 'overflows' | 'unknown', source) for fine-tuning a bf16-trained ``model_type`` in fp16 AMP."""
    table = constants().fp16_by_family
    if model_type in table.fine:
        return "fine", table.fine[model_type]
    if model_type in table.overflows:
        return "overflows", table.overflows[model_type]
    return "unknown", table.source


