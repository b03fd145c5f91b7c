"""Inference memory: hand-derived KV and weight bytes, real bitsandbytes storage, device splits, speed shape."""

from __future__ import annotations

import pytest

from perfguide.hardware.types import CPU, GPU, Hardware
from perfguide.memory.inference import estimate_inference, kv_cache_bytes, weight_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup
from perfguide.speed.inference import estimate_inference_speed


def llama(name: str, h: int, i: int, layers: int, heads: int, kv: int, vocab: int, total: int) -> ModelSpec:
    kvd = kv * 128
    return ModelSpec(name=name, model_type="llama", hidden_size=h, num_layers=layers, num_attention_heads=heads,
                     num_key_value_heads=kv, head_dim=128, intermediate_size=i, vocab_size=vocab, total_params=total,
                     embedding_params=vocab * h, lm_head_params=vocab * h, native_dtype="bf16",
                     block_linears={"q_proj": (h, h), "k_proj": (h, kvd), "v_proj": (h, kvd), "o_proj": (h, h),
                                    "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)})


# published parameter counts (model cards / config.json)
LLAMA2_7B = llama("llama-2-7b", 4096, 11008, 32, 32, 32, 32000, 6_738_415_616)
LLAMA31_8B = llama("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128256, 8_030_261_248)
LLAMA2_70B = llama("llama-2-70b", 8192, 28672, 80, 64, 8, 32000, 68_976_648_192)


def a100(n: int = 1, gib: int = 40) -> Hardware:
    gpus = tuple(GPU(name="A100", index=k, memory_total=gib * 2**30, memory_free=gib * 2**30, compute_capability=(8, 0),
                     bf16_tflops=312, fp16_tflops=312, fp32_tflops=19.5, tf32_tflops=156, memory_bandwidth_gbps=1555) for k in range(n))
    return Hardware(gpus=gpus, cpu=CPU(physical_cores=32, logical_cores=64, ram_total=2**38, ram_available=2**38),
                    interconnect="nvlink" if n > 1 else "none")


def infer(**kw: object) -> Setup:
    return Setup(task="infer", weights_dtype="bf16", **kw)


def test_kv_cache_mha_vs_gqa_at_4k_tokens() -> None:
    # 2 (K and V) x 32 layers x kv_heads x 128 head_dim x 4096 tokens x 2 bytes
    assert kv_cache_bytes(LLAMA2_7B, 1, 4096, 2) == 2 * 32 * 32 * 128 * 4096 * 2 == 2 * 2**30
    assert kv_cache_bytes(LLAMA31_8B, 1, 4096, 2) == 2 * 32 * 8 * 128 * 4096 * 2 == 2**29
    assert kv_cache_bytes(LLAMA31_8B, 8, 4096, 2) == 8 * 2**29


def test_weights_7b_bf16_vs_nf4() -> None:
    assert weight_bytes(LLAMA2_7B, "bf16") == 13_476_831_232
    linear = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)       # quantized by bnb
    rest = 6_738_415_616 - linear                              # embeddings, lm_head, norms stay bf16
    nf4_dq = linear // 2 + linear // 64 + 4 * linear // (64 * 256)   # packed 4-bit + uint8 absmax + fp32 nested absmax
    assert weight_bytes(LLAMA2_7B, "nf4") == nf4_dq + 2 * rest == 3_865_591_808
    assert weight_bytes(LLAMA2_7B, "nf4", double_quant=False) == linear // 2 + 4 * linear // 64 + 2 * rest
    assert weight_bytes(LLAMA2_7B, "int8") == linear + 4 * 32 * (4 * 4096 + 2 * 11008 + 4096) + 2 * rest


def test_bnb_storage_matches_real_bitsandbytes(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("bitsandbytes")
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    layer = model.model.layers[0]
    spec = ModelSpec(name="tiny", hidden_size=256, num_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                     intermediate_size=512, vocab_size=96, total_params=sum(p.numel() for p in model.parameters()),
                     embedding_params=96 * 256, lm_head_params=96 * 256,
                     block_linears={n: (m.in_features, m.out_features) for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)})
    configs = {"nf4": transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                                      bnb_4bit_compute_dtype=torch.bfloat16),
               "int8": transformers.BitsAndBytesConfig(load_in_8bit=True)}
    for dtype, qconfig in configs.items():
        q = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=qconfig, dtype=torch.bfloat16, device_map="cpu")
        held = 0
        for p in q.parameters():
            held += p.numel() * p.element_size()
            state = getattr(p, "quant_state", None)
            if state is not None:
                held += state.absmax.numel() * state.absmax.element_size()
                held += state.state2.absmax.numel() * state.state2.absmax.element_size() if state.state2 is not None else 0
            scb = getattr(p, "SCB", None)
            held += scb.numel() * scb.element_size() if scb is not None else 0
        assert weight_bytes(spec, dtype) == held, dtype


