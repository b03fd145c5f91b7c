"""Training speed model: FLOP counts, rates, communication and optimizer terms checked against hand-derived values.

The GPT-2 numbers are counted by hand from the published architecture (768 wide, 12 blocks, 50257 vocab,
1024 positions, tied head); the communication terms are the textbook ring formulas written out here.
"""

from __future__ import annotations

import warnings

import pytest

from perfguide._data import load
from perfguide.hardware.types import CPU, GPU, Hardware
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup
from perfguide.speed import estimate_speed
from perfguide.speed.rates import optimizer_bytes
from perfguide.speed.training import communication

GiB = 1024**3
h, L, V, P, S = 768, 12, 50257, 1024, 1024
# per block: c_attn 768x2304 (+2304 bias), c_proj 768x768 (+768), c_fc 768x3072 (+3072), proj 3072x768 (+768), 2 LayerNorms (4*768)
BLOCK = 768 * 2304 + 2304 + 768 * 768 + 768 + 768 * 3072 + 3072 + 3072 * 768 + 768 + 4 * 768
GPT2_TOTAL = V * h + P * h + L * BLOCK + 2 * h
assert GPT2_TOTAL == 124_439_808
GPT2_MATMUL = GPT2_TOTAL - (V * h + P * h) + V * h        # blocks + final norm, plus the tied lm_head matmul


def gpt2() -> ModelSpec:
    return ModelSpec(name="gpt2", model_type="gpt2", family="gpt2", hidden_size=h, num_layers=L, num_attention_heads=12,
                     num_key_value_heads=12, head_dim=64, intermediate_size=3072, vocab_size=V, max_position_embeddings=P,
                     tie_word_embeddings=True, gated_mlp=False, total_params=GPT2_TOTAL, embedding_params=V * h + P * h,
                     lm_head_params=0, block_linears={"attn.c_attn": (768, 2304), "attn.c_proj": (768, 768),
                                                      "mlp.c_fc": (768, 3072), "mlp.c_proj": (3072, 768)})


LLAMA_LINEARS = {**{f"self_attn.{p}_proj": (4096, 4096) for p in "qkvo"},
                 "mlp.gate_proj": (4096, 11008), "mlp.up_proj": (4096, 11008), "mlp.down_proj": (11008, 4096)}
LLAMA_TOTAL = 2 * 32000 * 4096 + 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096) + 4096
assert LLAMA_TOTAL == 6_738_415_616


def llama7b() -> ModelSpec:
    return ModelSpec(name="llama-7b", model_type="llama", family="llama", hidden_size=4096, num_layers=32, num_attention_heads=32,
                     num_key_value_heads=32, head_dim=128, intermediate_size=11008, vocab_size=32000, total_params=LLAMA_TOTAL,
                     embedding_params=32000 * 4096, lm_head_params=32000 * 4096, block_linears=LLAMA_LINEARS, native_dtype="bf16")


CPU32 = CPU(model_name="test cpu", physical_cores=32, logical_cores=64, ram_total=512 * GiB, ram_available=500 * GiB, fp32_gflops=2000.0)
A100 = GPU(name="A100-SXM4-80GB", memory_total=80 * GiB, memory_free=80 * GiB, compute_capability=(8, 0), bf16_tflops=312,
           fp16_tflops=312, tf32_tflops=156, fp32_tflops=19.5, memory_bandwidth_gbps=2039)
T4 = GPU(name="Tesla T4", memory_total=15 * GiB, memory_free=15 * GiB, compute_capability=(7, 5), fp16_tflops=65, fp32_tflops=8.1,
         memory_bandwidth_gbps=320)


def machine(gpu: GPU = A100, n: int = 1, nodes: int = 1, link: float | None = 300.0, net: float | None = 25.0) -> Hardware:
    return Hardware(gpus=(gpu,) * n, cpu=CPU32, interconnect="nvlink" if n > 1 else "none", intra_node_bandwidth_gbps=link if n > 1 else None,
                    inter_node_bandwidth_gbps=net if nodes > 1 else None, nodes=nodes, source="named")


def amp(**kw: object) -> Setup:
    base = dict(seq_len=S, micro_batch_size=1, weights_dtype="fp32", autocast="bf16", tf32=True)
    base.update(kw)
    return Setup(**base)  # type: ignore[arg-type]


