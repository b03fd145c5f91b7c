"""A training script's command-line flags, as ``HfArgumentParser.parse_args_into_dataclasses`` reads them
(``--per_device_train_batch_size 4 --bf16 --deepspeed ds.json``): TrainingArguments / SFTConfig / TRL ModelConfig
keys, read by perfguide.integrations.readers.training_args; changes come back as flags."""

from __future__ import annotations

import json
from typing import Any

from .base import Collector, nest
from .training_args import read as read_training_args
from .training_args import write as write_training_args

FORMAT = "script_flags"
SYNTAX = "flags"


def parse(tokens: list[str]) -> dict[str, Any]:
    """``--key value``, ``--key=value``, a bare ``--flag`` (True), and ``--key a b`` (a list, as nargs='+' reads it)."""
    out: dict[str, Any] = {}
    key: str | None = None
    for token in tokens:
        if token.startswith("--"):
            name, eq, value = token[2:].partition("=")
            key = None if eq else name.replace("-", "_")
            out[name.replace("-", "_")] = value if eq else True
        elif key is not None:
            current = out[key]
            out[key] = token if current is True else [*current, token] if isinstance(current, list) else [current, token]
    return out


def read(data: dict[str, Any], col: Collector, base_dir: str | None = None) -> None:
    read_training_args(data, col, base_dir=base_dir)


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """As TrainingArguments keys, spelled as flags; a nested key (``fsdp_config.activation_checkpointing``) becomes its
    parent's flag with a JSON object, the one spelling HfArgumentParser takes for a dict argument."""
    keys, rest = write_training_args(changes, setup)
    return {f"--{k}": json.dumps(v) if isinstance(v, dict) else v for k, v in nest(keys).items()}, rest
