"""gpt-oss's activation table (scripts/fit_moe_activations.py, EAGER_ONLY), checked on the real block.

Until stop 41 gpt-oss was priced with Mixtral's table: 0.79 of what its bf16 block saves (bench/family_audit.py).
Three things differ, each counted on real CPU tensors by the fit: its experts clamp and gate the interleaved gate/up
columns as ``(up + 1) * gate * sigmoid(alpha * gate)`` (more saved per routed unit than ``silu(gate) * up``); its
class refuses SDPA, and its eager softmax runs over [scores, sink] in the scores' dtype (2 B per head x s^2 under
bf16 weights, where Llama's eager keeps the fp32 softmax and its bf16 cast, 6 B), plus max's int64 indices and the
sink column per head and token; its RMSNorm multiplies the bf16 weight into the fp32 hidden state before the cast,
so each norm keeps the fp32 product (4 B x h) where Llama's keeps a bf16 copy (2 B x h).

Checked here at dims the fit never used (hidden 192, 6 heads of 64, 3 K/V heads, 6 experts of 160, top 3), bf16,
full fine-tuning, no checkpointing, at two lengths so the s x s term is tested too.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import block_saved_bytes

from perfguide.memory.activations import layer_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

HEADS = 6
CONFIG: dict[str, Any] = {"model_type": "gpt_oss", "hidden_size": 192, "num_attention_heads": HEADS,
                          "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 160, "num_local_experts": 6,
                          "num_experts_per_tok": 3, "num_hidden_layers": 2, "vocab_size": 512,
                          "max_position_embeddings": 1024, "tie_word_embeddings": False}
B = 2


def _priced(seq: int) -> float:
    setup = Setup(task="train", micro_batch_size=B, seq_len=seq, weights_dtype="bf16", optimizer="sgd",
                  attn_implementation="eager")
    return layer_bytes(ModelSpec.from_any(dict(CONFIG)), setup) / (B * seq)


def _saved(seq: int) -> float:
    """Per token, two batch sizes differenced (per-block constants cancel; the s x s terms scale with the batch)."""
    return (block_saved_bytes(CONFIG, 2 * B, seq, "eager") - block_saved_bytes(CONFIG, B, seq, "eager")) / (B * seq)


#: per token per block, what the training forward's DynamicCache keeps besides autograd's saves: GptOssConfig's
#: use_cache defaults to True and nothing turns it off without checkpointing, so each block's K and V (3 heads of 64,
#: 2 B) stay alive; eager attention saves the expanded copies, not these (the helper runs with use_cache=False)
CACHE = 2 * 3 * 64 * 2


@pytest.mark.parametrize("seq", [64, 128])
def test_priced_block_is_what_the_real_block_saves(seq: int) -> None:
    transformers = pytest.importorskip("transformers")
    assert transformers.AutoConfig.for_model("gpt_oss").use_cache
    assert _priced(seq) == pytest.approx(_saved(seq) + CACHE, rel=0.005)


def test_the_s2_term_is_the_bf16_softmax_alone() -> None:
    # per token the eager scores grow by heads x (s' - s) x bytes per s x s element: 2 B (the bf16 softmax output the
    # value matmul reuses), not Llama's 6 (fp32 softmax + its bf16 cast)
    growth = _saved(128) - _saved(64)
    assert growth == pytest.approx(HEADS * 64 * 2, rel=0.02)
    assert _priced(128) - _priced(64) == pytest.approx(growth, rel=0.02)


def test_the_table_is_no_longer_mixtrals() -> None:
    from perfguide.memory.activations import family_name
    from perfguide.model.fields import family

    assert family_name(family("gpt_oss"), "gpt_oss") == "gpt_oss"
