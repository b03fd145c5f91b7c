"""A LoRA target *list* on a transformers-5 MoE (memory/moe_lora.listed_targets), against real peft on CPU: peft
rewrites listed v4 expert / router names (Qwen3-MoE ``gate_proj`` / ``up_proj`` / ``down_proj`` / ``gate``, Mixtral
``w1`` / ``w3`` / ``w2`` / ``gate``) to the fused expert parameters and the router weight, drops them from the module
targets, and refuses half of a fused pair. Before, such a list was priced as attention-only adapters."""

from __future__ import annotations

from typing import Any

import pytest

from perfguide.errors import InvalidSetupError
from perfguide.memory.ledger import ledger
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

H, W, E, R = 64, 40, 4, 4   # a shape of its own: h 64, expert width 40, 4 experts
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def _config(model_type: str) -> dict[str, Any]:
    common = {"model_type": model_type, "hidden_size": H, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 256,
              "tie_word_embeddings": False, "num_experts_per_tok": 2}
    if model_type == "mixtral":
        return {**common, "intermediate_size": W, "num_local_experts": E}
    return {**common, "intermediate_size": 3 * H, "moe_intermediate_size": W, "num_experts": E}


def _real_trainable(config: dict[str, Any], targets: tuple[str, ...]) -> int:
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    model = peft.get_peft_model(model, peft.LoraConfig(r=R, lora_alpha=8, target_modules=list(targets), lora_dropout=0.0))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _priced(config: dict[str, Any], targets: tuple[str, ...] | str) -> int:
    setup = Setup(task="train", seq_len=16, micro_batch_size=1, weights_dtype="bf16",
                  lora=LoraSpec(r=R, alpha=8, target_modules=targets, dropout=0.0))
    return ledger(ModelSpec.from_any(config), setup).trainable_params


@pytest.mark.parametrize(("model_type", "experts"), [
    ("qwen3_moe", ("gate", "gate_proj", "up_proj", "down_proj")),
    ("qwen3_moe", ("gate_proj", "up_proj", "down_proj")),        # experts without the router
    ("qwen3_moe", ("mlp.down_proj",)),                           # a dotted name: peft matches the suffix
    ("mixtral", ("w1", "w2", "w3")),
    ("mixtral", ("gate", "w2")),
])
def test_listed_expert_names_are_the_fused_parameters(model_type: str, experts: tuple[str, ...]) -> None:
    config = _config(model_type)
    targets = (*ATTN, *experts)
    real = _real_trainable(config, targets)
    assert _priced(config, targets) == real
    # hand count, per layer: attention (q 64, k/v 32, o 64 wide), the router E x h at r, gate_up at 2r, down at r
    listed = {n.rsplit(".", 1)[-1] for n in experts}
    attention = R * (H + 64) + 2 * R * (H + 32) + R * (64 + H)
    router = R * (H + E) if "gate" in listed else 0
    gate_up = 2 * R * E * (H + 2 * W) if listed & {"gate_proj", "w1"} else 0
    down = R * E * (W + H) if listed & {"down_proj", "w2"} else 0
    assert real == config["num_hidden_layers"] * (attention + router + gate_up + down)


def test_a_list_naming_everything_prices_as_all_linear() -> None:
    from perfguide.hardware.types import Hardware
    from perfguide.memory import estimate_memory

    config = _config("qwen3_moe")
    every = (*ATTN, "gate", "gate_proj", "up_proj", "down_proj")
    assert _priced(config, every) == _priced(config, "all-linear")

    def memory(targets: tuple[str, ...] | str) -> Any:
        setup = Setup(task="train", seq_len=16, micro_batch_size=1, weights_dtype="bf16",
                      lora=LoraSpec(r=R, alpha=8, target_modules=targets, dropout=0.0))
        return estimate_memory(ModelSpec.from_any(config), setup, Hardware.from_name("a100-80gb"))

    assert memory(every).activations == memory("all-linear").activations   # the merged expert weights per block


def test_half_of_a_fused_pair_is_refused_as_peft_refuses_it() -> None:
    config = _config("qwen3_moe")
    with pytest.raises(InvalidSetupError, match="gate_up_proj"):
        _priced(config, (*ATTN, "gate_proj"))
    with pytest.raises(ValueError, match="gate_up_proj"):   # peft's own refusal
        _real_trainable(config, (*ATTN, "gate_proj"))
