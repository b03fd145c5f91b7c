"""Which arguments class a launched training script parses its flags into, read from the script itself.

``python trl/scripts/sft.py --model_name_or_path X`` takes SFTConfig's defaults (checkpointing on, bf16,
max_length 1024) and ModelConfig's float32 load, not TrainingArguments'; ``python trl/scripts/kto.py`` trains an
objective perfguide does not price. Without this, a TRL script's flags were read as TrainingArguments unless one of
them happened to be an SFTConfig-only key. The script names its classes in its parser call
(``TrlParser((ScriptArguments, SFTConfig, ModelConfig))``, ``HfArgumentParser((...))``, TRL's own scripts'
``dataclass_types = (...)``), as every script of TRL's
``trl/scripts`` and ``examples/scripts`` does; TRL's own two are also known by path, for a command copied from its
docs where the script is not on disk.
"""

from __future__ import annotations

import re

from .base import ConfigReadError, under

#: TRL's own scripts, by the path its docs launch them with
TRL_SCRIPTS = {"trl/scripts/sft.py": "SFTConfig", "trl/scripts/dpo.py": "DPOConfig"}
#: the arguments classes whose flags perfguide prices
PRICED = ("TrainingArguments", "Seq2SeqTrainingArguments", "SFTConfig", "DPOConfig")
_PARSER = re.compile(r"(?:TrlParser|HfArgumentParser\s*\(|dataclass_types\s*=)\s*\(?\s*\(([^)]*)\)")
_CLASS = re.compile(r"\b([A-Z]\w*(?:Config|TrainingArguments))\b")
_NOT_TRAINING = ("ModelConfig", "DatasetMixtureConfig")
_LARGEST = 2_000_000


def config_class(script: str, base_dir: str) -> str | None:
    """The training-arguments class ``script`` parses into (None: not found, the flags decide)."""
    path = under(script, base_dir)
    if path.is_file() and path.stat().st_size <= _LARGEST:
        calls = _PARSER.findall(path.read_text(encoding="utf-8", errors="replace"))
        names = [n for call in calls for n in _CLASS.findall(call) if n not in _NOT_TRAINING]
        if names:
            return names[0]
    normal = script.replace("\\", "/")
    return next((cls for suffix, cls in TRL_SCRIPTS.items() if normal.endswith(suffix)), None)


def check_priced(script: str, cls: str | None) -> None:
    if cls is not None and cls not in PRICED:
        raise ConfigReadError(f"{script} parses its flags into {cls}, a training objective perfguide does not price; accepted: "
                              f"scripts on {', '.join(PRICED)} (SFT, DPO and the Trainer's next-token loss)")
