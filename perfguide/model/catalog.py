"""The offline architecture catalog (data/architectures.json): hub ids, short names and aliases -> config dicts."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .._data import load
from .facts import ModuleFacts

_VARIANT_TOKENS = frozenset({"instruct", "chat", "it"})


def normalize(name: str) -> str:
    """Lower-case and drop '-instruct' / '-chat' / '-it' tokens: chat variants share their base model's shape."""
    return "-".join(t for t in name.strip().lower().split("-") if t not in _VARIANT_TOKENS)


def _models() -> dict[str, dict[str, Any]]:
    return load("architectures")["models"]


def counted_of(hub_id: str) -> ModuleFacts | None:
    """The meta-device facts recorded for this entry (never inherited through ``extends``: a count is per model)."""
    counted = _models()[hub_id].get("counted")
    return ModuleFacts.model_validate(counted) if counted is not None else None


def config_of(hub_id: str) -> dict[str, Any]:
    """The entry's full config, following ``extends`` (a fresh dict each call, so callers may keep it)."""
    entry = _models()[hub_id]
    base = config_of(entry["extends"]) if "extends" in entry else {}
    return base | entry["config"] | {"_name_or_path": hub_id}


@lru_cache(maxsize=1)
def _index() -> dict[str, str]:
    """normalized key -> canonical hub id; the full id, the name after '/', and each alias (and its name part)."""
    index: dict[str, str] = {}
    for hub_id, entry in _models().items():
        for name in (hub_id, *entry.get("aliases", ())):
            for key in (normalize(name), normalize(name.rsplit("/", 1)[-1])):
                index.setdefault(key, hub_id)
    return index


def lookup(name: str) -> str | None:
    """Canonical hub id for a hub id / short name / alias (case-insensitive), or None.

    An id with an unknown organisation does not fall back to its name part: 'someone/gpt2' may be anything.
    """
    return _index().get(normalize(name))


def catalog_names() -> list[str]:
    """Canonical hub ids of every catalog entry, sorted case-insensitively (for the CLI and the docs)."""
    return sorted(_models(), key=str.lower)


def short_names() -> list[str]:
    """Every accepted short name and alias (used for 'did you mean' suggestions)."""
    return sorted({k for k in _index() if "/" not in k})
