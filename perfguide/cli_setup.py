"""``perfguide estimate`` flags generated from the Setup fields, so the CLI can never drift from the API.

Values are parsed loosely here (strings, ints, on/off) and validated by ``Setup.parse``, which gives the
same one-line errors the Python API gives.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal

from .setup import LoraSpec, Setup

NONE_WORD = "none"
LORA_FLAGS = ("r", "alpha")  # LoraSpec fields exposed as --lora-r / --lora-alpha


def _split_optional(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (annotation, False)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _optional_str(value: str) -> str | None:
    return None if value.lower() == NONE_WORD else value


def _optional_int(value: str) -> int | None:
    return None if value.lower() == NONE_WORD else int(value)


def _add_field(group: argparse._ArgumentGroup, name: str, annotation: Any, default: Any, description: str | None) -> None:
    inner, nullable = _split_optional(annotation)
    about = f"{description}; " if description else ""
    unset = argparse.SUPPRESS  # flags not given leave no attribute, so "none" can mean None
    if inner is bool:
        group.add_argument(_flag(name), action=argparse.BooleanOptionalAction, default=unset, help=f"{about}default {default}")
    elif inner is int:
        group.add_argument(_flag(name), type=_optional_int if nullable else int, default=unset, metavar="N",
                           help=f"{about}default {default}")
    elif typing.get_origin(inner) is Literal or inner is str:
        choices = list(typing.get_args(inner)) + ([NONE_WORD] if nullable else [])
        shown = f"one of {', '.join(choices)}; " if inner is not str else f"'{NONE_WORD}' for None; " if nullable else ""
        group.add_argument(_flag(name), type=_optional_str if nullable else str, default=unset, metavar=name.upper(),
                           help=f"{about}{shown}default {default}")


def add_setup_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Setup field (``--micro-batch-size``, ``--gradient-checkpointing/--no-...``), plus LoRA's r/alpha."""
    group = parser.add_argument_group("setup (perfguide.Setup fields; unset ones keep the Setup default)")
    for name, field in Setup.model_fields.items():
        if name != "lora":
            _add_field(group, name, field.annotation, field.default, field.description)
    for name in LORA_FLAGS:
        group.add_argument(f"--lora-{name}", type=int, default=None, metavar="N",
                           help=f"add LoRA adapters with this {name} (default {LoraSpec.model_fields[name].default})")


def setup_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The Setup dict of the flags the user actually gave; LoRA appears when any --lora-* flag is set."""
    values = {name: getattr(args, name) for name in Setup.model_fields if name != "lora" and hasattr(args, name)}
    lora = {name: getattr(args, f"lora_{name}") for name in LORA_FLAGS if getattr(args, f"lora_{name}") is not None}
    if lora:
        values["lora"] = lora
    return values
