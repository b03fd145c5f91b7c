"""Speed terms of the modern technique stack, added to the core step model (speed/model.py) as small parts.

Each returns seconds per micro-step or per optimizer step from the same physics the core uses (FLOPs at an
achievable rate, bytes over a bandwidth); constants live in data/techniques.json with their sources.
* padding-free: matmuls pay for real tokens only; flash_attention_2 runs attention per sample (sum of l^2),
  SDPA / eager run it over the flattened row with a block mask (T^2, nothing skipped).
* Liger FLCE: the head GEMMs run on chunks (smaller M, lower efficiency) but the fp32 logits are never
  streamed through memory; it can lose at small batch (its issues report slowdowns there).
* fp8 (torchao / Transformer Engine): block-Linear GEMMs at the fp8 peak, plus the memory-bound casts and
  amax reductions of every operand; small GEMMs get slower, so the plan prices it per model.
* activation offloading and paged optimizers: bytes over PCIe, overlapped with compute where they can be.
* torch.compile: fewer kernels per layer (fused elementwise ops) and a one-off compile time.
"""

from __future__ import annotations

from .._technique_data import constants
from ..hardware.types import GPU, Hardware
from ..model.types import ModelSpec
from ..setup import Setup


def _c(name: str) -> float:
    return float(getattr(constants(), name).value)


# --- padding-free ------------------------------------------------------------------------------------

def attention_shape(setup: Setup) -> tuple[int, int]:
    """(batch, sequence) the attention kernels really run over."""
    if setup.padding_free and setup.avg_seq_len:
        if setup.attn_implementation == "flash_attention_2":
            return setup.micro_batch_size, setup.avg_seq_len        # varlen: each sample attends to itself only
        return 1, setup.micro_batch_size * setup.avg_seq_len       # one row with a block-diagonal mask
    return setup.micro_batch_size, setup.seq_len


def matmul_tokens(setup: Setup) -> int:
    """Tokens the Linear layers process per micro-step: real ones under padding-free, padded ones otherwise."""
    if setup.padding_free and setup.avg_seq_len:
        return setup.micro_batch_size * setup.avg_seq_len
    return setup.micro_batch_size * setup.seq_len


def real_tokens_per_micro(setup: Setup) -> int:
    """Tokens that carry training signal (what tokens/s should count)."""
    return setup.micro_batch_size * (setup.avg_seq_len or setup.seq_len)


# --- Liger -------------------------------------------------------------------------------------------

def liger_delta(spec: ModelSpec, setup: Setup, rate_at: float, rate_chunk: float, bandwidth: float) -> float:
    """Seconds per micro-step Liger FLCE adds (positive) or saves (negative) against HF's loss path.

    ``rate_at`` / ``rate_chunk``: achievable FLOP/s of the head GEMMs at the full token count and at Liger's chunk.
    """
    tokens = matmul_tokens(setup)
    head_flops = 6.0 * tokens * spec.hidden_size * spec.vocab_size
    gemm = head_flops / rate_chunk - head_flops / rate_at
    traffic = tokens * spec.vocab_size * _c("hf_loss_bytes_per_logit") / bandwidth if bandwidth else 0.0
    return gemm - traffic


# --- fp8 ---------------------------------------------------------------------------------------------

def fp8_capable(gpu: GPU) -> bool:
    """fp8 tensor cores: the GPU's capability flag where the hardware table has one, else its fp8 peak."""
    flag = getattr(gpu, "supports_fp8", None)
    if isinstance(flag, bool):
        return flag
    return bool(gpu.fp8_tflops)


def fp8_linear_time(linears: list[tuple[int, int, int]], tokens: int, fp8_rate: float, bandwidth: float) -> float:
    """Seconds per micro-step of the block Linears in fp8: 3 GEMMs (fwd, grad-input, grad-weight) per Linear at
    the fp8 rate, plus casting its three operands (input T x in, weight in x out, grad-output T x out)."""
    gemm = sum(6.0 * tokens * i * o * n for i, o, n in linears) / fp8_rate
    cast_elems = sum((tokens * i + i * o + tokens * o) * n for i, o, n in linears)
    return gemm + (cast_elems * _c("fp8_cast_bytes_per_element") / bandwidth if bandwidth else 0.0)


def bf16_linear_time(linears: list[tuple[int, int, int]], tokens: int, rate: float) -> float:
    return sum(6.0 * tokens * i * o * n for i, o, n in linears) / rate


# --- host transfers ----------------------------------------------------------------------------------

def activation_offload_seconds(offloaded_bytes: int, pcie_bytes_per_s: float) -> float:
    """Seconds per micro-step of moving checkpointed activations out and back (before overlap)."""
    return _c("activation_offload_pcie_passes") * offloaded_bytes / pcie_bytes_per_s


def paged_seconds(states: int, free_device: int, pcie_bytes_per_s: float) -> float:
    """Seconds per optimizer step of paging evicted optimizer state in and out; nothing when it all stays on the GPU."""
    evicted = max(0, states - max(0, free_device))
    return _c("paged_pcie_passes") * evicted / pcie_bytes_per_s


# --- torch.compile -----------------------------------------------------------------------------------

def compiled_launch_fraction(setup: Setup) -> float:
    return _c("compile_kernel_fraction") if setup.torch_compile else 1.0


def compile_seconds(spec: ModelSpec, setup: Setup) -> float:
    """One-off compile time of a run (not per step); matters for short runs. Zero without torch_compile."""
    if not setup.torch_compile:
        return 0.0
    layer_types = 2 if spec.sliding_window and spec.model_type in ("gemma2", "gemma3") else 1
    return _c("compile_seconds_base") + layer_types * _c("compile_seconds_per_layer_type")


def free_device_bytes(hardware: Hardware, device_total: int, headroom: float = 0.10) -> int:
    """What unified-memory pages may fill on the GPU besides the allocator's own peak."""
    gpu = hardware.smallest_gpu
    if gpu is None:
        return 0
    return int(gpu.memory_total * (1 - headroom)) - device_total
