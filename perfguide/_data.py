"""Loads the bundled data files once, validated into pydantic models at load.

Each data file has a schema (a pydantic model) next to the code that reads it; ``validated(name, Schema)``
parses ``perfguide/data/<name>.json`` into it once and caches it, so a missing row or a mistyped value fails
when the file is first read, naming the file and the field, never later as a ``KeyError`` or as a silent
``.get(..., default)`` that prices a plan with a number nobody wrote down. ``Fact`` is the common
``{"value": ..., "source": "..."}`` row; ``FactTable`` the file of such rows plus its ``_doc``.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


@cache
def validated(name: str, schema: type[M]) -> M:
    """``perfguide/data/<name>.json`` as ``schema``, validated once; a mismatch is one DataFileError line."""
    try:
        return schema.model_validate(load(name))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise DataFileError(f"perfguide/data/{name}.json does not match {schema.__name__}: {where}: {err['msg']} "
                            f"({exc.error_count()} error(s)); the bundled data is damaged, reinstall perfguide") from None
