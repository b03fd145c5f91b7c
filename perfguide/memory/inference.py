"""Memory of serving a model with ``generate``: weights, KV cache, the prefill transient and the logits.

Shapes follow transformers 5.24 exactly where they can be known: the KV cache holds
``prompt + new_tokens - 1`` positions after ``generate`` (the last sampled token is never fed back),
sliding-window layers keep ``window - 1`` positions (dynamic) or ``min(max_len, window)`` (static), and
``generate`` asks for the logits of the last position only (``logits_to_keep=1``).
"""

from __future__ import annotations

import math
from typing import Literal

from .._data import DataModel, Fact, fact_value, validated
from ..hardware.types import Hardware
from ..model.catalog import catalog_file
from ..model.code import built_by
from ..model.layer_widths import kv_elements
from ..model.linears import linear_shapes
from ..model.recurrent import STATE_ONLY
from ..model.types import ModelSpec
from ..setup import Setup
from .bnb_inference import load_transient_bytes, matmul_dequant_bytes
from .compressed_cache import compressed_cache_bytes
from .overhead import capacity_bytes, cuda_context_bytes, to_estimate
from .types import MemoryEstimate

HALF = 2
FP32 = 4
OFFLOAD_HEADROOM = 0.10  # the Constraints default: max_memory leaves this fraction of each GPU free


class InferenceData(DataModel):
    """data/inference.json: the constants of the inference memory and speed models, each with its source."""

    nf4_blocksize: Fact[int]
    nf4_nested_blocksize: Fact[int]
    decode_bandwidth_efficiency: Fact[float]
    prefill_compute_efficiency: Fact[float]
    eager_overhead_s_per_layer: Fact[float]
    static_compile_overhead_factor: Fact[float]
    quant_decode_slowdown: Fact[dict[Literal["int8", "nf4"], float]]
    quant_prefill_slowdown: Fact[dict[Literal["int8", "nf4"], float]]
    tp_allreduce_latency_s: Fact[dict[Literal["nvlink", "pcie", "none"], float]]
    pcie_offload_bandwidth_gbps: Fact[float]
    cpu_bandwidth_efficiency: Fact[float]
    default_gpu_bandwidth_gbps: Fact[float]


def inference_data() -> InferenceData:
    return validated("inference", InferenceData)


def activation_bytes_per_element(setup: Setup) -> int:
    """Activations and KV cache take the dtype of the non-quantized modules: fp32 only for fp32 weights."""
    return FP32 if setup.weights_dtype == "fp32" else HALF


def _linear_weight_bytes(in_f: int, out_f: int, dtype: str, double_quant: bool) -> float:
    """One Linear weight as bitsandbytes stores it (bias stays 16-bit and is counted with the rest)."""
    n = in_f * out_f
    if dtype == "int8":
        return n + FP32 * out_f  # int8 codes + one fp32 scale (SCB) per output row
    if dtype == "nf4":
        block = inference_data().nf4_blocksize.value
        if double_quant:  # uint8 absmax per block + fp32 absmax per nested block
            return n / 2 + n / block + FP32 * n / (block * inference_data().nf4_nested_blocksize.value)
        return n / 2 + FP32 * n / block
    return n * (FP32 if dtype == "fp32" else HALF)


def weight_bytes(spec: ModelSpec, weights_dtype: str, *, double_quant: bool = True, stored: str | None = None) -> int:
    """Weights as loaded: bnb quantizes only the blocks' Linear layers; embeddings, lm_head and norms stay 16-bit.

    ``stored``: the format a pre-quantized checkpoint keeps in memory (Setup.checkpoint_format). A GPTQ / AWQ /
    FP8 / MXFP4 / compressed-tensors checkpoint takes its format's bytes, as the serving engines price it
    (memory/serving.py format_weight_bytes); a bitsandbytes one the bnb layout below (weights_dtype names it).
    """
    if stored is not None and stored not in ("int8", "nf4"):
        from .serving import format_weight_bytes

        return format_weight_bytes(spec, stored)
    if weights_dtype not in ("int8", "nf4"):
        return spec.total_params * (FP32 if weights_dtype == "fp32" else HALF)
    linears = sum(_linear_weight_bytes(i, o, weights_dtype, double_quant) * n for _, i, o, n in linear_shapes(spec))
    rest = spec.total_params - spec.linear_params
    return int(linears + rest * HALF)


