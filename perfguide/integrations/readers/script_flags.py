"""A training script's command-line flags, as ``HfArgumentParser.parse_args_into_dataclasses`` reads them
(``--per_device_train_batch_size 4 --bf16 --deepspeed ds.json``): TrainingArguments / SFTConfig / TRL ModelConfig
keys, read by perfguide.integrations.readers.training_args; changes come back as flags."""

from __future__ import annotations

import json
from typing import Any

from .base import Collector, as_int, nest
from .hf_keys import SEQ2SEQ
from .training_args import is_sft
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


def read(data: dict[str, Any], col: Collector, base_dir: str | None = None, args_class: str | None = None,
         model_config: bool | None = None) -> None:
    """``args_class``: the class the script parses into (script_kind), whose defaults apply; None: the flags say.
    ``model_config``: whether TRL's ModelConfig is parsed too (its float32 load default); None: an SFT script's is."""
    trl = args_class in ("SFTConfig", "DPOConfig")
    if not trl and not (args_class is None and is_sft(data)):
        data = _own_lengths(data, col)
        data = _seq2seq_arguments(data, col)
    read_training_args(data, col, base_dir=base_dir, sft=True if trl else None if args_class is None else False,
                       dpo=args_class == "DPOConfig" if args_class is not None else None, model_config=model_config)


#: the length flags of transformers' example scripts' own DataTrainingArguments (examples/pytorch: run_clm's
#: ``block_size``, run_glue / run_mlm / run_ner / run_qa's ``max_seq_length``, run_summarization / run_translation's
#: ``max_source_length`` and ``max_target_length``), which TrainingArguments does not have
OWN_LENGTHS = {"block_size": "seq_len", "max_seq_length": "seq_len", "max_source_length": "seq_len", "max_target_length": "target_len"}


def _own_lengths(data: dict[str, Any], col: Collector) -> dict[str, Any]:
    """A TrainingArguments script's own length flags, read as the lengths they set (the rest goes on as before)."""
    out = dict(data)
    for key, field in OWN_LENGTHS.items():
        if out.get(key) not in (None, True):
            col.set(field, as_int(out.pop(key), col.where(key)), f"{key} (the script's own data argument, as transformers' examples name it)")
    return out


def _seq2seq_arguments(data: dict[str, Any], col: Collector) -> dict[str, Any]:
    """Seq2SeqTrainingArguments' own flags (the seq2seq and speech example scripts parse into it): read, not priced
    (``predict_with_generate``'s evaluation is not priced, as no evaluation is)."""
    found = sorted(k for k in data if k in SEQ2SEQ)
    col.ignore(*found)
    return {k: v for k, v in data.items() if k not in found}


def _flag_value(key: str, value: Any, setup: Any) -> Any:
    """A value as the flag's parser takes it. ``fsdp`` and ``deepspeed`` are string arguments on the command line
    (TrainingArguments: ``fsdp: str | None``, ``deepspeed: dict | str | None``): 'False' / 'None' would be read as
    an FSDP option or a config path and refused, so off is the empty string and FSDP on is its sharding option,
    which transformers folds into fsdp_config (whose reshard_after_forward, when given, wins)."""
    if isinstance(value, dict):
        return json.dumps(value)
    if key in ("fsdp", "deepspeed") and value in (False, None):
        return ""
    if key == "fsdp" and value is True:
        return "full_shard" if setup.gathers_params else "shard_grad_op"
    return value


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """As TrainingArguments keys, spelled as flags; a nested key (``fsdp_config.activation_checkpointing``) becomes its
    parent's flag with a JSON object, the one spelling HfArgumentParser takes for a dict argument."""
    keys, rest = write_training_args(changes, setup)
    return {f"--{k}": _flag_value(k, v, setup) for k, v in nest(keys).items()}, rest
