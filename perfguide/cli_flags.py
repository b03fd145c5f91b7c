"""CLI flags generated from the pydantic models (``Setup`` for ``estimate``, ``Constraints`` for ``recommend``), so the
CLI can never drift from the API: a field added to either model is a flag without touching the parser.

Values are parsed loosely here (strings, numbers, on/off, comma lists) and validated by the models themselves,
which give the same one-line errors the Python API gives. A nested model field (``lora``) becomes prefixed flags
(``--lora-r``, ``--lora-use-dora``); setting any of them sets the nested object. Unset flags leave no value,
so the model's own default (or "perfguide decides") applies.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel

from .setup import Setup

NONE_WORD = "none"


def _plain(annotation: Any) -> Any:
    """``Annotated[int, Strict()]`` (pydantic's StrictInt inside a union) -> ``int``."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _split_optional(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (annotation, False)."""
    annotation = _plain(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) < len(typing.get_args(annotation)):
            return (_plain(args[0]) if len(args) == 1 else typing.Union[tuple(args)]), True  # noqa: UP007 - built at run time
    return annotation, False


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _none_or(convert: Any) -> Any:
    def parse(value: str) -> Any:
        return None if value.lower() == NONE_WORD else convert(value)

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names the type in its error message
    return parse


def _names(value: str) -> str | tuple[str, ...]:
    """``q_proj,v_proj`` -> a tuple; a single word (``all-linear``) stays a word."""
    parts = tuple(p.strip() for p in value.split(",") if p.strip())
    return parts if len(parts) > 1 or "," in value else value


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _kind(inner: Any) -> str | None:
    """bool / int / float / str / names (tuple of str, maybe or a word) / model / None (not a flag)."""
    if inner in (bool, int, float, str):
        return inner.__name__
    if typing.get_origin(inner) is Literal:
        return "str"
    if _is_model(inner):
        return "model"
    members = typing.get_args(inner) if typing.get_origin(inner) in (typing.Union, types.UnionType) else (inner,)
    if any(typing.get_origin(m) is tuple for m in members):
        return "names"
    return None


def _choices(inner: Any) -> list[str]:
    members = typing.get_args(inner) if typing.get_origin(inner) in (typing.Union, types.UnionType) else (inner,)
    return [str(c) for m in members if typing.get_origin(m) is Literal for c in typing.get_args(m)]


def _add_field(group: argparse._ArgumentGroup, dest: str, annotation: Any, default: Any, about: str) -> None:
    inner, nullable = _split_optional(annotation)
    kind = _kind(inner)
    unset = argparse.SUPPRESS  # flags not given leave no attribute, so "none" can mean None
    shown = f"{about}; " if about else ""
    if kind == "bool":
        group.add_argument(_flag(dest), dest=dest, action=argparse.BooleanOptionalAction, default=unset,
                           help=about if "default" in about else f"{shown}default {default}")
        return
    choices = _choices(inner)
    # a field whose own values include "none" (quantization='none': the checkpoint as it is) keeps the word as that
    # value; reading it as None would drop the constraint the user gave
    nullable_word = nullable and NONE_WORD not in choices
    if choices:
        listed = f"one of {', '.join(choices + ([NONE_WORD] if nullable_word else []))}"
    else:
        listed = f"'{NONE_WORD}' for None" if nullable_word else ""
    if kind == "names":
        listed = "comma-separated module names, or all-linear"
    said_default = "default" in about
    tail = "; ".join(part for part in (listed, "" if said_default else f"default {default}") if part)
    convert: Any = {"int": int, "float": float, "str": str, "names": _names}[kind]  # type: ignore[index]
    metavar = {"int": "N", "float": "F", "names": "A,B"}.get(kind or "", dest.upper())
    group.add_argument(_flag(dest), dest=dest, type=_none_or(convert) if nullable_word else convert, default=unset,
                       metavar=metavar, help=f"{shown}{tail}" if tail else about)


def add_model_flags(parser: argparse.ArgumentParser, model: type[BaseModel], title: str, *, skip: tuple[str, ...] = (),
                    help_text: dict[str, str] | None = None) -> None:
    """One flag per field of ``model`` (nested models: one per their fields, prefixed), except ``skip``."""
    group = parser.add_argument_group(title)
    help_text = help_text or {}
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        inner, _ = _split_optional(field.annotation)
        if _kind(inner) == "model":
            for sub, subfield in inner.model_fields.items():
                dest = f"{name}_{sub}"
                if _kind(_split_optional(subfield.annotation)[0]) not in (None, "model"):
                    _add_field(group, dest, subfield.annotation, subfield.default,
                               help_text.get(dest, subfield.description or f"{name}.{sub}; setting any --{name}-* adds {name}"))
        elif _kind(inner) is not None:
            _add_field(group, name, field.annotation, field.default, help_text.get(name, field.description or ""))


def values_from_args(args: argparse.Namespace, model: type[BaseModel], *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of ``model`` the user actually gave, nested ones as a dict when any of their flags was set."""
    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        inner, _ = _split_optional(field.annotation)
        if _kind(inner) == "model":
            nested = {sub: getattr(args, f"{name}_{sub}") for sub in inner.model_fields if hasattr(args, f"{name}_{sub}")}
            if nested:
                values[name] = nested
        elif hasattr(args, name):
            values[name] = getattr(args, name)
    return values


def add_setup_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Setup field (``--micro-batch-size``, ``--gradient-checkpointing/--no-...``, ``--lora-r``...)."""
    add_model_flags(parser, Setup, "setup (perfguide.Setup fields; unset ones keep the Setup default)")


def setup_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The Setup dict of the flags the user actually gave; LoRA appears when any --lora-* flag is set."""
    return values_from_args(args, Setup)
