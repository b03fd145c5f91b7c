"""Memory terms of a serving engine: weights per format and rank, the profiled activation peak, CUDA graphs,
non-torch buffers and the KV bytes of one position; the account they add up to (EngineMemory).

The engines do not size the KV cache from the workload: they measure what is left and fill it. Each engine's
budget rule (what it subtracts from what) is its own and lives in its module under perfguide/engines/; the
terms it subtracts are the same physics for all of them and live here, below the engines.
"""

from __future__ import annotations

import fnmatch
import math
import re
from typing import NamedTuple

from pydantic import Field

from .._base import GiB, Model
from .._serving_data import EngineFacts, serving_facts
from ..model.layer_widths import kv_elements, uniform
from ..model.quantized import ignored_modules
from ..model.types import Linears, ModelSpec, derived, linear_weight_count
from ..setup import ServingSetup
from .ledger import NF4_DQ_BLOCK

HALF = 2


class EngineMemory(Model):
    """One GPU of one engine replica, as the engine's start-up log would report it."""

    engine: str
    total: int = Field(ge=0, description="device memory, bytes")
    budget: int = Field(ge=0, description="what the engine's rule lets it use (a fraction of the total or of the free memory)")
    weights: int = Field(ge=0)
    activation_peak: int = Field(ge=0, description="transient peak of the profile run at max_num_batched_tokens")
    non_torch: int = Field(ge=0, description="NCCL, custom all-reduce and attention-backend buffers")
    cuda_graphs: int = Field(ge=0)
    cuda_context: int = Field(ge=0)
    kv_cache_bytes: int = Field(description="bytes left for KV blocks; negative = the weights do not leave room")
    kv_bytes_per_token: int = Field(ge=0, description="the K/V-keeping layers' cache of one position on this GPU (a hybrid's "
                                    "attention layers only; 0: a pure recurrent model)")
    block_size: int = Field(ge=1)
    num_blocks: int = Field(ge=0)
    kv_cache_tokens: int = Field(ge=0, description="the token count the engine logs for its KV cache")
    max_model_len: int = Field(ge=1)
    max_concurrency: float = Field(ge=0, description="sequences of max_model_len tokens the cache holds at once")
    latent_cache: bool = False
    state_slots: int | None = Field(default=None, ge=0, description="recurrent-state pages one decode step can hold, one per "
                                    "sequence (a hybrid model's pool blocks under vLLM); None: no recurrent layers")
    state_slots_needed: int = Field(default=0, ge=0, description="max_num_seqs where the engine checks it against those slots "
                                    "before capturing CUDA graphs; 0: no check (eager)")

    @property
    def fits(self) -> bool:
        """The engines refuse to start unless one max_model_len sequence fits the cache, and vLLM unless every decode
        sequence max_num_seqs allows has a recurrent-state page ("max_num_seqs (N) exceeds available Mamba cache blocks")."""
        return self.max_concurrency >= 1.0 and (self.state_slots is None or self.state_slots >= self.state_slots_needed)


def mla_dims(spec: ModelSpec) -> tuple[int, int] | None:
    """(kv_lora_rank, rope dims) of a multi-head latent attention model, None for ordinary attention."""
    rank = getattr(spec, "kv_lora_rank", None) or (spec.config or {}).get("kv_lora_rank")
    if not rank:
        return None
    rope = getattr(spec, "qk_rope_head_dim", None) or (spec.config or {}).get("qk_rope_head_dim") or 0
    return int(rank), int(rope)


#: DeepSeek Sparse Attention's caches quantize in blocks of this many values, each with one fp32 scale: the indexer key
#: always (vLLM DeepseekV32IndexerCache, head size index_head_dim + index_head_dim // 128 * 4, uint8; SGLang
#: NSATokenToKVPool's index_k_with_scale_buffer), and the fp8 latent (vLLM's fp8_ds_mla, SGLang's flashmla_kv layout)
DSA_QUANT_BLOCK, DSA_SCALE_BYTES = 128, 4


