"""Bare sizes ("7b", "350m", "1.5B") -> a Llama-shaped ModelSpec of about that many parameters.

Rule (data/architectures.json ``size_rule``): a catalog Llama within 10% of the size, the closest, keeps
real shapes for the sizes people mean ("7b" -> Llama-2-7b, "70b" -> Llama-3-70B); any other size gets a
synthetic Llama-2-shaped model whose hidden size follows Llama-2's layers/hidden aspect ratio and whose
layer count lands nearest the requested size.
"""

from __future__ import annotations

import math
import re
from typing import Any

from . import catalog
from .catalog import SizeRule
from .counting import analytic_count, build_spec
from .types import ModelSpec

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmbt])\s*$", re.IGNORECASE)
_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def is_size_like(text: str) -> bool:
    """'0b' and '0.0m' look like sizes even though parse_size refuses them (zero parameters)."""
    return _SIZE.match(text) is not None


def parse_size(text: str) -> int | None:
    """'7b' -> 7_000_000_000; None when ``text`` is not a bare size."""
    match = _SIZE.match(text)
    value = int(float(match[1]) * _SCALE[match[2].lower()]) if match else 0
    return value if value >= 1 else None  # '0.0000000001k' rounds to no parameters at all


def _total(config: dict[str, Any]) -> int:
    counted = analytic_count(config, "lm")
    assert counted is not None, config.get("model_type")  # size_rule names counted model types only
    return counted.total


def _closest_catalog(target: int, rule: SizeRule) -> str | None:
    """The catalogued model nearest the size, among unquantized checkpoints only: a size names a shape, and a GPTQ or
    AWQ repo of the same shape (TheBloke/Llama-2-7B-GPTQ) would price its stored format instead."""
    best = min(((abs(math.log(_total(c) / target)), i) for i in catalog.catalog_names()
                if (c := catalog.config_of(i)).get("model_type") in rule.model_types and i not in rule.skip
                and "quantization_config" not in c), default=None)
    return best[1] if best and best[0] <= math.log1p(rule.match_within) else None


def _round_up(value: float, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)


def _synthetic(target: int, rule: SizeRule) -> dict[str, Any]:
    """Template config scaled: hidden from the aspect ratio (12 h^2 params per layer), then the layer count."""
    base = catalog.config_of(rule.template)
    heads, hidden, layers = base["num_attention_heads"], base["hidden_size"], base["num_hidden_layers"]
    head_dim, kv_ratio = base.get("head_dim") or hidden // heads, base.get("num_key_value_heads", heads) / heads
    mult, vocab = rule.hidden_multiple, base["vocab_size"]

    def approx(h: int) -> float:
        return 12 * h**2 * (h * layers / hidden) + 2 * vocab * h

    h = min((mult * k for k in range(1, 1024)), key=lambda x: abs(math.log(approx(x) / target)))
    h = _round_up(h, head_dim)
    n_heads = h // head_dim
    config = base | dict(hidden_size=h, num_attention_heads=n_heads, num_key_value_heads=max(1, round(n_heads * kv_ratio)),
                         head_dim=head_dim, intermediate_size=_round_up(8 * h / 3, rule.intermediate_multiple),
                         num_hidden_layers=1)
    one = _total(config)
    per_layer = _total(config | {"num_hidden_layers": 2}) - one
    return config | {"num_hidden_layers": max(1, round((target - one + per_layer) / per_layer))}


def spec_for_size(text: str) -> ModelSpec:
    """The ModelSpec for a bare size string (see the module docstring for the shape rule)."""
    target = parse_size(text)
    if target is None:
        raise ValueError(f"not a size: {text!r}")
    rule = catalog.catalog_file().size_rule
    hub_id = _closest_catalog(target, rule)
    if hub_id is not None:
        config, label = catalog.config_of(hub_id), f"{hub_id.rsplit('/', 1)[-1]} shape"
    else:
        config = _synthetic(target, rule)
        label = f"synthetic {config['model_type']}: hidden {config['hidden_size']}, {config['num_hidden_layers']} layers"
        config["_name_or_path"] = f"size:{text.strip()}"
    counted = analytic_count(config, "lm")
    assert counted is not None
    return build_spec(config, counted, f"{text.strip()} ({label})", "size")
