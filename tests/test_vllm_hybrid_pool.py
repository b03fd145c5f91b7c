"""vLLM's pool for hybrid models (attention + gated-DeltaNet / Mamba layers), checked against hand counts from the
configs and against published start-up logs, not against perfguide's own output.

Hand counts follow vLLM's own rules (vllm/v1/kv_cache_interface.py MambaSpec / FullAttentionSpec, the
HybridAttentionMambaModelConfig block alignment, kv_cache_utils' uniform-page grouping): a recurrent layer's page is
its conv state (channels x (kernel - 1), model dtype) plus its recurrent state (value heads x key dim x value dim, in
the config's mamba_ssm_dtype); the attention block is 16 x cdiv(that page, 16 x one layer's K/V bytes per token).
"""

from __future__ import annotations

import math

import pytest

import perfguide
from perfguide.engines.vllm import ENGINE
from perfguide.memory.serving import EngineMemory, start_limit, state_page_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import ServingSetup

GIB = 2**30


def _serving(**kw: object) -> ServingSetup:
    base: dict[str, object] = {"engine": "vllm", "weight_format": "bf16", "dtype": "bf16"}
    return ServingSetup(**(base | kw))


def test_qwen36_35b_state_page_is_the_hand_count() -> None:
    spec = ModelSpec.from_any("Qwen/Qwen3.6-35B-A3B")
    # config.json: 16 key heads and 32 value heads of 128, conv kernel 4, mamba_ssm_dtype float32
    conv = (2 * 16 * 128 + 32 * 128) * (4 - 1) * 2
    recurrent = 32 * 128 * 128 * 4
    assert state_page_bytes(spec, _serving()) == conv + recurrent == 2_146_304
    # two tensor-parallel ranks halve the channels and the value heads
    assert state_page_bytes(spec, _serving(tensor_parallel_size=2)) == (conv + recurrent) // 2


def test_qwen36_27b_attention_block_is_784() -> None:
    """784 tokens: the unified block LMCache's Qwen3.6-27B recipe quotes from vLLM's start-up log ("Setting attention
    block size to ... tokens to ensure that attention page size is >= mamba page size"; recipe reference values
    Qwen3.5-0.8B=544, Qwen3.6-27B=784, quoted in a public launch script), and the hand count: a state page of
    10,240 x 3 x 2 + 48 x 128 x 128 x 4 = 3,207,168 bytes over 4 KV heads x 256 x 2 x 2 = 4,096 bytes per token."""
    spec = ModelSpec.from_any("Qwen/Qwen3.6-27B")
    pool = ENGINE.pool_layout(spec, _serving(max_model_len=32768))
    assert 16 * math.ceil(3_207_168 / (16 * 4096)) == 784
    assert pool.block_size == 784
    assert pool.page_bytes == 784 * 4096          # the state page padded up to the attention page
    assert pool.group == 16                       # 16 attention and 48 recurrent layers: groups of 16
    assert pool.per_request == math.ceil(32768 / 784) + 3 * 2   # prefix caching ("align"): two state pages a group


