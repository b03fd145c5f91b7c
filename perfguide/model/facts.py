"""What only a built module can tell about a model, as data, and the ModelSpec assembled from it.

Model types without an analytic counter (:mod:`perfguide.model.counting`) are counted by building the transformers
class on the meta device, which costs a cold ``import transformers`` (~17 s) and torch. The catalog records, per
such entry, the facts that build produced (``counted`` in data/architectures.json, written by
``scripts/catalog_counts.py`` and checked against a fresh meta-device build in tests/test_catalog_counted.py), so a
catalogued model resolves from data alone; everything else still comes from the config, read the same way.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .._base import Model
from . import fields, shape
from .types import Linears, ModelSpec


class ModuleFacts(Model):
    """Counts and shapes read off the module itself (not its config); one per meta-device build."""

    total_params: int = Field(gt=0)
    trainable_params: int = Field(ge=0)
    architecture: str
    embedding_params: int = Field(ge=0)
    lm_head_params: int = Field(ge=0)
    tie_word_embeddings: bool
    block_linears: Linears
    dims: dict[str, Any]                  # hidden/layers/heads/vocab/kv heads/head_dim/MLP width (+ enc-dec stacks, block kinds)
    expert_params: int = Field(default=0, ge=0)
    num_moe_layers: int = Field(default=0, ge=0)
    separate_expert_modules: bool = False
    vision_params: int = Field(default=0, ge=0)


def spec_from_facts(config: dict[str, Any], facts: ModuleFacts, name: str, source: str) -> ModelSpec:
    """The ModelSpec of a module whose facts are ``facts`` and whose config is ``config``."""
    model_type = str(config.get("model_type", "unknown"))
    exact: dict[str, Any] = dict(total_params=facts.total_params, trainable_params=facts.trainable_params,
                                 architecture=facts.architecture, separate_expert_modules=facts.separate_expert_modules,
                                 vision_params=facts.vision_params,
                                 **shape.head_fields({**config, "architectures": [facts.architecture]}))
    dims = facts.dims
    layers = dims.get("num_decoder_layers") or dims["num_layers"]
    read = {k: v for k, v in shape.read_all(config, model_type, layers).items() if k not in exact}
    if facts.expert_params and read.get("num_experts", 1) > 1:
        read |= {"expert_params": facts.expert_params, "num_moe_layers": facts.num_moe_layers}
    decoder = shape.decoder_config(config)
    return ModelSpec(name=name, model_type=model_type, family=fields.family(model_type), **dims, **exact,
                     embedding_params=facts.embedding_params, block_linears=facts.block_linears,
                     lm_head_params=facts.lm_head_params, tie_word_embeddings=facts.tie_word_embeddings, **read,
                     max_position_embeddings=decoder.get("max_position_embeddings") or config.get("max_position_embeddings"),
                     native_dtype=fields.native_dtype(config) if config else "fp32", source=source,
                     config=config or None)
