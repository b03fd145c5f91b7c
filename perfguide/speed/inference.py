"""Speed of one ``generate`` call: a compute-bound prefill, then memory-bandwidth-bound decode steps.

Decode reads every weight and the whole KV cache once per new token, so time per token is
bytes / (bandwidth x efficiency), plus the eager kernel-launch overhead per layer that static cache +
``torch.compile`` (CUDA graphs) removes, plus two all-reduces per layer under tensor parallelism.
Constants and their sources: perfguide/data/inference.json (GPU and decode), perfguide/data/efficiency.json
(the CPU's peak, achieved fraction and RAM bandwidth, shared with the training model so a CPU is one machine).

``bound`` and ``mfu`` describe the phase that takes most of the call: decode for the usual prompt + a few hundred
new tokens (memory-bandwidth bound, so a low MFU), prefill when the prompt dominates (compute bound). MFU is that
phase's model FLOPs / (its time x the devices' spec-sheet peak): averaging a compute-bound prefill into a
bandwidth-bound decode would report a high MFU for a call that is mostly waiting on memory.
"""

from __future__ import annotations

from typing import NamedTuple

from .. import techniques
from .._data import fact_value
from ..hardware.types import Hardware
from ..memory.inference import InferenceData, activation_bytes_per_element, inference_data, kv_cache_bytes, weight_bytes
from ..model.code import built_by
from ..model.types import ModelSpec
from ..setup import Setup
from .rates import cpu_path, cpu_peak_gflops, host_bandwidth_gbps
from .serving import routed_expert_fraction
from .types import Throughput


def _facts() -> InferenceData:
    return inference_data()


class Device(NamedTuple):
    """What one device offers a decode loop: bytes/s after efficiency and FLOP/s after efficiency."""

    bandwidth: float       # bytes/s, achieved
    flops: float           # FLOP/s, achieved
    peak_flops: float      # FLOP/s, spec sheet (for MFU)
    overhead_s: float      # per-token launch overhead of the whole model


def _gpu_device(spec: ModelSpec, setup: Setup, hardware: Hardware) -> Device:
    gpu = hardware.smallest_gpu
    assert gpu is not None, "called only when the hardware has a GPU"
    bw = (gpu.memory_bandwidth_gbps or _facts().default_gpu_bandwidth_gbps.value) * 1e9
    dtype = setup.compute_dtype if setup.compute_dtype != "fp32" else ("tf32" if setup.tf32 and gpu.supports_tf32 else "fp32")
    if dtype == "bf16" and not gpu.supports_bf16:
        # bnb weights dequantize to the plan's 16-bit dtype, fp16 without bf16 (bnb_4bit_compute_dtype, model_kwargs);
        # bf16 weights asked for on such a GPU are emulated at fp32-or-worse rates
        dtype = "fp16" if setup.weights_dtype in ("int8", "nf4") and not setup.autocast else "fp32"
    peak = (gpu.half_tflops(dtype) or gpu.fp32_tflops or 15.0) * 1e12
    overhead = spec.total_layers * _facts().eager_overhead_s_per_layer.value
    overhead *= techniques.kernel_factors(setup).decode_overhead   # torch.compile + static cache: CUDA graphs
    return Device(bw * _facts().decode_bandwidth_efficiency.value, peak * _facts().prefill_compute_efficiency.value, peak, overhead)


def cpu_threads(setup: Setup, hardware: Hardware) -> int:
    return min(setup.cpu_threads or hardware.cpu.physical_cores, hardware.cpu.logical_cores)


def _cpu_device(setup: Setup, hardware: Hardware) -> Device:
    """The training model's CPU peak (fp32, native bf16, or emulated 16-bit) and its achieved fraction."""
    cpu = hardware.cpu
    share = min(1.0, cpu_threads(setup, hardware) / cpu.physical_cores)
    sixteen_bit = setup.weights_dtype != "fp32"  # bf16/fp16 weights, or bnb weights dequantized to 16-bit
    peak = cpu_peak_gflops(cpu, sixteen_bit, setup.cpu_threads)[0] * 1e9
    achieved = peak * fact_value("efficiency", "cpu_peak_fraction")[cpu_path(cpu, sixteen_bit)]
    bw = host_bandwidth_gbps(cpu) * 1e9 * share * _facts().cpu_bandwidth_efficiency.value
    return Device(bw, achieved, peak, 0.0)


def _tp_comm_s(spec: ModelSpec, setup: Setup, hardware: Hardware | None) -> float:
    """Two latency-bound all-reduces per layer per forward (Megatron-style column/row split)."""
    if setup.strategy != "tp" or setup.num_gpus < 2:
        return 0.0
    link = hardware.interconnect if hardware is not None else "pcie"
    table: dict[str, float] = {str(k): v for k, v in _facts().tp_allreduce_latency_s.value.items()}
    return 2 * spec.total_layers * table.get(str(link), table["pcie"])  # no measured figure for a link: PCIe's (the slow side)