def test_qwen36_35b_nvfp4_pool_matches_the_published_log() -> None:
    """github.com/noonghunna/club-3090 issue 612 (vLLM 0.24.0, RTX 5090, Qwen3.6-35B-A3B NVFP4, --kv-cache-dtype fp8,
    --enable-prefix-caching, --max-model-len 131072): "Available KV cache memory: 5.98 GiB", "GPU KV cache size:
    567,978 tokens", "Maximum concurrency for 131,072 tokens per request: 4.33x". The weights' format does not enter:
    the pool is cut from the KV memory the log prints."""
    spec = ModelSpec.from_any("Qwen/Qwen3.6-35B-A3B")
    pool = ENGINE.pool_layout(spec, _serving(max_model_len=131072, kv_cache_dtype="fp8", enable_prefix_caching=True))
    assert pool.block_size == 2096                # 2,146,304 / (2 KV heads x 256 x 2 x 1 byte) = 2,096 exactly
    per_block = pool.page_bytes * int(pool.group)
    counts = range(int(5.975 * GIB) // per_block, int(5.985 * GIB) // per_block + 1)   # 5.98 GiB as printed
    assert pool.per_request == math.ceil(131072 / 2096) + 3 * 2 == 69
    logged = [b for b in counts if int(b / pool.per_request * 131072) == 567_978 and round(b / pool.per_request, 2) == 4.33]
    assert logged == [299] and int(5.98 * GIB) // per_block == 299


def test_without_prefix_caching_a_request_takes_one_state_page_per_group() -> None:
    """vLLM's "none" mode (MambaSpec.max_memory_usage_bytes: one page), its default for hybrids: a command that does not
    pass --enable-prefix-caching is read so."""
    spec = ModelSpec.from_any("Qwen/Qwen3.6-35B-A3B")
    on = ENGINE.pool_layout(spec, _serving(max_model_len=8192, enable_prefix_caching=True))
    off = ENGINE.pool_layout(spec, _serving(max_model_len=8192, enable_prefix_caching=False))
    assert on.per_request - off.per_request == 3
    assert ENGINE.prefix_caching_default(spec) is False
    assert ENGINE.prefix_caching_default(ModelSpec.from_any("meta-llama/Llama-3.1-8B")) is True


def test_attention_only_models_keep_the_16_token_pool() -> None:
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    pool = ENGINE.pool_layout(spec, _serving(max_model_len=8192))
    assert (pool.block_size, pool.states) == (16, False)
    assert pool.page_bytes == 16 * 2 * 8 * 128 * 2


def test_start_refusal_is_vllms_own_message() -> None:
    mem = EngineMemory(engine="vllm", total=80 * GIB, budget=70 * GIB, weights=60 * GIB, activation_peak=GIB, non_torch=0,
                       cuda_graphs=0, cuda_context=0, kv_cache_bytes=9 * GIB, kv_bytes_per_token=1, block_size=784,
                       num_blocks=73, kv_cache_tokens=1, max_model_len=8192, max_concurrency=5.0, state_slots=73,
                       state_slots_needed=256)
    assert not mem.fits
    assert "max_num_seqs (256) exceeds available Mamba cache blocks (73)" in (start_limit(mem) or "")
    assert start_limit(mem.model_copy(update={"state_slots_needed": 73})) is None


def test_a_plan_never_asks_for_more_sequences_than_state_pages() -> None:
    rec = perfguide.recommend("Qwen/Qwen3.6-35B-A3B", scenario="infer_gpu_one", hardware="h100-80gb", engine="vllm",
                              gpu_memory_utilization=0.5, max_model_len=8192)
    command = rec.serve_command().split()
    seqs = int(command[command.index("--max-num-seqs") + 1])
    decision = next(d for d in rec.decisions if d.setting == "gpu_memory_utilization")
    blocks = int(decision.reason.split(" blocks of ")[0].rsplit("; ", 1)[1].replace(",", ""))
    assert seqs <= blocks < 256
    assert "refuses to start with more sequences" in decision.reason


def test_a_forced_max_num_seqs_above_the_pages_runs_eager() -> None:
    """vLLM checks the state pages before capturing CUDA graphs; a user's own max_num_seqs is kept, so the plan that starts
    is the eager one."""
    rec = perfguide.recommend("Qwen/Qwen3.6-35B-A3B", scenario="infer_gpu_one", hardware="h100-80gb", engine="vllm",
                              gpu_memory_utilization=0.5, max_model_len=8192, max_num_seqs=1024)
    command = rec.serve_command().split()
    assert command[command.index("--max-num-seqs") + 1] == "1024"
    assert "--enforce-eager" in command


def test_check_says_why_a_serve_command_does_not_start() -> None:
    c = perfguide.check(config="vllm serve Qwen/Qwen3.6-27B --gpu-memory-utilization 0.85 --max-model-len 32768", hardware="h100-80gb")
    assert not c.fits
    assert c.memory.start_limit is not None
    assert "max_num_seqs (1,024) exceeds available Mamba cache blocks" in c.memory.start_limit
    assert any("Mamba cache blocks" in n for n in c.notes)
    edits = [e.text() for ch in c.changes for e in ch.edits]   # the smallest changes that start: eager, or fewer sequences
    assert "--enforce-eager" in edits and any(e.startswith("--max-num-seqs ") for e in edits)


def test_qwen3_next_tp2_pool_matches_a_published_0_13_log() -> None:
    """A public vLLM 0.13.0 start-up log (a docker-compose service "qwen3-next-instruct": Qwen3NextForCausalLM with
    W4A16 experts, 2x L40S, --tensor-parallel-size 2 --kv-cache-dtype fp8 --max-model-len 32768; vLLM disables prefix
    caching for the hybrid, "Hybrid or mamba-based model detected without support for prefix caching: disabling"):
    "Setting attention block size to 1072 tokens", "Available KV cache memory: 17.58 GiB", "GPU KV cache size:
    767,552 tokens", "Maximum concurrency for 32,768 tokens per request: 84.29x". Qwen3-Next's config names no
    mamba_ssm_dtype, so the recurrent state is bf16: a rank's page is 4,096 x 3 x 2 + 16 x 128 x 128 x 2 = 548,864
    bytes, 1,072 tokens of one K/V head of 256 in fp8 (512 bytes). The Instruct release has the Thinking config's shape."""
    spec = ModelSpec.from_any("Qwen/Qwen3-Next-80B-A3B-Thinking")
    serving = _serving(max_model_len=32768, kv_cache_dtype="fp8", tensor_parallel_size=2, enable_prefix_caching=False)
    assert state_page_bytes(spec, serving) == 4096 * 3 * 2 + 16 * 128 * 128 * 2 == 548_864
    pool = ENGINE.pool_layout(spec, serving)
    assert (pool.block_size, pool.page_bytes, pool.group) == (1072, 548_864, 12)
    per_block = pool.page_bytes * int(pool.group)
    # the log prints the KV memory to 0.01 GiB: the pool holds one of these block counts
    counts = range(int(17.575 * GIB) // per_block, int(17.585 * GIB) // per_block + 1)
    assert pool.per_request == math.ceil(32768 / 1072) + 3 == 34
    # ...and the one both printed figures name is among them
    logged = [b for b in counts if round(b / pool.per_request, 2) == 84.29 and b // 4 * 1072 == 767_552]
    assert logged == [2866]   # 0.13's token log: blocks over the 4 groups x the block (0.24 logs concurrency x length)


def test_a_pure_recurrent_model_gets_a_pool_of_state_pages() -> None:
    """transformers' default GraniteMoeHybridConfig has no attention layer (every layer "mamba"): no K/V per token, one
    group of state pages, a request one page per layer (bench/fuzz.py found it raising inside EngineMemory)."""
    from transformers import GraniteMoeHybridConfig

    from perfguide.hardware import Hardware

    config = GraniteMoeHybridConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, num_key_value_heads=4,
                                    intermediate_size=512, shared_intermediate_size=512, num_local_experts=4,
                                    num_experts_per_tok=2, mamba_n_heads=16, mamba_d_head=32, vocab_size=1000)
    spec = ModelSpec.from_any(config)
    assert spec.kv_layers == 0 and spec.stateful_layers == spec.num_layers == 4
    serving = _serving(max_model_len=4096, enable_prefix_caching=False)
    # Mamba-2 by hand: conv channels 16 x 32 + 2 x 1 group x 256 state, 3 columns, bf16; recurrent 16 x 32 x 256, bf16
    assert state_page_bytes(spec, serving) == (16 * 32 + 2 * 256) * 3 * 2 + 16 * 32 * 256 * 2
    pool = ENGINE.pool_layout(spec, serving)
    assert (pool.block_size, pool.page_bytes, pool.group, pool.per_request) == (4096, state_page_bytes(spec, serving), spec.num_layers, 1)
    mem = ENGINE.memory(spec, serving, Hardware.from_name("h100-80gb"))
    assert mem.kv_bytes_per_token == 0 and mem.state_slots == mem.num_blocks > 0
    assert mem.num_blocks == max(0, mem.kv_cache_bytes) // (pool.page_bytes * spec.num_layers)


def test_a_hybrid_decode_step_reads_the_attention_layers_k_v_and_moves_each_state_page_twice() -> None:
    """Qwen3.6-35B-A3B on one rank, bf16 K/V: 10 attention layers x 2 KV heads x 256 x 2 (K, V) x 2 bytes per token;
    30 gated-DeltaNet layers each read and write their 2,146,304-byte state page per sequence and step."""
    from perfguide.memory.serving import attention_kv_bytes_per_token, kv_bytes_per_token, state_traffic_bytes

    spec, serving = ModelSpec.from_any("Qwen/Qwen3.6-35B-A3B"), _serving(max_model_len=8192)
    assert attention_kv_bytes_per_token(spec, serving) == 10 * 2 * 256 * 2 * 2
    assert kv_bytes_per_token(spec, serving) == 40 * 2 * 256 * 2 * 2     # the pool's upper bound, every layer
    assert state_traffic_bytes(spec, serving) == 2 * 30 * 2_146_304
    llama = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    assert attention_kv_bytes_per_token(llama, serving) == kv_bytes_per_token(llama, serving)
    assert state_traffic_bytes(llama, serving) == 0


def test_a_hybrid_decodes_long_contexts_faster_than_if_every_layer_held_k_v() -> None:
    """At 64 sequences of 8K tokens the all-attention reading moved 40 layers' K/V (43 GB a step); the attention layers'
    K/V and the state pages are 10.7 + 8.2 GB (19.0): the step is memory bound either way, so it shortens with the bytes."""
    from perfguide.hardware import Hardware
    from perfguide.speed.serving import decode_step_s

    spec, hw = ModelSpec.from_any("Qwen/Qwen3.6-35B-A3B"), Hardware.from_name("h100-80gb")
    serving = _serving(max_model_len=16384)
    hybrid, bound, _, _ = decode_step_s(spec, serving, hw, 64, 8192, 0.0)
    flat = spec.model_copy(update={"layer_types": None, "conv_state_kernel": 0})
    everywhere, _, _, _ = decode_step_s(flat, serving, hw, 64, 8192, 0.0)
    assert bound == "memory-bandwidth"
    kv_all = 64 * 8192 * 40 * 2048
    kv_hybrid = 64 * (8192 * 10 * 2048 + 2 * 30 * 2_146_304)
    gpu = hw.smallest_gpu
    assert gpu is not None and gpu.memory_bandwidth_gbps
    rate = gpu.memory_bandwidth_gbps * 1e9 * _decode_efficiency()
    weights = everywhere - kv_all / rate   # what the two readings share: the weights' read time
    assert hybrid == pytest.approx(weights + kv_hybrid / rate, rel=1e-9)
    assert kv_all / 1e9 == pytest.approx(43.0, abs=0.1) and kv_hybrid / 1e9 == pytest.approx(18.98, abs=0.01)


def _decode_efficiency() -> float:
    from perfguide._serving_data import serving_facts

    return serving_facts().decode_bandwidth_efficiency.value


def test_qwen35_27b_blocks_are_the_mamba_cache_blocks_a_published_profile_reads() -> None:
    """A public profiling note of Qwen3.5-27B under vLLM (bf16 K/V, one GPU; its start-up log quoted): "Setting attention
    block size to 784 tokens", "Capping cudagraph capture sizes from max 256 to 136 to fit Mamba cache blocks (141
    blocks available)", and a KV cache of "6.76 GiB / 27,440 tokens" (that release's token log: blocks // 4 groups x
    784). The pool's blocks are the Mamba cache blocks: 6.76 GiB over 16 layers' 784 x 4,096-byte pages."""
    spec = ModelSpec.from_any("Qwen/Qwen3.5-27B")
    pool = ENGINE.pool_layout(spec, _serving(max_model_len=32768))
    assert (pool.block_size, pool.page_bytes, pool.group) == (784, 784 * 4096, 16)
    per_block = pool.page_bytes * int(pool.group)
    counts = range(int(6.755 * GIB) // per_block, int(6.765 * GIB) // per_block + 1)
    assert [b for b in counts if b // 4 * 784 == 27_440] == [141] and int(6.76 * GIB) // per_block == 141