#: Formats transformers 5.24 dequantizes to bf16 at load when the device cannot run them: FP8 below compute
#: capability 8.9 or off GPU (quantizer_finegrained_fp8.py validate_environment), MXFP4 below 7.5 or on CPU
#: without use_kernels (quantizer_mxfp4.py). (minimum compute capability, runs on CPU)
_DEQUANTIZED_BELOW: dict[str, tuple[tuple[int, int], bool]] = {"fp8": ((8, 9), False), "fp8_block": ((8, 9), False),
                                                               "mxfp4": ((7, 5), False)}


def loaded_format(stored: str, device: str, compute_capability: tuple[int, int] | None) -> tuple[str | None, str]:
    """What a pre-quantized checkpoint becomes in memory under ``from_pretrained``, and why: its own format, or
    None where transformers dequantizes it to 16-bit on this device (then the weights take 16-bit bytes)."""
    rule = _DEQUANTIZED_BELOW.get(stored)
    if rule is None:
        return stored, f"the checkpoint is saved {stored} (its quantization_config): from_pretrained loads it as stored"
    need, on_cpu = rule
    if device == "cpu" and not on_cpu:
        return None, f"the checkpoint is saved {stored}; transformers dequantizes it at load off GPU (16-bit weights)"
    if device != "cpu" and (compute_capability or (0, 0)) < need:
        return None, (f"the checkpoint is saved {stored}; transformers dequantizes it at load (16-bit weights) on GPUs below compute "
                      f"capability {need[0]}.{need[1]}")
    return stored, f"the checkpoint is saved {stored} (its quantization_config): from_pretrained loads it as stored"


def _layer_windows(spec: ModelSpec) -> list[int | None]:
    """Positions each decoder layer may keep (None = all, 0 = stores nothing), as transformers builds the cache:
    sliding layers their window, Llama-4's chunked layers their chunk (cache_utils.get_layer_types_and_kwargs)."""
    windows = {"sliding_attention": spec.sliding_window, "chunked_attention": spec.attention_chunk_size, "dummy": 0,
               **dict.fromkeys(STATE_ONLY, 0)}
    return [windows.get(kind) for kind in spec.cache_layer_types()]


def recurrent_state_bytes(spec: ModelSpec, batch: int, dtype_bytes: int, share: float = 1.0) -> int:
    """The fixed state a hybrid model's recurrent layers cache per sequence (model/recurrent.py): the conv state in the
    activation dtype, the recurrent state in fp32, whatever the length; ``share`` of it on one tensor-parallel rank."""
    per_layer = spec.conv_state_elements * dtype_bytes + spec.recurrent_state_elements * FP32
    return int(batch * spec.stateful_layers * per_layer * share)


def kv_cache_bytes(spec: ModelSpec, batch: int, tokens: int, dtype_bytes: int, *, static: bool = False,
                   kv_heads: int | None = None, cross_tokens: int = 0) -> int:
    """What every layer's cache holds after ``tokens`` positions went through the (decoder) model.

    Sliding layers keep ``window - 1`` positions in the dynamic cache and ``min(tokens, window)`` in the static
    one (transformers 5.24 DynamicSlidingWindowLayer / StaticSlidingWindowLayer); a hybrid model's linear-attention and
    convolution layers keep their fixed state instead (``recurrent_state_bytes``). Elements per position are
    ``ModelSpec.kv_elements_per_token`` (K and V per KV head, or MLA's compressed latent). ``kv_heads``
    overrides the head count, e.g. the heads one tensor-parallel rank holds. ``cross_tokens``: encoder positions
    each decoder layer of an encoder-decoder caches for cross-attention (EncoderDecoderCache).
    """
    share = 1.0 if kv_heads is None else kv_heads / spec.num_key_value_heads
    return (grown_kv_bytes(spec, batch, tokens, dtype_bytes, static=static, kv_heads=kv_heads, cross_tokens=cross_tokens)
            + recurrent_state_bytes(spec, batch, dtype_bytes, share))


