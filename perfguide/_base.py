"""Shared pydantic base: immutable models with ``to_dict()`` / ``to_json()`` like the HF ecosystem."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

GiB = 1024**3
MiB = 1024**2


class Model(BaseModel):
    """Frozen, strict-about-unknown-fields base for every object crossing the API."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    def to_dict(self) -> dict[str, Any]:
        """JSON data, every string through the one sanitiser (perfguide._text.clean): names from configs are data."""
        from ._text import clean_data

        return clean_data(self.model_dump(mode="json"))

    def to_json(self, indent: int | None = 2) -> str:
        import json

        from ._text import clean_data

        return json.dumps(clean_data(json.loads(self.model_dump_json())), indent=indent, ensure_ascii=False)


M = TypeVar("M", bound=Model)


def build_strict(cls: type[M], values: dict[str, Any], kind: str, error: type[Exception], key: str = "") -> M:
    """Construct ``cls`` from user kwargs; an unknown key or a bad value is one line naming it and the accepted ones."""
    from .errors import did_you_mean

    unknown = [k for k in values if k not in cls.model_fields]
    if unknown:
        k = unknown[0]
        raise error(f"unknown {kind}{key} {k!r}.{did_you_mean(k, cls.model_fields)} Accepted: {', '.join(cls.model_fields)}")
    try:
        return cls(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        if not err["loc"]:   # a rule across fields (a model validator): its own sentence, not the whole input echoed
            raise error(f"invalid {kind}: {str(err['msg']).removeprefix('Value error, ')}") from None
        where = ".".join(str(p) for p in err["loc"])
        raise error(f"invalid {kind} value for {where}: {err['msg']} (got {err.get('input')!r})") from None
