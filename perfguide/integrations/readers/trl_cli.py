"""``trl sft ...`` / ``trl dpo ...``: TRL's CLI runs its own ``scripts/sft.py`` / ``scripts/dpo.py`` through
``accelerate launch`` (trl/cli/commands/training.py): the flags the script's parser knows (SFTConfig / DPOConfig,
ModelConfig, ScriptArguments, and ``--config`` naming a YAML of the same keys, which the command line overrides) go
to the script; the rest go to ``accelerate launch``, where ``--accelerate_config NAME`` is a file or one of the
configs TRL ships (``trl/accelerate_configs/NAME.yaml``: zero1-3, fsdp1, fsdp2, multi_gpu, single_gpu).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from .base import Collector, ConfigReadError, Reading, under
from .script_flags import parse

#: the TRL subcommands perfguide prices, and whether the script is DPO's (the others train objectives it does not price)
SUBCOMMANDS = {"sft": False, "dpo": True}
#: accelerate launch options perfguide reads or passes over when accelerate itself is not installed to list them all
_LAUNCH_FALLBACK = frozenset({"config_file", "num_processes", "num_machines", "mixed_precision", "use_deepspeed", "zero_stage",
                              "deepspeed_config_file", "offload_optimizer_device", "offload_param_device", "use_fsdp",
                              "fsdp_version", "fsdp_offload_params", "fsdp_reshard_after_forward", "multi_gpu", "use_cpu",
                              "zero3_init_flag", "main_process_port", "main_process_ip", "machine_rank", "gpu_ids",
                              "dynamo_backend", "num_cpu_threads_per_process"})


@lru_cache(maxsize=1)
def launch_options() -> frozenset[str]:
    """Every ``accelerate launch`` option, from accelerate's own parser (TRL's CLI cannot run without accelerate)."""
    try:
        from accelerate.commands.launch import launch_command_parser
    except ImportError:
        return _LAUNCH_FALLBACK
    return frozenset(a.dest for a in launch_command_parser()._actions if a.option_strings and a.dest != "help")


def split(words: list[str]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(subcommand, the script's flags, accelerate launch's flags), split as TRL's CLI splits them: a flag the
    script's dataclasses know is the script's, even where accelerate has one of the same name
    (``--gradient_accumulation_steps``)."""
    from .training_args import KNOWN

    sub = words[1] if len(words) > 1 else ""
    if sub not in SUBCOMMANDS:
        others = "grpo, kto, reward, rloo and distillation train objectives perfguide does not price"
        raise ConfigReadError(f"cannot read `trl {sub}`; accepted: `trl sft ...` and `trl dpo ...` ({others})")
    flags = parse(words[2:])
    script = {k: v for k, v in flags.items() if k in KNOWN or k == "config"}
    launch = {k: v for k, v in flags.items() if k not in script}
    return sub, script, launch


def read(words: list[str], base_dir: str) -> list[Reading]:
    """The script's settings (its ``--config`` YAML under its flags), then accelerate launch's, then any accelerate
    config file they name."""
    from . import launcher, load, training_args

    sub, script, launch = split(words)
    data = dict(script)
    name = f"trl {sub} flags"
    config = data.pop("config", None)
    if config not in (None, True):
        path = str(under(str(config), base_dir))
        from_file = load(path)
        launch = {**{k: v for k, v in from_file.items() if k not in training_args.KNOWN}, **launch}
        data = {**{k: v for k, v in from_file.items() if k in training_args.KNOWN}, **data}
        name = f"trl {sub} flags over {Path(path).name}"
    col = Collector("script_flags", name)
    training_args.read(data, col, sft=True, dpo=SUBCOMMANDS[sub], base_dir=base_dir)
    outer = Collector("launcher", f"trl {sub} launch flags")
    unknown = sorted(k for k in launch if k not in launch_options() and k != "accelerate_config")
    outer.reject((f"--{k}" for k in unknown), (f"--{k}" for k in sorted(training_args.KNOWN | launch_options())))
    launch = {k: v for k, v in launch.items() if k not in unknown}
    if launch.get("accelerate_config") not in (None, True):
        launch["config_file"] = accelerate_config_file(str(launch.pop("accelerate_config")), base_dir)
    extra = launcher.read_launcher("accelerate", launch, outer, base_dir)
    return [col.reading(), outer.reading(), *extra]


def accelerate_config_file(value: str, base_dir: str) -> str:
    """``--accelerate_config``: a file, else the config of that name TRL ships (resolved as TRL resolves it)."""
    path = under(value, base_dir)
    if path.is_file():
        return str(path)
    try:
        from importlib import resources

        shipped = resources.files("trl.accelerate_configs").joinpath(f"{value}.yaml")
    except ModuleNotFoundError:
        raise ConfigReadError(f"--accelerate_config {value!r} is not a file, and TRL (which ships the named configs) is not "
                              "installed here to read it; pass the accelerate config file's path") from None
    if not shipped.is_file():
        names = sorted(p.name.removesuffix(".yaml") for p in resources.files("trl.accelerate_configs").iterdir()
                       if p.name.endswith(".yaml"))
        raise ConfigReadError(f"--accelerate_config {value!r} is neither a file nor a config TRL ships; accepted: a path, or "
                              f"{', '.join(names)}")
    return str(shipped)