def estimate_inference_speed(spec: ModelSpec, setup: Setup, hardware: Hardware, headroom: float | None = None) -> Throughput:
    """Prefill + (new_tokens - 1) decode steps; tokens/s counts every sequence of every replica."""
    spec = built_by(spec, setup.model_code, setup.linearized_experts)   # the layout the running code builds (litgpt: an LM head of its own)
    on_gpu = setup.device == "cuda" and hardware.has_gpu
    dev = _gpu_device(spec, setup, hardware) if on_gpu else _cpu_device(setup, hardware)
    tp = setup.num_gpus if setup.strategy == "tp" and on_gpu else 1
    b, s, new = setup.micro_batch_size, setup.seq_len, max(setup.new_tokens, 1)
    act = activation_bytes_per_element(setup)
    weights = weight_bytes(spec, setup.weights_dtype, stored=setup.checkpoint_format)
    quant = setup.weights_dtype if setup.weights_dtype in ("int8", "nf4") else None
    q_decode = _facts().quant_decode_slowdown.value[quant] if quant else 1.0
    q_prefill = _facts().quant_prefill_slowdown.value[quant] if quant else 1.0
    attn_unit = 2 * spec.num_attention_heads * spec.head_dim * (spec.num_decoder_layers or spec.num_layers)
    comm = _tp_comm_s(spec, setup, hardware)
    offload_bw = _facts().pcie_offload_bandwidth_gbps.value * 1e9

    # prefill: compute-bound matmuls (2 * active params per token) plus causal attention
    prefill_flops = 2 * spec.active_params * b * s + attn_unit * b * s * s
    prefill_compute = prefill_flops / (dev.flops * tp) * q_prefill
    prefill_parts = {"compute": prefill_compute, "memory-bandwidth": weights / tp / dev.bandwidth,
                     "launch-overhead": dev.overhead_s, "communication": comm}
    prefill = max(prefill_compute, prefill_parts["memory-bandwidth"]) + dev.overhead_s + comm

    # decode: every step streams the weights and the cache (taken at its mean length)
    mean_tokens = s + (new - 1) / 2
    kv_mean = kv_cache_bytes(spec, b, int(mean_tokens), act, static=setup.cache_implementation == "static")
    step_flops = 2 * spec.active_params * b + 2 * attn_unit * b * mean_tokens
    # bnb kernels dequantize per call: a quantized step costs a measured multiple of the 16-bit step
    streamed = weight_bytes(spec, "bf16") if quant else weights
    if spec.is_moe and spec.total_params:  # an MoE layer reads only the experts some token of the step was routed to
        streamed = int(streamed * (1 - spec.expert_params / spec.total_params * (1 - routed_expert_fraction(spec, b))))
    mem_time = streamed / tp / dev.bandwidth + kv_mean / tp / dev.bandwidth
    compute_time = step_flops / (dev.flops * tp)
    offload_time = 0.0
    if setup.offload_params and on_gpu:
        from ..memory.inference import estimate_inference

        offloaded = (estimate_inference(spec, setup, hardware) if headroom is None
                     else estimate_inference(spec, setup, hardware, headroom)).cpu_ram
        offload_time = offloaded / offload_bw
    step = (max(mem_time, compute_time) + dev.overhead_s) * q_decode + comm + offload_time
    decode = step * (new - 1)
    total = prefill + offload_time + decode

    # the phase that takes most of the call names the bound and is the one whose MFU is reported
    if decode >= prefill + offload_time:
        parts = {"memory-bandwidth": mem_time, "compute": compute_time, "launch-overhead": dev.overhead_s,
                 "communication": comm, "offload": offload_time}
        phase_flops, phase_time = step_flops, step
    else:
        parts = prefill_parts | {"offload": offload_time}
        phase_flops, phase_time = prefill_flops, prefill + offload_time
    replicas = setup.num_gpus if setup.strategy == "single" and on_gpu else 1
    mfu = phase_flops / (phase_time * tp * dev.peak_flops) if phase_time and dev.peak_flops else 0.0
    forward_only = setup.new_tokens == 0  # an encoder / task head: one forward over the prompt, no decode step
    return Throughput(
        step_time_s=total,
        tokens_per_s=replicas * b * (s if forward_only else new) / total,
        flops_per_step=prefill_flops + step_flops * (new - 1),
        compute_time_s=prefill_compute + compute_time * (new - 1),
        comm_time_s=comm * new,
        offload_time_s=offload_time * new,
        achievable_tflops=dev.flops / 1e12,
        mfu=min(1.0, mfu),
        prefill_time_s=prefill,
        decode_tokens_per_s=None if forward_only else 1.0 / step,
        time_per_output_token_ms=None if forward_only else step * 1000,
        bound=max(parts, key=parts.__getitem__),
    )
