"""The "LoRA off the experts" suggestion (scenarios/moe_targets.py) of a MoE LoRA plan that does not fit.

The trainable counts are derived by hand from Qwen3-30B-A3B's published config.json (hidden 2048, 32 query / 4 KV
heads of 128, 48 layers, 128 experts of width 768) and peft's ParamWrapper shapes (gate_up at rank 2r); the
followed config is applied by the real peft to a real transformers-5 Qwen3-MoE on CPU, which must leave every
expert and router weight untouched.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import perfguide
from perfguide.cli import main
from perfguide.setup import LoraSpec

MODEL = "Qwen/Qwen3-30B-A3B"
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
H, HEADS, KV, D, LAYERS, EXPERTS, WIDTH, R = 2048, 32, 4, 128, 48, 128, 768, 16

#: per layer r x (in + out) of q (h -> 32 x 128), k and v (h -> 4 x 128), o (32 x 128 -> h)
ATTN_TRAINABLE = LAYERS * R * ((H + HEADS * D) + 2 * (H + KV * D) + (HEADS * D + H))
#: all-linear adds the router (r x (h + experts)) and the expert stacks: gate_up lora_A (2r x E, h) and lora_B
#: (2 x width, 2r x E); down lora_A (r x E, width) and lora_B (h, r x E)
ALL_LINEAR_TRAINABLE = ATTN_TRAINABLE + LAYERS * (R * (H + EXPERTS) + 2 * R * EXPERTS * (H + 2 * WIDTH)
                                                  + R * EXPERTS * (WIDTH + H))


def _suggestion(rec: perfguide.Recommendation) -> str:
    found = [s for s in rec.suggestions if "target_modules=" in s]
    assert len(found) == 1, rec.suggestions
    return found[0]


def test_qwen3_moe_lora_on_one_h100_is_offered_attention_only_lora() -> None:
    rec = perfguide.recommend(MODEL, scenario="train_gpu_one", hardware="h100", finetune="lora")
    assert not rec.fits
    text = _suggestion(rec)
    assert text.startswith(f"lora=LoraSpec(target_modules={ATTN!r}) (--lora-target-modules {','.join(ATTN)}) fits")
    assert f"{ATTN_TRAINABLE / 1e6:,.1f}M trainable parameters instead of {ALL_LINEAR_TRAINABLE / 1e6:,.1f}M" in text
    assert "transformers_weight_conversion.py" in text   # the peft code path that rewrites all-linear


def test_the_suggestion_followed_fits_and_builds_a_real_lora_config() -> None:
    rec = perfguide.recommend(MODEL, scenario="train_gpu_one", hardware="h100", finetune="lora",
                              lora=LoraSpec(target_modules=ATTN))
    assert rec.fits
    assert rec.suggestions == ()
    pytest.importorskip("peft")
    config = rec.lora_config()
    assert set(config.target_modules) == set(ATTN) and not config.target_parameters


def test_followed_config_leaves_the_experts_frozen_in_real_peft() -> None:
    """The followed plan's LoraConfig on a small real Qwen3-MoE: peft adapts only the attention (r x (in + out) per
    projection), and no expert stack or router; all-linear on the same model does adapt them (the contrast)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    rec = perfguide.recommend(MODEL, scenario="train_gpu_one", hardware="h100", finetune="lora",
                              lora=LoraSpec(target_modules=ATTN))
    h, heads, kv, d, layers = 64, 4, 2, 16, 2
    cfg = transformers.AutoConfig.for_model(model_type="qwen3_moe", hidden_size=h, num_attention_heads=heads,
                                            num_key_value_heads=kv, head_dim=d, num_hidden_layers=layers, vocab_size=256,
                                            intermediate_size=96, moe_intermediate_size=40, num_experts=4,
                                            num_experts_per_tok=2, max_position_embeddings=128)

    def adapted(config: Any) -> dict[str, int]:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        wrapped = peft.get_peft_model(model, config)
        return {n: p.numel() for n, p in wrapped.named_parameters() if p.requires_grad}

    ours = adapted(rec.lora_config())
    assert not any("experts" in n or ".mlp." in n for n in ours), sorted(ours)
    assert sum(ours.values()) == layers * R * ((h + heads * d) + 2 * (h + kv * d) + (heads * d + h))
    every = adapted(peft.LoraConfig(r=R, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
    assert any("experts" in n for n in every)


def test_cli_flag_of_the_suggestion_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["recommend", MODEL, "--scenario", "train_gpu_one", "--hardware", "h100", "--finetune", "lora",
                 "--lora-target-modules", ",".join(ATTN), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["fits"] and out["setup"]["lora"]["target_modules"] == list(ATTN)


def test_many_gpus_with_forced_ddp_get_it_too() -> None:
    rec = perfguide.recommend(MODEL, scenario="train_gpu_many", hardware="h100:2", finetune="lora", strategy="ddp")
    assert not rec.fits
    assert "per GPU" in _suggestion(rec)


def test_full_finetune_offers_lora_with_its_finetune_kwarg() -> None:
    rec = perfguide.recommend(MODEL, scenario="train_gpu_one", hardware="h100", finetune="full")
    assert _suggestion(rec).startswith(f"finetune='lora', lora=LoraSpec(target_modules={ATTN!r})")


@pytest.mark.parametrize(("model", "kwargs"), [
    ("meta-llama/Llama-3.1-70B", {}),                                   # dense: no experts to keep LoRA off
    (MODEL, {"lora": LoraSpec(target_modules=ATTN), "hardware": "t4"}),   # already off the experts
    ("mistralai/Mixtral-8x7B-v0.1", {}),                                # off the experts still does not fit one H100
])
def test_no_suggestion_where_it_would_not_help(model: str, kwargs: dict[str, Any]) -> None:
    rec = perfguide.recommend(model, scenario="train_gpu_one", **{"hardware": "h100", "finetune": "lora", **kwargs})
    assert not rec.fits
    assert not [s for s in rec.suggestions if "target_modules=" in s]
