"""Families whose blocks add norms to Llama's: their own activation coefficients (data/activations.json).

Qwen3 (q_norm / k_norm per head), Gemma (RMSNorm scaled by 1 + weight in fp32), OLMo 2, Phi-3 and Gemma 3 used to
resolve to the llama table, StableLM too (LayerNorm, a quarter of each head rotated: 13-16% fewer bytes than it priced),
Phi-1.5/2 and GPT-J to GPT-2's (attention and MLP in parallel off one LayerNorm: 12-20% fewer). Counted on the real modules (saved_tensors_hooks, fake tensors, CUDA kernel choice) the
llama table priced a bf16 Qwen3 block 13-15% low per token and a Gemma block 7-9% low, so each is now fitted by
scripts/fit_activations.py. Checked here two ways: the bytes per token by hand (bf16, full fine-tuning, SDPA, no
checkpointing, no dropout), and the bytes the installed transformers' block saves for backward on real CPU tensors
(bf16 SDPA on CPU runs a flash kernel that saves what CUDA's does: q, k, v, output and a logsumexp per head).
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import block_saved_bytes

from perfguide.memory.activations import family_name, layer_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

H, I, HEADS, KV_HEADS, HD = 128, 448, 8, 2, 16
Q, KV = HEADS * HD, KV_HEADS * HD
B, S = 2, 64


#: fitted with every head a key/value head (their releases' shapes: StableLM 2 1.6B, Phi-1.5, Phi-2)
MHA = ("stablelm", "phi")


def _config(model_type: str) -> dict[str, Any]:
    return {"model_type": model_type, "hidden_size": H, "intermediate_size": I, "num_attention_heads": HEADS,
            "num_key_value_heads": HEADS if model_type in MHA else KV_HEADS, "head_dim": HD, "num_hidden_layers": 2,
            "vocab_size": 512, "max_position_embeddings": 1024, "tie_word_embeddings": False, "pad_token_id": 0}


def _priced(model_type: str) -> float:
    setup = Setup(task="train", micro_batch_size=B, seq_len=S, weights_dtype="bf16", optimizer="sgd")
    return layer_bytes(ModelSpec.from_any(_config(model_type)), setup) / (B * S)


# bf16 Llama block, bytes per token: each RMSNorm keeps its fp32 upcast (4h), the bf16 normalised tensor its weight's
# gradient needs (2h), its output the next Linears keep for theirs (2h) and a 4-byte rsqrt; SDPA keeps the rotated q
# and k, v, its output (o_proj's input) and a 4-byte logsumexp per head; the SwiGLU keeps gate, silu(gate), up and
# their product (down_proj's input), 2 B each.
LLAMA = 2 * (8 * H + 4) + (2 + 2) * Q + 4 * HEADS + (2 + 2) * KV + 8 * I


def test_qwen3_block_by_hand() -> None:
    # q_norm / k_norm (per head, before the rotation): each keeps the fp32 upcast (4), the bf16 normalised tensor (2)
    # and a 4-byte rsqrt per head
    assert _priced("qwen3") == LLAMA + 6 * Q + 4 * HEADS + 6 * KV + 4 * KV_HEADS


def test_gemma_block_by_hand() -> None:
    # GemmaRMSNorm multiplies by (1 + weight) in fp32: the normalised tensor its weight's gradient needs is fp32 (4h,
    # not 2h), two norms per block
    assert _priced("gemma") == LLAMA + 2 * 2 * H


def test_llama_block_by_hand() -> None:
    assert _priced("llama") == LLAMA


def _saved_per_token(model_type: str) -> float:
    """Per token: two batch sizes differenced, so per-block constants (Gemma's fp32 1 + weight) cancel."""
    return (block_saved_bytes(_config(model_type), 2 * B, S) - block_saved_bytes(_config(model_type), B, S)) / (B * S)


@pytest.mark.parametrize("model_type", ["qwen3", "gemma", "llama", "stablelm", "phi"])
def test_priced_block_is_what_the_real_block_saves(model_type: str) -> None:
    # LayerNorm blocks: up to 8 B per token short, the per-row mean / rstd (4 x 2 B here), which the fit's 512-B
    # allocator rounding drops at its small token counts (a row of 128-256 tokens is under one block)
    assert _priced(model_type) == pytest.approx(_saved_per_token(model_type), abs=8 if model_type in MHA else 0)


@pytest.mark.parametrize(("model_type", "family"), [("qwen3", "qwen3"), ("qwen3_moe", "qwen3_moe"), ("gemma", "gemma"),
                                                    ("gemma3_text", "gemma3_text"), ("gemma3", "gemma3_text"),
                                                    ("olmo2", "olmo2"), ("phi3", "phi3"), ("mistral", "llama"),
                                                    ("stablelm", "stablelm"), ("phi", "phi"), ("gptj", "gptj"),
                                                    # stop 40's audit (bench/family_audit.py, tests/test_family_audit.py)
                                                    ("falcon", "falcon"), ("bloom", "bloom"), ("mpt", "mpt"),
                                                    ("starcoder2", "starcoder2"), ("gpt_bigcode", "gpt_bigcode"),
                                                    ("cohere", "cohere"), ("olmoe", "olmoe"),
                                                    # traced equal to the llama table's price: the alias stays
                                                    ("qwen2", "llama"), ("granite", "llama"), ("smollm3", "llama")])
def test_families_resolve_to_their_own_tables(model_type: str, family: str) -> None:
    assert family_name("llama", model_type) == family
