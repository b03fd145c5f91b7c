"""Memory of a serving engine (vLLM, SGLang): weights, the profiled activation peak, CUDA graphs, and the
paged KV cache that fills whatever the budget leaves.

The engines do not size the KV cache from the workload: they measure what is left and fill it.
vLLM 0.33 (vllm/v1/worker/gpu_worker.py ``determine_available_memory``)::

    KV = ceil(total x gpu_memory_utilization) - weights - non-torch memory - activation peak - CUDA graphs

then cuts it into blocks of 16 tokens (every layer's K and V for 16 positions) and logs
``GPU KV cache size: N tokens`` = blocks / ceil(max_model_len / 16) x max_model_len, with the concurrency at
max_model_len beside it. SGLang 0.5.23 (``_profile_available_bytes``) keeps ``mem_fraction_static`` of the
memory free before loading for weights + KV pool, and counts the pool in tokens. Predicting those numbers
before renting the GPU is the point: the engines' own profiler only tells you after start-up.
"""

from __future__ import annotations

import math

from pydantic import Field

from .._base import GiB, MiB, Model
from .._serving_data import EngineFacts, serving_facts
from ..hardware.types import Hardware
from ..model.types import ModelSpec
from ..setup import ServingSetup
from .inference import weight_bytes
from .overhead import cuda_context_bytes

HALF = 2


class EngineMemory(Model):
    """One GPU of one engine replica, as the engine's start-up log would report it."""

    engine: str
    total: int = Field(ge=0, description="device memory, bytes")
    budget: int = Field(ge=0, description="what the engine may use: total x gpu_memory_utilization (vLLM) or mem_fraction_static x free (SGLang)")
    weights: int = Field(ge=0)
    activation_peak: int = Field(ge=0, description="transient peak of the profile run at max_num_batched_tokens")
    non_torch: int = Field(ge=0, description="NCCL, custom all-reduce and attention-backend buffers")
    cuda_graphs: int = Field(ge=0)
    cuda_context: int = Field(ge=0)
    kv_cache_bytes: int = Field(description="bytes left for KV blocks; negative = the weights do not leave room")
    kv_bytes_per_token: int = Field(ge=1, description="every layer's cache of one position on this GPU")
    block_size: int = Field(ge=1)
    num_blocks: int = Field(ge=0)
    kv_cache_tokens: int = Field(ge=0, description="vLLM's 'GPU KV cache size: N tokens' (SGLang: max_total_num_tokens)")
    max_model_len: int = Field(ge=1)
    max_concurrency: float = Field(ge=0, description="sequences of max_model_len tokens the cache holds at once")
    latent_cache: bool = False

    @property
    def fits(self) -> bool:
        """The engines refuse to start unless one max_model_len sequence fits the cache."""
        return self.max_concurrency >= 1.0


def _mla_dims(spec: ModelSpec) -> tuple[int, int] | None:
    """(kv_lora_rank, rope dims) of a multi-head latent attention model, None for ordinary attention."""
    rank = getattr(spec, "kv_lora_rank", None) or (spec.config or {}).get("kv_lora_rank")
    if not rank:
        return None
    rope = getattr(spec, "qk_rope_head_dim", None) or (spec.config or {}).get("qk_rope_head_dim") or 0
    return int(rank), int(rope)


def kv_bytes_per_token(spec: ModelSpec, serving: ServingSetup) -> int:
    """One position of every layer on one rank: 2 x KV heads x head_dim (MLA: one latent of rank + rope dims).

    Tensor parallelism splits the KV heads (a rank keeps at least one: heads are replicated when tp > heads);
    an MLA latent is shared by all heads, so every rank holds all of it. Pipeline stages split the layers.
    """
    dtype = 1 if serving.kv_cache_dtype == "fp8" else HALF
    layers = math.ceil((spec.num_decoder_layers or spec.num_layers) / serving.pipeline_parallel_size)
    mla = _mla_dims(spec)
    if mla is not None:
        return layers * (mla[0] + mla[1]) * dtype
    heads = max(1, spec.num_key_value_heads // serving.tensor_parallel_size)
    return layers * 2 * heads * spec.head_dim * dtype


def format_weight_bytes(spec: ModelSpec, fmt: str) -> int:
    """The whole model's weights in one format: only the blocks' Linears are quantized; embeddings, lm_head and
    norms stay 16-bit. Int4 group formats add one fp16 scale and one packed 4-bit zero point per group."""
    facts = serving_facts().formats[fmt]
    if fmt == "bitsandbytes":
        return weight_bytes(spec, "nf4")
    if facts.bits == 16:
        return spec.total_params * HALF
    per_weight = facts.bits / 8 + ((HALF + 0.5) / facts.group_size if facts.group_size else 0.0)
    return int(spec.linear_params * per_weight + (spec.total_params - spec.linear_params) * HALF)


def rank_weight_bytes(spec: ModelSpec, serving: ServingSetup) -> int:
    """Weights on one GPU: tensor parallel splits Linears, embedding and lm_head; norms are replicated."""
    total = format_weight_bytes(spec, serving.weight_format)
    norms = max(0, spec.total_params - spec.linear_params - spec.embedding_params - spec.lm_head_params) * HALF
    return (total - norms) // (serving.tensor_parallel_size * serving.pipeline_parallel_size) + norms


def activation_peak_bytes(spec: ModelSpec, serving: ServingSetup) -> int:
    """The profile run's transient: ``max_num_batched_tokens`` tokens through one layer, plus the sampler.

    The MLP holds gate/up outputs and their product (3 x tokens x intermediate / tp, 16-bit) beside two
    residual-width buffers; the sampler holds fp32 logits of ``max_num_seqs`` rows. Checked against vLLM's
    profiler log for Llama-3.1-8B (github.com/vllm-project/vllm/issues/10517: 2.07 GiB at 20000 tokens).
    """
    tokens = serving.max_num_batched_tokens
    width = spec.intermediate_size * (spec.num_experts_per_tok if spec.is_moe else 1)
    mlp = tokens * (3 if spec.gated_mlp else 2) * math.ceil(width / serving.tensor_parallel_size) * HALF
    residual = 2 * tokens * spec.hidden_size * HALF
    sampler = serving.max_num_seqs * spec.vocab_size * 4
    return mlp + residual + sampler


def cuda_graph_sizes(serving: ServingSetup, facts: EngineFacts) -> list[int]:
    """Batch sizes vLLM captures: 1, 2, 4, then every 8 below 256, every 16 above, up to 2 x max_num_seqs."""
    if serving.enforce_eager:
        return []
    top = min(2 * serving.max_num_seqs, facts.max_cuda_graph_size, serving.max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))
    return sizes


