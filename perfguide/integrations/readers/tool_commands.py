"""The fine-tuning tools' own commands, read as each tool runs them: ``tune run [torchrun flags] RECIPE --config FILE
[key=value ...]``, ``llamafactory-cli train FILE [key=value ...]`` and ``axolotl train FILE [--key value ...]``. The
config file is read in its own format with the command line's overrides applied the tool's way (OmegaConf dot-lists
for torchtune and LLaMA-Factory, flags for axolotl); ``tune run``'s torchrun flags give the process count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .base import Collector, ConfigReadError, Reading, take_flags, under

TOOLS = ("tune", "llamafactory-cli", "axolotl")
#: the format each tool's config file is read in, and the subcommand that trains
_FORMAT = {"tune": ("torchtune", "run"), "llamafactory-cli": ("llamafactory", "train"), "axolotl": ("axolotl", "train")}
#: the environment LLaMA-Factory's launcher reads (src/llamafactory/launcher.py at ff6d4d12): torchrun's processes per
#: node (else the visible device count) and nodes
LLAMAFACTORY_ENV = ("NPROC_PER_NODE", "CUDA_VISIBLE_DEVICES", "NNODES")


def read(words: list[str], base_dir: str, env: dict[str, str] | None = None) -> list[Reading]:
    """The config file under the command line's overrides, then the launch flags (``tune run``'s torchrun flags, the
    environment ``llamafactory-cli`` starts torchrun from)."""
    from . import launcher, load, module

    tool = words[0].rsplit("/", 1)[-1]
    fmt, verb = _FORMAT[tool]
    if words[1:2] != [verb]:
        raise ConfigReadError(f"cannot read `{tool} {' '.join(words[1:2])}`; accepted: `{tool} {verb} ...` (the command that trains)")
    launch, config, overrides = _split(tool, words[2:])
    path = _path(config, base_dir, tool)
    data = load(path)
    for key, value in overrides.items():
        set_override(data, key, value, tool)
    source = Path(path).name + (f" + {tool} overrides" if overrides else "")
    col = Collector(fmt, source)
    module(fmt).read(data, col, base_dir=str(Path(path).resolve().parent))
    readings = [col.reading()]
    if tool == "llamafactory-cli" and env and set(env) & set(LLAMAFACTORY_ENV):
        readings.append(_llamafactory_processes(env))
    if launch:
        outer = Collector("launcher", "tune run flags")
        readings += launcher.read_launcher("torchrun", launch, outer, base_dir)
        readings.insert(1, outer.reading())
    return readings


def _llamafactory_processes(env: dict[str, str]) -> Reading:
    """``NPROC_PER_NODE`` (else one process per ``CUDA_VISIBLE_DEVICES`` entry) and ``NNODES``, as the launcher reads them."""
    from .base import torchrun_env

    col = Collector("launcher", "llamafactory-cli environment")
    per_node, _, visible = torchrun_env(env, col)
    if per_node is None and visible:
        col.set("num_gpus", visible, "CUDA_VISIBLE_DEVICES (one process per visible GPU)")
    return col.reading()


def _split(tool: str, words: list[str]) -> tuple[dict[str, Any], str, dict[str, str]]:
    """(launch flags, the config file, key -> value overrides) of the words after the subcommand."""
    if tool == "tune":   # tune run [torchrun flags] RECIPE --config FILE [key=value ...]
        launch, i = take_flags(words, lambda w: w.lstrip("-").replace("-", "_"), ("standalone",))
        rest = words[i + 1:]
        if i >= len(words) or "--config" not in rest or rest.index("--config") + 1 >= len(rest):
            raise ConfigReadError("`tune run` needs a recipe and `--config FILE`, e.g. `tune run lora_finetune_single_device --config my.yaml`")
        at = rest.index("--config")
        config, extra = rest[at + 1], rest[:at] + rest[at + 2:]
        return launch, config, _dotlist(extra, tool)
    if not words:
        raise ConfigReadError(f"`{tool} train` names no config file; e.g. `{tool} train config.yaml`")
    config, extra = words[0], words[1:]
    if tool == "axolotl":   # axolotl train FILE [--key value | --key=value | --flag]
        flags, i = take_flags(extra, lambda w: w.lstrip("-").replace("-", "_"), ())
        if i < len(extra):
            raise ConfigReadError(f"cannot read {extra[i]!r} after the config file; axolotl takes `--key value` overrides")
        return {}, config, {k: v if isinstance(v, str) else "true" for k, v in flags.items()}
    return {}, config, _dotlist(extra, tool)


def _dotlist(words: list[str], tool: str) -> dict[str, str]:
    """OmegaConf's ``from_dotlist`` syntax: ``a.b=value`` each; anything else is not an override."""
    out: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or not key or key.startswith(("-", "~")):
            raise ConfigReadError(f"cannot read {word!r} in the {tool} command; accepted overrides: key=value (dotted for nested keys)")
        out[key] = value
    return out


def set_override(data: dict[str, Any], key: str, value: Any, tool: str) -> None:
    """One override, a text value parsed as a YAML scalar (as OmegaConf and jsonargparse do): ``batch_size=4`` is the
    int 4; a bare flag's True or a list stays as it is."""
    node = data
    *parents, last = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigReadError(f"the {tool} override {key}=... sets a key inside {part!r}, which is not a mapping in the config")
        node = child
    if not isinstance(value, str):
        node[last] = value
        return
    try:
        node[last] = yaml.safe_load(value) if value else None
    except yaml.YAMLError:
        node[last] = value


def _path(config: str, base_dir: str, tool: str) -> str:
    path = under(config, base_dir)
    if path.is_file():
        return str(path)
    if tool == "tune" and not path.suffix:
        raise ConfigReadError(f"--config {config!r} is not a file here; a torchtune built-in config is read from its file: "
                              f"`tune cp {config} my_config.yaml`, then `--config my_config.yaml`")
    raise ConfigReadError(f"cannot read {config!r} (no such file); pass the {tool} config file the command runs")
