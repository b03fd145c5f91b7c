"""QLoRA on a MoE whose experts are fused 3-D parameters: bitsandbytes leaves them 16-bit (checked on transformers'
own replacement), peft's k-bit preparation upcasts them, and a QLoRA plan that does not fit says that LoRA does."""

from __future__ import annotations

import re

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


def test_a_qlora_plan_that_does_not_fit_names_the_lora_plan_that_does() -> None:
    rec = perfguide.recommend("openai/gpt-oss-20b", "train_gpu_one", hardware="h100-80gb", finetune="qlora")
    assert not rec.fits
    line = next(s for s in rec.suggestions if s.startswith("finetune='lora' fits"))
    assert "bitsandbytes does not quantize" in line and "19.1B" in line
    lora = perfguide.recommend("openai/gpt-oss-20b", "train_gpu_one", hardware="h100-80gb", finetune="lora")
    assert lora.fits and re.search(re.escape(lora.setup.label), line)


def test_dense_models_get_no_such_note() -> None:
    rec = perfguide.recommend("meta-llama/Llama-3.1-70B", "train_gpu_one", hardware="rtx4090", finetune="qlora")
    assert not rec.fits and not any("bitsandbytes does not quantize" in s for s in rec.suggestions)