def non_torch_bytes(serving: ServingSetup, facts: EngineFacts) -> int:
    return facts.non_torch_bytes + (facts.non_torch_bytes_per_tp_rank if serving.tensor_parallel_size > 1 else 0)


def sglang_mem_fraction(total: int, serving: ServingSetup) -> float:
    """SGLang's own default (arg_groups/memory_hook.py): reserve 512 MB + 1.5 MB per chunked-prefill token +
    1 GB per 8 TP ranks + 2 MB per decode graph batch, at least 10 GB on GPUs over 60 GB."""
    gpu_mb = total / MiB
    reserved = 512 + max(serving.max_num_batched_tokens, 2048) * 1.5 + serving.tensor_parallel_size * serving.pipeline_parallel_size / 8 * 1024
    reserved += 0 if serving.enforce_eager else min(serving.max_num_seqs, 256) * 2
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mb - reserved) / gpu_mb, 3)


def estimate_engine_memory(spec: ModelSpec, serving: ServingSetup, hardware: Hardware) -> EngineMemory:
    """The engine's start-up memory account on the smallest GPU of the layout."""
    gpu = hardware.smallest_gpu
    if gpu is None:
        raise ValueError("a serving engine needs a GPU")
    facts = serving_facts().engines[serving.engine]
    # the engines budget from the total CUDA reports, a little under the board total the datasheet row holds
    total, context = gpu.memory_total - int(serving_facts().driver_reserved_bytes.value), cuda_context_bytes(hardware)
    weights = rank_weight_bytes(spec, serving)
    per_token = kv_bytes_per_token(spec, serving)
    graphs = len(cuda_graph_sizes(serving, facts)) * facts.cuda_graph_bytes_per_size
    if serving.engine == "vllm":
        budget = math.ceil(total * serving.gpu_memory_utilization)
        act, other = activation_peak_bytes(spec, serving), non_torch_bytes(serving, facts)
        kv = budget - weights - other - act - graphs
    else:  # SGLang: weights + pool = mem_fraction_static x the memory free before loading
        budget = int((total - context) * serving.gpu_memory_utilization)
        act, other = activation_peak_bytes(spec, serving), non_torch_bytes(serving, facts)
        kv = budget - weights
    block = facts.block_size
    blocks = max(0, kv) // (block * per_token)
    per_request = math.ceil(serving.max_model_len / block)
    concurrency = blocks / per_request
    tokens = int(concurrency * serving.max_model_len) if serving.engine == "vllm" else blocks * block
    return EngineMemory(
        engine=serving.engine, total=total, budget=budget, weights=weights, activation_peak=act, non_torch=other,
        cuda_graphs=graphs, cuda_context=context, kv_cache_bytes=kv, kv_bytes_per_token=per_token, block_size=block,
        num_blocks=blocks, kv_cache_tokens=tokens, max_model_len=serving.max_model_len, max_concurrency=concurrency,
        latent_cache=_mla_dims(spec) is not None,
    )


def describe(mem: EngineMemory) -> str:
    """The account in one line, GiB as the engines print them."""
    return (f"{mem.budget / GiB:.2f} GiB budget - {mem.weights / GiB:.2f} weights - {mem.activation_peak / GiB:.2f} activation peak - "
            f"{mem.non_torch / GiB:.2f} non-torch - {mem.cuda_graphs / GiB:.2f} CUDA graphs = {mem.kv_cache_bytes / GiB:.2f} GiB KV "
            f"({mem.kv_cache_tokens:,} tokens, {mem.max_concurrency:.2f}x max_model_len {mem.max_model_len:,})")
