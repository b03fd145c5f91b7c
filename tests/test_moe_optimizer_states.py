"""Fused routed-expert tensors (Qwen3-MoE, gpt-oss: counted only in ``expert_params``) are large matrices to an
optimizer: bitsandbytes keeps 8-bit state for every tensor of >= 4096 elements, so their AdamW state is ~2 B per
parameter, not the 8 B of fp32 state it keeps for small 1-D tensors (bnb optim/optimizer.py ``min_8bit_size``)."""

from __future__ import annotations

import pytest

import perfguide
from perfguide.setup import Setup


@pytest.mark.parametrize("model", ["Qwen/Qwen3-30B-A3B", "openai/gpt-oss-20b"])
def test_bnb_8bit_adamw_state_of_an_moe_is_two_bytes_a_parameter(model: str) -> None:
    spec = perfguide.ModelSpec.from_any(model)
    s = Setup(task="train", device="cuda", micro_batch_size=1, seq_len=512, weights_dtype="bf16", autocast="bf16",
              optimizer="adamw_bnb_8bit")
    got = perfguide.estimate(model, s, hardware="mi300x", host_ram="1850GiB").optimizer_states
    # by hand: embeddings keep fp32 exp_avg + exp_avg_sq under the Trainer (8 B), everything else 2 x 1 B
    # plus one fp32 absmax per 2048-element block (2 x 4/2048 B); norms and router vectors are a rounding error
    emb = spec.embedding_params
    by_hand = 8 * emb + (spec.total_params - emb) * (2 + 8 / 2048)
    assert abs(got - by_hand) / by_hand < 0.03, (got / 2**30, by_hand / 2**30)
    assert spec.expert_params > 0.5 * spec.total_params   # the experts are most of the model: the term decides
