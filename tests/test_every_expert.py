"""transformers' Llama-4 MoE runs every expert over every token (model/code.py built_by, data/architectures.json
``every_expert_model_types``): what a block saves for backward and the matmul FLOPs of a forward are the counts of
a top-k equal to the number of experts, traced on a tiny Llama-4 text model built by the installed transformers."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import block_saved_bytes

from perfguide.memory.activations import layer_bytes
from perfguide.model.code import built_by
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

H, I, B, S = 96, 48, 2, 32


def _config(experts: int) -> dict[str, Any]:
    return {"model_type": "llama4_text", "hidden_size": H, "intermediate_size": I, "intermediate_size_mlp": 4 * H,
            "num_local_experts": experts, "num_experts_per_tok": 1, "num_attention_heads": 6, "num_key_value_heads": 2,
            "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 1024,
            "tie_word_embeddings": False, "interleave_moe_layer_step": 1, "no_rope_layers": [1, 1],
            "attention_chunk_size": 8192}


@pytest.mark.parametrize("experts", [6, 12])
def test_a_block_keeps_every_experts_activations(experts: int) -> None:
    """Per token, the real block saves 7,660 B (6 experts) and 12,304 B (12); priced as routed to its top-1 it was
    3,300 and 3,324 (57% and 73% under); as built through the Mixtral table, 7,340 and 12,212. Since stop 71 its own
    table (scripts/fit_moe_activations.py llama4_text: the llama table plus Llama4TextMoe's every-expert block, exact on
    the MoE part): the rest is Llama-4's attention, whose L2 norm on q and k (use_qk_norm) the llama table has not: by
    hand an fp32 copy of each (4 B per query- and key-wide unit) and one fp32 rsqrt per head, per token."""
    setup = Setup(task="train", micro_batch_size=B, seq_len=S, weights_dtype="bf16", optimizer="sgd")
    spec = ModelSpec.from_any(_config(experts))
    saved = (block_saved_bytes(_config(experts), 2 * B, S) - block_saved_bytes(_config(experts), B, S)) / (B * S)
    priced = layer_bytes(built_by(spec, "transformers"), setup) / (B * S)
    heads, kv_heads, head_dim = 6, 2, 16
    assert priced + 4 * (heads + kv_heads) * (head_dim + 1) == pytest.approx(saved, abs=0.5)
    assert layer_bytes(spec, setup) / (B * S) < 0.5 * saved           # the checkpoint's top-1: what a routing engine runs


def test_a_forward_multiplies_every_experts_weights() -> None:
    """FlopCounterMode over a real forward: the matmuls do 2 x 292,992 FLOPs a token, the all-experts count (its
    norms aside, 480); the top-1 count is 155,232."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    from perfguide.speed.rates import matmul_params

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**_config(6)), attn_implementation="sdpa")
    with FlopCounterMode(display=False) as counter:
        model(input_ids=torch.randint(0, 512, (B, S)))
    flops = sum(v for op, v in counter.get_flop_counts()["Global"].items() if str(op).split(".")[1] in ("mm", "bmm", "addmm"))
    spec = ModelSpec.from_any(model)
    assert matmul_params(built_by(spec, "transformers")) == pytest.approx(flops / (2 * B * S), rel=0.005)
    assert matmul_params(spec) < 0.6 * flops / (2 * B * S)


def test_engines_that_route_keep_the_top_k() -> None:
    """Only transformers' own modeling runs every expert: litgpt's code and the checkpoint as read keep top-1."""
    spec = ModelSpec.from_any("meta-llama/Llama-4-Scout-17B-16E")
    assert built_by(spec, "transformers").num_experts_per_tok == 16
    assert spec.num_experts_per_tok == built_by(spec, "litgpt").num_experts_per_tok == 1
    dense = ModelSpec.from_any("Qwen/Qwen3-30B-A3B")
    assert built_by(dense, "transformers") is dense


#: Scout's routed experts by hand from its config: 48 MoE layers x 16 experts x (gate + up + down) x 5,120 x 8,192
SCOUT_EXPERTS = 48 * 16 * 3 * 5120 * 8192


