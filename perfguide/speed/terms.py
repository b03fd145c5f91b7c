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
from .._data import load
from ..hardware.types import GPU
from ..memory.activations import layer_bytes, logits_bytes
from ..model.types import ModelSpec
from ..setup import Setup

_QUANT_BYTES = {"nf4": 0.5, "int8": 1.0}


def _value(name: str):  # noqa: ANN202 - numbers or small dicts straight from the data file
    return load("efficiency")[name]["value"]


def gpu_class(gpu: GPU) -> str:
    """'datacenter' for the big training dies of Ampere and later (A100, H100/H200, B200: compute capability
    8.0+ with minor 0), 'volta' for the V100 (7.0: first-generation, fp16-only tensor cores), 'graphics' for the
    GeForce / workstation / inference dies (T4, A10, RTX 3090/4090, A6000, L4, L40S: x.5-x.9).

    They reach different fractions of their spec-sheet peak: graphics dies boost well above the clock their
    datasheet TFLOP/s assume; Volta's tensor cores are fed by an older memory system and cuBLAS generation.
    """
    if gpu.vendor != "nvidia":
        return "datacenter"   # AMD Instinct (CDNA) parts are training dies
    if gpu.compute_capability[1] != 0:
        return "graphics"
    return "datacenter" if gpu.supports_bf16 else "volta"


def matmul_path(setup: Setup) -> str:
    """'tensor' when matmuls run on tensor cores (fp16/bf16/tf32), 'cuda' for plain fp32 FMA units."""
    return "cuda" if setup.compute_dtype == "fp32" else "tensor"


def asymptote(gpu: GPU, setup: Setup) -> float:
    """Fraction of the dtype's peak that large matmuls reach inside a training step, by GPU class and path."""
    table = _value("peak_fraction_by_class")
    path = matmul_path(setup) if gpu.has_tensor_cores else "cuda"
    return float(table[path][gpu_class(gpu)])


def half_saturation(setup: Setup) -> float:
    """Hidden size at which a GEMM reaches half its asymptote: tensor cores need far wider GEMMs to fill."""
    return float(_value("hidden_half_saturation_by_path")[matmul_path(setup)])


def attention_efficiency(setup: Setup) -> float:
    """Attention matmul rate relative to the model's GEMMs. SDPA dispatches to the FlashAttention-2 kernels on
    Ampere and later (PyTorch 2.2+), so SDPA and flash_attention_2 share one 'fused' value; eager attention's
    matmuls are plain batched GEMMs and its real cost, the s x s traffic, is ``eager_score_bytes``."""
    table = _value("attention_efficiency")
    return float(table["eager"] if setup.attn_implementation == "eager" else table["fused"])


def framework_efficiency(framework: str) -> float:
    """How much faster than HF Trainer a training stack runs the same step (fused kernels, no Trainer overhead).

    perfguide's own plans run under HF Trainer / accelerate, so it is 1.0 there; the bench passes the stack each
    published row was measured with, so this term, not the GPU constants, absorbs the difference.
    """
    table = _value("framework_efficiency")
    return float(table.get(framework, table["hf_trainer"]))


def elementwise_bytes(spec: ModelSpec, setup: Setup) -> float:
    """Bytes the memory-bound kernels of one micro-step move: every saved activation (what the memory model
    counts per block, eager attention's s x s scores included) and the fp32 loss buffers are written and read
    ``elementwise_passes`` times over forward and backward; checkpointing re-runs the forward's share (1/3);
    fused or compiled kernels cut the passes (``Technique.kernel_factors``)."""
    if setup.task != "train":
        return 0.0
    fused = setup.model_copy(update={"attn_implementation": "sdpa"})   # eager's s x s part: eager_score_bytes
    saved = spec.total_layers * layer_bytes(spec, fused, keeps_frozen_inputs=True) + logits_bytes(spec, setup)
    passes = float(_value("elementwise_passes"))
    if setup.gradient_checkpointing:
        passes *= 4 / 3
    passes *= techniques.kernel_factors(setup).elementwise
    return passes * saved


def eager_score_bytes(spec: ModelSpec, setup: Setup) -> float:
    """Eager attention runs a chain of kernels over the b x heads x s x s scores (QK^T output, scale, mask,
    softmax - in fp32 under autocast -, dropout, the cast back for AV, and each one's backward), every one a
    full read and write of the score tensor; fused kernels (SDPA, flash) keep the scores on chip."""
    if setup.attn_implementation != "eager" or setup.task != "train":
        return 0.0
    attended = min(setup.seq_len, spec.sliding_window) if spec.sliding_window else setup.seq_len
    elements = setup.micro_batch_size * spec.num_attention_heads * setup.seq_len * attended * spec.total_layers
    recompute = 4 / 3 if setup.gradient_checkpointing else 1.0
    return elements * float(_value("eager_score_bytes_per_element")) * recompute


def dequant_bytes(spec: ModelSpec, setup: Setup, matmul_params: int) -> float:
    """bitsandbytes dequantizes a 4/8-bit base to 16 bit before every matmul that uses it: it reads the
    packed weights and writes a 16-bit copy, in forward, in the input-gradient pass, and again in the recompute."""
    q = _QUANT_BYTES.get(setup.weights_dtype)
    if q is None:
        return 0.0
    passes = 2 + (1 if setup.gradient_checkpointing else 0)
    return passes * matmul_params * (q + 2) * float(_value("dequant_traffic_factor"))


def lora_bytes(setup: Setup, lora_inputs_per_layer: int, layers: int) -> float:
    """Each adapted Linear copies its input through the adapter's dropout and (on a 16-bit base) an fp32 cast,
    and the backward reads and writes those copies again: ``lora_passes`` x tokens x input width x 4 bytes."""
    if setup.lora is None or not lora_inputs_per_layer:
        return 0.0
    tokens = setup.micro_batch_size * setup.seq_len
    return float(_value("lora_passes")) * tokens * lora_inputs_per_layer * layers * 4
