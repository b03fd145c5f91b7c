"""FP8 training on fp8-capable GPUs (Hopper, Ada, Blackwell): accelerate ``mixed_precision="fp8"`` with the torchao
backend (``Float8Linear``, dynamic tensorwise scaling) or Transformer Engine. Only the block Linears' GEMMs run in
fp8; weights, norms, attention and the loss stay bf16.

Its gain depends on GEMM size: every operand is cast (amax + scale + fp8 copy, memory-bound) around each GEMM,
so small shapes get slower (torchao's float8 README says so and lists the speedup per shape). The speed model
prices the fp8 GEMMs at the fp8 peak plus those casts per model (``speed``): fused under torch.compile, op by op
(25 bytes per element, 9 kernels per cast) in eager, which is how accelerate's AO backend runs without
``torch_compile``; the extra kernels count against launch-bound small steps (``kernel_factors``). The search tries fp8
next to bf16 wherever the GPU has it, taking it only where the priced step is faster. Memory: unchanged
(the published torchtitan/torchao A/B runs differ by < 0.5%).
"""

from __future__ import annotations

from typing import Any

from .._data import fact_value
from ..data.techniques import constant
from ..model.linears import block_linear_shapes
from ..speed.rates import half_saturation
from . import kernel_factors
from .base import EmitContext, LadderContext, Requires, Technique
from .effects import KernelFactors, SpeedContext, StepSeconds

#: Linears of a gated-MLP transformer block (q, k, v, o, gate, up, down); a hook on the Setup alone cannot see the spec
LINEARS_PER_BLOCK = 7

SOURCES = (
    "https://huggingface.co/docs/accelerate/usage_guides/low_precision_training",
    "https://github.com/pytorch/ao/tree/main/torchao/float8 (README: performance by GEMM shape)",
    "https://github.com/pytorch/ao/blob/main/docs/source/workflows/training.md (Llama-3-8B float8 tables)",
)


class Fp8(Technique):
    name = "fp8"
    fields = ()
    summary = "block-Linear GEMMs in fp8 (torchao Float8Linear / Transformer Engine) over bf16 weights"
    sources = SOURCES
    #: binding: torchao's Float8Linear converts full-precision nn.Linear layers (full fine-tuning only), through
    #: accelerate's torchao backend, which DeepSpeed plans do not use
    requires = Requires(devices=("cuda",), tasks=("train",), packages=("torchao",), gpu_capability="supports_fp8",
                        finetune=("full",), strategies=("single", "ddp", "fsdp", "fsdp_shard_grad_op"), binding=True)
    order = 12
    axis = True
    switch = "fp8"

    def active(self, setup: Any) -> bool:
        return setup.autocast == "fp8"

    def axis_values(self, ctx: LadderContext) -> list[dict[str, Any]]:
        gpu = ctx.hardware.smallest_gpu if ctx.hardware is not None else None
        wanted = ctx.wants.get("fp8")
        # a requested precision is honoured as given: fp8 only where perfguide picks the precision (or fp8=True)
        if ctx.autocast != "bf16" or gpu is None or not gpu.supports_fp8 or wanted is False or (ctx.wants.get("precision") and not wanted):
            return [{}]
        return [{}, {"autocast": "fp8"}]

    def off(self) -> dict[str, Any]:
        return {"autocast": "bf16"}

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        gpu = ctx.gpu
        if not (self.active(ctx.setup) and capable(gpu) and gpu.fp8_tflops):
            return StepSeconds()
        linears = block_linear_shapes(ctx.spec)
        fp8_rate = ctx.gemm_rate(gpu.fp8_tflops, ctx.asymptote * constant("fp8_peak_fraction"), ctx.tokens)
        fp8_rate *= width_penalty(ctx.spec.hidden_size, half_saturation(ctx.setup, gpu))
        fwd_bwd = (3 + kernel_factors(ctx.setup).recompute) / 3   # a recomputed forward runs its GEMMs again
        delta = (linear_seconds(linears, ctx.tokens, fp8_rate, ctx.bandwidth, cast_bytes(ctx.setup))
                 - half_linear_seconds(linears, ctx.tokens, ctx.rate))
        return StepSeconds(compute=fwd_bwd * delta)

    def accelerate_config(self, ctx: EmitContext) -> dict[str, Any]:
        # torchao Float8Linear (accelerate ClusterConfig.fp8_config); mixed_precision 'fp8' is the precision's word
        return {"fp8_config": {"backend": "AO"}} if self.active(ctx.setup) else {}

    def kernel_factors(self, setup: Any) -> KernelFactors:
        """The casts' own kernels: launch-bound small steps pay them even where the GEMMs got faster."""
        if not self.active(setup):
            return KernelFactors()
        per_linear = constant("fp8_cast_kernels_per_linear_compiled" if setup.torch_compile else "fp8_cast_kernels_per_linear")
        base = float(fact_value("efficiency", "cuda_ops_per_layer"))
        return KernelFactors(launches=1 + LINEARS_PER_BLOCK * per_linear / base)

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        # the Trainer's own switch stays bf16; fp8 comes from accelerate (mixed_precision: fp8, fp8_backend: ao)
        return {"bf16": True} if self.active(ctx.setup) else {}


def capable(gpu: Any) -> bool:
    """fp8 tensor cores: the GPU's capability flag where the hardware table has one, else its fp8 peak."""
    flag = getattr(gpu, "supports_fp8", None)
    if isinstance(flag, bool):
        return flag
    return bool(gpu.fp8_tflops)


def width_penalty(hidden: int, half: float) -> float:
    """fp8's share of the width-saturation curve relative to bf16's: an fp8 tensor-core instruction does twice the
    multiply-adds per cycle, so an fp8 GEMM of width h spends as long in its main loop as a bf16 one of width h/2,
    against the same fixed per-tile prologue and epilogue; with saturation x / (x + half) that is
    sat(h/2) / sat(h) = (h + half) / (h + 2 half): near 1 for wide models, well below for narrow ones (gpt2)."""
    return (hidden + half) / (hidden + 2 * half)


def cast_bytes(setup: Any) -> float:
    """Bytes streamed per operand element to scale and cast it: fused under torch.compile, op by op in eager."""
    return constant("fp8_cast_bytes_per_element" if setup.torch_compile else "fp8_cast_bytes_per_element_eager")


def linear_seconds(linears: list[tuple[int, int, int]], tokens: int, fp8_rate: float, bandwidth: float,
                   bytes_per_element: float | None = None) -> float:
    """Seconds per micro-step of the block Linears in fp8: 3 GEMMs (fwd, grad-input, grad-weight) per Linear at
    the fp8 rate, plus casting its three operands (input T x in, weight in x out, grad-output T x out) at
    ``bytes_per_element`` each (default: the compiled, fused cast)."""
    per = constant("fp8_cast_bytes_per_element") if bytes_per_element is None else bytes_per_element
    gemm = sum(6.0 * tokens * i * o * n for i, o, n in linears) / fp8_rate
    cast_elems = sum((tokens * i + i * o + tokens * o) * n for i, o, n in linears)
    return gemm + (cast_elems * per / bandwidth if bandwidth else 0.0)


def half_linear_seconds(linears: list[tuple[int, int, int]], tokens: int, rate: float) -> float:
    """The same GEMMs at the 16-bit rate: what fp8 replaces."""
    return sum(6.0 * tokens * i * o * n for i, o, n in linears) / rate


TECHNIQUES = (Fp8(),)
