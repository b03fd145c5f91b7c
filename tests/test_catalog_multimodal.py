"""Llama-4 (Scout, Maverick) and Gemma-3 (4B/12B/27B) in the catalog: multimodal checkpoints whose language model sits
in ``text_config``.

References: the module transformers 5.24 builds on the meta device from the catalog's own config (parameter counts,
routed experts, MoE layers, vision tower), the model cards' published totals, real cache tensors after a CPU
``generate`` on tiny models of each kind, and the KV bytes by hand from the layer pattern.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfguide import ModelSpec, recommend
from perfguide.memory.inference import cached_tokens, kv_cache_bytes
from perfguide.model.catalog import config_of
from perfguide.model.code import built_by
from perfguide.setup import Setup
from perfguide.speed.rates import matmul_params

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LLAMA4 = ["meta-llama/Llama-4-Scout-17B-16E", "meta-llama/Llama-4-Maverick-17B-128E"]
GEMMA3 = ["google/gemma-3-4b-pt", "google/gemma-3-12b-pt", "google/gemma-3-27b-pt"]
VISION = ("vision_model", "vision_tower", "multi_modal_projector")


def _meta(config: dict[str, Any]) -> tuple[Any, Any]:
    hf = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("architectures", "_name_or_path")})
    with torch.device("meta"):
        return getattr(transformers, config["architectures"][0])._from_config(hf), hf


def _numel(module: Any, where: tuple[str, ...] = ()) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if not where or any(w in n.split(".") for w in where))


@pytest.mark.parametrize("hub", LLAMA4)
def test_llama4_experts_moe_layers_and_vision_against_the_meta_module(hub: str) -> None:
    spec = ModelSpec.from_any(hub)
    module, hf = _meta(config_of(hub))
    text = hf.text_config
    assert spec.total_params == _numel(module)
    assert spec.vision_params == _numel(module, VISION) > 0  # counted in the total: the checkpoint ships the tower
    assert spec.expert_params == _numel(module, ("experts",))
    assert spec.num_moe_layers == len(text.moe_layers)  # 48 (Scout, every layer) / 24 (Maverick, every 2nd)
    assert (spec.num_experts, spec.num_experts_per_tok, spec.num_shared_experts) == (text.num_local_experts, 1, 1)
    idle = _numel(module, ("experts",)) * (text.num_local_experts - 1) // text.num_local_experts
    assert spec.active_params == _numel(module) - _numel(module, VISION) - idle
    # a dense layer (Maverick's even layers) is intermediate_size_mlp wide, an expert intermediate_size
    dense = [m for n, m in module.named_modules() if n.endswith("feed_forward") and hasattr(m, "gate_proj")]
    assert all(m.gate_proj.out_features == text.intermediate_size_mlp for m in dense)
    assert len(dense) == text.num_hidden_layers - len(text.moe_layers)
    assert spec.active_intermediate_size == text.intermediate_size * 2  # one routed + the shared expert
    assert spec.cache_layer_types() == tuple("chunked_attention" if r else "full_attention" for r in text.no_rope_layers)


@pytest.mark.parametrize("hub", GEMMA3)
def test_gemma3_counts_and_layer_pattern_against_the_meta_module(hub: str) -> None:
    spec = ModelSpec.from_any(hub)
    module, hf = _meta(config_of(hub))
    assert spec.total_params == _numel(module) and spec.vision_params == _numel(module, VISION) > 0
    assert spec.active_params == spec.total_params - spec.vision_params and not spec.is_moe
    assert spec.embedding_params == hf.text_config.vocab_size * hf.text_config.hidden_size  # the SigLIP table is vision
    assert spec.cache_layer_types() == tuple(hf.text_config.layer_types)
    full = [i for i, kind in enumerate(spec.cache_layer_types()) if kind == "full_attention"]
    assert full == list(range(5, spec.num_layers, 6))  # 5 sliding : 1 global
    assert spec.tie_word_embeddings and spec.supports_sdpa and spec.native_dtype == "bf16"


def test_gemma3_27b_kv_cache_by_layer_type() -> None:
    """62 layers: every 6th global (10) keeps every position, 52 sliding keep window - 1 = 1023; 16 KV heads x 128."""
    spec = ModelSpec.from_any("google/gemma-3-27b-pt")
    tokens = 7000 + 1000 - 1
    per_position = 2 * 16 * 128 * 2  # K and V, bf16
    assert kv_cache_bytes(spec, 1, tokens, 2) == (10 * tokens + 52 * 1023) * per_position


def test_llama4_plans_price_every_expert_flops() -> None:
    """transformers runs every Llama-4 expert over every token (model/code.py built_by), so a plan's FLOPs per step
    follow the experts held, not the top-1 routed: matmul weights a token by hand from the configs (h 5,120, q 40 x
    128, k / v 8 x 128, expert width 8,192, Maverick's dense MLP 16,384, vocabulary 202,048). Scout: 48 x (attention
    62,914,560 + router 5,120 x 16 + 17 expert-sized MLPs of 125,829,120) + head 1,034,485,760 = 106,734,878,720.
    Maverick: 48 attention + 24 dense MLPs (251,658,240) + 24 x (router 5,120 x 128 + 129 expert-sized MLPs) + head
    = 399,676,866,560, 3.74x. (Routed, as the checkpoints' top-1 reads, both were ~17B: the same FLOPs.)"""
    pinned = dict(finetune="lora", micro_batch_size=1, gradient_checkpointing=True, strategy="fsdp", seq_len=2048,
                  global_batch_size=8)
    scout, maverick = (recommend(h, "train_gpu_many", hardware="b200:8", **pinned) for h in LLAMA4)
    assert scout.setup == maverick.setup
    for hub, by_hand in zip(LLAMA4, (106_734_878_720, 399_676_866_560), strict=True):
        assert matmul_params(built_by(ModelSpec.from_any(hub), "transformers")) == pytest.approx(by_hand, rel=1e-4)  # the norms
    # the step's attention (the same in both) dilutes the 3.74 of the matmuls
    assert 3.6 < maverick.throughput.flops_per_step / scout.throughput.flops_per_step < 3.75
    assert maverick.memory.device_total > 2.5 * scout.memory.device_total  # memory still holds every expert


@pytest.mark.parametrize("hub", GEMMA3)
def test_gemma3_serving_plans_fit_with_their_pattern_cache(hub: str) -> None:
    rec = recommend(hub, "infer_gpu_one", hardware="h100-80gb", prompt_len=7000, max_new_tokens=1000)
    spec = ModelSpec.from_any(hub)
    b = rec.setup.micro_batch_size
    assert rec.memory.kv_cache == kv_cache_bytes(spec, b, 7000 + 1000 - 1, 2)
    every_layer_full = spec.kv_elements_per_token() * 2 * b * (7000 + 1000 - 1) * spec.num_layers
    assert rec.memory.kv_cache < 0.3 * every_layer_full  # five of six layers keep 1,023 positions only


# --- real cache tensors on tiny models of each kind --------------------------------------------------------------
TINY_GEMMA3 = dict(architectures=["Gemma3ForConditionalGeneration"], model_type="gemma3", mm_tokens_per_image=4,
                   image_token_index=250, boi_token_index=251, eoi_token_index=252,
                   text_config=dict(model_type="gemma3_text", hidden_size=64, intermediate_size=128, num_hidden_layers=12,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256, sliding_window=8,
                                    sliding_window_pattern=6, max_position_embeddings=128, query_pre_attn_scalar=16),
                   vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, image_size=28, patch_size=14, vision_use_head=False))