def indexer_bytes_per_layer(spec: ModelSpec) -> int:
    """One position's indexer key in one layer: fp8 values and their scales, whatever the KV cache dtype (132 B for
    DeepSeek-V3.2's 128 dims); 0 without an indexer."""
    found = spec.sparse_index
    return found.head_dim + math.ceil(found.head_dim / DSA_QUANT_BLOCK) * DSA_SCALE_BYTES if found else 0


def _mla_bytes_per_layer(spec: ModelSpec, rank: int, rope: int, fp8: bool) -> int:
    """One position's latent in one layer. A sparse-attention model's fp8 cache keeps the latent in fp8 with a scale
    per 128 and the rope key in 16 bits (vLLM fp8_ds_mla, FlashMLA's sparse kernel: 656 B for 512 + 64, the size
    SGLang's 8 x B200 log of DeepSeek-V3.2-Exp implies, sgl-project/sglang#11309); any other MLA cache is the latent and
    rope key in the cache dtype."""
    if fp8 and spec.sparse_index:
        return rank + math.ceil(rank / DSA_QUANT_BLOCK) * DSA_SCALE_BYTES + rope * HALF
    return (rank + rope) * (1 if fp8 else HALF)


def kv_bytes_per_token(spec: ModelSpec, serving: ServingSetup) -> int:
    """One position of every layer on one rank: 2 x KV heads x head_dim (MLA: one latent of rank + rope dims, and a
    sparse-attention model's indexer key beside it).

    Tensor parallelism splits the KV heads (a rank keeps at least one: heads are replicated when tp > heads);
    an MLA latent is shared by all heads, so every rank holds all of it, and so is the one-head indexer key. Pipeline
    stages split the layers.
    """
    dtype = 1 if serving.kv_cache_dtype == "fp8" else HALF
    layers = math.ceil((spec.num_decoder_layers or spec.num_layers) / serving.pipeline_parallel_size)
    mla = mla_dims(spec)
    if mla is not None:
        return layers * (_mla_bytes_per_layer(spec, *mla, fp8=dtype == 1) + indexer_bytes_per_layer(spec))
    heads = max(1, spec.num_key_value_heads // serving.tensor_parallel_size)
    if uniform(spec):
        return layers * 2 * heads * spec.head_dim * dtype
    # Gemma's layers at their own widths (model/layer_widths.py), this stage's share of them
    per_layer = kv_elements(spec, heads)   # each layer that share of its own heads, at least one
    return math.ceil(sum(per_layer) * dtype * layers / len(per_layer))


def has_state_pages(spec: ModelSpec) -> bool:
    """Whether the model has recurrent layers whose state model/recurrent.py sizes (a serving engine keeps one page of it
    per sequence beside the attention layers' K/V)."""
    return bool(spec.stateful_layers and spec.conv_state_kernel)


def state_page_bytes(spec: ModelSpec, serving: ServingSetup) -> int:
    """One recurrent layer's state for one sequence on one rank, as vLLM's MambaSpec pages it (vllm/v1/kv_cache_interface.py
    page_size_bytes; model_executor/layers/mamba/mamba_utils.py state shapes): the conv state keeps ``kernel - 1``
    columns of its channels in the model dtype, the recurrent state is split over tensor-parallel ranks and kept in the
    dtype the config names (Qwen3.5's ``mamba_ssm_dtype``, read by its VerifyAndUpdateConfig where
    ``--mamba-ssm-cache-dtype`` is "auto"), else the model dtype."""
    tp, kernel = serving.tensor_parallel_size, spec.conv_state_kernel
    conv = math.ceil(spec.conv_state_elements // kernel / tp) * (kernel - 1) * HALF
    ssm = 4 if spec.recurrent_state_dtype == "float32" else HALF
    return conv + math.ceil(spec.recurrent_state_elements / tp) * ssm


def attention_layers(spec: ModelSpec) -> int:
    """Layers whose cache and attention grow with the context: a hybrid's attention layers (its recurrent layers keep a
    state page instead, ``state_page_bytes``); every layer of any other model."""
    return spec.kv_layers if has_state_pages(spec) else (spec.num_decoder_layers or spec.num_layers)


def attention_kv_bytes_per_token(spec: ModelSpec, serving: ServingSetup) -> int:
    """``kv_bytes_per_token`` over the ``attention_layers``."""
    return kv_bytes_per_token(spec, serving) * attention_layers(spec) // (spec.num_decoder_layers or spec.num_layers)


def attended_positions(spec: ModelSpec, context: int) -> int:
    """Cached positions one decode step's attention reads: every one, except under sparse attention, which reads the
    ``index_topk`` its indexer picks (DeepSeek-V3.2: 2,048) after the indexer has scored them all."""
    found = spec.sparse_index
    return min(context, found.topk) if found else context


def attention_read_bytes(spec: ModelSpec, serving: ServingSetup, context: int) -> int:
    """Cache bytes one decode step reads per sequence on one rank: the attended positions' K/V (or latents), and under
    sparse attention every position's indexer key, which the indexer scores before it picks."""
    per_token = attention_kv_bytes_per_token(spec, serving)
    if not spec.sparse_index:
        return context * per_token
    layers = math.ceil(attention_layers(spec) / serving.pipeline_parallel_size)
    index = layers * indexer_bytes_per_layer(spec)
    return attended_positions(spec, context) * (per_token - index) + context * index


def state_traffic_bytes(spec: ModelSpec, serving: ServingSetup) -> int:
    """Bytes one decode step moves per sequence on one rank for its recurrent layers: each reads its state page and
    writes it back (the state is updated in place, the K/V only appended to)."""
    if not has_state_pages(spec):
        return 0
    return 2 * math.ceil(spec.stateful_layers / serving.pipeline_parallel_size) * state_page_bytes(spec, serving)


def routed_expert_params(spec: ModelSpec) -> int:
    """Routed-expert weights over the whole model (0 for a dense model)."""
    if not spec.is_moe:
        return 0
    listed = {k: v for k, v in spec.block_linears.items() if k.startswith("experts.")}
    return spec.expert_params or linear_weight_count(listed, spec.num_experts) * spec.total_layers


def served_linear_params(spec: ModelSpec) -> int:
    """Weights a serving format quantizes: every block Linear and every routed expert. Fused expert tensors
    (Qwen3-MoE, gpt-oss, DeepSeek-V3, Llama-4 in transformers 5) are parameters, not nn.Linear, so the spec's
    Linear count leaves them out (bitsandbytes skips them); the engines' fused-MoE kernels quantize them too."""
    listed = any(k.startswith("experts.") for k in spec.block_linears)
    return spec.linear_params + (0 if listed else routed_expert_params(spec))


class WeightBytes(NamedTuple):
    """A model's weights in one format, split the way the layouts split them."""

    experts: int      # routed experts: split by tensor parallel, or over every rank with expert parallelism
    dense: int        # the rest but the norms: attention, shared experts, embeddings, lm_head (split by tensor parallel)
    norms: int        # replicated on every rank

    @property
    def total(self) -> int:
        return self.experts + self.dense + self.norms


def bytes_per_weight(fmt: str) -> float:
    """A quantized weight's bytes: its bits plus, per group, a 16-bit scale and a 4-bit zero point (int4 group
    formats; the microscaling formats' 8-bit scale is within that). bitsandbytes nf4 keeps one absmax per group
    instead, double-quantized as SGLang's in-flight loader calls ``quantize_4bit(compress_statistics=True)``
    (sglang srt/model_loader/loader.py, 0.5.23): a uint8 per group plus an fp32 per NF4_DQ_BLOCK groups."""
    facts = serving_facts().formats[fmt]
    if fmt == "nf4":
        return facts.bits / 8 + (1 + 4 / NF4_DQ_BLOCK) / facts.group_size
    return facts.bits / 8 + ((HALF + 0.5) / facts.group_size if facts.group_size else 0.0)


def _skipped(name: str, entry: str) -> bool:
    """Whether ``entry`` of an ignore list names module ``name``: a ``re:`` pattern (compressed-tensors), a glob,
    or a run of whole dotted components (vLLM's is_layer_skipped matches by name, AWQ by substring)."""
    if entry.startswith("re:"):
        return re.fullmatch(entry[3:], name) is not None
    if "*" in entry:
        return fnmatch.fnmatchcase(name, entry) or fnmatch.fnmatchcase(name, entry + ".*")
    return f".{entry}." in f".{name}."


def unquantized_linear_params(spec: ModelSpec) -> int:
    """Block Linear weights the checkpoint's ignore list keeps in 16-bit (e.g. Llama-3.1-405B-FP8: every
    attention projection and the MLPs of the first and last layers, arXiv 2407.21783 sec. 6.2). Routed experts
    are counted by their listed shapes only; an ignore list naming whole expert tensors is not read."""
    entries = ignored_modules(spec.config)
    if not entries:
        return 0

    def count() -> int:
        return sum(i * o for layer, linears in enumerate(spec.layer_linears()) for name, (i, o) in linears.items()
                   if not name.startswith("experts.") and any(_skipped(f"model.layers.{layer}.{name}", e) for e in entries))

    return derived(spec, "unquantized_linear_params", count)


def format_weight_parts(spec: ModelSpec, fmt: str) -> WeightBytes:
    """The model's weights in ``fmt``: block Linears and routed experts quantized (MXFP4, as gpt-oss ships it,
    only the experts), less the Linears the checkpoint's own ignore list keeps 16-bit; embeddings, lm_head and
    norms stay 16-bit."""
    experts = routed_expert_params(spec)
    norms = max(0, spec.total_params - spec.linear_params - (0 if any(k.startswith("experts.") for k in spec.block_linears) else experts)
                - spec.embedding_params - spec.lm_head_params)
    if serving_facts().formats[fmt].bits == 16:
        return WeightBytes(experts * HALF, (spec.total_params - experts - norms) * HALF, norms * HALF)
    per = bytes_per_weight(fmt)
    quantized = experts if fmt == "mxfp4" else served_linear_params(spec) - unquantized_linear_params(spec)
    return WeightBytes(int(experts * per), int((quantized - experts) * per + (spec.total_params - quantized - norms) * HALF), norms * HALF)


def format_weight_bytes(spec: ModelSpec, fmt: str) -> int:
    """The whole model's weights in one format."""
    return format_weight_parts(spec, fmt).total


def expert_ranks(serving: ServingSetup) -> int:
    """Ranks the routed experts are divided over: the tensor-parallel group, or every GPU of the deployment
    with expert parallelism (vLLM --enable-expert-parallel: EP size = TP x DP; attention stays per replica)."""
    ep = serving.data_parallel_size if serving.enable_expert_parallel else 1
    return serving.tensor_parallel_size * serving.pipeline_parallel_size * ep


def rank_weight_bytes(spec: ModelSpec, serving: ServingSetup) -> int:
    """Weights on one GPU: tensor (and pipeline) parallel split the Linears, embedding and lm_head; experts
    go over ``expert_ranks``; norms are replicated."""
    parts = format_weight_parts(spec, serving.weight_format)
    split = serving.tensor_parallel_size * serving.pipeline_parallel_size
    return parts.dense // split + parts.experts // expert_ranks(serving) + parts.norms


def rope_cache_bytes(spec: ModelSpec, element_bytes: int) -> int:
    """The rotary embedding's cos/sin table, a buffer built at model init and counted with the weights: one row of
    ``rotary_dim`` values per position up to ``max_position_embeddings`` (vLLM's RotaryEmbedding keeps it in the
    model dtype; SGLang keeps it fp32 on CUDA 'for numerical stability', sglang/srt/layers/rotary_embedding.py).
    Shared by every layer (get_rope caches one instance). MLA rotates only its rope dims."""
    mla = mla_dims(spec)
    rotary = mla[1] if mla is not None else int(spec.head_dim * float((spec.config or {}).get("partial_rotary_factor") or 1.0))
    return (spec.max_position_embeddings or 0) * rotary * element_bytes


#: PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): requests up to kSmallSize share 2 MiB
#: segments, requests under kMinLargeAlloc are carved from kLargeBuffer segments, larger ones get a segment of their
#: own rounded up to kRoundLarge
_SMALL, _MIN_LARGE, _LARGE_BUFFER, _ROUND_LARGE = 1 << 20, 10 << 20, 20 << 20, 2 << 20


def rank_weight_tensors(spec: ModelSpec, serving: ServingSetup) -> list[int]:
    """Byte sizes of one rank's weight tensors in the order the engines allocate them: the vocab-split embedding, then
    per layer q/k/v fused (QKVParallelLinear: KV heads replicated when TP exceeds them), the other block Linears with
    gate/up fused (MergedColumnParallelLinear), each split by TP, and the routed experts as FusedMoE's two tensors
    (w13: gate and up, w2: down) over ``expert_ranks``; the lm_head last. Quantized tensors at their format's bits
    (scales are separate small tensors)."""
    bits = serving_facts().formats[serving.weight_format].bits
    tp = serving.tensor_parallel_size
    layers = math.ceil((spec.num_decoder_layers or spec.num_layers) / serving.pipeline_parallel_size)
    kv_split = max(1, spec.num_key_value_heads // tp) / max(1, spec.num_key_value_heads)

    def fused(linears: Linears) -> list[int]:
        groups: dict[str, int] = {}
        for name, (i, o) in linears.items():
            if name.startswith("experts."):
                continue
            leaf = name.rsplit(".", 1)[-1]
            key = "qkv" if leaf in ("q_proj", "k_proj", "v_proj") else "gate_up" if leaf in ("gate_proj", "up_proj") else name
            share = kv_split if leaf in ("k_proj", "v_proj") else 1 / tp
            groups[key] = groups.get(key, 0) + int(i * o * share * bits / 8)
        return list(groups.values())

    moe_layers = spec.num_moe_layers if spec.num_moe_layers is not None else (spec.num_decoder_layers or spec.num_layers)
    expert = format_weight_parts(spec, serving.weight_format).experts // max(1, moe_layers) // expert_ranks(serving)
    gated = 2 / 3 if spec.gated_mlp else 1 / 2
    experts = [int(expert * gated), expert - int(expert * gated)] if expert else []
    blocks = [size for linears in spec.layer_linears()[:layers] for size in [*fused(linears), *experts]]
    vocab = spec.vocab_size * spec.hidden_size * HALF // tp
    return [vocab, *blocks, *([vocab] if spec.lm_head_params else [])]


def allocator_rounding_bytes(sizes: list[int]) -> int:
    """What the caching allocator reserves beyond ``sizes`` when they are allocated in turn and kept: a tensor over
    kMinLargeAlloc gets its own segment rounded up to 2 MiB (the tail stays reserved); mid-size tensors pack into
    20 MiB segments, a tensor that does not fit the current one opening the next (the remainder stays reserved).
    Small tensors share 2 MiB segments (negligible). An engine that measures its load by free device memory
    (SGLang's 'mem usage') counts this; one that counts allocated bytes (vLLM) does not."""
    waste, left = 0, 0
    for size in sizes:
        if size <= _SMALL:
            continue
        if size < _MIN_LARGE:
            if size > left:
                waste, left = waste + left, _LARGE_BUFFER
            left -= size
            continue
        waste += -size % _ROUND_LARGE
    return waste + left


def activation_peak_bytes(spec: ModelSpec, serving: ServingSetup, facts: EngineFacts | None = None) -> int:
    """The profile run's transient peak: the larger of the forward pass and the sampler run that follows it.

    Forward: ``max_num_batched_tokens`` tokens through one layer; the MLP holds gate/up outputs and their product
    (3 x tokens x intermediate / tp, 16-bit) beside two residual-width buffers (checked against vLLM's profiler
    log for Llama-3.1-8B, github.com/vllm-project/vllm/issues/10517: 2.07 GiB at 20000 tokens).
    Sampler: the profile samples ``max_num_seqs`` rows with top-k and top-p set (vLLM V1
    gpu_model_runner._dummy_sampler_run; V0 profile_run likewise), so the native path sorts the vocabulary:
    ``sampler_bytes_per_logit`` per row x vocab (the engine's facts), with the batch's hidden states kept
    alive. The forward's transients are freed before the sampler runs, so the two do not add.
    """
    tokens = serving.max_num_batched_tokens
    width = spec.intermediate_size * (spec.num_experts_per_tok if spec.is_moe else 1)
    mlp = tokens * (3 if spec.gated_mlp else 2) * math.ceil(width / serving.tensor_parallel_size) * HALF
    residual = 2 * tokens * spec.hidden_size * HALF
    per_logit = facts.sampler_bytes_per_logit if facts is not None else 0.0
    sampler = int(serving.max_num_seqs * spec.vocab_size * per_logit) + tokens * spec.hidden_size * HALF
    return max(mlp + residual, sampler)


def cuda_graph_sizes(serving: ServingSetup, facts: EngineFacts) -> list[int]:
    """Batch sizes captured as CUDA graphs: 1, 2, 4, then every 8 below 256, every 16 above, up to
    2 x max_num_seqs and the engine's own cap (vllm/config/vllm.py's schedule; engines with a lower cap stop sooner)."""
    if serving.enforce_eager:
        return []
    top = min(2 * serving.max_num_seqs, facts.max_cuda_graph_size, serving.max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))
    return sizes


def non_torch_bytes(serving: ServingSetup, facts: EngineFacts) -> int:
    return facts.non_torch_bytes + (facts.non_torch_bytes_per_tp_rank if serving.tensor_parallel_size > 1 else 0)


def start_limit(mem: EngineMemory) -> str | None:
    """vLLM's own refusal when a hybrid's recurrent-state pages are fewer than the sequences it must capture graphs for."""
    if mem.state_slots is None or mem.state_slots >= mem.state_slots_needed:
        return None
    return (f"{mem.engine} refuses to start: max_num_seqs ({mem.state_slots_needed:,}) exceeds available Mamba cache blocks "
            f"({mem.state_slots:,}): each block of this hybrid model's pool is also one decode sequence's recurrent-state page; "
            f"lower max_num_seqs to at most {mem.state_slots:,}, or run eager")


def describe(mem: EngineMemory) -> str:
    """The account in one line, GiB as the engines print them."""
    line = (f"{mem.budget / GiB:.2f} GiB budget - {mem.weights / GiB:.2f} weights - {mem.activation_peak / GiB:.2f} activation peak - "
            f"{mem.non_torch / GiB:.2f} non-torch - {mem.cuda_graphs / GiB:.2f} CUDA graphs = {mem.kv_cache_bytes / GiB:.2f} GiB KV "
            f"({mem.kv_cache_tokens:,} tokens, {mem.max_concurrency:.2f}x max_model_len {mem.max_model_len:,})")
    if mem.state_slots is None:
        return line
    return line + f"; {mem.num_blocks:,} blocks of {mem.block_size:,} tokens, each also one sequence's recurrent-state page"
