"""Speed of a serving engine under continuous batching (the engine's own traits come in as arguments): bandwidth-bound decode until the batch makes it
compute-bound, chunked prefill, tensor-parallel all-reduces, replicas, MoE routing and quantized kernels.

One decode step of ``batch`` running sequences reads the weights once (an MoE layer only the experts some
token was routed to), every sequence's KV cache, and does 2 x active params FLOPs per token; it takes the
longer of the two at the achieved bandwidth / FLOP rate (roofline), plus two all-reduces per layer under
tensor parallelism (latency + ring bytes over the link) and the scheduler's per-step cost. Quantized formats
read fewer bytes at their kernel's efficiency (Marlin int4, FP8) and compute in FP8 only where the GPU has it. The
routed experts are read by the fused-MoE grouped GEMMs at a lower rate than a dense GEMM's (moe_expert_read_efficiency);
where the engine dequantizes a format in software (MXFP4 on Ampere) each MoE layer also pays a fixed latency.
Prefill is compute bound; with chunked prefill it shares steps with decode, which costs its FLOPs once.
"""

from __future__ import annotations

import math

from pydantic import Field

from .._base import Model
from .._serving_data import FormatFacts, serving_facts
from ..hardware.types import GPU, Hardware
from ..memory.serving import (
    attended_positions,
    attention_layers,
    attention_read_bytes,
    expert_ranks,
    format_weight_parts,
    state_traffic_bytes,
)
from ..model.types import ModelSpec
from ..setup import ServingSetup


class ServingSpeed(Model):
    """One engine replica layout (all its replicas together) on a fixed workload."""

    batch: int = Field(ge=1, description="sequences decoding together in one replica")
    time_per_output_token_ms: float = Field(gt=0, description="one decode step at that batch")
    ttft_ms: float = Field(gt=0, description="prefill of one prompt, alone")
    output_tokens_per_s: float = Field(gt=0, description="all replicas, steady state")
    bound: str
    weight_bytes_read: int = Field(ge=0, description="per rank per decode step")
    comm_ms: float = Field(ge=0, description="all-reduce time per decode step")


def _compute_rate(gpu: GPU, fmt: FormatFacts) -> float:
    """Achieved FLOP/s: FP8 tensor cores only where the GPU has them, else the 16-bit rate (weight-only kernels)."""
    eff = serving_facts().compute_efficiency.value
    if fmt.compute == "fp8" and gpu.supports_fp8 and gpu.fp8_tflops:
        return gpu.fp8_tflops * 1e12 * eff
    return (gpu.half_tflops("bf16" if gpu.supports_bf16 else "fp16") or gpu.fp32_tflops or 15.0) * 1e12 * eff


def routed_expert_fraction(spec: ModelSpec, batch: int) -> float:
    """Expected share of an MoE layer's experts a decode step touches: each of ``batch`` tokens picks k of E,
    so an expert stays cold with probability (1 - k/E)^batch. Batch 1 reads k/E of them; large batches all."""
    if not spec.is_moe:
        return 1.0
    return 1.0 - (1.0 - spec.num_experts_per_tok / spec.num_experts) ** batch


def weight_reads(spec: ModelSpec, serving: ServingSetup, batch: int) -> tuple[int, int]:
    """(dense, routed-expert) bytes of weights one rank streams per decode step: its share of the dense weights, and of
    the experts only those some token of the step was routed to (with expert parallelism the tokens of every replica
    reach the rank's experts)."""
    parts = format_weight_parts(spec, serving.weight_format)
    split = serving.tensor_parallel_size * serving.pipeline_parallel_size
    tokens = batch * (serving.data_parallel_size if serving.enable_expert_parallel else 1)
    experts = parts.experts * routed_expert_fraction(spec, tokens) / expert_ranks(serving)
    return parts.dense // split + parts.norms, int(experts)


def weight_bytes_read(spec: ModelSpec, serving: ServingSetup, batch: int) -> int:
    """Every weight byte one rank streams per decode step (weight_reads, summed)."""
    return sum(weight_reads(spec, serving, batch))


