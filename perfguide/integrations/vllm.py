"""Recommendation -> vLLM: ``EngineArgs`` / ``vllm.LLM`` kwargs and the ``vllm serve`` command line.

Names are those of vLLM 0.33.0 (vllm/engine/arg_utils.py); tests check every one against the names that
version's parser registers (tests/data/engine_flags.json, extracted by scripts/engine_flags.py), because
vLLM pins a CUDA torch and cannot be installed beside this project's test environment.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from .._serving_data import serving_facts
from ..errors import PerfGuideError
from ..setup import ServingSetup

if TYPE_CHECKING:
    from ..recommendation import Recommendation

_DTYPES = {"fp16": "float16"}


def serving_of(rec: Recommendation, engine: str) -> ServingSetup:
    """The plan's engine settings; a transformers plan or the other engine's plan is one clear line."""
    s = rec.setup.serving
    if s is None or s.engine != engine:
        have = s.engine if s is not None else "transformers"
        raise PerfGuideError(f"this plan is for engine={have!r}, not {engine!r}; "
                             f"use recommend(..., scenario='infer_gpu_one' or 'infer_gpu_many', engine={engine!r})")
    return s


def vllm_args(rec: Recommendation) -> dict[str, Any]:
    """Kwargs for ``vllm.LLM(**kw)`` / ``EngineArgs(**kw)``; data_parallel_size > 1 is for ``vllm serve``."""
    s = serving_of(rec, "vllm")
    kw: dict[str, Any] = {
        "model": rec.model.name,
        "dtype": _DTYPES.get(s.weight_format, "bfloat16"),
        "tensor_parallel_size": s.tensor_parallel_size,
        "pipeline_parallel_size": s.pipeline_parallel_size,
        "data_parallel_size": s.data_parallel_size,
        "max_model_len": s.max_model_len,
        "gpu_memory_utilization": s.gpu_memory_utilization,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "quantization": serving_facts().formats[s.weight_format].vllm,
        "kv_cache_dtype": s.kv_cache_dtype,
        "enable_prefix_caching": s.enable_prefix_caching,
        "enforce_eager": s.enforce_eager,
    }
    return kw


def vllm_command(rec: Recommendation) -> str:
    """``vllm serve MODEL --flag value ...``: the same settings as :func:`vllm_args`, as the CLI spells them."""
    kw = vllm_args(rec)
    parts = ["vllm", "serve", shlex.quote(kw.pop("model"))]
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:  # False is the engine's default for every switch the plan can turn off
            continue
        if value is True:
            parts.append(flag)
        else:
            parts += [flag, shlex.quote(str(value))]
    return " ".join(parts)
