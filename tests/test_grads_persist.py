"""zero_grad(set_to_none=False), PyTorch < 2.0's default: the previous step's gradients stay allocated through forward."""

from __future__ import annotations

from perfguide.memory.analytic import training_memory
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup


def test_persisting_grads_add_the_gradient_bytes_to_the_forward_peak() -> None:
    spec = ModelSpec.from_any("gpt2")
    setup = Setup(task="train", micro_batch_size=8, seq_len=512, weights_dtype="fp32", optimizer="adamw_torch")
    freed = training_memory(spec, setup)
    kept = training_memory(spec, setup, grads_persist=True)
    assert "forward" in kept.notes[0]
    # fp32 full fine-tuning: one 4-byte gradient per parameter; without persistence only the head's (tied to the
    # embedding in GPT-2, so the embedding's) gradient exists before backward reaches the blocks
    head = spec.embedding_params * 4
    assert kept.peak_allocated - freed.peak_allocated == spec.total_params * 4 - head


def test_gradient_accumulation_already_holds_them() -> None:
    spec = ModelSpec.from_any("gpt2")
    setup = Setup(task="train", micro_batch_size=8, seq_len=512, weights_dtype="fp32", optimizer="adamw_torch",
                  gradient_accumulation_steps=4)
    assert training_memory(spec, setup, grads_persist=True).peak_allocated == training_memory(spec, setup).peak_allocated
