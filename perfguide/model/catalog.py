"""The offline architecture catalog (data/architectures.json): hub ids, short names and aliases -> config dicts."""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from typing import Any

from pydantic import Field, model_validator

from .._data import DataModel, Fact, validated
from .facts import ModuleFacts

_VARIANT_TOKENS = frozenset({"instruct", "chat", "it"})
#: dropped only beside a parameter count ('Mistral-Small-24B-Base-2501', 'Qwen3-4B-Base', 'gemma-3-27b-pt'): alone,
#: 'base' is a size ('bert-base-uncased', 't5-base') and must keep telling models apart
_BASE_TOKENS = frozenset({"base", "pt"})
_PARAM_COUNT = re.compile(r"^(a?\d+(\.\d+)?[bm])$")


def normalize(name: str) -> str:
    """Lower-case and drop '-instruct' / '-chat' / '-it' tokens (and '-base' / '-pt' beside a parameter count):
    chat variants share their base model's shape."""
    tokens = name.strip().lower().split("-")
    drop = _VARIANT_TOKENS | (_BASE_TOKENS if any(_PARAM_COUNT.match(t) for t in tokens) else frozenset())
    return "-".join(t for t in tokens if t not in drop)


class CatalogEntry(DataModel):
    """One hub id: its config.json values, the entry it extends, its aliases, where the values come from, and the
    recorded meta-device facts (entries without an analytic counter)."""

    aliases: list[str] = Field(default_factory=list)
    extends: str | None = None
    source: str | None = Field(default=None, min_length=10)
    config: dict[str, Any]
    counted: ModuleFacts | None = None


class Mirror(DataModel):
    """An organisation that re-uploads other organisations' checkpoints under their own names, config.json unchanged,
    and the name suffixes that mark a re-upload whose config adds keys (Unsloth's ``-bnb-4bit``: the weights stored
    nf4, with the ``quantization_config`` its uploads carry)."""

    source: str = Field(min_length=10)
    suffixes: dict[str, dict[str, Any]] = Field(default_factory=dict)


class SizeRule(DataModel):
    """How a bare size ('7b') becomes a shape (perfguide.model.sizes; the file's ``size_rule._doc`` says it in words)."""

    model_types: tuple[str, ...] = Field(min_length=1)
    match_within: float = Field(gt=0, lt=1)
    template: str
    hidden_multiple: int = Field(gt=0)
    intermediate_multiple: int = Field(gt=0)
    #: entries a bare size never names: fine-tunes and code variants of a base model of the same size
    skip: tuple[str, ...] = ()


class CatalogFile(DataModel):
    """data/architectures.json, validated once at first use: every reader of the file reads this object."""

    bf16_native_model_types: Fact[list[str]]
    no_sdpa_model_types: Fact[list[str]]
    tp_split_expert_model_types: Fact[list[str]]
    #: model types whose transformers modeling runs every expert over every token (model/code.py built_by)
    every_expert_model_types: Fact[list[str]]
    #: architecture -> the block class FSDP wraps (transformers' ``_no_split_modules[0]``)
    block_classes: Fact[dict[str, str]]
    #: organisation -> what its re-uploads are; any other organisation's copy of a name stays unresolved
    mirror_organisations: dict[str, Mirror] = Field(default_factory=dict)
    #: model_type -> key into data/activations.json (its own ``_doc`` row aside)
    families: dict[str, str]
    size_rule: SizeRule
    models: dict[str, CatalogEntry]

    @model_validator(mode="after")
    def _extends_known(self) -> CatalogFile:
        for hub_id, entry in self.models.items():
            if entry.extends is not None and entry.extends not in self.models:
                raise ValueError(f"{hub_id} extends {entry.extends!r}, which is not an entry")
        if self.size_rule.template not in self.models:
            raise ValueError(f"size_rule.template {self.size_rule.template!r} is not an entry")
        for hub_id in self.size_rule.skip:
            if hub_id not in self.models:
                raise ValueError(f"size_rule.skip names {hub_id!r}, which is not an entry")
        return self


def catalog_file() -> CatalogFile:
    """The validated catalog (cached by ``validated``); a damaged file is one DataFileError naming the entry and field."""
    return validated("architectures", CatalogFile)


def _models() -> dict[str, CatalogEntry]:
    return catalog_file().models


def counted_of(hub_id: str) -> ModuleFacts | None:
    """The meta-device facts recorded for this entry (never inherited through ``extends``: a count is per model)."""
    return _models()[hub_id].counted


def config_of(hub_id: str) -> dict[str, Any]:
    """The entry's full config, following ``extends`` (a fresh dict each call, so callers may keep it)."""
    entry = _models()[hub_id]
    base = config_of(entry.extends) if entry.extends is not None else {}
    return base | copy.deepcopy(entry.config) | {"_name_or_path": hub_id}


@lru_cache(maxsize=1)
def _index() -> dict[str, str]:
    """normalized key -> canonical hub id; the full id, the name after '/', and each alias (and its name part)."""
    index: dict[str, str] = {}
    for hub_id, entry in _models().items():
        for name in (hub_id, *entry.aliases):
            for key in (normalize(name), normalize(name.rsplit("/", 1)[-1])):
                index.setdefault(key, hub_id)
    return index


def lookup(name: str) -> str | None:
    """Canonical hub id for a hub id / short name / alias (case-insensitive), or None.

    An id with an unknown organisation does not fall back to its name part: 'someone/gpt2' may be anything.
    """
    return _index().get(normalize(name))


def mirrored(name: str) -> tuple[str, dict[str, Any]] | None:
    """A mirror organisation's re-upload of a catalogued checkpoint (``unsloth/Llama-3.2-1B-Instruct``,
    ``unsloth/llama-3-8b-bnb-4bit``): the entry it copies and the config keys its name suffix adds; None otherwise.
    A name the entry's lookup does not know after the suffix is taken off (Unsloth's ``-unsloth-bnb-4bit`` dynamic
    quants, whose 16-bit modules vary, or ``-GGUF`` files) is not resolved."""
    org, _, rest = name.strip().partition("/")
    mirrors = catalog_file().mirror_organisations
    mirror = next((m for o, m in mirrors.items() if o.lower() == org.lower()), None) if rest else None
    if mirror is None:
        return None
    for suffix, added in sorted(mirror.suffixes.items(), key=lambda kv: -len(kv[0])):
        if rest.lower().endswith(suffix.lower()):
            hub_id = lookup(rest[: -len(suffix)])
            return (hub_id, copy.deepcopy(added)) if hub_id else None
    hub_id = lookup(rest)
    return (hub_id, {}) if hub_id else None


def catalog_names() -> list[str]:
    """Canonical hub ids of every catalog entry, sorted case-insensitively (for the CLI and the docs)."""
    return sorted(_models(), key=str.lower)


def short_names() -> list[str]:
    """Every accepted short name and alias (used for 'did you mean' suggestions)."""
    return sorted({k for k in _index() if "/" not in k})


def block_class(architecture: str | None) -> str | None:
    """The transformer block class of ``architecture`` (``LlamaForCausalLM`` -> ``LlamaDecoderLayer``), as
    transformers' ``_no_split_modules`` names it, without importing transformers; None for one the table lacks."""
    return catalog_file().block_classes.value.get(architecture or "")
