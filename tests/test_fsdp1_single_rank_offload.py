"""FSDP1 on one rank with CPU offload keeps every unit's fp32 GPU copy until backward
(sharding.unsharded_compute_copies, wired into memory/analytic.py).

Hand-derived: GPT-2 XL has 1,557,611,200 parameters (48 x 30,720,000 block Linears + 48 x 4 x 1600 LayerNorm /
bias terms + 50257 x 1600 tied embedding + 1024 x 1600 positions + the final LayerNorm); all are fp32 on the
GPU at the forward peak, less the two gathered units and one unit gradient the sharding model already counts
(the largest unit is the 50257 x 1600 embedding: 3 x 4 B x 80,411,200).
"""

from __future__ import annotations

import pytest

from perfguide.memory.analytic import training_memory
from perfguide.memory.sharding import unsharded_compute_copies
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

GPT2_XL = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 1600, "n_layer": 48, "n_head": 25,
           "n_positions": 1024, "vocab_size": 50257}
EMBED = 50257 * 1600


def _setup(**kw: object) -> Setup:
    fields: dict[str, object] = dict(task="train", micro_batch_size=2, seq_len=128, weights_dtype="fp32",
                                     attn_implementation="eager", optimizer="adamw_torch", strategy="fsdp", num_gpus=1,
                                     fsdp_version=1, offload_params=True, offload_optimizer=True)
    fields.update(kw)
    return Setup(**fields)  # type: ignore[arg-type]


def test_param_count_is_gpt2_xl() -> None:
    block = 1600 * 4800 + 4800 + 1600 * 1600 + 1600 + 1600 * 6400 + 6400 + 6400 * 1600 + 1600 + 4 * 1600
    assert ModelSpec.from_any(GPT2_XL).total_params == 48 * block + EMBED + 1024 * 1600 + 2 * 1600 == 1_557_611_200


def test_one_rank_keeps_all_fp32_copies_less_the_gathered_units() -> None:
    spec = ModelSpec.from_any(GPT2_XL)
    assert unsharded_compute_copies(spec, _setup(), 3 * 4 * EMBED, params_offloaded=True) == 1_557_611_200 * 4 - 12 * EMBED


@pytest.mark.parametrize("change", [{"num_gpus": 2}, {"fsdp_version": 2}, {"offload_params": False, "offload_optimizer": False},
                                    {"autocast": "fp16"}])
def test_not_charged_where_the_copy_is_freed_or_not_made(change: dict[str, object]) -> None:
    # 2 ranks: the all-gathered copy's storage is resized to 0 after forward; FSDP2 frees its all-gather output
    # the same way; without offload the parameter already lives on the GPU; under autocast matmuls save 16-bit casts
    setup = _setup(**change)
    assert unsharded_compute_copies(ModelSpec.from_any(GPT2_XL), setup, 3 * 4 * EMBED, params_offloaded=setup.offload_params) == 0


def test_one_rank_offload_peak_exceeds_two_ranks_by_the_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same micro-batch on 1 and 2 offloaded ranks: the peak differs by the kept copies (weights, grads and
    optimizer state are all on the host either way). Both priced with the window the copies replace (two gathered
    units and a unit gradient in every phase: torch before 2.0, memory/fsdp_window.py); on torch 2.x two ranks hold
    the root alone at the loss and the phase of their peak moves (tests/test_fsdp_live_peak.py)."""
    import perfguide.memory.overhead as overhead

    monkeypatch.setattr(overhead, "installed_torch", lambda: "1.13.1")
    spec = ModelSpec.from_any(GPT2_XL)
    one, two = training_memory(spec, _setup()), training_memory(spec, _setup(num_gpus=2))
    assert one.peak_allocated - two.peak_allocated == pytest.approx(1_557_611_200 * 4 - 12 * EMBED, rel=0.02)