def dequantized_in_software(fmt: str, gpu: GPU | None) -> bool:
    """Whether the engines run ``fmt`` on ``gpu`` by dequantizing it in their kernels: an NVIDIA GPU below the format's
    native_min_cc (MXFP4 on Ampere through Marlin), or another vendor's (the native kernels, e.g. vLLM's Triton /
    FlashInfer MXFP4 MoE, are NVIDIA's; CDNA3 GPUs such as the MI300X have no FP4 datapath). No GPU: the slow path."""
    native = serving_facts().formats[fmt].native_min_cc
    if native is None:
        return False
    return gpu is None or gpu.vendor != "nvidia" or tuple(gpu.compute_capability) < native


def moe_latency_s(spec: ModelSpec, serving: ServingSetup, gpu: GPU | None = None) -> float:
    """The fused-MoE kernels' fixed cost per decode step where the experts are dequantized in software: routing, token
    sorting and two grouped GEMMs per MoE layer (on this rank's pipeline stage) that stay latency bound whatever the
    bytes they read. Native paths pay their cost as a lower read rate of the experts instead (_stage_s)."""
    if not spec.is_moe or not dequantized_in_software(serving.weight_format, gpu):
        return 0.0
    layers = spec.num_moe_layers if spec.num_moe_layers is not None else (spec.num_decoder_layers or spec.num_layers)
    return math.ceil(layers / serving.pipeline_parallel_size) * serving_facts().moe_layer_decode_latency_s.value


def allreduce_s(hardware: Hardware, tp: int, message_bytes: float) -> float:
    """One ring all-reduce over ``tp`` ranks: a latency term plus 2(t-1)/t of the message over the bus."""
    if tp < 2:
        return 0.0
    link = serving_facts().tp_allreduce.value.get(hardware.interconnect) or serving_facts().tp_allreduce.value["pcie"]
    return link.latency_s + 2 * (tp - 1) / tp * message_bytes / (link.bus_gbps * 1e9)


def _stage_s(spec: ModelSpec, serving: ServingSetup, hardware: Hardware, batch: int, context: int) -> tuple[float, str, int, float]:
    """(seconds, bound, weight bytes read, comm seconds) of one pipeline stage (the whole model without PP) on a
    micro-batch of ``batch`` sequences: its ranks' weight and KV reads or its FLOPs, its all-reduces, its MoE kernels."""
    gpu = hardware.smallest_gpu
    assert gpu is not None
    facts = serving_facts()
    fmt = facts.formats[serving.weight_format]
    tp, pp = serving.tensor_parallel_size, serving.pipeline_parallel_size
    bandwidth = (gpu.memory_bandwidth_gbps or 900.0) * 1e9 * facts.decode_bandwidth_efficiency.value
    dense, routed = weight_reads(spec, serving, batch)
    weights = dense + routed
    kv = batch * (attention_read_bytes(spec, serving, context) + state_traffic_bytes(spec, serving))
    moe_rate = bandwidth * fmt.decode_efficiency * facts.moe_expert_read_efficiency.value
    memory_s = dense / (bandwidth * fmt.decode_efficiency) + routed / moe_rate + kv / bandwidth
    attn = 4 * attention_layers(spec) * spec.num_attention_heads * spec.head_dim * attended_positions(spec, context)
    index = spec.sparse_index
    if index is not None:   # the indexer scores every cached position: its heads' dot products with each key
        attn += 2 * attention_layers(spec) * index.n_heads * index.head_dim * context
    compute_s = batch * (2 * spec.active_params + attn) / (tp * pp) / _compute_rate(gpu, fmt)
    layers = math.ceil(spec.total_layers / pp)
    comm_s = 2 * layers * allreduce_s(hardware, tp, batch * spec.hidden_size * 2)
    fixed = (layers * 1.5e-4 if serving.enforce_eager else 0.0) + moe_latency_s(spec, serving, gpu)
    bound = "memory-bandwidth" if memory_s >= compute_s else "compute"
    if comm_s > max(memory_s, compute_s):
        bound = "communication"
    return max(memory_s, compute_s) + comm_s + fixed, bound, weights, comm_s