def test_sliding_window_caps_the_cache() -> None:
    mistral = LLAMA31_8B.model_copy(update={"sliding_window": 4096})
    assert kv_cache_bytes(mistral, 1, 32_000, 2) == kv_cache_bytes(LLAMA31_8B, 1, 4095, 2)
    assert kv_cache_bytes(mistral, 1, 32_000, 2, static=True) == kv_cache_bytes(LLAMA31_8B, 1, 4096, 2)


def test_eager_attention_adds_the_score_matrix() -> None:
    s = infer(seq_len=4096, new_tokens=1)
    sdpa, eager = estimate_inference(LLAMA2_7B, s), estimate_inference(LLAMA2_7B, s.replace(attn_implementation="eager"))
    # 32 heads x 4096^2 scores in bf16 + the fp32 softmax: the ~2*h*N^2 bytes order of magnitude of llm_tutorial_optimization (transformers docs)
    assert eager.activations - sdpa.activations > 32 * 4096**2 * 2


def test_static_cache_preallocates_full_length() -> None:
    dyn = estimate_inference(LLAMA2_7B, infer(seq_len=1000, new_tokens=1000))
    static = estimate_inference(LLAMA2_7B, infer(seq_len=1000, new_tokens=1000, cache_implementation="static"))
    assert dyn.kv_cache == static.kv_cache == kv_cache_bytes(LLAMA2_7B, 1, 1999, 2)
    assert static.peak_allocated >= dyn.peak_allocated - dyn.activations


def test_device_map_and_tp_split_per_gpu() -> None:
    one = estimate_inference(LLAMA2_70B, infer(seq_len=512, new_tokens=256))
    dm = estimate_inference(LLAMA2_70B, infer(seq_len=512, new_tokens=256, strategy="device_map", num_gpus=4), a100(4, 80))
    tp = estimate_inference(LLAMA2_70B, infer(seq_len=512, new_tokens=256, strategy="tp", num_gpus=8), a100(8, 80))
    per_layer = (one.weights - 2 * 2 * 262_144_000) // 80
    assert one.weights / 4 <= dm.weights <= one.weights / 4 + per_layer + 2 * 262_144_000
    assert dm.kv_cache == one.kv_cache * 20 // 80 or dm.kv_cache == one.kv_cache * 21 // 80
    assert one.weights / 8 <= tp.weights < one.weights / 8 * 1.01
    assert tp.kv_cache == one.kv_cache // 8   # 8 KV heads over 8 ranks: one head each


def test_litgpt_llama2_7b_bf16_within_5_percent() -> None:
    # shared/groundtruth row 206: Llama-2-7B bf16, batch 1, short prompt + 50 new tokens, 13.52 GB max_memory_allocated
    mem = estimate_inference(LLAMA2_7B, infer(seq_len=16, new_tokens=50), a100())
    assert abs(mem.peak_allocated / 1e9 - 13.52) / 13.52 < 0.05


def test_decode_is_bandwidth_bound_and_tp_is_faster() -> None:
    s = infer(seq_len=512, new_tokens=256, micro_batch_size=8)
    single = estimate_inference_speed(LLAMA2_7B, s, a100())
    assert single.bound in ("memory-bandwidth", "launch-overhead")
    assert single.prefill_time_s < single.step_time_s
    tp = estimate_inference_speed(LLAMA2_7B, s.replace(strategy="tp", num_gpus=4), a100(4))
    dm = estimate_inference_speed(LLAMA2_7B, s.replace(strategy="device_map", num_gpus=4), a100(4))
    assert tp.time_per_output_token_ms < single.time_per_output_token_ms <= dm.time_per_output_token_ms * 1.01
    nf4 = estimate_inference_speed(LLAMA2_7B, s.replace(weights_dtype="nf4"), a100())
    assert nf4.time_per_output_token_ms > single.time_per_output_token_ms   # bnb dequantization is not free
