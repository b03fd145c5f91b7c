"""QLoRA on a MoE whose experts are fused 3-D parameters: bitsandbytes leaves them 16-bit (checked on transformers'
own replacement), and perfguide's QLoRA plan keeps them 16-bit (no peft k-bit upcast, as TRL's SFTTrainer runs it), so
the plan fits where the upcast to fp32 (76 GB of experts on gpt-oss-20b) could not."""

from __future__ import annotations

import pytest

import perfguide


def test_bnb_replacement_leaves_gpt_oss_experts_unquantized() -> None:
    """The premise, on transformers' own bitsandbytes replacement of a tiny gpt-oss (meta device)."""
    transformers = pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    bnb = pytest.importorskip("bitsandbytes")
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    cfg = transformers.GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                    vocab_size=128)
    with accelerate.init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    model = replace_with_bnb_linear(model, quantization_config=transformers.BitsAndBytesConfig(load_in_4bit=True))
    experts = [p for n, p in model.named_parameters() if ".experts." in n]
    assert experts and not any(isinstance(p, bnb.nn.Params4bit) for p in experts)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())   # the attention is quantized


def test_gpt_oss_20b_expert_count_by_hand() -> None:
    """24 layers x 32 experts x (gate_up 2880 x 5760 + down 2880 x 2880 + their biases 5760 + 2880)."""
    spec = perfguide.ModelSpec.from_any("openai/gpt-oss-20b")
    by_hand = 24 * 32 * (2880 * 5760 + 2880 * 2880 + 5760 + 2880)
    assert abs(spec.fused_expert_params - by_hand) <= by_hand * 1e-3


def test_the_qlora_plan_keeps_the_experts_16_bit_and_fits_an_h100() -> None:
    spec = perfguide.ModelSpec.from_any("openai/gpt-oss-20b")
    rec = perfguide.recommend("openai/gpt-oss-20b", "train_gpu_one", hardware="h100-80gb", finetune="qlora")
    assert rec.fits and rec.setup.quantized and not rec.setup.kbit_upcast
    # by hand: the experts alone take 2 B each; peft's upcast makes them 4 B (76.5 GB), and the same plan no longer fits
    assert 2 * spec.fused_expert_params <= rec.memory.weights < 4 * spec.fused_expert_params
    from perfguide.memory import estimate_memory
    upcast = estimate_memory(rec.model, rec.setup.replace(kbit_upcast=True), rec.hardware)
    assert upcast.weights >= 4 * spec.fused_expert_params and upcast.needed > upcast.capacity
    lora = perfguide.recommend("openai/gpt-oss-20b", "train_gpu_one", hardware="h100-80gb", finetune="lora")
    # only the attention Linears are quantized: QLoRA saves little over LoRA on this model (both fit)
    assert lora.fits and rec.memory.needed < lora.memory.needed < rec.memory.needed + 2 * 2**30
