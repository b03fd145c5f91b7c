"""The GPU training step's terms that are not matmul FLOPs: bytes moved by memory-bound kernels, GPU class, stack.

A training step on a GPU is matmuls at an achievable tensor-core (or CUDA-core) rate plus kernels that are bound
by memory bandwidth: the elementwise ops around the matmuls (norms, activations, dropout, residual adds, the
eager attention softmax over s x s scores, the fp32 loss over the vocabulary), the dequantization of a 4-bit
base, the LoRA adapters' input copies. Each is written here as bytes moved, so a test can count them by hand
and a technique (fused kernels, compile, liger) can contribute a factor on one named term. Constants:
perfguide/data/efficiency.json, each with its source (the fitted ones name the published rows they came from).
"""

from __future__ import annotations

from .. import techniques
from .._data import fact_value
from ..hardware.types import GPU
from ..model.types import ModelSpec
from ..setup import Setup
from . import traffic

_QUANT_BYTES = {"nf4": 0.5, "int8": 1.0}


def _value(name: str):  # noqa: ANN202 - numbers or small dicts straight from the data file
    return fact_value("efficiency", name)


def gpu_class(gpu: GPU) -> str:
    """'datacenter' for the big training dies of Ampere and later (A100, H100/H200, B200: compute capability
    8.0+ with minor 0), 'volta' for the V100 (7.0: first-generation, fp16-only tensor cores), 'graphics' for the
    GeForce / workstation / inference dies (T4, A10, RTX 3090/4090, A6000, L4, L40S: x.5-x.9), 'cdna' for AMD
    Instinct (MI300X/MI325X).

    They reach different fractions of their spec-sheet peak: graphics dies boost well above the clock their
    datasheet TFLOP/s assume; Volta's tensor cores are fed by an older memory system and cuBLAS generation.
    """
    if gpu.vendor != "nvidia":
        return "cdna"         # AMD Instinct: training dies, but ROCm's GEMMs reach a smaller share of their spec
    if gpu.compute_capability[1] != 0:
        return "graphics"
    return "datacenter" if gpu.supports_bf16 else "volta"


def matmul_path(setup: Setup) -> str:
    """'tensor' when matmuls run on tensor cores (fp16/bf16/tf32), 'cuda' for plain fp32 FMA units."""
    return "cuda" if setup.compute_dtype == "fp32" else "tensor"


def asymptote(gpu: GPU, setup: Setup) -> float:
    """Fraction of the dtype's peak that large matmuls reach inside a training step: the GPU's measured maximum
    achievable matmul rate (``GPU.matmul_tflops``, bf16/fp16 on tensor cores) where one is published, else its
    class's constant (by GPU class and matmul path)."""
    path = matmul_path(setup) if gpu.has_tensor_cores else "cuda"
    peak = gpu.half_tflops(setup.compute_dtype)
    if path == "tensor" and setup.compute_dtype in ("bf16", "fp16") and gpu.matmul_tflops and peak:
        return gpu.matmul_tflops / peak        # above 1 where a card boosts past its datasheet clock (RTX 4090)
    return float(_value("peak_fraction_by_class")[path][gpu_class(gpu)])


def half_saturation(setup: Setup) -> float:
    """Hidden size at which a GEMM reaches half its asymptote: tensor cores need far wider GEMMs to fill."""
    return float(_value("hidden_half_saturation_by_path")[matmul_path(setup)])


def attention_efficiency(setup: Setup) -> float:
    """Rate of attention matmuls that run as plain GEMMs (eager attention, and the fp32 kernels on CUDA cores)
    relative to the model's GEMMs; eager's real cost, the s x s traffic, is ``eager_score_bytes``. Fused kernels
    on tensor cores are priced by ``fused_attention_seconds`` instead, at their own rate."""
    return float(_value("attention_efficiency")["eager"])


def fused_attention(setup: Setup) -> bool:
    """SDPA / flash_attention_2 on tensor cores: one kernel with its own achievable rate, not a GEMM."""
    return setup.attn_implementation != "eager" and matmul_path(setup) == "tensor"


def attention_arch(gpu: GPU) -> str:
    """The flash-kernel generation a GPU runs: FlashAttention-2 is written for Ampere's mma.sync (sm80, also
    Ada sm89), and does not use Hopper's wgmma/TMA - FlashAttention-3 does -, so on an H100 the same kernel
    reaches a much smaller fraction of peak; Volta/Turing get the memory-efficient (cutlass) SDPA kernel."""
    if gpu.vendor != "nvidia":
        return "cdna"
    major = gpu.compute_capability[0]
    return {7: "volta_turing", 8: "ampere", 9: "hopper"}.get(major, "blackwell" if major >= 10 else "volta_turing")


def causal_fraction(spec: ModelSpec, setup: Setup) -> float:
    """Share of the b x s x s_attended score tiles a fused kernel really computes. A causal decoder's kernels
    skip the tiles above the diagonal (FlashAttention-2 ``causal=True``, SDPA ``is_causal``): about half, or
    ``1 - w / 2s`` with a sliding window w < s. Encoders attend both ways (all of it); eager attention builds the
    full s x s matrix and masks it afterwards. The MFU convention (no causal halving) is unchanged."""
    if setup.attn_implementation == "eager" or not spec.generates or spec.is_encoder_decoder:
        return 1.0
    attended = min(setup.seq_len, spec.sliding_window) if spec.sliding_window else setup.seq_len
    return 1.0 - attended / (2.0 * setup.seq_len)