def attn_fwd(micro: int, seq: int = S) -> float:
    return 4 * L * (12 * 64) * seq * seq * micro


def test_training_flops_are_6n_plus_attention() -> None:
    t = estimate_speed(gpt2(), amp(micro_batch_size=2, gradient_accumulation_steps=3), machine())
    tokens = 2 * S * 3
    assert t.flops_per_step == pytest.approx(6 * GPT2_MATMUL * tokens + 3 * 3 * attn_fwd(2))


def test_checkpointing_adds_one_forward() -> None:
    """Checkpointing re-runs the blocks' forward, not the (tied) output head's V x h matmul, which runs once."""
    plain = estimate_speed(gpt2(), amp(), machine())
    ckpt = estimate_speed(gpt2(), amp(gradient_checkpointing=True), machine())
    assert ckpt.flops_per_step - plain.flops_per_step == pytest.approx(2 * (GPT2_MATMUL - V * h) * S + attn_fwd(1))
    assert ckpt.step_time_s > plain.step_time_s


def test_lora_skips_frozen_weight_grads() -> None:
    # all-linear r=16: 16 * ((768+2304) + (768+768) + (768+3072) + (3072+768)) per block = 196608; x12 blocks
    adapters = 16 * ((768 + 2304) + (768 + 768) + (768 + 3072) + (3072 + 768)) * 12
    t = estimate_speed(gpt2(), amp(weights_dtype="bf16", lora=LoraSpec(r=16)), machine())
    assert t.flops_per_step == pytest.approx(4 * GPT2_MATMUL * S + 6 * adapters * S + 3 * attn_fwd(1))


def test_sliding_window_caps_attended_tokens() -> None:
    spec = gpt2().model_copy(update={"sliding_window": 256})
    t = estimate_speed(spec, amp(), machine())
    assert t.flops_per_step == pytest.approx(6 * GPT2_MATMUL * S + 3 * 4 * L * 768 * S * 256)


