"""Readers of the configs practitioners already have, one module per format; ``read_file`` / ``read_object`` pick one.

Each module has ``FORMAT``, ``SYNTAX`` (how a change is shown: kwargs, yaml, json, flags), ``read(data, collector)``
and ``write(changes, setup) -> (keys, rest)``, which turns Setup changes back into the format's own keys.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from .base import Collector, ConfigReadError, Reading

#: format -> module (imported on first use); the order is the order detection tries them in
MODULES = {"accelerate": "accelerate", "deepspeed": "deepspeed", "axolotl": "axolotl", "llamafactory": "llamafactory",
           "torchtune": "torchtune", "training_args": "training_args", "launcher": "launcher", "script_flags": "script_flags",
           "peft_example": "peft_example", "fsdp_qlora": "fsdp_qlora", "swift": "swift", "litgpt": "litgpt",
           "arctic_training": "arctic_training"}


def module(fmt: str) -> ModuleType:
    if fmt not in MODULES:
        raise ConfigReadError(f"unknown config format {fmt!r}; accepted: {', '.join(MODULES)}")
    return importlib.import_module(f".{MODULES[fmt]}", __name__)


def load(path: str) -> dict[str, Any]:
    """A JSON or YAML file as a dict; anything else (a missing file, a list, a syntax error) is one line."""
    try:
        p = Path(path).expanduser()
        text = p.read_text(encoding="utf-8")
    except (OSError, ValueError, RuntimeError) as exc:  # ValueError: a NUL in the path; RuntimeError: ~user unknown
        if isinstance(exc, UnicodeDecodeError):
            raise ConfigReadError(f"{path!r} is not a text file; pass a JSON or YAML config") from None
        raise ConfigReadError(f"cannot read {path[:200]!r} ({getattr(exc, 'strerror', None) or exc}); pass an existing config file") from None
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigReadError(f"{p.name} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
        except RecursionError:
            raise ConfigReadError(f"{p.name} nests deeper than Python's JSON parser allows; pass a flat config") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except RecursionError:
            raise ConfigReadError(f"{p.name} nests deeper than the YAML parser allows; pass a flat config") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise ConfigReadError(f"{p.name} is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigReadError(f"{p.name} must hold a mapping of config keys, got {type(data).__name__ if data else 'nothing'}")
    return data


def detect(data: dict[str, Any]) -> str:
    """Which format a parsed file is, from the keys only that format has."""
    if "distributed_type" in data or "compute_environment" in data:
        return "accelerate"
    if "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data:
        return "deepspeed"
    if "base_model" in data:
        return "axolotl"
    if "checkpoint_dir" in data and ("train" in data or "precision" in data):   # LitGPT's finetune / pretrain YAML
        return "litgpt"
    if isinstance(data.get("model"), dict) and "name_or_path" in data["model"] and isinstance(data.get("data"), dict):
        return "arctic_training"   # an ArcticTraining recipe: model.name_or_path beside a data block
    if any(isinstance(v, dict) and "_component_" in v for v in data.values()):   # torchtune's instantiable blocks
        return "torchtune"
    if isinstance(data.get("model"), str) and _LLAMAFACTORY_V1 & set(data):
        raise ConfigReadError("a LLaMA-Factory v1 config (model / dist_config / kernel_config, for its v1 trainer) is not read "
                              "yet; the v0 YAML of llamafactory-cli train (model_name_or_path, finetuning_type, "
                              "per_device_train_batch_size) is")
    if _LLAMAFACTORY & set(data):
        return "llamafactory"
    return "training_args"


#: keys only LLaMA-Factory's (v0) configs have: its training keys, and its chat template / inference / export keys,
#: which its chat, API and export configs carry without a training key (examples/inference, examples/merge_lora)
_LLAMAFACTORY = frozenset({"finetuning_type", "stage", "cutoff_len", "template", "infer_backend", "export_dir"})
#: keys only LLaMA-Factory's v1 configs have (examples/v1 at ff6d4d12), beside a string ``model``
_LLAMAFACTORY_V1 = frozenset({"model_class", "dist_config", "kernel_config", "quant_config", "peft_config", "train_dataset"})


def read_file(path: str, fmt: str | None = None) -> Reading:
    data = load(path)
    fmt = fmt or detect(data)
    col = Collector(fmt, Path(path).name)
    base_dir = str(Path(path).expanduser().resolve().parent)
    mod = module(fmt)
    if fmt == "deepspeed":
        mod.read(data, col)
    else:
        mod.read(data, col, base_dir=base_dir)
    return col.reading()


def read_command(argv: list[str] | str) -> list[Reading]:
    """A launch command: the script's flags first (they own the run's settings), then the launcher, then any
    accelerate config file the launcher names; ``NAME=value`` words before it are the environment it runs in."""
    import shlex

    words = shlex.split(argv) if isinstance(argv, str) else list(argv)
    base_dir = str(Path.cwd())
    env, words = environment(words)
    if words and words[0].rsplit("/", 1)[-1] == "swift":
        from . import swift

        return swift.read_command(words, env, base_dir)
    if words and words[0].rsplit("/", 1)[-1] == "litgpt":
        from . import litgpt

        return litgpt.read_command(words, base_dir)
    from .tool_commands import LLAMAFACTORY_ENV

    readings = _read_launched(words, base_dir, env)
    lf = words[:1] and words[0].rsplit("/", 1)[-1] == "llamafactory-cli"
    unread = [k for k in env if not (lf and k in LLAMAFACTORY_ENV)]
    if unread:   # ms-swift's and LLaMA-Factory's launchers take their process counts from the environment; others do not
        first = readings[0]
        said = f"environment {', '.join(unread)} before the command: not read (the launcher's flags and configs say the run)"
        readings[0] = first.model_copy(update={"notes": (*first.notes, said)})
    return readings


def environment(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """The ``NAME=value`` words a shell line sets before its command, and the command."""
    env: dict[str, str] = {}
    i = 0
    while i < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[i], re.S):
        name, _, value = words[i].partition("=")
        env[name] = value
        i += 1
    return env, words[i:]


#: axolotl's training entry point as a module, the form its docs launch under accelerate, torchrun and python
AXOLOTL_MODULE = "axolotl.cli.train"


def _read_launched(words: list[str], base_dir: str, env: dict[str, str]) -> list[Reading]:
    from . import fsdp_qlora, launcher, peft_example, script_flags, script_kind, swift

    if words and words[0].rsplit("/", 1)[-1] == "trl":
        from . import trl_cli

        return trl_cli.read(words, base_dir)
    if words and words[0].rsplit("/", 1)[-1] in ("tune", "llamafactory-cli", "axolotl"):
        from . import tool_commands

        return tool_commands.read(words, base_dir, env)
    if words[:1] and words[0].rsplit("/", 1)[-1] in launcher.PYTHONS and words[1:3] == ["-m", AXOLOTL_MODULE]:
        from . import tool_commands

        one = Collector("launcher", "python -m")
        one.set("num_gpus", 1, "one process (python, not a launcher)")
        return [*tool_commands.read(["axolotl", "train", *words[3:]], base_dir), one.reading()]
    name, flags, path, script_args = launcher.split(words)
    if swift.is_cli_script(path):   # ms-swift's own entry under accelerate / torchrun: the launcher counts the processes
        outer = Collector("launcher", f"{name} flags")
        got = [*launcher.read_launcher(name, flags, outer, base_dir)]
        got.insert(0, outer.reading())
        per_node = next((x.value for r in got for x in r.settings if x.field == "num_gpus"), 1)
        nodes = next((x.value for r in got for x in r.settings if x.field == "nodes"), 1)
        return [swift.read_launched(script_args, int(per_node) * int(nodes), base_dir), *got]
    if path == AXOLOTL_MODULE and (flags.get("m") or flags.get("module")):   # `accelerate launch -m axolotl.cli.train cfg.yml`
        from . import tool_commands

        inner = tool_commands.read(["axolotl", "train", *script_args], base_dir)
        return _under_launcher(name, {k: v for k, v in flags.items() if k not in ("m", "module")}, base_dir, inner)
    if _llamafactory_entry(path, script_args, base_dir):   # `accelerate launch ... src/train.py examples/x.yaml`
        from . import tool_commands

        return _under_launcher(name, flags, base_dir, tool_commands.read(["llamafactory-cli", "train", *script_args], base_dir))
    source = script_kind.source_of(path, base_dir)
    cls, model_config = script_kind.config_class(path, source)
    script_kind.check_priced(path, cls)
    data, config = script_kind.arguments(path, source, cls, script_args, base_dir)
    if fsdp_qlora.is_fsdp_qlora(source) if source is not None else fsdp_qlora.its_flags(data):
        script = Collector("fsdp_qlora", "train.py flags (Answer.AI fsdp_qlora)")
        if source is None:
            script.note(f"{path} is not on disk here: read as Answer.AI's fsdp_qlora train.py by its flags (--train_type ...)")
        fsdp_qlora.read(data, script, base_dir=base_dir)
    elif source is not None and peft_example.is_peft_example(source):
        script = Collector("peft_example", "script flags (PEFT examples/sft/train.py)")
        peft_example.read(data, script, base_dir=base_dir)
    else:
        over = "" if config is None else f" over {Path(config).name}"
        script = Collector("script_flags", ("script flags" if cls is None else f"script flags ({cls})") + over)
        script.task = script_kind.head_of(source)   # run_glue.py's classifier, read from the class the script loads
        script_flags.read(data, script, base_dir=base_dir, args_class=cls, model_config=model_config)
    return _under_launcher(name, flags, base_dir, [script.reading()])


def _under_launcher(name: str, flags: dict[str, Any], base_dir: str, inner: list[Reading]) -> list[Reading]:
    """The script's readings, then the launcher's flags and the config files they name (the process count)."""
    from . import launcher

    outer = Collector("launcher", f"{name} flags")
    extra = launcher.read_launcher(name, flags, outer, base_dir)
    return [*inner, outer.reading(), *extra]


#: LLaMA-Factory's entry scripts, which read the YAML given first (src/train.py and src/llamafactory/launcher.py call
#: run_exp, whose parser loads argv[1] and takes key=value overrides after it: hparams/parser.py read_args)
_LLAMAFACTORY_ENTRIES = ("train.py", "launcher.py")


def _llamafactory_entry(path: str, script_args: list[str], base_dir: str) -> bool:
    """A launched LLaMA-Factory entry script given a LLaMA-Factory YAML, as its README launches it under accelerate."""
    if Path(path).name not in _LLAMAFACTORY_ENTRIES or not script_args or not script_args[0].endswith((".yaml", ".yml")):
        return False
    config = Path(base_dir, script_args[0]).expanduser()
    try:
        return config.is_file() and detect(load(str(config))) == "llamafactory"
    except ConfigReadError:
        return False


def read_object(obj: Any) -> Reading:
    """A TrainingArguments / SFTConfig / DPOConfig instance (every priced attribute read, plus what differs from the class
    default), or a plain dict of their kwargs."""
    from . import training_args

    if isinstance(obj, dict):
        col = Collector("training_args", "config")
        training_args.read(obj, col)
        return col.reading()
    name = type(obj).__name__
    col = Collector("training_args", name)
    dpo = hasattr(obj, "precompute_ref_log_probs") and hasattr(obj, "beta")   # TRL's DPOConfig
    training_args.read(object_values(obj), col, sft=hasattr(obj, "packing") and hasattr(obj, "max_length"), dpo=dpo)
    return col.reading()


def object_values(obj: Any) -> dict[str, Any]:
    """The kwargs an args dataclass instance stands for: priced fields always, the others where they differ from the
    field's default (as ``__post_init__`` normalises it). No fresh instance is built to compare with: building a
    TrainingArguments resets accelerate's process state, which would break the Trainer running this check."""
    import dataclasses

    from . import training_args

    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise ConfigReadError(f"config must be a file path, a command, a dict or a TrainingArguments / SFTConfig, got {type(obj).__name__}")
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if f.name in ("gradient_checkpointing", "gradient_checkpointing_kwargs", "output_dir", "local_rank"):
            continue  # deprecated mirrors of activation_checkpointing*, and where / which rank, not how
        value = getattr(obj, f.name, None)
        value = getattr(value, "value", value)  # enums (optim, strategies) as their words
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.name in training_args.PRICED or not _is_default(value, default):
            out[f.name] = value
    return out


def _is_default(value: Any, default: Any) -> bool:
    """Equal to the default, or what ``__post_init__`` makes of it: "" / None -> [] or False, "none" -> ["none"],
    None -> a helper object (accelerator_config)."""
    if value == default or (not value and not default):
        return True
    if isinstance(value, list) and isinstance(default, str):
        return [str(getattr(v, "value", v)) for v in value] == default.split()
    return default is None and not isinstance(value, str | int | float | bool | list | dict | tuple)