def pipeline_hop_s(hardware: Hardware, serving: ServingSetup, message_bytes: float) -> float:
    """One stage handing its activations to the next: over the GPUs' own link within a node, over the network when
    the stages span nodes (TP x PP more GPUs than a node has)."""
    table = serving_facts().tp_allreduce.value
    link = table.get(hardware.interconnect) or table["pcie"]
    if serving.tensor_parallel_size * serving.pipeline_parallel_size > max(1, hardware.gpu_count):
        net = hardware.inter_node_bandwidth_gbps or table["pcie"].bus_gbps
        return table["pcie"].latency_s + message_bytes / (net * 1e9)
    return link.latency_s + message_bytes / (link.bus_gbps * 1e9)


def decode_step_s(spec: ModelSpec, serving: ServingSetup, hardware: Hardware, batch: int, context: int,
                  step_overhead_s: float) -> tuple[float, str, int, float]:
    """(seconds, bound, weight bytes read per rank, comm seconds) between two tokens of one sequence, ``batch``
    sequences decoding at ``context``; ``step_overhead_s`` is the engine's own host work per step.

    Without pipeline parallelism that is one step. With PP stages the batch splits into up to PP micro-batches that
    follow each other through the stages: a token passes every stage in turn (PP x a stage's time on its micro-batch,
    plus PP - 1 hand-offs), while the other micro-batches fill the stages it is not in. Fewer micro-batches than stages
    (batch < PP) leave (PP - micro-batches) / PP of the stages idle: the pipeline bubble, which is why one sequence
    decodes no faster on PP stages than on one of them holding the whole model."""
    pp = serving.pipeline_parallel_size
    micro = min(pp, batch)
    stage, bound, weights, comm = _stage_s(spec, serving, hardware, math.ceil(batch / micro), context)
    hops = (pp - 1) * pipeline_hop_s(hardware, serving, math.ceil(batch / micro) * spec.hidden_size * 2) if pp > 1 else 0.0
    return pp * stage + hops + step_overhead_s, bound, weights, pp * comm


def prefill_s(spec: ModelSpec, serving: ServingSetup, hardware: Hardware, prompt: int) -> float:
    """One prompt's prefill: compute bound (2 x active params per token + causal attention), chunked into
    ``max_num_batched_tokens`` pieces, each with its all-reduces of chunk x hidden activations."""
    gpu = hardware.smallest_gpu
    assert gpu is not None
    fmt = serving_facts().formats[serving.weight_format]
    tp = serving.tensor_parallel_size
    flops = 2 * spec.active_params * prompt + 2 * attention_layers(spec) * spec.num_attention_heads * spec.head_dim * prompt * prompt
    chunks = math.ceil(prompt / serving.max_num_batched_tokens)
    chunk = min(prompt, serving.max_num_batched_tokens)
    comm = chunks * 2 * spec.total_layers * allreduce_s(hardware, tp, chunk * spec.hidden_size * 2)
    return flops / tp / _compute_rate(gpu, fmt) + comm


def estimate_serving_speed(spec: ModelSpec, serving: ServingSetup, hardware: Hardware, prompt: int, output: int, batch: int,
                           step_overhead_s: float) -> ServingSpeed:
    """Steady state of ``batch`` concurrent requests per replica, each ``prompt`` in and ``output`` out.

    Serving ``batch`` requests takes ``output`` decode steps (at the mean context) plus every prompt's
    prefill FLOPs (chunked prefill folds them into the same steps, so they add their compute once).
    """
    mean_context = prompt + max(output - 1, 0) // 2
    step, bound, read, comm = decode_step_s(spec, serving, hardware, batch, mean_context, step_overhead_s)
    first = prefill_s(spec, serving, hardware, prompt)
    cycle = output * step + batch * first
    replicas = serving.data_parallel_size
    return ServingSpeed(batch=batch, time_per_output_token_ms=step * 1000, ttft_ms=first * 1000,
                        output_tokens_per_s=replicas * batch * output / cycle, bound=bound,
                        weight_bytes_read=read, comm_ms=comm * 1000)
