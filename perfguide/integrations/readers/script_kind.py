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
from typing import Any

from .base import ConfigReadError, under

#: TRL's own scripts, by the path its docs launch them with
TRL_SCRIPTS = {"trl/scripts/sft.py": "SFTConfig", "trl/scripts/dpo.py": "DPOConfig"}
#: the arguments classes whose flags perfguide prices
PRICED = ("TrainingArguments", "Seq2SeqTrainingArguments", "SFTConfig", "DPOConfig")
#: TRL's config classes for objectives perfguide does not price (trl's top level and trl.experimental, 1.16 / HEAD);
#: a class of another name (a script's own TrainingArguments subclass, its data arguments) decides nothing
UNPRICED = ("GRPOConfig", "KTOConfig", "RewardConfig", "RLOOConfig", "DistillationConfig", "OnlineDPOConfig", "ORPOConfig",
            "CPOConfig", "BCOConfig", "PRMConfig", "GKDConfig", "NashMDConfig", "XPOConfig", "PPOConfig", "GOLDConfig",
            "SDFTConfig", "SDPOConfig", "TPOConfig", "GMPOConfig", "A2POConfig")
_PARSER = re.compile(r"(?:TrlParser|HfArgumentParser\s*\(|dataclass_types\s*=)\s*\(?\s*\(([^)]*)\)")
_NAME = re.compile(r"\b([A-Z]\w*)\b")
_LARGEST = 2_000_000


def source_of(script: str, base_dir: str) -> str | None:
    """The script's text, where it is on disk here (None: not found, or too large to be a training script)."""
    path = under(script, base_dir)
    if path.is_file() and path.stat().st_size <= _LARGEST:
        return path.read_text(encoding="utf-8", errors="replace")
    return None


def config_class(script: str, source: str | None) -> tuple[str | None, bool]:
    """(the training-arguments class ``script`` parses into, among PRICED and UNPRICED, or None: the flags decide;
    whether TRL's ModelConfig is parsed beside it, whose defaults then load the model)."""
    if source is not None:
        names = [n for call in _PARSER.findall(source) for n in _NAME.findall(call)]
        found = [n for n in names if n in PRICED or n in UNPRICED]
        if found:
            return found[0], "ModelConfig" in names
    normal = script.replace("\\", "/")
    cls = next((c for suffix, c in TRL_SCRIPTS.items() if normal.endswith(suffix)), None)
    return cls, cls is not None


def check_priced(script: str, cls: str | None) -> None:
    if cls is not None and cls not in PRICED:
        raise ConfigReadError(f"{script} parses its flags into {cls}, a training objective perfguide does not price; accepted: "
                              f"scripts on {', '.join(PRICED)} (SFT, DPO and the Trainer's next-token loss)")


def uses_trl_parser(script: str, source: str | None) -> bool:
    """Whether the script parses with TRL's TrlParser (which reads ``--config FILE``), by its text or TRL's own path."""
    if source is not None:
        return "TrlParser" in source
    return any(script.replace("\\", "/").endswith(suffix) for suffix in TRL_SCRIPTS)


def arguments(script: str, source: str | None, cls: str | None, words: list[str], base_dir: str) -> tuple[dict[str, Any], str | None]:
    """(the script's settings, the YAML they came from or None), as its parser takes them. TrlParser
    (trl/scripts/utils.py, trl 1.16) reads ``--config FILE`` as defaults the flags override, and only that spelling;
    HfArgumentParser refuses a word that is no flag ("Some specified arguments are not used"), except where the
    script reads a sole YAML / JSON argument itself (``parse_yaml_file``). A word the parser would stop on is refused
    here rather than passed over, which priced the class defaults instead of the file the user meant."""
    from .script_flags import parse

    leading = next((words[:i] for i, w in enumerate(words) if w.startswith("-")), words)
    data = parse(words)
    trl = uses_trl_parser(script, source)
    if any(w.startswith("--config=") for w in words) and trl:
        raise ConfigReadError(f"{script} parses with TrlParser, which finds its YAML only as two words, `--config FILE`; "
                              "`--config=FILE` stops it as an unknown argument")
    if leading and cls is not None:
        sole = words == leading and len(leading) == 1 and leading[0].endswith((".yaml", ".yml", ".json"))
        if sole and not trl and source is not None and ("parse_yaml_file" in source or "parse_json_file" in source):
            return _file(leading[0], base_dir), leading[0]
        how = "`--config FILE` (TrlParser)" if trl else "--flags (HfArgumentParser refuses a word that is no flag)"
        raise ConfigReadError(f"{script} does not read {leading[0]!r} as given: its parser takes {how}; "
                              f"pass {'--config ' + leading[0] if trl else 'the settings as --key value flags'}")
    if source is None and not trl and data.get("config") not in (None, True):   # its values would be dropped unread
        raise ConfigReadError(f"{script} is not a file here, so which parser reads --config {data['config']} is unknown; run the "
                              "check where the script is (a TrlParser script takes the YAML's values under its flags)")
    config = data.pop("config", None) if trl else None
    if config in (None, True):
        return data, None
    return {**_file(str(config), base_dir), **data}, str(config)


def _file(path: str, base_dir: str) -> dict[str, Any]:
    """A script's YAML / JSON of argument values; TrlParser's ``env`` block sets variables, no argument."""
    from . import load

    values = load(str(under(path, base_dir)))
    values.pop("env", None)
    return values


#: the Auto classes a training script may load its model with -> the head it trains (model.tasks.TASKS)
_HEADS = {"AutoModelForSequenceClassification": "seq-cls", "AutoModelForTokenClassification": "token-cls",
          "AutoModelForQuestionAnswering": "qa"}


def head_of(source: str | None) -> str | None:
    """The head a script trains, where its source loads exactly one task head and no LM (transformers' run_glue.py:
    ``AutoModelForSequenceClassification.from_pretrained``); None: the model's own."""
    if source is None or re.search(r"AutoModelFor(CausalLM|Seq2SeqLM|MaskedLM)\b", source):
        return None
    found = {task for cls, task in _HEADS.items() if re.search(rf"\b{cls}\b", source)}
    return found.pop() if len(found) == 1 else None
