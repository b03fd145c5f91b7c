"""FP8 training on fp8-capable GPUs (Hopper, Ada, Blackwell): accelerate ``mixed_precision="fp8"`` with the torchao
backend (``Float8Linear``, dynamic tensorwise scaling) or Transformer Engine. Only the block Linears' GEMMs run in
fp8; weights, norms, attention and the loss stay bf16.

Its gain depends on GEMM size: every operand is cast (amax + scale + fp8 copy, memory-bound) around each GEMM,
so small shapes get slower (torchao's float8 README says so and lists the speedup per shape). The speed model
prices the fp8 GEMMs at the fp8 peak plus those casts per model (speed/techniques.py), and the search tries fp8
next to bf16 wherever the GPU has it, taking it only where the priced step is faster. Memory: unchanged
(the published torchtitan/torchao A/B runs differ by < 0.5%).
"""

from __future__ import annotations

from typing import Any

from .base import EmitContext, LadderContext, Requires, Technique

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
    requires = Requires(devices=("cuda",), tasks=("train",), packages=("torchao",), gpu_capability="supports_fp8")
    order = 12
    axis = True

    def active(self, setup: Any) -> bool:
        return setup.autocast == "fp8"

    def axis_values(self, ctx: LadderContext) -> list[dict[str, Any]]:
        gpu = ctx.hardware.smallest_gpu if ctx.hardware is not None else None
        wanted = ctx.wants.get("fp8")
        # a requested precision is honoured as given: fp8 only where perfguide picks the precision (or fp8=True)
        if ctx.autocast != "bf16" or gpu is None or not gpu.supports_fp8 or wanted is False or (ctx.wants.get("precision") and not wanted):
            return [{}]
        return [{}, {"autocast": "fp8"}]

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        # the Trainer's own switch stays bf16; fp8 comes from accelerate (mixed_precision: fp8, fp8_backend: ao)
        return {"bf16": True} if self.active(ctx.setup) else {}


TECHNIQUES = (Fp8(),)
