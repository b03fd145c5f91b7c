"""Shared pydantic base: immutable models with ``to_dict()`` / ``to_json()`` like the HF ecosystem."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

GiB = 1024**3
MiB = 1024**2


class Model(BaseModel):
    """Frozen, strict-about-unknown-fields base for every object crossing the API."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_json(self, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent)
