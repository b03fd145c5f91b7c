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
