"""What a reader hands back: the Setup fields a foreign config sets, where each came from, and what it left unpriced.

A user's config is read, not retyped (docs/check.md): every value perfguide prices is traced to the key it came
from, every default it had to assume says so, and every key it read but cannot price is named, never dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ..._base import Model
from ..._text import plain_name
from ...errors import PerfGuideError, did_you_mean

Syntax = Literal["kwargs", "yaml", "json", "flags"]


class ConfigReadError(PerfGuideError):
    """A config file or command perfguide cannot read: one line naming the file, the key and what is accepted."""


class Setting(Model):
    """One Setup field as priced: its value and where it came from (a file's key, or the default assumed and why)."""

    field: str
    value: Any
    source: str
    assumed: bool = False
    format: str = ""   # the reader whose keys said it: a change to this field is written back in that format


class Reading(Model):
    """One foreign config (a file, an object or a command line) turned into Setup fields."""

    format: str
    source: str
    settings: tuple[Setting, ...] = ()
    auto: dict[str, str] = Field(default_factory=dict)   # Setup field -> the key left "auto" (DeepSpeed): filled from the other configs
    ignored: tuple[str, ...] = ()   # "source: key" read but not priced
    unknown: tuple[str, ...] = ()   # keys the format does not have
    model: str | None = None
    notes: tuple[str, ...] = ()
    multi_process: str = "ddp"      # the strategy the format's own launcher uses for several processes (torchtune: FSDP2)
    spans_gpus: str = ""            # why the command's launcher starts one process per visible GPU when it names no count
    task: str | None = None         # the head the run trains, where not the model's own (model.tasks.TASKS: "seq-cls", ...)
    num_labels: int | None = None   # that head's width, for a classifier
    fixed: tuple[str, ...] = ()     # Setup fields the format has no key for (a fit change does not turn them)


class Collector:
    """Builds a Reading while a reader walks a config; the reader names keys, this keeps the bookkeeping."""

    def __init__(self, fmt: str, source: str, prefix: str = "") -> None:
        self.format, self.source, self.prefix = fmt, source, prefix  # prefix: where the format sits inside another file
        self.settings: list[Setting] = []
        self.auto: dict[str, str] = {}
        self.ignored: list[str] = []
        self.unknown: list[str] = []
        self.notes: list[str] = []
        self.model: str | None = None
        self.multi_process = "ddp"
        self.spans_gpus = ""
        self.task: str | None = None
        self.num_labels: int | None = None
        self.fixed: tuple[str, ...] = ()

    def where(self, key: str) -> str:
        return f"{self.source}: {self.prefix}{key}"

    def set(self, field: str, value: Any, key: str) -> None:
        self.settings = [s for s in self.settings if not (s.field == field and s.format == self.format)]
        self.settings.append(Setting(field=field, value=value, source=self.where(key), format=self.format))

    def set_model(self, name: Any, key: str) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ConfigReadError(f"{self.where(key)} must name a model (a hub id or a local path), got {name!r}")
        self.model = name.strip()
        self.settings.append(Setting(field="model", value=self.model, source=self.where(key), format=self.format))

    def assume(self, field: str, value: Any, why: str) -> None:
        self.settings.append(Setting(field=field, value=value, source=why, assumed=True, format=self.format))

    def mark_auto(self, field: str, key: str) -> None:
        self.auto[field] = self.where(key)

    def ignore(self, *keys: str) -> None:
        self.ignored += [self.where(k) for k in keys]

    def reject(self, keys: Iterable[str], known: Iterable[str]) -> None:
        """Keys the format does not have: listed with the closest real key, never silently read as something. A key
        name is shown as inert text (no markup, escapes or bidi overrides: perfguide._text.plain_name)."""
        known = tuple(known)
        for key in (plain_name(str(k)) for k in keys):
            hint = did_you_mean(key.rsplit(".", 1)[-1], known).strip()
            self.unknown.append(self.where(key) + (f" ({hint[0].lower()}{hint[1:]})" if hint else ""))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def reading(self) -> Reading:
        return Reading(format=self.format, source=self.source, settings=tuple(self.settings), auto=self.auto,
                       ignored=tuple(self.ignored), unknown=tuple(self.unknown), model=self.model, notes=tuple(self.notes),
                       multi_process=self.multi_process, spans_gpus=self.spans_gpus, task=self.task, num_labels=self.num_labels,
                       fixed=self.fixed)


def set_kbit_dtypes(col: Collector, key: str, why: str, *, recast: bool = False, fp32_norms_key: str | None = None) -> None:
    """A k-bit base's embedding, head and norms as the training framework leaves them (``why``, read in its code): in
    the load dtype (``kbit_upcast=False``), or, where ``recast``, peft's upcast with the embedding and head cast back
    to bf16 and the norms fp32 (``kbit_recast_bf16``, which perfguide prices on unsharded bf16 runs only). A framework
    switch that keeps fp32 norms where the recast cannot be priced (``fp32_norms_key``) is named in the notes."""
    if recast:
        col.set("kbit_recast_bf16", True, f"{key} ({why})")
        return
    col.set("kbit_upcast", False, f"{key} ({why})")
    if fp32_norms_key:
        col.note(f"{col.where(fp32_norms_key)}: the fp32 norms of a sharded or fp16 run are priced 16-bit: their weights "
                 "(KB) and the fp32 outputs they pass on are not counted")


def take_flags(words: list[str], name: Callable[[str], str], switches: Collection[str], on: Any = True) -> tuple[dict[str, Any], int]:
    """The leading ``--flag value`` / ``--flag=value`` / switch words of a command (a switch gets ``on``), and the
    index of the first word that is not a flag: launchers and servers share argparse's spelling."""
    flags: dict[str, Any] = {}
    i = 0
    while i < len(words) and words[i].startswith("-"):
        raw, eq, value = words[i].partition("=")
        key = name(raw)
        if eq:
            flags[key] = value
        elif key in switches or i + 1 >= len(words) or words[i + 1].startswith("-"):
            flags[key] = on
        else:
            flags[key], i = words[i + 1], i + 1
        i += 1
    return flags, i


# --- value parsing shared by the readers: one line naming the key when a value is not what the format takes -------

def as_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigReadError(f"{where} must be true or false, got {value!r}")


def switched_on(data: Mapping[str, Any], key: str, col: Collector) -> bool:
    """A boolean key of the file that is present and true (absent or null: off)."""
    return data.get(key) is not None and as_bool(data[key], col.where(key))


def as_int(value: Any, where: str, low: int = 1) -> int:
    if isinstance(value, bool):
        raise ConfigReadError(f"{where} must be an integer >= {low}, got {value!r}")
    try:
        number = int(str(value).strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
        raise ConfigReadError(f"{where} must be an integer >= {low}, got {value!r}") from None
    if (isinstance(value, float) and number != value) or number < low:
        raise ConfigReadError(f"{where} must be an integer >= {low}, got {value!r}")
    return number


def mapping(value: Any, where: str) -> dict[str, Any]:
    """A nested block of settings (``fsdp_config``, ``zero_optimization``, ...): absent or empty is ``{}``; a value
    of another type is one line, never an AttributeError deep inside a reader."""
    if value is None or value == {} or value is False or value == "":
        return {}
    if not isinstance(value, dict):
        raise ConfigReadError(f"{where} must be a mapping of settings, got {type(value).__name__} {str(value)[:40]!r}")
    return value


def listing(value: Any, where: str) -> list[Any]:
    """A list of names (``plugins``, ``lora_attn_modules``); absent is ``[]``, one name a list of one."""
    if value is None or value is False or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ConfigReadError(f"{where} must be a list, got {type(value).__name__} {str(value)[:40]!r}")
    return value


def as_float(value: Any, where: str) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except (TypeError, ValueError):
        raise ConfigReadError(f"{where} must be a number, got {value!r}") from None


def choice(value: Any, where: str, mapping: Mapping[str, Any]) -> Any:
    """A word the format accepts, mapped to perfguide's; anything else is one line listing the accepted words."""
    key = str(value).strip().lower() if value is not None else "none"
    if key not in mapping:
        accepted = ", ".join(sorted(mapping))
        raise ConfigReadError(f"{where}={value!r} is not a value perfguide can price.{did_you_mean(key, mapping)} Accepted: {accepted}")
    return mapping[key]


#: ``attn_implementation`` naming a Hub kernel repository (``org/repo``, optionally ``:function``), which transformers
#: loads through the ``kernels`` package (axolotl's gpt-oss examples: ``kernels-community/vllm-flash-attn3``)
_HUB_KERNEL = re.compile(r"^[\w.-]+/[\w.-]+(?::[\w.]+)?$")


def attention(value: Any, where: str, mapping: Mapping[str, Any], col: Collector) -> Any:
    """An ``attn_implementation`` word; a Hub flash-attention kernel is priced as the flash-attn it builds (FlashAttention-3
    where its name says flash-attn3, else FlashAttention-2: neither keeps s x s scores) and noted; other Hub kernels are
    refused in one line."""
    text = str(value).strip()
    if _HUB_KERNEL.match(text):
        if "flash" not in text.lower():
            raise ConfigReadError(f"{where}={text!r} is a Hub attention kernel perfguide cannot price (only flash-attention "
                                  f"builds are: their names say flash). Accepted: {', '.join(sorted(mapping))}, or a Hub "
                                  "flash-attention kernel id")
        kernel = "flash_attention_3" if "attn3" in text.lower().replace("-", "").replace("_", "") else "flash_attention_2"
        col.note(f"{where}={text!r} is a Hub kernel (transformers loads it through the kernels package): priced as "
                 f"{kernel}, a flash-attention build that keeps no s x s score matrix")
        return kernel
    return choice(value, where, mapping)


#: a LoRA target a reader cannot name without the model: every ``nn.Linear`` leaf of its blocks, as axolotl's
#: ``lora_target_linear`` lists them (loaders/adapter.py find_all_linear_names), resolved once the model is known
#: (pricing.resolve_targets). On a transformers-5 MoE the fused experts and the router are parameters, not Linears.
LINEAR_LEAVES = "<the model's nn.Linear leaves>"

#: values a reader can only name by the model's shape, resolved once it is known (pricing.resolve_model_keyed):
#: ArcticTraining's tiled_mlp_compute (shards of ALST's size, techniques/tiled_mlp.alst_shard_tokens) and its unset
#: data.max_length (the model's max_position_embeddings, TrainerConfig.set_max_length)
TILED_BY_HIDDEN, LENGTH_FROM_MODEL = "_tiled_mlp_by_hidden", "_seq_len_from_model"

#: torch dtype spellings (from_pretrained ``dtype``, axolotl/LLaMA-Factory flags) -> Setup.weights_dtype
DTYPE_WORDS = {"float32": "fp32", "fp32": "fp32", "torch.float32": "fp32", "float": "fp32",
               "bfloat16": "bf16", "bf16": "bf16", "torch.bfloat16": "bf16",
               "float16": "fp16", "fp16": "fp16", "half": "fp16", "torch.float16": "fp16"}


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: how changes to nested keys are named."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`flatten`, for showing a change as the YAML / JSON block the user pastes."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def under(value: str, base_dir: str) -> Path:
    """A path a command line names: ``~`` expanded, a relative one taken from the directory the command runs in."""
    try:
        path = Path(value).expanduser()
    except RuntimeError:   # ``~nouser``: no such home; the path stays as written and is then not found
        path = Path(value)
    return path if path.is_absolute() else Path(base_dir) / path


#: the block Linears a LoRA target regex is tried on, with the module paths transformers' decoders put them under
#: (text models, the language model of a vision-language one, the same under peft's wrapper)
_BLOCK_LINEARS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}
_BLOCK_PREFIXES = ("model.layers.0", "model.language_model.layers.0", "language_model.model.layers.0", "base_model.model.model.layers.0")


def regex_targets(pattern: str, where: str) -> tuple[str, ...]:
    """A ``target_modules`` string (other than ``all-linear``), which PEFT fullmatches as a regex against every module's
    full name (tuners_utils.check_target_module_exists): the block Linears it matches, as perfguide counts them (on
    every block: a regex that picks some layers only is priced as all of them, an upper bound)."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ConfigReadError(f"{where}={pattern!r} is not a regular expression PEFT can match ({exc})") from None
    names = tuple(n for sub, linears in _BLOCK_LINEARS.items() for n in linears
                  if any(rx.fullmatch(f"{p}.{s}.{n}") for p in _BLOCK_PREFIXES for s in (sub, "cross_attn")))
    if not names:
        raise ConfigReadError(f"{where}={pattern!r} matches none of a decoder block's Linears (PEFT fullmatches a string "
                              "against each module's full name, e.g. model.layers.0.self_attn.q_proj); list the names instead")
    return names


def switched(value: Any) -> bool:
    """A config value that turns a feature on: anything but absent, false, empty or a "false"-like word."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "0", "no", "none", "null")
    return value is not None and value is not False and value != [] and value != {}


def refuse_unpriced(data: Mapping[str, Any], col: Collector, unpriced: Mapping[str, str], priced: str) -> None:
    """The first key of ``unpriced`` (key -> what it runs) that ``data`` turns on, refused in one line: a run perfguide
    does not price is never priced as the run without it."""
    key = next((k for k in unpriced if switched(data.get(k))), None)
    if key is not None:
        raise ConfigReadError(f"{col.where(key)}: {unpriced[key]} is not priced; perfguide check prices {priced}")



def torchrun_env(env: Mapping[str, str], col: Collector) -> tuple[int | None, int, int]:
    """(``NPROC_PER_NODE`` or None, ``NNODES``, the GPUs ``CUDA_VISIBLE_DEVICES`` names: 0 when unset), as the tools
    that start torchrun from the environment read them (ms-swift's cli, LLaMA-Factory's launcher); a given process
    count and more than one node are set on ``col``."""
    per_node = as_int(env["NPROC_PER_NODE"], "NPROC_PER_NODE") if "NPROC_PER_NODE" in env else None
    nodes = as_int(env.get("NNODES", 1), "NNODES")
    if per_node is not None:
        col.set("num_gpus", per_node, "NPROC_PER_NODE")
    if nodes > 1:
        col.set("nodes", nodes, "NNODES")
    return per_node, nodes, len([d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()])
