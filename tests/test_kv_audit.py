"""bench/kv_audit.py reads what a real ``generate`` cache holds; checked on caches whose bytes are known by hand, so the
audit's table says what it claims (tiny fp32 configs, 2 prompts of 20 tokens, 5 new: 24 cached positions)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


@pytest.mark.parametrize(("model_type", "per_position"), [
    # 2 layers x K and V x 2 KV heads x 16 dims
    ("llama", 2 * 2 * 2 * 16),
    # GPT-BigCode's one K/V head, its keys and values two views of one fused tensor: each storage counted once, whole
    ("gpt_bigcode", 2 * 2 * 1 * 16),
    # Gemma-4: two full-attention layers of 2 KV heads of global_head_dim 32 (the audit's config), not head_dim 16
    ("gemma4_text", 2 * 2 * 2 * 32),
    # Gemma 3n: the second layer reuses the first's K/V (a "dummy" cache layer): one layer of 2 KV heads of 16
    ("gemma3n_text", 1 * 2 * 2 * 16),
])
def test_audit_reads_the_cache_generate_leaves(model_type: str, per_position: int) -> None:
    pytest.importorskip("transformers")
    from kv_audit import BATCH, NEW, PROMPT, audit

    row = audit(model_type)
    assert row["real"] == per_position * 4 * BATCH * (PROMPT + NEW - 1)
    assert row["priced"] == row["real"]


@pytest.mark.parametrize("model_type", ["qwen3_next", "jamba"])
def test_audit_reaches_an_attention_layer_of_a_hybrid(model_type: str) -> None:
    """Qwen3-Next's tiny two layers are both gated DeltaNet; at a depth of 4 its class makes the fourth full attention,
    and the cache holds that layer's K/V beside three layers' fixed states. Jamba's Mamba-1 layers keep a conv state
    of expand x hidden channels over mamba_d_conv and a state of those channels x mamba_d_state (it was priced as a
    growing K/V: 0.46 of the real cache at 24 positions)."""
    pytest.importorskip("transformers")
    from kv_audit import audit

    row = audit(model_type)
    assert row["real"] > 0 and row["priced"] == row["real"]


def test_mimo_cache_reads_its_wider_sliding_layers_and_narrower_values() -> None:
    """MiMo-V2-Flash's attention (MiMoV2FlashAttention): the sliding layers hold twice the K/V heads, and values are
    v_head_dim wide beside keys of head_dim. Its released shape (48 layers, layer 0 and every 6th full, 4 K/V heads,
    keys 192, values 128, a 128-token window written as ``sliding_window_size``): per sequence of 10,000 positions in
    bf16, 9 full layers x 4 x (192 + 128) x 10,000 + 39 sliding x 8 x 320 x 128 (the window plus the query, less one)."""
    from perfguide.memory.inference import grown_kv_bytes
    from perfguide.model import spec_from_any

    types = ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention" for i in range(48)]
    spec = spec_from_any({"model_type": "mimo_v2_flash", "hidden_size": 4096, "intermediate_size": 16384,
                          "num_hidden_layers": 48, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192,
                          "v_head_dim": 128, "sliding_window_size": 128, "layer_types": types, "vocab_size": 152576,
                          "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8})
    full, sliding = types.count("full_attention"), types.count("sliding_attention")
    assert (full, sliding) == (9, 39)
    assert grown_kv_bytes(spec, 1, 10_000, 2) == 2 * (full * 4 * 320 * 10_000 + sliding * 8 * 320 * 128)
