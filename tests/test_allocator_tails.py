"""The caching allocator's unsplit segment tails of per-parameter state tensors (sharding.unsplit_tail_bytes).

torch's CUDA caching allocator gives a request of 10 MiB or more a segment rounded up to 2 MiB, rounds the block to
512 B and splits the rest off only when more than 1 MiB remains (c10/cuda/CUDACachingAllocator.cpp: kMinLargeAlloc,
kRoundLarge, round_size, get_allocation_size, should_split ``remaining > kSmallSize``), so a tail of 1 MiB or less
is allocated with the tensor and counted by ``max_memory_allocated``. Expected bytes are hand-derived from those
constants and from the 2022 HF PyTorch-FSDP blog's gpt2-large (fp32, AdamW, one tensor per parameter under DDP).
"""

from __future__ import annotations

import pytest

from perfguide.memory.ledger import ledger
from perfguide.memory.sharding import per_tensor_state_tails, unsplit_tail_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

MiB = 1 << 20


@pytest.mark.parametrize(("nbytes", "tail"), [
    (1280 * 5120 * 4, 1 * MiB),            # 25 MiB -> a 26 MiB segment, 1 MiB left: not split off
    (1280 * 3840 * 4, 0),                  # 18.75 MiB -> 20 MiB, 1.25 MiB left: split off as a free block
    (50257 * 1280 * 4, 633_856),           # GPT-2 wte: 245.39 MiB -> 246 MiB
    (4096 * 4096 * 2, 0),                  # 32 MiB: a whole number of 2 MiB
    (1280 * 1280 * 4, 0),                  # 6.25 MiB: below 10 MiB, packed into shared 20 MiB segments
    (10 * MiB + 1, 0),                     # block 10 MiB + 512 B, segment 12 MiB: 2 MiB - 512 B left, split off
    (11 * MiB + 1, MiB - 512),             # block 11 MiB + 512 B, segment 12 MiB: 1 MiB - 512 B left, kept
])
def test_tail_hand_counts(nbytes: int, tail: int) -> None:
    assert unsplit_tail_bytes(nbytes) == tail


GPT2_LARGE = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 1280, "n_layer": 36, "n_head": 20,
              "n_positions": 1024, "vocab_size": 50257}


def _setup(**kw: object) -> Setup:
    fields: dict[str, object] = dict(task="train", micro_batch_size=7, seq_len=128, weights_dtype="fp32",
                                     attn_implementation="eager", optimizer="adamw_torch_fused", strategy="ddp",
                                     num_gpus=2)
    fields.update(kw)
    return Setup(**fields)  # type: ignore[arg-type]


def test_gpt2_large_ddp_adamw_hand_count() -> None:
    # per block: c_fc and mlp.c_proj (1280 x 5120 fp32) keep 1 MiB each; c_attn's 1.25 MiB tail is split off and
    # attn.c_proj (6.25 MiB) shares segments: 2 MiB x 36 blocks + wte's 633,856 B = 76,131,328 B per copy;
    # weights + two AdamW moments = 3 copies, gradients one
    spec, setup = ModelSpec.from_any(GPT2_LARGE), _setup()
    led = ledger(spec, setup)
    per_copy = 2 * MiB * 36 + 633_856
    assert per_copy == 76_131_328
    adam = 2 * led.trainable_params * 4
    assert per_tensor_state_tails(spec, setup, led, adam) == (3 * per_copy, per_copy)


@pytest.mark.parametrize("kw", [dict(strategy="fsdp"), dict(strategy="zero2"), dict(weights_dtype="nf4", lora=LoraSpec(r=8, alpha=16, target_modules=("c_attn",)))])
def test_flattened_or_packed_layouts_get_none(kw: dict[str, object]) -> None:
    spec, setup = ModelSpec.from_any(GPT2_LARGE), _setup(**kw)
    led = ledger(spec, setup)
    assert per_tensor_state_tails(spec, setup, led, 2 * led.trainable_params * led.param_bytes) == (0, 0)