def grown_kv_bytes(spec: ModelSpec, batch: int, tokens: int, dtype_bytes: int, *, static: bool = False,
                   kv_heads: int | None = None, cross_tokens: int = 0) -> int:
    """The part of ``kv_cache_bytes`` that grows with the positions: the attention layers' K/V (DeepSeek-V4's window
    and compressed entries: memory/compressed_cache.py; its one K/V head is on every tensor-parallel rank)."""
    compressed = compressed_cache_bytes(spec, batch, tokens, dtype_bytes)
    if compressed is not None:
        return compressed
    total = 0
    for window, elements in zip(_layer_windows(spec), kv_elements(spec, kv_heads)):
        kept = tokens if window is None else 0 if window == 0 else min(tokens, window if static else window - 1)
        total += elements * dtype_bytes * batch * (kept + cross_tokens)
    return total


def cached_tokens(setup: Setup, spec: ModelSpec | None = None) -> int:
    """Positions in the self-attention cache when ``generate`` returns: every fed token but the last sampled one.

    Decoder-only: the prompt plus the new tokens. Encoder-decoder: the prompt goes to the encoder, the decoder
    starts from one start token, so its cache holds ``new_tokens`` positions. Encoders keep no cache.
    """
    if spec is not None and not spec.generates:
        return 0
    if spec is not None and spec.is_encoder_decoder:
        return max(setup.new_tokens, 1)
    return setup.seq_len + max(setup.new_tokens, 1) - 1


def logits_bytes(spec: ModelSpec, setup: Setup, dtype_bytes: int) -> int:
    """Generation: last-position logits (``logits_to_keep=1``) plus the fp32 copy ``generate`` takes for the
    processors. One forward pass of an encoder or task head: the head's output for every position it scores."""
    if spec.generates:
        return setup.micro_batch_size * spec.vocab_size * (dtype_bytes + FP32)
    positions = 1 if spec.logits_per_sequence else setup.seq_len
    return setup.micro_batch_size * positions * spec.logits_width * dtype_bytes


