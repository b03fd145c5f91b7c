"""Engine memory (vLLM / SGLang): the KV cache the engine's own budget rule leaves, derived by hand here."""

from __future__ import annotations

import math

import pytest
from test_inference_memory import LLAMA31_8B, llama

from perfguide import Hardware, engines
from perfguide._serving_data import serving_facts
from perfguide.memory.overhead import cuda_context_bytes
from perfguide.memory.serving import (
    _skipped,
    activation_peak_bytes,
    allocator_rounding_bytes,
    format_weight_bytes,
    kv_bytes_per_token,
    rank_weight_bytes,
    rank_weight_tensors,
    rope_cache_bytes,
)
from perfguide.model.types import ModelSpec
from perfguide.setup import ServingSetup

GiB = 1024**3
LLAMA31_70B = llama("llama-3.1-70b", 8192, 28672, 80, 64, 8, 128256, 70_553_706_496)


def test_8b_on_a100_kv_tokens_equal_the_published_budget_rule_by_hand() -> None:
    """vLLM 0.33 gpu_worker.determine_available_memory + kv_cache_utils.update_kv_cache_capacity, by hand."""
    hw = Hardware.from_name("a100-80gb")
    s = ServingSetup(engine="vllm", max_model_len=8192, gpu_memory_utilization=0.9, max_num_seqs=256, max_num_batched_tokens=8192)
    vllm = serving_facts().engines["vllm"]
    total = round(79.14 * 2**30)   # CUDA's total: torch's printed 'total capacity of 79.14 GiB' (gpus.json)
    requested = math.ceil(total * 0.9)
    weights = 8_030_261_248 * 2                               # bf16, every parameter
    forward = 8192 * 3 * 14336 * 2 + 2 * 8192 * 4096 * 2                       # MLP gate/up/product + two residuals
    sampler = 256 * 128256 * 38 + 8192 * 4096 * 2   # sorting sampler: 2+4+8+(4+8)+(4+8) bytes per logit, hidden states kept
    activation = max(forward, sampler)              # the forward's buffers are freed before the sampler runs
    graph_sizes = 3 + len(range(8, 256, 8)) + len(range(256, 513, 16))           # 1,2,4 / step 8 / step 16 up to 512
    graphs = graph_sizes * vllm.cuda_graph_bytes_per_size
    kv = requested - weights - vllm.non_torch_bytes - activation - graphs
    block = 16 * 32 * 2 * 8 * 128 * 2                         # 16 tokens x 32 layers x K,V x 8 heads x 128 x bf16
    blocks = kv // block
    tokens = int(blocks / (8192 // 16) * 8192)

    mem = engines.server(s.engine).memory(LLAMA31_8B, s, hw)
    assert mem.kv_cache_bytes == kv
    assert mem.num_blocks == blocks
    assert mem.kv_cache_tokens == tokens == blocks * 16
    assert mem.max_concurrency == pytest.approx(blocks / 512)
    assert 50 * GiB < kv < 56 * GiB                          # ~54.6 GiB: weights take 15 of the 72 GiB budget


def test_kv_bytes_per_token_matches_published_vllm_log() -> None:
    """github.com/vllm-project/vllm/issues/10517: Llama-3.1-8B, kv_cache_size=3.81GiB -> 1952 GPU blocks of 16 tokens."""
    per_token = kv_bytes_per_token(LLAMA31_8B, ServingSetup(engine="vllm"))
    assert per_token == 131072                                # 128 KiB: 32 layers x 2 x 8 heads x 128 x 2 bytes
    assert 3.81 * GiB / (16 * per_token) == pytest.approx(1952, rel=0.002)


@pytest.mark.parametrize(("tokens", "peak_torch_gib"), [(20000, 17.06), (29000, 17.98)])
def test_activation_peak_close_to_published_profile(tokens: int, peak_torch_gib: float) -> None:
    """Same issue: profile runs at max_num_batched_tokens = 20000 / 29000 peaked at 17.06 / 17.98 GiB of torch
    memory with 14.9888 GiB of weights ('Loading model weights took 14.9888 GB', vLLM printed GiB as GB)."""
    peak = activation_peak_bytes(LLAMA31_8B, ServingSetup(engine="vllm", max_num_batched_tokens=tokens, max_num_seqs=256))
    assert peak == pytest.approx((peak_torch_gib - 14.9888) * GiB, rel=0.10)


def test_fp8_kv_halves_bytes_and_tp_splits_heads() -> None:
    base = kv_bytes_per_token(LLAMA31_70B, ServingSetup(engine="vllm"))
    assert kv_bytes_per_token(LLAMA31_70B, ServingSetup(engine="vllm", kv_cache_dtype="fp8")) * 2 == base
    assert kv_bytes_per_token(LLAMA31_70B, ServingSetup(engine="vllm", tensor_parallel_size=8)) * 8 == base
    # 16 ranks for 8 KV heads: each rank still keeps one whole head (replicated)
    assert kv_bytes_per_token(LLAMA31_70B, ServingSetup(engine="vllm", tensor_parallel_size=16)) * 8 == base


def test_mla_latent_cache_is_rank_plus_rope_and_not_split() -> None:
    """DeepSeek-V2-Lite config.json: kv_lora_rank 512, qk_rope_head_dim 64, 27 layers: one 576-wide latent per layer."""
    spec = ModelSpec(name="dsv2-lite", hidden_size=2048, num_layers=27, num_attention_heads=16, num_key_value_heads=16,
                     head_dim=192, intermediate_size=10944, vocab_size=102400, total_params=15_700_000_000,
                     embedding_params=102400 * 2048, lm_head_params=102400 * 2048,
                     config={"kv_lora_rank": 512, "qk_rope_head_dim": 64})
    assert kv_bytes_per_token(spec, ServingSetup(engine="vllm")) == 27 * 576 * 2
    assert kv_bytes_per_token(spec, ServingSetup(engine="vllm", tensor_parallel_size=4)) == 27 * 576 * 2


def test_int4_group_weights_and_fp8_weights() -> None:
    linear = LLAMA31_70B.linear_params
    rest = LLAMA31_70B.total_params - linear
    # 4-bit codes + an fp16 scale and a 4-bit zero point per group of 128
    assert format_weight_bytes(LLAMA31_70B, "awq") == int(linear * (0.5 + 2.5 / 128) + rest * 2)
    assert format_weight_bytes(LLAMA31_70B, "fp8") == int(linear * 1 + rest * 2)
    # ~37 GB: the 4-bit 70B leaves most of an H100 for the KV cache; 16-bit does not fit at all
    hw = Hardware.from_name("h100-80gb")
    assert engines.server("vllm").memory(LLAMA31_70B, ServingSetup(engine="vllm", weight_format="awq"), hw).fits
    assert not engines.server("vllm").memory(LLAMA31_70B, ServingSetup(engine="vllm", weight_format="bf16"), hw).fits


def test_sglang_pool_is_fraction_of_free_memory_minus_weights() -> None:
    hw = Hardware.from_name("a100-80gb")
    s = ServingSetup(engine="sglang", gpu_memory_utilization=0.85, max_model_len=4096)
    mem = engines.server(s.engine).memory(LLAMA31_8B, s, hw)
    pool = int((round(79.14 * 2**30) - cuda_context_bytes(hw)) * 0.85) - 8_030_261_248 * 2
    assert mem.kv_cache_bytes == pool
    assert mem.kv_cache_tokens == pool // 131072               # token granularity (page size 1)


def _toy_llama(quantization_config: dict[str, object] | None = None) -> ModelSpec:
    config: dict[str, object] = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "vocab_size": 1000,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 4096,
    }
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    return ModelSpec.from_any(config)


def test_fp8_checkpoint_keeps_its_ignore_list_in_16_bit_by_hand() -> None:
    """Llama-3.1-405B-Instruct-FP8's scheme on a toy Llama (fbgemm_fp8, MLPs of the inner layers only, Llama 3
    paper sec. 6.2): attention and the first and last MLPs stay bf16."""
    ignore = ["self_attn", "model.layers.0.mlp", "model.layers.3.mlp", "lm_head"]
    spec = _toy_llama({"quant_method": "fbgemm_fp8", "modules_to_not_convert": ignore})
    attention = 256 * 256 + 256 * 128 + 256 * 128 + 256 * 256           # q, k, v (2 KV heads x 64), o
    mlp = 3 * 256 * 512                                                   # gate, up, down
    embeddings = 2 * 1000 * 256                                           # embed_tokens + untied lm_head
    norms = 4 * 2 * 256 + 256                                             # two RMSNorms per layer + the final one
    assert spec.total_params == 4 * (attention + mlp) + embeddings + norms
    fp8 = 2 * mlp                                                         # layers 1 and 2
    bf16 = 4 * attention + 2 * mlp + embeddings + norms
    assert format_weight_bytes(spec, "fp8") == fp8 * 1 + bf16 * 2
    # without the list every Linear is fp8
    plain = _toy_llama()
    assert format_weight_bytes(plain, "fp8") == 4 * (attention + mlp) + (embeddings + norms) * 2


@pytest.mark.parametrize(("entry", "name", "hit"), [
    ("model.layers.1.mlp", "model.layers.1.mlp.up_proj", True),
    ("model.layers.1.mlp", "model.layers.11.mlp.up_proj", False),   # whole components, not a substring of "11"
    ("self_attn", "model.layers.7.self_attn.o_proj", True),
    ("model.layers.*.self_attn", "model.layers.7.self_attn.q_proj", True),    # gpt-oss writes globs
    ("re:.*mlp\\.gate$", "model.layers.3.mlp.gate", True),                    # compressed-tensors writes regexes
    ("re:.*mlp\\.gate$", "model.layers.3.mlp.gate_proj", False),
])
def test_ignore_list_entries_name_modules_as_the_checkpoints_write_them(entry: str, name: str, hit: bool) -> None:
    assert _skipped(name, entry) is hit


def test_sampler_peak_matches_a_published_v0_profile() -> None:
    """github.com/vllm-project/vllm/issues/13882 (vLLM 0.7 V0, Qwen2.5-7B, 256 sequences, max_model_len 4096):
    'PyTorch activation peak memory takes 1.42GiB'. The sort path's live bytes per logit: bf16 logits 2 + fp32 4 +
    int64 iota 8 + sorted keys 4 and indices 8 + radix alternate buffers 4 + 8 = 38; the forward at 4096 tokens
    (3 x 4096 x 18944 x 2 = 0.43 GiB) is freed before the sampler runs."""
    spec = ModelSpec.from_any("Qwen/Qwen2.5-7B")
    facts = serving_facts().engines["vllm"]
    s = ServingSetup(engine="vllm", max_num_seqs=256, max_num_batched_tokens=4096, max_model_len=4096)
    by_hand = 256 * 152064 * 38 + 4096 * 3584 * 2
    assert activation_peak_bytes(spec, s, facts) == by_hand
    assert by_hand / GiB == pytest.approx(1.42, rel=0.03)


def test_allocator_rounding_by_hand() -> None:
    """PyTorch's caching allocator: a tensor over 10 MiB gets a segment of its own rounded up to 2 MiB; 1-10 MiB
    tensors pack into 20 MiB segments; up to 1 MiB they share small segments (not counted)."""
    mib = 2**20
    # 3 + 3 MiB open one 20 MiB segment (14 left); 15 MiB takes a 16 MiB segment (1 wasted); 12 MiB fits 12 exactly
    assert allocator_rounding_bytes([3 * mib, 3 * mib, 15 * mib, mib // 2, 12 * mib]) == 14 * mib + 1 * mib
    # a third 8 MiB tensor does not fit the 4 MiB the first segment has left: a second segment, 12 MiB of it unused
    assert allocator_rounding_bytes([8 * mib] * 3) == 4 * mib + 12 * mib
    assert allocator_rounding_bytes([64 * mib, mib]) == 0


def test_rotary_buffer_is_counted_in_the_model_dtype_by_vllm_and_fp32_by_sglang() -> None:
    """vLLM 'Model loading took 14.9888 GB' for Llama-3.1-8B on one GPU (github.com/vllm-project/vllm/issues/10517):
    8,030,261,248 bf16 parameters are 14.957 GiB; the 131072 x 128 cos/sin table in bf16 (32 MiB) makes up the rest."""
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    assert rope_cache_bytes(spec, 2) == 131072 * 128 * 2
    s = ServingSetup(engine="vllm")
    loaded = engines.server("vllm").loaded_weight_bytes(spec, s)
    assert loaded == 8_030_261_248 * 2 + 131072 * 128 * 2
    assert loaded / GiB == pytest.approx(14.9888, abs=0.002)
    # SGLang keeps the table fp32 on CUDA, bf16 on ROCm (srt/layers/rotary_embedding.py)
    sg = ServingSetup(engine="sglang")
    assert (engines.server("sglang").loaded_weight_bytes(spec, sg, "nvidia")
            - engines.server("sglang").loaded_weight_bytes(spec, sg, "amd")) == 131072 * 128 * 2


def test_sglang_load_figure_of_qwq_32b_tp4_by_hand() -> None:
    """SGLang 0.4.3 on 4x L4 logged 'mem usage=15.54 GB' per rank for QwQ-32B (Qwen2.5-32B shapes, TP4;
    github.com/didier-durand/llms-in-clouds docs/sglang.md). SGLang reads the fall in free memory, so the caching
    allocator's 2 MiB rounding of each large tensor counts. Per layer and rank: qkv 5120 x 7168 / 4 bf16 = 17.5 MiB
    (0.5 MiB to 18), o_proj 5120 x 5120 / 4 = 12.5 MiB (1.5 to 14), gate_up 5120 x 55296 / 4 = 135 MiB
    (an odd count: 1 MiB to 136), down 67.5 MiB (0.5 to 68): 3.5 MiB x 64 layers; embedding and lm_head 152064 x 5120 / 4 bf16 = 371.25 MiB each (0.75 to 372); the fp32 rotary table
    131072 x 128 x 4 = 64 MiB (whole)."""
    spec = ModelSpec.from_any("Qwen/Qwen2.5-32B")
    s = ServingSetup(engine="sglang", tensor_parallel_size=4)
    mib = 2**20
    rounding = 64 * 3.5 * mib + 2 * 0.75 * mib
    assert allocator_rounding_bytes([*rank_weight_tensors(spec, s), 64 * mib]) == rounding
    loaded = engines.server("sglang").loaded_weight_bytes(spec, s)
    assert loaded - rank_weight_bytes(spec, s) == 131072 * 128 * 4 + rounding
    assert loaded / GiB == pytest.approx(15.54, rel=0.003)      # the log; the parameters alone are 15.26 GiB (-1.8%)
