"""One block of litgpt's own GPT (Setup.model_code='litgpt': memory/litgpt_blocks.py, data/litgpt.json, and its LoRA
branch in memory/lora_activations.py) against litgpt 0.4.12 traced on real CPU tensors at dims the table was not
fitted at (scripts/fit_litgpt.py fits h 256 / i 1024 at s 128; these are h 320 / i 1280 and 2560, or s 256 and rank 32,
or Gemma's and Gemma 2's real 2b blocks: ``fit_litgpt.py check``).

The traced figures are bytes per token one block keeps when the forward returns (two blocks minus one, perfguide's
live-bytes tracker, bf16-true as finetune/lora.py builds the model). CPU's dropout keeps a bf16 noise tensor where
CUDA's fused kernel keeps a 1-byte mask, so a dropout trace is read with 1 byte less per dropped element (the
adapted Linears' input widths): what a GPU run keeps."""

from __future__ import annotations

from typing import Any

import pytest

from perfguide.memory.analytic import training_memory
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

B, S, V = 2, 256, 1024
PHI = dict(model_type="phi", hidden_size=320, intermediate_size=1280, num_attention_heads=4, partial_rotary_factor=0.4,
           resid_pdrop=0.1, tie_word_embeddings=False, max_position_embeddings=2048, vocab_size=V)
LLAMA = dict(model_type="llama", hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2,
             head_dim=64, tie_word_embeddings=True, max_position_embeddings=2048, vocab_size=V)
#: gemma-2b's block and gemma-2-2b's (their Hub configs' dims): heads of 256, one and four key/value groups
GEMMA = dict(model_type="gemma", hidden_size=2048, intermediate_size=16384, num_attention_heads=8, num_key_value_heads=1,
             head_dim=256, tie_word_embeddings=True, max_position_embeddings=8192, hidden_activation="gelu_pytorch_tanh",
             vocab_size=V)
GEMMA2 = dict(model_type="gemma2", hidden_size=2304, intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4,
              head_dim=256, tie_word_embeddings=True, max_position_embeddings=8192, hidden_activation="gelu_pytorch_tanh",
              attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=256, sliding_window=4096,
              vocab_size=V)
PHI_ALL = ("q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2")
GEMMA_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def block_bytes_per_token(config: dict[str, Any], lora: LoraSpec | None, model_code: str = "litgpt") -> float:
    """perfguide's activations of a two-block model minus a one-block one, per token."""
    setup = Setup(task="train", micro_batch_size=B, seq_len=S, weights_dtype="bf16", optimizer="adamw_torch", lora=lora,
                  model_code=model_code)
    one, two = (training_memory(ModelSpec.from_any({**config, "num_hidden_layers": n}), setup).activations for n in (1, 2))
    return (two - one) / (B * S)


@pytest.mark.parametrize(("intermediate", "traced"), [(1280, 10900), (2560, 16020)])
def test_full_fine_tuning_block_as_traced(intermediate: int, traced: int) -> None:
    """litgpt's phi block (F.gelu in one kernel, no dropout) keeps far less than transformers' PhiDecoderLayer."""
    config = {**PHI, "intermediate_size": intermediate}
    assert block_bytes_per_token(config, None) == pytest.approx(traced, rel=0.005)
    assert block_bytes_per_token(config, None, "transformers") > 1.3 * traced


@pytest.mark.parametrize(("config", "targets", "rank", "dropout", "traced", "dropped"), [
    (PHI, ("q_proj", "v_proj"), 8, 0.05, 9672, 320),        # fused qkv, q and v enabled: its lora_B output is kept
    (PHI, ("q_proj", "v_proj"), 8, 0.0, 9032, 0),
    (PHI, PHI_ALL, 8, 0.05, 16116, 3 * 320 + 1280),          # one dropout per litgpt LoRA Linear, q/k/v fused
    (LLAMA, ("q_proj", "v_proj"), 32, 0.05, 12188, 256),
    (GEMMA, GEMMA_ALL, 8, 0.05, 230584, 4 * 2048 + 16384),
    (GEMMA2, GEMMA_ALL, 8, 0.05, 193736, 4 * 2304 + 9216),
])
def test_lora_block_as_traced(config: dict[str, Any], targets: tuple[str, ...], rank: int, dropout: float, traced: int,
                              dropped: int) -> None:
    lora = LoraSpec(r=rank, alpha=16, target_modules=targets, dropout=dropout)
    assert block_bytes_per_token(config, lora) == pytest.approx(traced - dropped, rel=0.01)


@pytest.mark.parametrize(("config", "traced"), [(GEMMA, 193608), (GEMMA2, 189528)])
def test_gemma_full_fine_tuning_block_as_traced(config: dict[str, Any], traced: int) -> None:
    """Gemma 2's attention soft-capping takes litgpt off SDPA onto its own scores, 8 B per b x heads x s^2 (tanh
    output, fp32 softmax, its bf16 copy), and its two extra norms keep 16 h more: transformers' SDPA coefficients
    (what a model type missing from data/litgpt.json gets) leave 10% of the traced block out at s 256."""
    assert block_bytes_per_token(config, None) == pytest.approx(traced, rel=0.005)
    if config is GEMMA2:
        scores = B * 8 * S * S * 8 / (B * S)
        assert block_bytes_per_token(config, None, "transformers") < traced - 0.8 * scores


def test_litgpt_adapters_take_the_models_dtype() -> None:
    """litgpt creates lora_A / lora_B under fabric.init_module: bf16 under bf16-true, so parameters, gradients and
    AdamW's two moments take 2 bytes each (traced: trainable dtypes bfloat16); PEFT upcasts them to fp32."""
    spec = ModelSpec.from_any("meta-llama/Llama-2-7b-hf")
    lora = LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj"))
    setup = Setup(task="train", weights_dtype="bf16", optimizer="adamw_torch", lora=lora, micro_batch_size=1, seq_len=256)
    adapters = 32 * 2 * 8 * (4096 + 4096)
    lit, hf = training_memory(spec, setup.replace(model_code="litgpt")), training_memory(spec, setup)
    assert (lit.gradients, lit.optimizer_states) == (2 * adapters, 4 * adapters)
    assert (hf.gradients, hf.optimizer_states) == (4 * adapters, 8 * adapters)


@pytest.mark.parametrize(("shape", "traced"), [
    (dict(hidden_size=320, num_attention_heads=5, multi_query=True), 9880),                 # falcon-7b's layout
    (dict(hidden_size=512, num_attention_heads=8, new_decoder_architecture=True, num_kv_heads=2), 15396),
])
def test_falcon_full_fine_tuning_block_as_traced(shape: dict[str, Any], traced: int) -> None:
    """litgpt's falcon block (fitted at h 256 with one key/value group) against litgpt 0.4.12's falcon-7b code traced
    at these shapes (MLP 4 x hidden, heads of 64, one norm shared by attention and MLP; the second with two key/value
    groups, which transformers builds only under new_decoder_architecture, whose second norm the form leaves out, as
    data/litgpt.json says). Falcon's configs name no kv heads and no MLP width, so this also needs them read off the
    module (a fused query_key_value of (heads + 2 kv) x 64)."""
    config = dict(model_type="falcon", vocab_size=V, parallel_attn=True, bias=False, alibi=False,
                  tie_word_embeddings=True, max_position_embeddings=2048, architectures=["FalconForCausalLM"], **shape)
    assert block_bytes_per_token(config, None) == pytest.approx(traced, rel=0.005)