def prefill_transient_bytes(spec: ModelSpec, setup: Setup, dtype_bytes: int, shards: int = 1) -> int:
    """The largest short-lived buffer set of one layer during prefill: residual + max(attention, MLP).

    Eager attention materialises b*h*s*s scores (and a fp32 softmax) plus the causal mask; SDPA/flash kernels
    tile them away. The gated MLP holds act(gate), up and their product: 3 x b*s*intermediate.
    ``shards`` divides the head and intermediate dimensions (tensor parallelism).
    """
    b, s = setup.micro_batch_size, setup.seq_len
    heads = max(1, spec.num_attention_heads // shards)
    tokens = b * s
    residual = 2 * tokens * spec.hidden_size * dtype_bytes
    q_and_out = 2 * tokens * heads * spec.head_dim * dtype_bytes
    repeated_kv = 2 * tokens * heads * spec.head_dim * dtype_bytes if spec.num_key_value_heads < spec.num_attention_heads else 0
    attention = q_and_out + repeated_kv
    if setup.attn_implementation == "eager":
        attention += b * heads * s * s * (dtype_bytes + FP32) + b * s * s * dtype_bytes
    mlp_width = math.ceil(spec.active_intermediate_size / shards)
    mlp = (3 if spec.gated_mlp else 2) * tokens * mlp_width * dtype_bytes
    return residual + max(attention, mlp)


def _balanced_map(sizes: list[int], parts: int, block: int) -> list[list[int]]:
    """accelerate's device_map="auto" over modules in order (transformers calls get_balanced_memory, then
    infer_auto_device_map). Every GPU but the last is capped at total/parts plus a buffer of 1.25 decoder blocks (the
    largest no-split module; the mean leaf module it is compared with is far smaller in a decoder), the first GPU also
    keeps room for the largest module still to place, and the last takes the rest. Without the buffer, equal blocks that
    do not divide evenly would pile onto the last GPU (Qwen3-235B-A22B on 8 GPUs: 13 blocks on the most loaded, not 17)."""
    per_gpu = sum(sizes) // parts + int(1.25 * block)
    groups: list[list[int]] = [[]]
    used = 0
    for i, size in enumerate(sizes):
        limit = per_gpu - max(sizes[i:]) if len(groups) == 1 else per_gpu
        while len(groups) < parts and used + size > limit:
            groups.append([])
            used, limit = 0, per_gpu
        groups[-1].append(i)
        used += size
    return groups


def _device_map_share(spec: ModelSpec, setup: Setup, weights: int, kv: int) -> tuple[int, int, int]:
    """(weights, kv cache, layers) on the most loaded GPU when layers are split in order across GPUs."""
    layers = spec.num_decoder_layers or spec.num_layers
    embed = spec.embedding_params * (FP32 if setup.weights_dtype == "fp32" else HALF)
    head = spec.lm_head_params * (FP32 if setup.weights_dtype == "fp32" else HALF)
    per_layer = max(0, weights - embed - head) // spec.total_layers
    if setup.model_code == "litgpt":  # litgpt generate/sequentially.py: n_layer / devices blocks each, the rest on the root
        n_layers = math.ceil(layers / setup.num_gpus)
        return embed + head + n_layers * per_layer, kv // layers * n_layers, n_layers
    sizes = [embed] + [per_layer] * layers + [head]
    groups = _balanced_map(sizes, setup.num_gpus, per_layer)
    kv_per_layer = kv // layers
    best = max(groups, key=lambda g: sum(sizes[i] for i in g))
    n_layers = sum(1 for i in best if 0 < i <= layers)
    return sum(sizes[i] for i in best), kv_per_layer * n_layers, n_layers


def _tp_shards_fused_experts(spec: ModelSpec) -> bool:
    """Whether tp_plan="auto" splits routed experts that ``linear_params`` does not count (transformers 5 fuses them into
    3-D tensors): their config's ``base_model_tp_plan`` names ``experts.gate_up_proj`` (Qwen3-MoE), or not (gpt-oss),
    as data/architectures.json ``tp_split_expert_model_types`` records it (no transformers import while planning)."""
    if not spec.fused_expert_params:
        return False
    return spec.model_type in catalog_file().tp_split_expert_model_types.value


def _tp_weights(spec: ModelSpec, setup: Setup, weights: int, tp: int) -> int:
    """Per-rank weights under tp_plan="auto": linears, embedding and lm_head split (and fused experts where the
    model's tp plan splits them); norms and the rest replicated."""
    norms = spec.total_params - spec.linear_params - spec.embedding_params - spec.lm_head_params
    norms -= spec.expert_params if _tp_shards_fused_experts(spec) else 0
    norm_bytes = max(0, norms) * (FP32 if setup.weights_dtype == "fp32" else HALF)
    return (weights - norm_bytes) // tp + norm_bytes


def _reserved_ratio() -> float:
    return fact_value("calibration", "reserved_over_allocated")


def _offload_split(setup: Setup, hardware: Hardware | None, gpu_weights: int, rest: int,
                   headroom: float = OFFLOAD_HEADROOM) -> tuple[int, int]:
    """With offload allowed, the GPU keeps what fits beside the cache and transients (less the caller's headroom,
    the same fraction its fit check keeps free); the rest goes to CPU RAM."""
    if not setup.offload_params or hardware is None or not hardware.has_gpu:
        return gpu_weights, 0
    capacity = capacity_bytes(hardware, setup)
    assert capacity is not None, "a machine with a GPU has a capacity"
    budget = capacity * (1 - headroom) - cuda_context_bytes(hardware)
    on_gpu = max(0, min(gpu_weights, int(budget / _reserved_ratio()) - rest))
    return on_gpu, gpu_weights - on_gpu


def estimate_inference(spec: ModelSpec, setup: Setup, hardware: Hardware | None = None,
                       headroom: float = OFFLOAD_HEADROOM) -> MemoryEstimate:
    """Bytes on the most loaded device for one ``generate`` call with ``micro_batch_size`` sequences."""
    spec = built_by(spec, setup.model_code, setup.linearized_experts)   # the layout the running code builds (litgpt: an LM head of its own)
    act = activation_bytes_per_element(setup)
    static = setup.cache_implementation == "static"
    weights = weight_bytes(spec, setup.weights_dtype, double_quant=setup.nf4_double_quant, stored=setup.checkpoint_format)
    whole = weights
    b, tokens = setup.micro_batch_size, cached_tokens(setup, spec)
    prompt_tokens = min(tokens, 1 if spec.is_encoder_decoder else setup.seq_len)
    cross = setup.seq_len if spec.is_encoder_decoder else 0
    notes: list[str] = [] if spec.generates else ["one forward pass: an encoder / task head keeps no KV cache"]
    shards, kv_heads = 1, spec.num_key_value_heads
    if setup.strategy == "tp" and setup.num_gpus > 1:
        shards = setup.num_gpus
        kv_heads = max(1, spec.num_key_value_heads // shards)
        kv_full = kv_cache_bytes(spec, b, tokens, act, static=static, kv_heads=kv_heads, cross_tokens=cross)
        kv_prompt = kv_cache_bytes(spec, b, prompt_tokens, act, static=static, kv_heads=kv_heads, cross_tokens=cross)
        weights = _tp_weights(spec, setup, weights, shards)
        notes.append(f"tensor parallel over {shards} GPUs: per-rank weights, heads and KV cache")
    else:
        kv_full = kv_cache_bytes(spec, b, tokens, act, static=static, cross_tokens=cross)
        kv_prompt = kv_cache_bytes(spec, b, prompt_tokens, act, static=static, cross_tokens=cross)
        if setup.strategy == "device_map" and setup.num_gpus > 1:
            weights, kv_full_share, n_layers = _device_map_share(spec, setup, weights, kv_full)
            kv_prompt = kv_prompt * n_layers // max(1, spec.num_decoder_layers or spec.num_layers)
            kv_full = kv_full_share
            notes.append(f"layers split across {setup.num_gpus} GPUs; most loaded GPU holds {n_layers} layers")
    if static:
        kv_prompt = kv_full  # preallocated at max length before the prefill
        notes.append(f"static cache preallocated for {tokens} positions")
    transient = prefill_transient_bytes(spec, setup, act, shards)
    per_layer_kv = kv_full // max(1, spec.num_decoder_layers or spec.num_layers)
    if spec.stateful_layers:   # a hybrid: only its attention layers' caches grow
        grown = grown_kv_bytes(spec, b, tokens, act, static=static, kv_heads=kv_heads, cross_tokens=cross)
        per_layer_kv = grown // max(1, spec.kv_layers)
    decode_transient = 0 if static else per_layer_kv  # torch.cat copies one attention layer's cache per step
    # bitsandbytes' 16-bit copy of a weight in a 4-bit matmul over several rows (bnb_inference.py)
    transient += matmul_dequant_bytes(spec, setup, b * prompt_tokens, shards)
    decode_transient += matmul_dequant_bytes(spec, setup, b, shards)
    logits = logits_bytes(spec, setup, act)
    # quantizing at load keeps a 16-bit copy of the weight being quantized beside the others (bnb_inference.py)
    rest = max(kv_prompt + transient, kv_full + decode_transient, load_transient_bytes(spec, setup, shards)) + logits
    weights, offloaded = _offload_split(setup, hardware, weights, rest, headroom)
    if offloaded and setup.strategy == "device_map":  # every GPU is filled to the budget first; CPU RAM takes the rest
        offloaded = max(offloaded, whole - max(1, setup.num_gpus) * weights)
    if offloaded:
        notes.append(f"{offloaded / 1e9:.1f} GB of weights offloaded to CPU RAM (moved to the GPU every forward)")
    peak = weights + rest
    cpu_ram = offloaded
    if setup.device == "cpu":
        cpu_ram = peak
    return to_estimate(
        setup=setup, hardware=hardware, weights=weights, gradients=0, optimizer_states=0,
        activations=max(transient, decode_transient), peak_allocated=peak, logits=logits, kv_cache=kv_full,
        cpu_ram=cpu_ram, notes=tuple(notes),
    )