def fused_attention_seconds(spec: ModelSpec, setup: Setup, gpu: GPU, peak_tflops: float, attn_flops: float,
                            kernel: str | None = None) -> float:
    """Seconds the fused attention kernels of one micro-step take: the executed (causal) share of the counted
    FLOPs at the kernel's own fraction of peak (FlashAttention-2's by GPU generation; ``kernel`` names an older
    one, priced relative to it). The stack term does not apply: the kernel, not the stack, decides its speed."""
    if not fused_attention(setup) or attn_flops <= 0:
        return 0.0
    fraction = float(_value("attention_peak_fraction")[attention_arch(gpu)])
    if kernel is not None:
        fraction *= float(_value("attention_kernel_speed")[kernel])
    return attn_flops * causal_fraction(spec, setup) * flash_backward_factor(setup) / (peak_tflops * 1e12 * fraction)


def flash_backward_factor(setup: Setup) -> float:
    """Executed over counted attention FLOPs of a training micro-step: a flash kernel keeps no s x s matrix, so its
    backward recomputes the scores and runs 5 matmuls where the forward ran 2 (``flash_backward_ratio`` = 2.5 x the
    forward, not the 2x the MFU convention counts): (1 + 2.5 [+ 1 recompute]) / (1 + 2 [+ 1])."""
    if setup.task != "train":
        return 1.0
    recompute = techniques.kernel_factors(setup).recompute   # forwards re-run in backward (checkpointing)
    return (1.0 + float(_value("flash_backward_ratio")) + recompute) / (3.0 + recompute)


def framework_efficiency(framework: str) -> float:
    """How much faster than HF Trainer a training stack runs the same step (fused kernels, no Trainer overhead).

    perfguide's own plans run under HF Trainer / accelerate, so it is 1.0 there; the bench passes the stack each
    published row was measured with, so this term, not the GPU constants, absorbs the difference.
    """
    table = _value("framework_efficiency")
    return float(table.get(framework, table["hf_trainer"]))


def elementwise_bytes(spec: ModelSpec, setup: Setup) -> float:
    """Bytes the memory-bound kernels of one micro-step move: every block's non-GEMM ops and the head's loss
    path, as traced on the real modules (perfguide/speed/traffic.py, data/traffic.json), times
    ``elementwise_traffic_factor`` (such small kernels reach less of the bandwidth than a streaming copy);
    checkpointing re-runs the forward's share; fused or compiled kernels cut it (``Technique.kernel_factors``).
    Eager attention's s x s chain is ``eager_score_bytes``."""
    if setup.task != "train":
        return 0.0
    kernels = techniques.kernel_factors(setup)
    tokens = setup.micro_batch_size * setup.seq_len
    moved = traffic.block_bytes(spec, setup, tokens, kernels.recompute) + traffic.head_bytes(spec, setup)
    return traffic.priced(moved * kernels.elementwise)


def eager_score_bytes(spec: ModelSpec, setup: Setup) -> float:
    """Eager attention runs a chain of kernels over the b x heads x s x s scores (QK^T output, scale, mask,
    softmax - in fp32 under autocast -, dropout, the cast back for AV, and each one's backward), every one a
    full read and write of the score tensor; fused kernels (SDPA, flash) keep the scores on chip. The bytes per
    score element are traced (eager minus SDPA, data/traffic.json) and priced like the other memory-bound kernels."""
    if setup.attn_implementation != "eager" or setup.task != "train":
        return 0.0
    return traffic.priced(traffic.eager_score_bytes(spec, setup, techniques.kernel_factors(setup).recompute))


def dequant_bytes(spec: ModelSpec, setup: Setup, matmul_params: int) -> float:
    """bitsandbytes dequantizes a 4/8-bit base to 16 bit before every matmul that uses it: it reads the
    packed weights and writes a 16-bit copy, in forward, in the input-gradient pass, and again in the recompute."""
    q = _QUANT_BYTES.get(setup.weights_dtype)
    if q is None:
        return 0.0
    passes = 2 + techniques.kernel_factors(setup).recompute
    return passes * matmul_params * (q + 2) * float(_value("dequant_traffic_factor"))


def lora_bytes(setup: Setup, lora_inputs_per_layer: int, layers: int) -> float:
    """Each adapted Linear copies its input through the adapter's dropout and (on a 16-bit base) an fp32 cast,
    and the backward reads and writes those copies again: ``lora_passes`` x tokens x input width x 4 bytes."""
    if setup.lora is None or not lora_inputs_per_layer:
        return 0.0
    tokens = setup.micro_batch_size * setup.seq_len
    return float(_value("lora_passes")) * tokens * lora_inputs_per_layer * layers * 4


def lora_ops_per_layer(setup: Setup, lora_rank_per_layer: int) -> float:
    """Extra eager ops per block a PEFT LoRA adds: every adapted Linear runs dropout, lora_A, lora_B, the scaling
    multiply and the add in forward, and their gradients (A's and B's weight grads included) in backward -
    ``lora_ops_per_adapted_linear`` host dispatches each, whatever the tensor size (counted by bench/host_ops.py).
    ``lora_rank_per_layer`` is r x adapted Linears of one block (the memory ledger's count)."""
    if setup.lora is None or not lora_rank_per_layer:
        return 0.0
    return float(_value("lora_ops_per_adapted_linear")) * lora_rank_per_layer / setup.lora.r
