"""Stacks whose blocks are not all alike (hybrid linear attention, dense first layers before MoE ones, two attention
widths): every kind of block's Linears is counted for the layers built that way, checked against real modules (a tiny
Qwen3.5 built on the CPU, bitsandbytes' own 4-bit storage, peft's own LoRA) and against hand counts from published
configs, never against perfguide's own output."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from perfguide.integrations.lora import target_modules
from perfguide.memory.ledger import ledger, quantized_weight_bytes
from perfguide.model.linears import linear_shapes
from perfguide.model.types import BlockKind, ModelSpec
from perfguide.setup import LoraSpec, Setup

transformers = pytest.importorskip("transformers")


def _tiny_hybrid() -> torch.nn.Module:
    """Qwen3.5's text stack: two gated-DeltaNet layers (wider than the attention, so a miscount shows) and two
    full-attention ones, the last block a full-attention one, as in every released Qwen3.5 / 3.6."""
    config = transformers.Qwen3_5TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        vocab_size=256, linear_num_key_heads=2, linear_num_value_heads=8, linear_key_head_dim=16, linear_value_head_dim=32,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"], torch_dtype="bfloat16")
    torch.manual_seed(0)
    return transformers.Qwen3_5ForCausalLM(config).to(torch.bfloat16)


def _block_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]  # type: ignore[union-attr]


def test_every_kind_of_block_counts_its_own_linears() -> None:
    model = _tiny_hybrid()
    spec = ModelSpec.from_any(model)
    real = _block_linears(model)
    assert spec.linear_params == sum(m.weight.numel() for m in real)
    counted = {name: n for name, _, _, n in linear_shapes(spec)}
    assert counted["linear_attn.in_proj_qkv"] == 2 and counted["self_attn.q_proj"] == 2 and counted["mlp.down_proj"] == 4
    assert [kind.layers for kind in spec.block_kinds] == [(0, 2), (1, 3)]


def test_qlora_weights_cost_what_bitsandbytes_keeps() -> None:
    """Every block Linear quantized as bitsandbytes' Linear4bit stores it (quantize_4bit, nf4, double quant: packed 4-bit
    storage, a uint8 absmax per 64 weights, an fp32 absmax per 256 blocks); every other parameter stays bf16. Before
    the kinds were counted, the DeltaNet projections were priced at 16 bits."""
    functional = pytest.importorskip("bitsandbytes.functional")
    model = _tiny_hybrid()
    spec = ModelSpec.from_any(model)
    linears = _block_linears(model)
    packed = 0
    for m in linears:
        stored, state = functional.quantize_4bit(m.weight.data, quant_type="nf4", compress_statistics=True)
        packed += stored.numel() * stored.element_size() + state.absmax.numel() * state.absmax.element_size()
        packed += state.state2.absmax.numel() * state.state2.absmax.element_size()
    rest = sum(p.numel() for p in model.parameters()) - sum(m.weight.numel() for m in linears)
    assert quantized_weight_bytes(spec, "nf4", upcast=False) == pytest.approx(packed + 2 * rest, rel=0.01)


def test_all_linear_lora_trains_what_peft_builds() -> None:
    peft = pytest.importorskip("peft")
    model = _tiny_hybrid()
    spec = ModelSpec.from_any(model)
    lora = LoraSpec(r=8, alpha=16, target_modules="all-linear")
    names = target_modules(spec, lora)
    assert "linear_attn.in_proj_qkv" in names and "self_attn.q_proj" in names
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=names))
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    setup = Setup(micro_batch_size=1, seq_len=64, weights_dtype="bf16", autocast="bf16", lora=lora)
    assert ledger(spec, setup).trainable_params == trainable


def test_published_configs_by_hand() -> None:
    """Qwen3.5-27B (48 gated-DeltaNet layers, 16 full-attention ones with the output gate) and DeepSeek-V3 (3 dense
    layers, then 58 MoE layers with one shared expert; routed experts are fused tensors, not Linears), from the config
    values alone."""
    h = 5120
    key, value = 16 * 128, 48 * 128
    deltanet = h * (2 * key + value) + h * value + 2 * h * 48 + value * h
    attention = h * 24 * 256 * 2 + 2 * h * 4 * 256 + 24 * 256 * h
    mlp = 3 * h * 17408
    assert ModelSpec.from_any("Qwen/Qwen3.5-27B").linear_params == 48 * deltanet + 16 * attention + 64 * mlp
    h = 7168
    mla = h * 1536 + 1536 * 128 * 192 + h * (512 + 64) + 512 * 128 * (128 + 128) + 128 * 128 * h
    assert ModelSpec.from_any("deepseek-ai/DeepSeek-V3").linear_params == 61 * mla + 3 * 3 * h * 18432 + 58 * 3 * h * 2048


def test_kinds_must_name_each_layer_once() -> None:
    spec = ModelSpec.from_any("Qwen/Qwen3.5-27B")
    kinds = [BlockKind(linears=k.linears, layers=k.layers) for k in spec.block_kinds]
    with pytest.raises(ValidationError, match="each of the 64 layers once"):
        ModelSpec(**(spec.model_dump(exclude={"block_kinds"}) | {"block_kinds": kinds[:1]}))
