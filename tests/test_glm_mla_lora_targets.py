"""GLM-4.7-Flash's LoRA targets as axolotl's examples list them (rows 3114-3118): the yaml names q_proj / v_proj /
k_proj / o_proj, but the model's multi-head latent attention has q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj and
o_proj. peft matches whole module names, so only o_proj is adapted; perfguide must price what peft builds."""

from __future__ import annotations

import pytest

from perfguide.memory.ledger import ledger
from perfguide.model.catalog import config_of
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

R = 4
TARGETS = ("q_proj", "v_proj", "k_proj", "o_proj")


def _tiny_glm47_flash() -> dict[str, object]:
    """GLM-4.7-Flash's catalogued config with every width scaled down (the same layout: MLA, a dense first layer,
    routed and shared experts)."""
    config = {k: v for k, v in config_of("zai-org/GLM-4.7-Flash").items() if k != "_name_or_path"}
    return config | dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                         q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12,
                         vocab_size=256, max_position_embeddings=128, pad_token_id=0, eos_token_id=1)


def test_only_o_proj_is_adapted_and_priced_as_peft_builds_it() -> None:
    import torch

    config = _tiny_glm47_flash()
    hf = transformers.AutoConfig.for_model(**config)
    model = transformers.AutoModelForCausalLM.from_config(hf, dtype=torch.float32)
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=R, lora_alpha=8, lora_dropout=0.0, target_modules=list(TARGETS)))
    names = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in adapted.named_parameters() if p.requires_grad}
    assert names == {"o_proj"}
    real = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    # by hand: 3 layers x r x (o_proj's input, heads x v_head_dim, + its output, the hidden size)
    assert real == 3 * R * (4 * 12 + 64)
    lora = LoraSpec(r=R, alpha=8, target_modules=TARGETS)
    for spec in (ModelSpec.from_any(config), ModelSpec.from_any(model)):
        assert ledger(spec, Setup(micro_batch_size=1, seq_len=8, weights_dtype="fp32", lora=lora)).trainable_params == real
