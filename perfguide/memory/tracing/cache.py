"""On-disk cache of traced steps, keyed by architecture config, traced depth and the setup's shape.

A trace costs seconds; planners price the same (model, shape) many times across runs, so results are kept as
small JSON files. The key includes the torch/transformers versions and the tracer version, because a library
upgrade can change which tensors a module saves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..._cache import cache_root
from .step import StepTrace

logger = logging.getLogger("perfguide.memory.trace")

#: Bump when the tracer's accounting changes, so stale cache entries are ignored.
TRACER_VERSION = 4  # 2: CUDA native_dropout (1-byte masks) emulated; 3: memory-bound traffic counted; 4: rows not taken for packed sequences (step._unpacked_rows)
#: Config keys that never change tensor bytes (names, provenance, generation defaults).
_IRRELEVANT = ("_name_or_path", "transformers_version", "architectures_note", "torch_dtype", "dtype", "auto_map",
               "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "_commit_hash")


def cache_dir() -> Path:
    """``trace/`` under perfguide's cache root (see perfguide._cache)."""
    return cache_root() / "trace"


def cache_key(config: dict[str, Any], depth: int, shape: dict[str, Any]) -> str:
    import torch
    import transformers

    arch = {k: v for k, v in config.items() if k not in _IRRELEVANT}
    blob = json.dumps({"config": arch, "depth": depth, "shape": shape, "tracer": TRACER_VERSION,
                       "torch": torch.__version__, "transformers": transformers.__version__}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def load(key: str) -> StepTrace | None:
    path = cache_dir() / f"{key}.json"
    try:
        return StepTrace.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValidationError, ValueError) as exc:
        logger.debug("ignoring unreadable trace cache entry %s: %s", path, exc)
        return None


def store(key: str, trace: StepTrace) -> None:
    """Write atomically (temp file + rename) so concurrent planners never read half a file."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{key}.{os.getpid()}.tmp"
        try:
            tmp.write_text(trace.model_dump_json(), encoding="utf-8")
            tmp.replace(directory / f"{key}.json")
        except BaseException:  # Ctrl-C or a full disk: no half-written temp file is left behind
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        logger.warning("could not write trace cache in %s: %s", directory, exc)
