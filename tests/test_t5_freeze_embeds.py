"""``--freeze_embeds`` of the 2021 seq2seq examples on T5: the shared embedding and the head tied to it train no more.

examples/seq2seq utils.py ``freeze_embeds`` sets ``requires_grad=False`` on ``model.shared`` and on each stack's
``embed_tokens`` (the same Parameter); T5 v1.0 ties ``lm_head.weight`` to it. Traced here on a real random-init T5
(current transformers, CPU), then priced against a hand count on t5-large (config.json: vocab 32128, d_model 1024).
"""

from __future__ import annotations

import pytest
from helpers import load_bench

from perfguide.memory.analytic import training_memory
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

SHARED = 32128 * 1024   # t5-large's shared embedding: 32,899,072 parameters


def test_freezing_shared_freezes_the_tied_head_on_a_real_t5() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2,
                                   tie_word_embeddings=True, decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(config)
    for module in (model.shared, model.encoder.embed_tokens, model.decoder.embed_tokens):
        for p in module.parameters():
            p.requires_grad = False
    assert model.lm_head.weight is model.shared.weight          # tied: one Parameter, frozen with the embedding
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert total - trainable == 64 * 16
    ids = torch.randint(1, 64, (2, 5))
    model(input_ids=ids, labels=ids).loss.backward()
    assert model.shared.weight.grad is None                     # no gradient, so no AdamW state and no DDP bucket slot
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def _frozen(spec: ModelSpec) -> ModelSpec:
    spec2: ModelSpec = load_bench("accuracy_spec").frozen_embeddings_spec(spec)
    return spec2


def test_the_frozen_spec_trains_all_but_the_shared_embedding() -> None:
    spec = ModelSpec.from_any("google-t5/t5-large")
    assert spec.embedding_params == SHARED and spec.lm_head_params == 0   # tied head: no parameters of its own
    assert _frozen(spec).trainable_params == spec.total_params - SHARED


def test_ddp_fp32_drops_the_embedding_gradient_adam_state_and_bucket_slot() -> None:
    # torch 1.7 DDP: the fp32 gradient (4 B), AdamW's exp_avg and exp_avg_sq (8 B) and DDP's flat bucket copy (4 B)
    spec = ModelSpec.from_any("google-t5/t5-large")
    setup = Setup(micro_batch_size=16, seq_len=128, strategy="ddp", num_gpus=2, attn_implementation="eager")
    full, frozen = training_memory(spec, setup, grads_persist=True), training_memory(_frozen(spec), setup, grads_persist=True)
    assert full.gradients - frozen.gradients == 4 * SHARED
    assert full.optimizer_states - frozen.optimizer_states == 8 * SHARED
    # within the allocator's per-tensor rounding tails: the frozen ledger prices the trainable tensors as one
    # hidden-wide matrix (ledger._frozen_groups), so its 2 MiB-segment tails differ from the per-shape ones
    assert full.peak_allocated - frozen.peak_allocated == pytest.approx(16 * SHARED, abs=4 * 2**20)
    assert frozen.activations == full.activations


def test_zero2_drops_the_embedding_masters_and_adam_state() -> None:
    # DeepSpeed receives only requires_grad parameters: per rank of 2, 4 B fp32 master + 8 B Adam moments per
    # parameter fewer at the backward peak (the fp16 weight stays: the engine halves the whole module)
    spec = ModelSpec.from_any("google-t5/t5-large")
    setup = Setup(micro_batch_size=40, seq_len=128, strategy="zero2", num_gpus=2, weights_dtype="fp32", autocast="fp16",
                  attn_implementation="eager")
    full, frozen = training_memory(spec, setup), training_memory(_frozen(spec), setup)
    assert full.weights == frozen.weights
    assert full.peak_allocated - frozen.peak_allocated == pytest.approx(12 * SHARED / 2, rel=1e-6)
