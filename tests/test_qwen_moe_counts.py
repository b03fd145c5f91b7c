"""Qwen2-MoE (one wide shared expert, gated) and Qwen3-MoE (no shared expert): perfguide's total and active parameters
against the module transformers builds on the meta device, and the active width by hand from the config.

Active = total - the routed experts a token does not visit: per MoE layer ``(E - k)`` experts of
``3 * hidden * moe_intermediate_size`` weights. The shared expert (``shared_expert_intermediate_size`` wide) and its
sigmoid gate are always active. Layers in ``mlp_only_layers`` or off the ``decoder_sparse_step`` are dense.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfguide import ModelSpec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

H, L, V = 64, 6, 256
BASE = dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
            intermediate_size=160, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, max_position_embeddings=128)
QWEN2_MOE = dict(model_type="qwen2_moe", shared_expert_intermediate_size=96, decoder_sparse_step=2, mlp_only_layers=[5], **BASE)
QWEN3_MOE = dict(model_type="qwen3_moe", head_dim=16, decoder_sparse_step=1, mlp_only_layers=[0], **BASE)


def _meta(config: dict[str, Any]) -> Any:
    hf = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hf)


def _numel(module: Any, part: str | None = None) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if part is None or part in n.split("."))


def _moe_layers(config: dict[str, Any]) -> list[int]:
    step, dense = config["decoder_sparse_step"], set(config["mlp_only_layers"])
    return [i for i in range(L) if i not in dense and (i + 1) % step == 0]


@pytest.mark.parametrize("config", [QWEN2_MOE, QWEN3_MOE], ids=lambda c: c["model_type"])
def test_total_and_active_params_equal_the_meta_module(config: dict[str, Any]) -> None:
    spec, module = ModelSpec.from_any(config), _meta(config)
    moe = _moe_layers(config)
    per_expert = 3 * H * config["moe_intermediate_size"]
    assert spec.total_params == _numel(module)
    assert spec.expert_params == _numel(module, "experts") == config["num_experts"] * per_expert * len(moe)
    assert spec.num_moe_layers == len(moe)
    idle = (config["num_experts"] - config["num_experts_per_tok"]) * per_expert * len(moe)
    assert spec.active_params == _numel(module) - idle


def test_qwen2_moe_shared_expert_width_is_its_own() -> None:
    spec, module = ModelSpec.from_any(QWEN2_MOE), _meta(QWEN2_MOE)
    shared = [m for n, m in module.named_modules() if n.endswith("mlp.shared_expert")]
    assert len(shared) == len(_moe_layers(QWEN2_MOE)) and all(m.gate_proj.out_features == 96 for m in shared)
    assert (spec.num_shared_experts, spec.shared_expert_intermediate_size) == (1, 96)
    assert spec.active_intermediate_size == 2 * 32 + 96  # k routed experts + the one shared expert, not 3 x 32
    gates = _numel(module, "shared_expert_gate")
    assert gates == H * len(_moe_layers(QWEN2_MOE))  # one sigmoid gate per MoE layer, always active


def test_qwen3_moe_has_no_shared_expert() -> None:
    spec, module = ModelSpec.from_any(QWEN3_MOE), _meta(QWEN3_MOE)
    assert not any("shared_expert" in n for n, _ in module.named_parameters())
    assert (spec.num_shared_experts, spec.shared_expert_intermediate_size) == (0, None)
    assert spec.active_intermediate_size == 2 * 32