def test_tiny_micro_batches_are_less_efficient() -> None:
    """Same global batch: larger micro-batches reach more of the peak (per-token time falls)."""
    times = [estimate_speed(gpt2(), amp(micro_batch_size=m, gradient_accumulation_steps=32 // m), machine()).step_time_s
             for m in (1, 2, 4, 8, 16, 32)]
    assert times == sorted(times, reverse=True)
    # the fixed per-micro-step part (weight streaming, launches) is a few % of a 1024-token GPT-2 step once the
    # token-proportional elementwise traffic is priced (data/traffic.json)
    assert times[0] > 1.05 * times[-1]


def test_precision_orders_speed_on_ampere() -> None:
    # 8 x S tokens: compute-bound (one 1 x S micro-batch of gpt2 is launch-bound: no precision makes the CPU faster)
    bf16 = estimate_speed(gpt2(), amp(micro_batch_size=8), machine())
    tf32 = estimate_speed(gpt2(), amp(micro_batch_size=8, autocast=None, tf32=True), machine())
    fp32 = estimate_speed(gpt2(), amp(micro_batch_size=8, autocast=None, tf32=False), machine())
    assert bf16.step_time_s < tf32.step_time_s < fp32.step_time_s
    # one 1 x S micro-batch is launch-bound: the host's dispatch of 12 layers x ops (x the autocast casts) at the
    # per-op host cost sets its time, so 8x the tokens cost far less than 8x
    tiny = estimate_speed(gpt2(), amp(), machine())
    eff = load("efficiency")
    floor = 12 * eff["cuda_ops_per_layer"]["value"] * eff["autocast_ops_factor"]["value"] * eff["kernel_launch_s"]["value"]
    assert tiny.compute_time_s == pytest.approx(floor)
    assert bf16.step_time_s < 8 * tiny.step_time_s and bf16.tokens_per_s > tiny.tokens_per_s
    assert 0 < bf16.mfu < 0.6


def test_bf16_on_t4_is_emulated_and_warns() -> None:
    with pytest.warns(UserWarning, match="no bf16 tensor cores"):
        bf16 = estimate_speed(gpt2(), amp(tf32=False), machine(T4))
    fp16 = estimate_speed(gpt2(), amp(autocast="fp16", tf32=False), machine(T4))
    assert fp16.step_time_s < bf16.step_time_s


def test_tokens_per_s_and_bound() -> None:
    s = amp(micro_batch_size=4, gradient_accumulation_steps=2)
    t = estimate_speed(gpt2(), s, machine())
    assert t.tokens_per_s == pytest.approx(4 * 2 * S / t.step_time_s)
    assert t.bound == "compute"
    assert t.step_time_s >= t.compute_time_s


def test_optimizer_step_streams_params_grads_and_states() -> None:
    # fused AdamW, fp32 master: read w(4) g(4) m(4) v(4), write w(4) m(4) v(4) = 28 B, plus the grad-norm read (4)
    assert optimizer_bytes(llama7b(), amp()) == pytest.approx(32 * LLAMA_TOTAL)
    # one token per step: the 7B update (215 GB at 0.8 x 2039 GB/s ~ 0.13 s) is the largest part of the step
    t = estimate_speed(llama7b(), amp(seq_len=1), machine())
    assert t.bound == "memory-bandwidth"
    bw = 2039e9 * load("efficiency")["memory_bandwidth_fraction"]["value"]
    no_update = estimate_speed(llama7b(), amp(seq_len=1, optimizer=None), machine())
    assert t.step_time_s - no_update.step_time_s == pytest.approx(32 * LLAMA_TOTAL / bw)


def _bus() -> float:
    return load("efficiency")["comm_bus_fraction"]["value"]


def test_ddp_ring_all_reduce() -> None:
    s = amp(strategy="ddp", num_gpus=8)
    per_micro, per_step, deferred = communication(llama7b(), s, machine(n=8), A100)
    grads = 4 * LLAMA_TOTAL                                     # DDP reduces the fp32 grads of fp32 master weights
    assert per_micro == 0 and deferred == 0
    assert per_step == pytest.approx(2 * 7 / 8 * grads / (300e9 * _bus()))


def test_zero3_gathers_params_twice_and_scatters_grads() -> None:
    s = amp(strategy="zero3", num_gpus=8)
    per_micro, per_step, deferred = communication(llama7b(), s, machine(n=8), A100)
    ring = 7 / 8 / (300e9 * _bus())
    assert per_micro == pytest.approx(2 * 2 * LLAMA_TOTAL * ring + 2 * LLAMA_TOTAL * ring)   # bf16 gathers fwd+bwd, bf16 grads
    assert per_step == 0 and deferred == 0   # DeepSpeed reduces every micro-step (its engine has no no_sync under ZeRO-3)


def test_inter_node_ring_adds_network_time() -> None:
    s = amp(strategy="ddp", num_gpus=8, nodes=2)
    _, per_step, _ = communication(llama7b(), s, machine(n=8, nodes=2), A100)
    grads = 4 * LLAMA_TOTAL
    assert per_step == pytest.approx(2 * 7 / 8 * grads / (300e9 * _bus()) + 2 * 1 / 2 * grads / (25e9 * _bus()))


def test_single_gpu_has_no_communication_and_ddp_costs_time() -> None:
    one = estimate_speed(llama7b(), amp(seq_len=2048), machine())
    assert one.comm_time_s == 0
    slow_net = estimate_speed(llama7b(), amp(seq_len=256, strategy="ddp", num_gpus=8, nodes=4), machine(n=8, nodes=4, net=1.0))
    assert slow_net.comm_time_s > 0
    assert slow_net.bound == "communication"


def test_offload_adds_pcie_time() -> None:
    base = amp(strategy="zero3", num_gpus=8)
    on = estimate_speed(llama7b(), base.replace(offload_optimizer=True, offload_params=True), machine(n=8))
    assert on.offload_time_s > 0
    assert estimate_speed(llama7b(), base, machine(n=8)).offload_time_s == 0


def test_quantized_base_is_slower_than_bf16_base() -> None:
    lora = LoraSpec(r=8)
    bf16 = estimate_speed(llama7b(), amp(seq_len=2048, weights_dtype="bf16", lora=lora), machine())
    nf4 = estimate_speed(llama7b(), amp(seq_len=2048, weights_dtype="nf4", lora=lora), machine())
    assert nf4.step_time_s > bf16.step_time_s


def test_cpu_bf16_needs_native_support_and_threads_scale() -> None:
    plain = CPU(model_name="avx2", physical_cores=16, logical_cores=32, ram_total=64 * GiB, ram_available=60 * GiB, flags=("avx2",))
    amx = plain.model_copy(update={"flags": ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")})
    fp32 = Setup(device="cpu", seq_len=256, micro_batch_size=2)
    bf16 = fp32.replace(autocast="bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        emulated = estimate_speed(gpt2(), bf16, Hardware(cpu=plain))
    assert emulated.step_time_s > estimate_speed(gpt2(), fp32, Hardware(cpu=plain)).step_time_s
    assert estimate_speed(gpt2(), bf16, Hardware(cpu=amx)).step_time_s < estimate_speed(gpt2(), fp32, Hardware(cpu=amx)).step_time_s
    half = estimate_speed(gpt2(), fp32.replace(cpu_threads=8), Hardware(cpu=plain))
    assert half.step_time_s > estimate_speed(gpt2(), fp32, Hardware(cpu=plain)).step_time_s


def test_inference_setups_go_to_the_inference_model() -> None:
    from perfguide.speed.inference import estimate_inference_speed

    s = Setup(task="infer", seq_len=128, new_tokens=32, weights_dtype="bf16", optimizer=None)
    assert estimate_speed(gpt2(), s, machine()) == estimate_inference_speed(gpt2(), s, machine())


def test_deterministic() -> None:
    s = amp(micro_batch_size=4, gradient_accumulation_steps=8, gradient_checkpointing=True)
    assert estimate_speed(llama7b(), s, machine()) == estimate_speed(llama7b(), s, machine())


# --- inference on CPU: which phase bounds the call, and its MFU ------------------------------------

CPU16 = CPU(physical_cores=16, logical_cores=32, ram_total=64 * GiB, ram_available=64 * GiB, fp32_gflops=1000.0)


def _infer_cpu(**kw: object) -> Setup:
    return Setup(**({"task": "infer", "device": "cpu", "weights_dtype": "fp32", "optimizer": None, "cpu_threads": 16} | kw))  # type: ignore[arg-type]


def test_cpu_decode_is_bandwidth_bound_and_its_mfu_is_low_by_hand() -> None:
    from perfguide.speed.inference import estimate_inference_speed

    # GPT-2 fp32, one sequence, a 128-token prompt and 65 new tokens: 64 decode steps that each stream all weights
    t = estimate_inference_speed(gpt2(), _infer_cpu(micro_batch_size=1, seq_len=128, new_tokens=65), Hardware(cpu=CPU16))
    peak = 1000e9                                                         # the probe's fp32 peak, all 16 cores
    achieved = peak * load("efficiency")["cpu_peak_fraction"]["value"]["fp32"]
    per_core = load("efficiency")["host_memory_gbps_per_core"]["value"]
    bandwidth = 16 * per_core * 1e9 * load("inference")["cpu_bandwidth_efficiency"]["value"]
    mean_tokens = 128 + 64 / 2                                            # the cache at its mean length over the decode
    kv = 2 * L * 12 * 64 * 160 * 4                                        # K and V, 12 heads x 64, fp32
    attn_unit = 2 * 12 * 64 * L                                           # QK^T + AV FLOPs per cached token
    step_flops = 2 * GPT2_TOTAL + 2 * attn_unit * mean_tokens
    step = (4 * GPT2_TOTAL + kv) / bandwidth                              # weights + cache read once per token
    assert step > step_flops / achieved                                   # memory, not compute, sets the pace
    assert t.time_per_output_token_ms == pytest.approx(step * 1e3)
    assert t.bound == "memory-bandwidth"
    assert t.mfu == pytest.approx(step_flops / (step * peak))            # ~2%, not the prefill's rate
    assert t.mfu < 0.05


def test_cpu_prefill_dominated_call_is_compute_bound_at_the_achieved_fraction() -> None:
    from perfguide.speed.inference import estimate_inference_speed

    # a long prompt and 2 new tokens: the call is the prefill; compute bound, its MFU is achieved / peak
    t = estimate_inference_speed(gpt2(), _infer_cpu(micro_batch_size=8, seq_len=1000, new_tokens=2), Hardware(cpu=CPU16))
    prefill_flops = 2 * GPT2_TOTAL * 8 * 1000 + 2 * 12 * 64 * L * 8 * 1000 * 1000
    achieved = 1000e9 * load("efficiency")["cpu_peak_fraction"]["value"]["fp32"]
    assert t.prefill_time_s == pytest.approx(prefill_flops / achieved)
    assert t.bound == "compute"
    assert t.mfu == pytest.approx(load("efficiency")["cpu_peak_fraction"]["value"]["fp32"])


@pytest.mark.parametrize("quant", ["nf4", "int8"])
def test_quantized_inference_on_t4_prefills_at_its_fp16_tensor_core_rate(quant: str) -> None:
    from perfguide.speed.inference import estimate_inference_speed

    # bitsandbytes dequantizes to the plan's 16-bit compute dtype, fp16 on a T4 (no bf16; model_kwargs sets
    # bnb_4bit_compute_dtype=float16): the prefill GEMMs run on the 65 TFLOP/s fp16 tensor cores (NVIDIA T4 datasheet:
    # 65 FP16 mixed-precision TFLOPS, 8.1 FP32), not at the 8.1 TFLOP/s fp32 rate
    s = Setup(task="infer", weights_dtype=quant, optimizer=None, micro_batch_size=16, seq_len=1024, new_tokens=2)
    t = estimate_inference_speed(llama7b(), s, machine(T4))
    eff = load("inference")["prefill_compute_efficiency"]["value"]
    slow = load("inference")["quant_prefill_slowdown"]["value"][quant]
    prefill_flops = 2 * LLAMA_TOTAL * 16 * 1024 + 2 * 32 * 128 * 32 * 16 * 1024 * 1024
    assert t.achievable_tflops == pytest.approx(65 * eff)
    assert t.prefill_time_s == pytest.approx(prefill_flops / (65e12 * eff) * slow, rel=0.01)
    assert t.mfu <= eff  # the prefill's model FLOPs against the fp16 peak: never above the achieved fraction


def test_encoder_forward_counts_its_input_tokens_and_has_no_decode() -> None:
    from perfguide.speed.inference import estimate_inference_speed

    # an encoder (BERT-style, new_tokens=0) runs one forward over the batch: 8 x 512 tokens go through the model in
    # the call's time, so tokens/s is 8 * 512 / step (not the 8 sequences / step a "one output token each" count
    # gives), and there is no decode step to time per output token
    t = estimate_inference_speed(gpt2(), _infer_cpu(micro_batch_size=8, seq_len=512, new_tokens=0), Hardware(cpu=CPU16))
    assert t.tokens_per_s == pytest.approx(8 * 512 / t.step_time_s)
    assert t.step_time_s == pytest.approx(t.prefill_time_s)
    assert t.decode_tokens_per_s is None and t.time_per_output_token_ms is None


def test_moe_decode_at_batch_one_streams_only_the_routed_experts() -> None:
    from perfguide.hardware.named import hardware_from_name
    from perfguide.model.types import ModelSpec
    from perfguide.speed.inference import estimate_inference_speed

    # Qwen3-30B-A3B (config.json: 128 experts, 8 per token, 48 layers): one decoding sequence routes each token to 8 of
    # 128 experts per layer, so a decode step reads the dense weights and 8/128 of the routed experts, not all 30.5B
    # weights (transformers' MoE loops over the experts some token hit); the rest of the step as for a dense model
    spec = ModelSpec.from_any("Qwen/Qwen3-30B-A3B")
    hw = hardware_from_name("mi300x")
    s = Setup(task="infer", weights_dtype="bf16", optimizer=None, micro_batch_size=1, seq_len=8, new_tokens=3)
    t = estimate_inference_speed(spec, s, hw)
    facts = load("inference")
    bandwidth = 5300e9 * facts["decode_bandwidth_efficiency"]["value"]      # MI300X datasheet: 5.3 TB/s HBM3
    read = 2 * (spec.total_params - spec.expert_params) + 2 * spec.expert_params * 8 / 128
    overhead = 48 * facts["eager_overhead_s_per_layer"]["value"]
    kv = 2 * 48 * 4 * 128 * 9 * 2                                         # K and V, 4 KV heads x 128, 9 cached tokens, bf16
    assert t.time_per_output_token_ms == pytest.approx(((read + kv) / bandwidth + overhead) * 1e3, rel=0.01)
