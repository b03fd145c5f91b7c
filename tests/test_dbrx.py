"""DBRX reads its nested ``attn_config`` / ``ffn_config`` (model/shape.py NESTED_KEYS): 16 routed experts, 4 active.

Before, its experts, their width and top-k sit in ``ffn_config`` where no reader looked: a DBRX config was priced as a
dense 131.6B model (every parameter active, an FFN of 4 x d_model), and databricks/dbrx-instruct was outside the
catalog. The references are Databricks' card ('132B total parameters of which 36B parameters are active on any
input'), transformers' own build and a count by hand of the routed experts.
"""

from __future__ import annotations

import pytest
from helpers import meta_total

from perfguide import ModelSpec

transformers = pytest.importorskip("transformers")

#: DBRX by hand: 40 layers of 16 experts, each three d_model x ffn_hidden_size matrices (w1, v1, w2)
EXPERTS = 40 * 16 * 3 * 6144 * 10752


def test_the_catalog_entry_is_the_card() -> None:
    spec = ModelSpec.from_any("databricks/dbrx-instruct")
    assert spec.total_params == meta_total("databricks/dbrx-instruct") == pytest.approx(132e9, rel=0.005)
    assert (spec.num_experts, spec.num_experts_per_tok, spec.intermediate_size, spec.num_key_value_heads) == (16, 4, 10752, 8)
    assert spec.expert_params == EXPERTS
    assert spec.active_params == spec.total_params - EXPERTS * 12 // 16 == pytest.approx(36e9, rel=0.02)


def test_an_mpt_attn_config_is_not_read_as_grouped_heads() -> None:
    """MPT nests an attn_config too; transformers' MptAttention has no grouped K/V, so an llm-foundry kv_n_heads in it
    changes nothing that runs."""
    config = transformers.MptConfig(d_model=256, n_heads=8, n_layers=2, vocab_size=1000,
                                    attn_config={"kv_n_heads": 2, "attn_type": "multihead_attention"})
    assert ModelSpec.from_any(config).num_key_value_heads == 8
