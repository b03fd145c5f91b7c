"""Loads the bundled data files once, validated into pydantic models at load.

Each data file has a schema (a pydantic model) next to the code that reads it; ``validated(name, Schema)``
parses ``perfguide/data/<name>.json`` into it once and caches it, so a missing row or a mistyped value fails
when the file is first read, naming the file and the field, never later as a ``KeyError`` or as a silent
``.get(..., default)`` that prices a plan with a number nobody wrote down. ``Fact`` is the common
``{"value": ..., "source": "..."}`` row; ``facts(name)`` validates a file that is only such rows (efficiency.json,
calibration.json) as ``Entry`` rows once, and ``fact_value`` / ``fact_extra`` read one of them (from the loaded
file itself, so the throughput fit's temporary edits of the loaded table are what the model reads).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .errors import DataFileError

M = TypeVar("M", bound=BaseModel)
V = TypeVar("V")


@cache
def load(name: str) -> Any:
    """Parse ``perfguide/data/<name>.json`` (raw JSON); cached so every caller shares one copy. Prefer ``validated``."""
    text = resources.files("perfguide.data").joinpath(f"{name}.json").read_text(encoding="utf-8")
    return json.loads(text)


class Fact(BaseModel, Generic[V]):
    """One sourced constant. ``Fact[float]`` checks the value's type; the source says where it comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: V
    source: str = Field(min_length=10)


class DataModel(BaseModel):
    """Base of the data-file schemas: frozen, unknown keys refused (a typo in a key is an error, not a default);
    ``_doc`` (the file's own description) is accepted as ``doc``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    doc: str = Field(default="", alias="_doc")


class Entry(BaseModel):
    """One row of a table of sourced constants: its value (a number or a small table), where it comes from, and
    the extras some rows carry (how it was fitted, a default for keys the table lacks, a cap, a per-GPU table)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: int | float | dict[str, Any] | list[Any]
    source: str = Field(min_length=10)
    fitted: dict[str, str] | str | None = None
    default: int | float | None = None
    cap: int | float | None = None
    by_cc_major: dict[str, int] | None = None
    by_era: dict[str, dict[str, int]] | None = None


def _damaged(name: str, schema: str, exc: ValidationError) -> DataFileError:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    return DataFileError(f"perfguide/data/{name}.json does not match {schema}: {where}: {err['msg']} "
                         f"({exc.error_count()} error(s)); the bundled data is damaged, reinstall perfguide")


@cache
def validated(name: str, schema: type[M]) -> M:
    """``perfguide/data/<name>.json`` as ``schema``, validated once; a mismatch is one DataFileError line."""
    try:
        return schema.model_validate(load(name))
    except ValidationError as exc:
        raise _damaged(name, schema.__name__, exc) from None


_ENTRIES = TypeAdapter(dict[str, Entry])


@cache
def facts(name: str) -> dict[str, Entry]:
    """Every row of a table of sourced constants (``_doc`` aside), validated as an ``Entry`` once."""
    try:
        return _ENTRIES.validate_python({k: v for k, v in load(name).items() if not k.startswith("_")})
    except ValidationError as exc:
        raise _damaged(name, "Entry rows", exc) from None


def _row(name: str, key: str) -> dict[str, Any]:
    """One row of a validated table; a row the code reads but the file lacks is one DataFileError line."""
    if key not in facts(name):
        raise DataFileError(f"perfguide/data/{name}.json has no row {key!r}; the bundled data is damaged, reinstall perfguide")
    row: dict[str, Any] = load(name)[key]
    return row


def fact_value(name: str, key: str) -> Any:
    """A row's value: a number or a small table, as the file has it (ints stay ints)."""
    return _row(name, key)["value"]


def fact_extra(name: str, key: str, extra: str) -> Any:
    """An extra a row must carry for the code that reads it (``cap``, ``default``, ``by_cc_major``, ``by_era``)."""
    row = _row(name, key)
    if extra not in row:
        raise DataFileError(f"perfguide/data/{name}.json row {key!r} lacks its {extra!r}; the bundled data is damaged, reinstall perfguide")
    return row[extra]
