"""Gemma 3n (E2B / E4B; transformers 5.24 modeling_gemma3n.py): Gemma 3's attention and FFN inside AltUp's four copies
of the hidden state, LAuReL's low-rank side path and a 256-wide per-layer-embedding path, its first 10 FFNs sparsifying
their activation (a gaussian top-k cutoff), its last layers reusing earlier layers' K/V. Through the generic (Llama)
table a block at the config class's widths was priced at 0.45 of what it keeps (bench/family_audit.py, stop 73)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import model_saved_bytes, priced_layer_bytes

from perfguide.memory.activations import layer_bytes, spec_family
from perfguide.memory.inference import grown_kv_bytes
from perfguide.model import spec_from_any
from perfguide.setup import Setup

B, S = 2, 32
#: widths none of the fits used, both layers full attention, none reusing another's K/V
TINY: dict[str, Any] = {"model_type": "gemma3n_text", "hidden_size": 96, "intermediate_size": [320, 320],
                        "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
                        "layer_types": ["full_attention"] * 2, "num_kv_shared_layers": 0, "vocab_size": 512,
                        "vocab_size_per_layer_input": 512, "max_position_embeddings": 1024, "pad_token_id": 0,
                        "eos_token_id": 1, "bos_token_id": 2}


@pytest.mark.parametrize("sparsity", [0.0, 0.95], ids=["dense-ffn", "sparse-ffn"])
def test_priced_layer_is_what_a_real_layer_adds(sparsity: float) -> None:
    """What one more layer adds to a real bf16 model's saved bytes on CPU (two layers minus one, two batch sizes, no
    tracer), a dense FFN and a sparsifying one. A layer's share of the per-layer embeddings is computed before the
    first block (b x s x layers x 256 wide), so a block's own saved tensors are 2,568 B per token short of it."""
    config = {**TINY, "activation_sparsity_pattern": [sparsity] * 2}
    assert spec_family(spec_from_any(config)) == "gemma3n_text"
    priced = (priced_layer_bytes(config, 2 * B, S) - priced_layer_bytes(config, B, S)) / (B * S)
    saved = [model_saved_bytes(config, 2, b, S) - model_saved_bytes(config, 1, b, S) for b in (B, 2 * B)]
    # within 0.1%: the sparse layer on CPU keeps 2 B per token more than the tracer fitted (of 18,186)
    assert priced == pytest.approx((saved[1] - saved[0]) / (B * S), rel=1e-3)


def test_class_default_stack_within_two_percent_of_the_tracer() -> None:
    """At the config class's widths (hidden 2048, FFN 16,384, 8 heads of 256, 2 K/V heads; its first 10 of 35 FFNs
    sparse), bf16: the mean layer against the tracer's dense and sparse blocks at their shares."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    transformers = pytest.importorskip("transformers")
    from fit_activations import block_bytes

    full = {**transformers.AutoConfig.for_model("gemma3n_text").to_dict(), "vocab_size": 512, "vocab_size_per_layer_input": 512}
    full.pop("transformers_version", None)
    spec = spec_from_any(full)
    assert spec.sparse_ffn_layers == 10 and spec_family(spec) == "gemma3n_text"
    setups = [Setup(micro_batch_size=1, seq_len=s, optimizer="sgd", weights_dtype="bf16") for s in (64, 128)]
    two = {**full, "num_hidden_layers": 2, "layer_types": ["full_attention"] * 2, "num_kv_shared_layers": 0,
           "intermediate_size": full["intermediate_size"][:2]}
    dense, sparse = ([block_bytes({**two, "activation_sparsity_pattern": [p] * 2}, st) for st in setups] for p in (0.0, 0.95))
    traced = [(25 * d + 10 * s) / 35 for d, s in zip(dense, sparse)]
    priced = [layer_bytes(spec, st) for st in setups]
    assert 0.98 < (priced[1] - priced[0]) / (traced[1] - traced[0]) < 1.02


def test_shared_kv_layers_cache_nothing() -> None:
    """The last ``num_kv_shared_layers`` reuse earlier layers' K/V (Gemma3nTextConfig.kv_sharing_modes): transformers
    gives them "dummy" cache layers. Four full layers of 2 K/V heads of 16, the last two shared: two layers cached."""
    config = {**TINY, "num_hidden_layers": 4, "layer_types": ["full_attention"] * 4, "intermediate_size": [320] * 4,
              "num_kv_shared_layers": 2}
    spec = spec_from_any(config)
    assert spec.cache_layer_types() == ("full_attention", "full_attention", "dummy", "dummy")
    assert grown_kv_bytes(spec, 1, 10, 2) == 2 * 10 * 2 * (2 * 2 * 16)