def test_linearized_experts_are_linears_bitsandbytes_quantizes() -> None:
    """axolotl's llama4_linearized_experts: the experts become one Linear per projection, so QLoRA stores them in nf4
    (the same bytes quantize_moe_experts' fused nf4 gives) and dequantizes one expert's Linear at a time, 84 MB, where
    the fused parametrization dequantizes a layer's whole stack, 4.03 GB."""
    from perfguide.memory.ledger import quantized_weight_bytes
    from perfguide.memory.top_of_stack import block_dequant_bytes

    spec = ModelSpec.from_any("meta-llama/Llama-4-Scout-17B-16E")
    built = built_by(spec, "transformers", linearized=True)
    assert spec.expert_params == SCOUT_EXPERTS and built.fused_expert_params == 0
    assert built.linear_params == spec.linear_params + SCOUT_EXPERTS
    assert quantized_weight_bytes(built, "nf4") == quantized_weight_bytes(spec, "nf4", experts=True)
    lora = {"r": 8, "target_modules": ("q_proj",)}
    linearized = Setup(task="train", weights_dtype="nf4", autocast="bf16", lora=lora, linearized_experts=True)
    fused = Setup(task="train", weights_dtype="nf4", autocast="bf16", lora=lora, quantized_experts=True)
    assert block_dequant_bytes(built, linearized) == 5120 * 8192 * 2
    assert block_dequant_bytes(built_by(spec, "transformers"), fused) == 16 * 3 * 5120 * 8192 * 2


def test_linearized_experts_are_refused_off_llama4() -> None:
    from perfguide.errors import InvalidSetupError

    with pytest.raises(InvalidSetupError, match="linearized_experts rebuilds a Llama-4's fused experts") as info:
        built_by(ModelSpec.from_any("Qwen/Qwen3-30B-A3B"), "transformers", linearized=True)
    assert "\n" not in str(info.value)


def test_axolotl_reads_its_llama4_linearized_experts(tmp_path: Any) -> None:
    """axolotl's single-H100 Scout QLoRA example (examples/llama-4/scout-qlora-single-h100-flex.yaml at 682a9cf79), its
    base model named by the original checkpoint (the example's axolotl-quants re-upload is the same shape): the
    linearized experts are read and priced, not listed as inert."""
    import perfguide

    yaml = (tmp_path / "scout.yaml")
    yaml.write_text("base_model: meta-llama/Llama-4-Scout-17B-16E\nmodel_type: Llama4ForConditionalGeneration\n"
                    "llama4_linearized_experts: true\nload_in_4bit: true\nadapter: qlora\nlora_r: 32\nlora_alpha: 64\n"
                    "lora_target_modules:\n  - self_attn.q_proj\n  - self_attn.k_proj\n  - self_attn.v_proj\n"
                    "  - self_attn.o_proj\n  - shared_expert.gate_proj\n  - shared_expert.up_proj\n  - shared_expert.down_proj\n"
                    "sequence_len: 4096\nsample_packing: true\nmicro_batch_size: 1\ngradient_accumulation_steps: 1\n"
                    "optimizer: adamw_torch_4bit\nbf16: true\ngradient_checkpointing: offload\n")
    result = perfguide.check(None, yaml, hardware="h100-80gb")
    assert result.setup.linearized_experts and result.fits
    assert not any("llama4_linearized_experts" in line for line in result.ignored)


def test_the_estimate_says_why() -> None:
    """The reason rides with the numbers: a Llama-4 estimate under transformers names the every-expert compute."""
    from perfguide.hardware import Hardware
    from perfguide.memory import estimate_memory

    spec = ModelSpec.from_any("meta-llama/Llama-4-Scout-17B-16E")
    setup = Setup(task="train", micro_batch_size=1, seq_len=1024, weights_dtype="nf4", autocast="bf16",
                  lora={"r": 8, "target_modules": ("q_proj",)}, gradient_checkpointing=True)
    notes = estimate_memory(spec, setup, Hardware.from_name("h100-80gb")).notes
    assert any("every one of" in n and "16 experts a token, not its top-1" in n for n in notes)
