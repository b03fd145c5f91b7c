"""The speed of a sequence-parallel step (techniques/sequence_parallel.py; ``Setup.sequence_ranks``): one rank's
slice priced as a step of its own (training.py runs it), widened here by what the ranks do together.

- Attention: a rank executes ``1 / sp`` of the whole sequence's attention FLOPs (Ulysses: every position for
  ``heads / sp`` heads; ring attention: its queries against every k / v slice), ``sp`` times what its slice alone
  would (a sliding window caps both); the difference runs at the attention kernel's own rate.
- Ulysses' all-to-alls: q, k, v and the attention output, forward, in backward (their gradients) and again in a
  checkpointed recompute; each rank sends ``(sp - 1) / sp`` of its slice's tensors. Key / value heads fewer than the
  ranks are repeated up to ``sp`` first (Ulysses splits heads, so every rank needs at least one). The exchange sits
  between the projections and the kernel that needs its result, so nothing hides it. Ring attention sends each k / v
  slice ``sp - 1`` times instead, overlapped with the blocks it computes; it is priced with Ulysses' bytes, the
  larger exposed cost of the two.
"""

from __future__ import annotations

from .. import techniques
from ..hardware.types import GPU, Hardware
from ..memory.fused_head import compute_bytes
from ..model.types import ModelSpec
from ..setup import Setup
from . import rates, terms
from .rates import attention_flops_fwd, constant, gpu_peak_tflops, pcie_gbps
from .types import Throughput


def attention_factor(spec: ModelSpec, whole: Setup, local: Setup) -> float:
    """A rank's attention FLOPs over its slice's own: ``sp`` without a sliding window."""
    mine = attention_flops_fwd(spec, *techniques.step_shape(whole).attention) / whole.sequence_ranks
    return mine / attention_flops_fwd(spec, *techniques.step_shape(local).attention)


def all_to_all_bytes(spec: ModelSpec, whole: Setup, local: Setup) -> float:
    """Bytes one rank sends per micro-step: q, k, v and the output of its slice, ``(sp - 1) / sp`` of each, in the
    forward, the backward and each recompute, at the compute width."""
    sp = whole.sequence_ranks
    kv_heads = max(spec.num_key_value_heads, sp)   # fewer k / v heads than ranks: repeated up to one per rank
    width = 2 * spec.num_attention_heads * spec.head_dim + 2 * kv_heads * spec.head_dim
    passes = 2 + techniques.kernel_factors(local).recompute
    tokens = techniques.step_shape(local).matmul_tokens
    return passes * spec.total_layers * tokens * width * compute_bytes(local) * (sp - 1) / sp


def all_to_all_seconds(nbytes: float, whole: Setup, hardware: Hardware, gpu: GPU) -> float:
    """The exchange at the slowest link its group spans: inside a node, or across nodes once ``sp`` exceeds a node."""
    if whole.sequence_ranks <= whole.num_gpus:
        bw = hardware.intra_node_bandwidth_gbps or pcie_gbps(gpu)
    else:
        bw = hardware.inter_node_bandwidth_gbps or constant("unknown_inter_node_gbps")
    return nbytes / (bw * 1e9 * constant("comm_bus_fraction"))


def widened(spec: ModelSpec, whole: Setup, local: Setup, hardware: Hardware, tp: Throughput, attn_flops: float,
            kernel: str | None = None) -> Throughput:
    """``tp`` (the slice's step) with the rest of the attention and the all-to-alls added; ``attn_flops`` is the
    slice's attention FLOPs per micro-step (forward, backward, recompute)."""
    gpu = hardware.smallest_gpu
    assert gpu is not None, "sequence parallelism is priced on GPUs only"
    peak = gpu_peak_tflops(gpu, local.compute_dtype)[0]
    more = attention_factor(spec, whole, local) - 1.0
    if rates.fused_attention(local):
        attention = more * terms.fused_attention_seconds(spec, local, gpu, peak, attn_flops, kernel)
    else:
        attention = more * attn_flops * rates.causal_fraction(spec, local) / (tp.achievable_tflops * 1e12 * rates.attention_efficiency(local))
    exchange = all_to_all_seconds(all_to_all_bytes(spec, whole, local), whole, hardware, gpu)
    ga = whole.gradient_accumulation_steps
    step = tp.step_time_s + ga * (attention + exchange)
    recompute = techniques.kernel_factors(local).recompute
    model_flops = tp.mfu * tp.step_time_s * peak * 1e12 + ga * more * attn_flops * 3 / (3 + recompute)
    compute, comm = tp.compute_time_s + ga * attention, tp.comm_time_s + ga * exchange
    return tp.model_copy(update={
        "step_time_s": step,
        "tokens_per_s": tp.tokens_per_s * tp.step_time_s / step if step > 0 else 0.0,
        "flops_per_step": tp.flops_per_step + ga * more * attn_flops,
        "compute_time_s": compute,
        "comm_time_s": comm,
        "comm_total_s": tp.comm_total_s + ga * exchange,
        "mfu": min(1.0, model_flops / (step * peak * 1e12)) if step > 0 else 0.0,
        "bound": "communication" if comm > compute else (tp.bound if tp.bound != "communication" else "compute"),
    })
