"""GPT-NeoX before transformers 4.49 registers a causal-mask buffer in every block (eras.attention_buffer_bytes,
data/activations.json attention_eras ``mask_buffer_bytes_per_position2``).

Expected bytes are hand-derived from modeling_gpt_neox.py as released (4.42.4 wheel lines 112 and 123-131, 4.48.0 lines
276 and 294-300): ``GPTNeoXAttention.__init__`` calls ``self._init_bias(config.max_position_embeddings)``, which
registers ``bias = torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool))`` (persistent=False); the
SDPA class (4.42+) inherits that __init__; 4.49.0 and 4.50.0 have no such buffer. One byte per max_positions^2 per
block, resident from load on: pythia-410m (max_position_embeddings 2048, 24 layers) 2048^2 x 24 = 100,663,296 B.
A live-bytes trace (perfguide's tracker, 4.42.4 wheel, real CPU fp16 GPT-NeoX) charges that storage once per block.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from helpers import load_bench

from perfguide.memory.analytic import training_memory
from perfguide.memory.eras import attention_buffer_bytes, attention_era_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

#: EleutherAI/pythia-410m-deduped's config.json shape (the transformers docs' GPT-NeoX SDPA table)
PYTHIA_410M = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 1024,
               "num_attention_heads": 16, "num_hidden_layers": 24, "intermediate_size": 4096, "vocab_size": 50304,
               "max_position_embeddings": 2048, "rotary_pct": 0.25, "tie_word_embeddings": False}


def _setup(attn: str = "eager", **kw: object) -> Setup:
    fields: dict[str, object] = dict(task="train", micro_batch_size=2, seq_len=1024, weights_dtype="fp16",
                                     attn_implementation=attn, optimizer="adamw_torch")
    fields.update(kw)
    return Setup(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("release", ["4.42.0", "4.42.4", "4.48.0"])
def test_gpt_neox_before_4_49_keeps_a_bool_mask_per_block_by_hand(attn: str, release: str) -> None:
    spec = ModelSpec.from_any(PYTHIA_410M)
    assert attention_buffer_bytes(spec, _setup(attn), release) == 2048 * 2048 * 1 * 24 == 100_663_296
    # independent of batch, length and checkpointing (a buffer, not an activation)
    assert attention_buffer_bytes(spec, _setup(attn, micro_batch_size=8, seq_len=128, gradient_checkpointing=True),
                                  release) == 100_663_296
    # saved activations: only eager's fp32-rotary q and k before 4.45 (tests/test_gpt_neox_fp32_rope.py), 4 B per h
    rope = 4 * 1024 * 2 * 1024 * 24 if attn == "eager" and release != "4.48.0" else 0
    assert attention_era_bytes(spec, _setup(attn), release) == rope


@pytest.mark.parametrize("release", ["4.49.0", "4.50.0", "5.24.0"])
def test_the_refactored_gpt_neox_has_no_mask_buffer(release: str) -> None:
    spec = ModelSpec.from_any(PYTHIA_410M)
    assert attention_buffer_bytes(spec, _setup(), release) == 0
    assert attention_buffer_bytes(spec, _setup("sdpa"), release) == 0


def test_resident_bytes_lift_every_phase_by_exactly_their_size() -> None:
    """A buffer resident beside the weights raises the peak whichever phase sets it (here the small-shape rows'
    end-of-backward peak as well as the long rows' forward peak)."""
    spec = ModelSpec.from_any(PYTHIA_410M)
    for setup in (_setup(micro_batch_size=1, seq_len=128), _setup(micro_batch_size=2, seq_len=2048)):
        base = training_memory(spec, setup).peak_allocated
        assert training_memory(spec, setup, resident_bytes=100_663_296).peak_allocated == base + 100_663_296


def test_model_half_leaves_a_bool_buffer_bool_on_real_torch() -> None:
    """The docs table ran model.half(): Module.half() casts floating-point buffers only, so the mask stays 1 B."""
    import torch

    m = torch.nn.Module()
    m.register_buffer("bias", torch.tril(torch.ones((64, 64), dtype=torch.bool)).view(1, 1, 64, 64), persistent=False)
    m.half()
    assert m.bias.dtype == torch.bool and m.bias.untyped_storage().nbytes() == 64 * 64


@pytest.fixture(scope="module")
def acc() -> ModuleType:
    return load_bench("accuracy")


def test_the_docs_table_rows_get_the_buffer_of_their_release(acc: ModuleType) -> None:
    """gpt_neox.md's table came with PR #31031 (GPTNeoXSdpaAttention first in 4.42: absent in 4.41.2): the bench
    charges 4.42's buffers beyond the installed release's none; an OPT row gets nothing."""
    from accuracy_loss import _resident_bytes, _transformers_version

    row = {"source": "huggingface/transformers docs/source/en/model_doc/gpt_neox.md (PR #31031)", "notes": "",
           "method": "loss=logits.sum()"}
    assert _transformers_version(row) == "4.42.0"
    assert _resident_bytes(row, ModelSpec.from_any(PYTHIA_410M), _setup("sdpa")) == 100_663_296
    opt_row = {**row, "source": "huggingface/transformers docs/source/en/model_doc/opt.md (PR #33298)"}
    opt = ModelSpec.from_any({"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": 1024,
                              "num_attention_heads": 16, "num_hidden_layers": 24, "ffn_dim": 4096,
                              "vocab_size": 50272, "max_position_embeddings": 2048})
    assert _resident_bytes(opt_row, opt, _setup("sdpa")) == 0
