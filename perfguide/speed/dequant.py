"""The dequantize kernel of a bitsandbytes 4-bit base: bandwidth-bound on some GPUs, ALU-bound on others.

Before every matmul that uses a 4-bit weight, bitsandbytes' ``dequantize_4bit`` runs ``kDequantizeBlockwise``: it
reads the packed codes and writes a 16-bit copy (terms.dequant_bytes), and on the way it decodes every 4-bit code.
Up to 0.47 the decode was a branch tree per nibble (dDequantizeNF4 / dDequantizeFP4Tree); a warp holds nearly all
16 codes, so it issues every branch, ~62 lane-instructions a weight for NF4 (counted in the release's SASS,
efficiency.json ``bnb_4bit_dequant_ops_per_element``), 36 of them on the 64-lane-a-clock integer/logic pipe. The
A100 has few such lanes for its bandwidth (108 SMs x 1.41 GHz x 64 = 9.7e12 a second for 2.0 TB/s), so there the
kernel is ALU-bound, 2.4x its bytes' time; an RTX 4090 (128 SMs x 2.52 GHz, 1.0 TB/s) stays bandwidth-bound. The
0.48 rewrite (a table lookup) cut the work ~3x: bitsandbytes PR #1747 measured it 1.36-2.07x faster on A100 and
H100 and faster on sm89 only at small sizes, which this model reproduces (tests/test_dequant_alu.py).

The kernel's era is chosen from the bitsandbytes release (the installed one for a plan made here; the bench
passes each published row's), like the other release-dependent facts: no bitsandbytes -> the newest era.
"""

from __future__ import annotations

from functools import cache

from .._packages import installed_release
from ..hardware.types import GPU
from ..memory.loss_path import era_at, version_tuple
from ..model.types import ModelSpec
from ..setup import Setup
from . import terms
from .rates import constant, matmul_params


@cache
def installed_bitsandbytes() -> str | None:
    """The bitsandbytes release installed next to perfguide (the one a plan made here dequantizes with)."""
    return installed_release("bitsandbytes")


def kernel_era(release: str | None) -> str:
    """The last kernel era whose first release is not newer than ``release``; None (no bitsandbytes here): the
    newest. A release older than the first 4-bit one (0.39.0) takes the first era."""
    eras = sorted(constant("bnb_4bit_dequant_ops_per_element").items(), key=lambda kv: version_tuple(kv[1]["since"]))
    return era_at(eras, release, lambda kv: kv[1]["since"])[0]


def sm_clocks_per_s(gpu: GPU) -> float:
    """Streaming-multiprocessor clocks per second summed over the GPU's SMs: its datasheet fp32 rate over the fp32
    lanes an SM of its compute capability has (efficiency.json ``sm_lanes_per_clock``); 0 where either is unknown."""
    cc = gpu.compute_capability
    lanes = constant("sm_lanes_per_clock")["fp32_by_cc"].get(f"{cc[0]}.{cc[1]}")   # (0, 0) off NVIDIA: none
    if not lanes or not gpu.fp32_tflops:
        return 0.0
    return float(gpu.fp32_tflops) * 1e12 / (2 * lanes)


def sm_clocks_per_element(setup: Setup, release: str | None) -> float:
    """SM clocks one weight's decode takes: its ALU-pipe lane-instructions over the pipe's lanes per clock, or all
    its lane-instructions over the SM's issue width, whichever binds; 0 for anything but a bnb 4-bit base."""
    if setup.weights_dtype != "nf4":
        return 0.0
    ops = constant("bnb_4bit_dequant_ops_per_element")[kernel_era(release)][setup.bnb_4bit_quant_type]
    lanes = constant("sm_lanes_per_clock")
    return max(float(ops["alu"]) / lanes["alu"], float(ops["issued"]) / lanes["issue"])


def dequantized_params(spec: ModelSpec, setup: Setup) -> float:
    """The matmul weights a k-bit base dequantizes per pass (terms.dequant_passes), a MoE's fused expert tensors as the
    run keeps them. bitsandbytes quantizes nn.Linear only: without ``Setup.quantized_experts`` the routed experts stay
    16-bit and nothing dequantizes them. With it (axolotl's quantize_moe_experts, a parametrization), every MoE layer
    dequantizes its whole stacks, every expert, not the routed ones only; the 16-bit stack is then what the grouped
    matmul saves, so the input-gradient pass reads it and it is dequantized in forward and in the recompute only. The
    experts' count is scaled by those passes over the Linears' (forward, input gradient, recompute)."""
    params = float(matmul_params(spec))
    fused = spec.fused_expert_params
    if not fused or setup.weights_dtype not in ("nf4", "int8"):
        return params
    routed = fused * min(spec.num_experts_per_tok, spec.num_experts) / spec.num_experts
    if not setup.quantized_experts:
        return params - routed
    passes = terms.dequant_passes(setup)
    return params - routed + fused * (passes - 1) / passes


def dequant_seconds(spec: ModelSpec, setup: Setup, gpu: GPU, bandwidth: float, matmul_params: float) -> float:
    """Seconds one micro-step's dequantize kernels take: the longer of their bytes at the usable ``bandwidth`` and
    their decode at the GPU's ALU rate (``matmul_params`` weights a pass, ``dequantized_params``; terms.dequant_passes
    passes), with the
    kernel of the installed bitsandbytes (``installed_bitsandbytes``; the bench sets each row's)."""
    moved = terms.dequant_bytes(spec, setup, matmul_params)
    if not moved or not bandwidth:
        return 0.0
    clocks = sm_clocks_per_s(gpu)
    per_element = sm_clocks_per_element(setup, installed_bitsandbytes())
    alu = terms.dequant_passes(setup) * matmul_params * per_element / clocks if clocks and per_element else 0.0
    return max(moved / bandwidth, alu)