TINY_LLAMA4 = dict(architectures=["Llama4ForCausalLM"], model_type="llama4_text", hidden_size=64, intermediate_size=32,
                   intermediate_size_mlp=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   vocab_size=256, num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                   attention_chunk_size=8, no_rope_layer_interval=2, max_position_embeddings=128)


def _cache_bytes(cache: Any) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values) if t is not None)


@pytest.mark.parametrize("config", [TINY_GEMMA3, TINY_LLAMA4], ids=["gemma3", "llama4"])
def test_kv_cache_by_layer_type_matches_generate(config: dict[str, Any]) -> None:
    hf = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    torch.manual_seed(0)
    model = getattr(transformers, config["architectures"][0])._from_config(hf).eval()
    batch, prompt, new = 2, 20, 5  # longer than the window / chunk of 8
    ids = torch.randint(3, 200, (batch, prompt))
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, return_dict_in_generate=True, pad_token_id=0)
    spec = ModelSpec.from_any(config)
    assert len(set(spec.cache_layer_types())) == 2  # both kinds present
    setup = Setup(task="infer", device="cpu", micro_batch_size=batch, seq_len=prompt, new_tokens=new, weights_dtype="fp32")
    assert kv_cache_bytes(spec, batch, cached_tokens(setup, spec), 4) == _cache_bytes(out.past_key_values)
    assert spec.total_params == _numel(model)
