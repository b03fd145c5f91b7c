"""Recommendation -> SGLang: the ``python -m sglang.launch_server`` command line.

Flag names are SGLang 0.5.23's (python/sglang/srt/arg_groups/fields/*.py); full names (``--tp-size``, not the
``--tp`` abbreviation argparse would also accept) so the command never depends on prefix matching. Tests check
them against tests/data/engine_flags.json, extracted from that version's sources by scripts/engine_flags.py.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from .._serving_data import serving_facts
from .vllm import serving_of

if TYPE_CHECKING:
    from ..recommendation import Recommendation

_KV = {"fp8": "fp8_e4m3", "auto": "auto"}


def sglang_flags(rec: Recommendation) -> list[tuple[str, str | None]]:
    """(flag, value) pairs; a None value is a bare switch."""
    s = serving_of(rec, "sglang")
    flags: list[tuple[str, str | None]] = [
        ("--model-path", rec.model.name),
        ("--tp-size", str(s.tensor_parallel_size)),
        ("--dp-size", str(s.data_parallel_size)),
        ("--context-length", str(s.max_model_len)),
        ("--mem-fraction-static", str(s.gpu_memory_utilization)),
        ("--max-running-requests", str(s.max_num_seqs)),
        ("--chunked-prefill-size", str(s.max_num_batched_tokens)),
        ("--kv-cache-dtype", _KV[s.kv_cache_dtype]),
        ("--dtype", "float16" if s.weight_format == "fp16" else "bfloat16"),
    ]
    quant = serving_facts().formats[s.weight_format].sglang
    if quant:
        flags.append(("--quantization", quant))
    if s.enforce_eager:
        flags.append(("--cuda-graph-backend-decode", "disabled"))
    if not s.enable_prefix_caching:
        flags.append(("--disable-radix-cache", None))
    return flags


def sglang_command(rec: Recommendation) -> str:
    parts = ["python", "-m", "sglang.launch_server"]
    for flag, value in sglang_flags(rec):
        parts += [flag] if value is None else [flag, shlex.quote(value)]
    return " ".join(parts)
