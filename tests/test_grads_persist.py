"""zero_grad(set_to_none=False), PyTorch < 2.0's default: the previous step's gradients stay allocated through forward."""

from __future__ import annotations

from perfguide.memory.analytic import training_memory
from perfguide.memory.sharding import unsplit_tail_bytes
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
    # kept gradients are whole tensors to the caching allocator: wte's (147.24 MiB in a 148 MiB segment) keeps its
    # unsplit 799,744 B tail (sharding.unsplit_tail_bytes); the blocks' are under 10 MiB
    assert unsplit_tail_bytes(spec.vocab_size * spec.hidden_size * 4) == 799_744
    assert kept.peak_allocated - freed.peak_allocated == spec.total_params * 4 - head + 799_744


def test_gradient_accumulation_already_holds_them() -> None:
    spec = ModelSpec.from_any("gpt2")
    setup = Setup(task="train", micro_batch_size=8, seq_len=512, weights_dtype="fp32", optimizer="adamw_torch",
                  gradient_accumulation_steps=4)
    assert training_memory(spec, setup, grads_persist=True).peak_allocated == training_memory(spec, setup).peak_allocated


def test_a_tied_heads_gradient_waits_beside_the_kept_ones() -> None:
    # GPT-2's lm_head is wte: one AccumulateGrad with two inputs (the head's matmul early in backward, the embedding
    # at the end), so autograd's input buffer holds the head's V x h gradient until the embedding's arrives. With
    # .grad kept (zeroed in place) that is a buffer of its own through backward: 50257 x 768 x 4 B = 154,389,504.
    # loss_bytes=0 (a loop whose loss keeps nothing) puts both peaks at the first recompute, where the wait shows
    spec = ModelSpec.from_any("gpt2")
    untied_flag = spec.model_copy(update={"tie_word_embeddings": False})   # same counts, no tie
    setup = Setup(task="train", micro_batch_size=1, seq_len=128, weights_dtype="fp32", optimizer="adamw_torch_fused",
                  gradient_checkpointing=True)
    kept = training_memory(spec, setup, grads_persist=True, loss_bytes=0)
    other = training_memory(untied_flag, setup, grads_persist=True, loss_bytes=0)
    assert kept.notes[0] == other.notes[0] == "peak in checkpoint recompute"
    assert kept.peak_allocated - other.peak_allocated == 50257 * 768 * 4
    # without kept gradients the waiting head gradient is the first one, already counted before the wait
    assert training_memory(spec, setup, loss_bytes=0).peak_allocated == training_memory(untied_flag, setup, loss_bytes=0).peak_allocated
    # it starts after the loss: a forward/loss peak does not see it
    long = setup.replace(seq_len=1024)
    assert training_memory(spec, long, grads_persist=True).notes[0] == "peak in forward/loss"
    assert (training_memory(spec, long, grads_persist=True).peak_allocated
            == training_memory(untied_flag, long, grads_persist=True).peak_allocated)
