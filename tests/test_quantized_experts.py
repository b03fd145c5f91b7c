"""axolotl's ``quantize_moe_experts``: the fused 3-D expert tensors quantized with bitsandbytes' parametrization, checked
against real CPU tensors (bitsandbytes ``replace_parameter_4bit`` on a tiny Qwen3-MoE, as axolotl's
monkeypatch/moe_quant.py applies it to every 3-D parameter whose name holds "expert"), and read from axolotl's own
example configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

import perfguide
from perfguide.memory.ledger import quantized_weight_bytes
from perfguide.memory.top_of_stack import block_dequant_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

bnb_parametrize = pytest.importorskip("bitsandbytes.nn.parametrize")


def _tiny() -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                            torch_dtype="bfloat16")
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(config).to(torch.bfloat16)


def _quantized_expert_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(16-bit bytes of the expert tensors before, bytes bitsandbytes keeps for them after: packed 4-bit storage, the
    uint8 absmax per 64 weights and the fp32 absmax per 256 blocks of double quantization)."""
    before = after = 0
    for module in list(model.modules()):
        for name, param in list(module.named_parameters(recurse=False)):
            if param.ndim < 3:
                continue
            before += param.numel() * param.element_size()
            bnb_parametrize.replace_parameter_4bit(module, name, compress_statistics=True, quant_type="nf4")
            state = module.parametrizations[name][0].quant_state
            stored = module.parametrizations[name].original
            after += stored.numel() * stored.element_size() + state.absmax.numel() * state.absmax.element_size()
            after += state.state2.absmax.numel() * state.state2.absmax.element_size()
    return before, after


def test_quantized_experts_cost_what_bitsandbytes_keeps() -> None:
    model = _tiny()
    spec = ModelSpec.from_any(model)
    assert spec.fused_expert_params == 2 * 8 * 3 * 64 * 64
    before, after = _quantized_expert_bytes(model)
    assert before == 2 * spec.fused_expert_params
    priced = (quantized_weight_bytes(spec, "nf4", upcast=False, experts=True)
              - quantized_weight_bytes(spec, "nf4", upcast=False, experts=False))
    assert priced == pytest.approx(after - before, rel=0.005)


def test_a_moe_block_dequantizes_its_whole_expert_tensors() -> None:
    """Reading a parametrized expert tensor returns it whole in 16 bits (bitsandbytes' Bnb4bitParametrization): one MoE
    block's gate_up and down stacks, 2 x 8 x 3 x 64 x 64 / 2 layers elements, which outgrow the block's largest Linear."""
    model = _tiny()
    spec = ModelSpec.from_any(model)
    _quantized_expert_bytes(model)
    experts = model.model.layers[0].mlp.experts
    whole = sum(getattr(experts, n).numel() for n in ("gate_up_proj", "down_proj"))
    assert experts.down_proj.dtype == torch.bfloat16 and whole == 8 * 3 * 64 * 64
    lora = LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj"))
    setup = Setup(micro_batch_size=1, seq_len=64, weights_dtype="nf4", autocast="bf16", lora=lora, quantized_experts=True)
    assert block_dequant_bytes(spec, setup) == whole * 2
    assert block_dequant_bytes(spec, setup.replace(quantized_experts=False)) == 64 * 64 * 2   # q_proj, the largest Linear


def test_quantized_experts_need_a_quantized_base() -> None:
    with pytest.raises(ValueError, match="quantized_experts"):
        Setup(micro_batch_size=1, seq_len=64, weights_dtype="bf16", quantized_experts=True)


def test_axolotl_reads_quantize_moe_experts(tmp_path: Path) -> None:
    """axolotl's Qwen3.5-122B-A10B QLoRA example (examples/qwen3.5/122b-a10b-moe-qlora.yaml at 067b021) quantizes the
    experts: with them in 16 bits the 122B base alone is over 230 GB, which one H100 cannot hold."""
    yaml = """base_model: Qwen/Qwen3.5-122B-A10B
load_in_4bit: true
quantize_moe_experts: true
adapter: qlora
lora_r: 16
lora_alpha: 32
lora_target_modules: [q_proj, k_proj, v_proj, o_proj]
sequence_len: 2048
micro_batch_size: 1
gradient_accumulation_steps: 2
optimizer: adamw_torch_4bit
bf16: auto
gradient_checkpointing: true
attn_implementation: flash_attention_2
"""
    (tmp_path / "on.yaml").write_text(yaml)
    (tmp_path / "off.yaml").write_text(yaml.replace("quantize_moe_experts: true\n", ""))
    with_experts = perfguide.check(config=str(tmp_path / "on.yaml"), hardware="h100-80gb")
    without = perfguide.check(config=str(tmp_path / "off.yaml"), hardware="h100-80gb")
    assert with_experts.setup.quantized_experts and not without.setup.quantized_experts
    assert with_experts.fits and not without.fits
    assert "quantize_moe_experts" not in " ".join(with_experts.ignored)


def test_the_experts_dequantized_per_step() -> None:
    """Qwen3-30B-A3B (48 MoE layers of 128 experts, 3 x 2048 x 768 each, 8 routed): bitsandbytes leaves the fused
    experts 16-bit, so a QLoRA step dequantizes no expert (the 8 routed of 128 leave the count); quantize_moe_experts
    dequantizes every expert's stacks in forward and recompute (the 16-bit stack is saved for the input gradient), 2
    of the Linears' 3 passes with checkpointing."""
    from perfguide.speed.dequant import dequantized_params
    from perfguide.speed.rates import matmul_params

    spec = ModelSpec.from_any("Qwen/Qwen3-30B-A3B")
    experts = 48 * 128 * 3 * 2048 * 768
    assert spec.fused_expert_params == experts
    lora = LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj"))
    plain = Setup(micro_batch_size=1, seq_len=1024, weights_dtype="nf4", autocast="bf16", lora=lora, gradient_checkpointing=True)
    assert matmul_params(spec) - dequantized_params(spec, plain) == pytest.approx(experts * 8 / 128)
    quantized = plain.replace(quantized_experts=True)
    assert dequantized_params(spec, quantized) - dequantized_params(spec, plain) == pytest.approx(experts * 2 / 3)
    assert dequantized_params(spec, plain.replace(weights_dtype="bf16", lora=lora)) == matmul_params(spec)
    longer = {"micro_batch_size": 4, "seq_len": 4096}   # past the host's launch floor: the GPU's time decides the step
    slower = perfguide.estimate_speed(spec, quantized.replace(**longer), hardware="h100-80gb").step_time_s
    assert slower > perfguide.estimate_speed(spec, plain.replace(**longer), hardware="h100-80gb").step_time_s
