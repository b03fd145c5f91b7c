"""transformers 4's MoE blocks run their experts one after another, so a recomputed block's backward holds one expert's
gradients at a time, not every routed pair's (memory/block_backward.py ``expert_loop_per_token``; traced under
transformers 4.48.1 by scripts/trace_moe_block.py).

Issue 24: the fms-acceleration Mixtral-8x7B QLoRA rows (1301 / 1303: transformers 4.48.1, one A100, b 4 / 8 x 4096)
were priced 7.4% / 10.8% high with transformers 5's grouped coefficients, the excess growing with the batch. Hand
counts from Mixtral-8x7B's shapes: h 4096, expert width 14336, 8 experts, top-2.
"""

from __future__ import annotations

import pytest

from perfguide.memory.activations import family_coefficients
from perfguide.memory.block_backward import block_backward_bytes, expert_loop_per_token, expert_loop_saved_bytes, stream_case
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

H, EXPERT, EXPERTS, TOP_K = 4096, 14336, 8, 2
B, S = 4, 4096
TOKENS = B * S
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def mixtral(model_type: str = "mixtral") -> ModelSpec:
    from transformers import MixtralConfig

    config = MixtralConfig(hidden_size=H, intermediate_size=EXPERT, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                           num_hidden_layers=32, vocab_size=32000, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K,
                           tie_word_embeddings=False)
    spec = ModelSpec.from_any(config)
    return spec if model_type == "mixtral" else spec.model_copy(update={"model_type": model_type})


def qlora(**update: object) -> Setup:
    """Row 1301: nf4 base after peft's kbit preparation and TRL's recast, LoRA r 16 on the attention, bf16 autocast."""
    base: dict[str, object] = dict(task="train", micro_batch_size=B, seq_len=S, weights_dtype="nf4", autocast="bf16",
                                   kbit_upcast=True, kbit_recast_bf16=True, gradient_checkpointing=True, optimizer="adamw_torch",
                                   attn_implementation="flash_attention_2",
                                   lora=LoraSpec(r=16, alpha=16, dropout=0.1, target_modules=ATTENTION))
    return Setup(**{**base, **update})  # type: ignore[arg-type]


@pytest.mark.parametrize(("setup", "nbytes"), [(qlora(), 4), (qlora(kbit_upcast=False, kbit_recast_bf16=False), 2)],
                         ids=["fp32_stream", "half_autocast"])
def test_the_loop_holds_one_experts_gradients(setup: Setup, nbytes: int) -> None:
    """At the gated product's backward of the first expert backward reaches: the product's gradient and its two
    factors' gradients, [tokens x top-k / experts, expert width] each, in the stream's dtype (4 B in peft's fp32
    stream, where bitsandbytes' Linear4bit returns fp32; 2 B on a bf16 stream). The priced term may differ from that
    by the hidden-unit tensors beside it (traced: -2.25 / +0.77 B per hidden unit) or be the block's peak outside the
    experts (traced: 8 / 9.4 B per hidden unit), never more."""
    spec = mixtral()
    one_expert = 3 * nbytes * EXPERT * TOKENS * TOP_K // EXPERTS
    priced = block_backward_bytes(spec, setup, "4.48.1")
    assert one_expert - 3 * H * TOKENS <= priced <= max(one_expert + H * TOKENS, 10 * H * TOKENS)


def test_grouped_experts_hold_every_routed_pair() -> None:
    """Under a release whose experts run grouped (5.0: grouped_mm by default) the block keeps the dense coefficients
    over the k active experts (fp32 stream: 10 B per active FFN unit per token, less a few per hidden unit), more than
    5x what the loop holds: one expert takes top-k / experts = 1/4 of the tokens."""
    spec = mixtral()
    assert expert_loop_per_token(spec, qlora(), "5.0.0", stream_case(qlora())) is None
    grouped = block_backward_bytes(spec, qlora(), "5.0.0")
    assert grouped >= 10 * TOP_K * EXPERT * TOKENS - 8 * H * TOKENS
    assert block_backward_bytes(spec, qlora(), "4.48.1") * 5 < grouped


@pytest.mark.parametrize(("setup", "nbytes"), [(qlora(), 4), (qlora(kbit_upcast=False, kbit_recast_bf16=False), 2)],
                         ids=["fp32_stream", "half_autocast"])
def test_the_loop_saves_two_copies_per_routed_pair(setup: Setup, nbytes: int) -> None:
    """transformers 4 keeps, per routed pair, the expert's output (``* routing_weights`` saves it) and the weighted
    product (``index_add_`` saves its whole ``source``), h wide each in the stream's dtype; the grouped table of
    transformers 5 counts one 16-bit copy per routed pair with the experts frozen (its hk coefficient less the frozen
    one). Checkpointed: the recomputed block only; else every block."""
    spec = mixtral()
    table = family_coefficients("mixtral")["half"]
    grouped = table.per_token["hk"] - (table.frozen_linear_inputs_per_token or {}).get("hk", 0.0)
    assert grouped == 2
    per_block = TOKENS * TOP_K * H * (2 * nbytes - 2)
    assert expert_loop_saved_bytes(spec, setup, "4.48.1", checkpointed=True) == per_block
    assert expert_loop_saved_bytes(spec, setup, "4.48.1", checkpointed=False) == per_block * 32
    assert expert_loop_saved_bytes(spec, setup, "5.0.0", checkpointed=True) == 0


@pytest.mark.parametrize("case", ["dense", "other_moe", "full", "no_autocast"])
def test_only_the_traced_loop_moves(case: str) -> None:
    """What was not traced keeps its price: a dense model (no row of a dense model moves), a MoE family whose loop
    was not traced, full fine-tuning (the experts' weight gradients), a bf16 base without autocast."""
    from transformers import MistralConfig

    spec = mixtral()
    setup = qlora()
    if case == "dense":
        spec = ModelSpec.from_any(MistralConfig(hidden_size=H, intermediate_size=EXPERT, num_attention_heads=32,
                                                num_key_value_heads=8, num_hidden_layers=32, vocab_size=32000))
    elif case == "other_moe":
        spec = mixtral("qwen2_moe")
    elif case == "full":
        setup = qlora(lora=None, weights_dtype="bf16", kbit_upcast=False, kbit_recast_bf16=False)
    else:
        setup = qlora(weights_dtype="bf16", autocast=None, kbit_upcast=False, kbit_recast_bf16=False)
    key = stream_case(setup) if setup.lora is not None else None
    assert expert_loop_per_token(spec, setup, "4.48.1", key) is None
    assert expert_loop_saved_bytes(spec, setup, "4.48.1", checkpointed=True) == 0
