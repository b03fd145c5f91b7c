"""torch.compile: fuse the model's graph; with a static KV cache, decode replays CUDA graphs.

Training: fewer kernels per layer (fused elementwise chains) and fewer passes of the memory-bound kernels
(``kernel_factors``), plus a one-off compile time that matters for short runs (``compile_seconds``). For serving
it pays when latency is preferred and decode is launch-overhead or bandwidth bound; every new shape recompiles,
so it is not chosen for throughput serving with varied batches.
"""

from __future__ import annotations

from typing import Any

from .._data import fact_value
from ..data.techniques import constant
from ..memory.inference import inference_data
from .base import EmitContext, Technique
from .effects import KernelFactors

SOURCES = (
    "https://huggingface.co/docs/transformers/llm_optims#static-kv-cache-and-torchcompile",
    "https://docs.pytorch.org/docs/stable/generated/torch.compile.html",
)


class TorchCompile(Technique):
    name = "torch_compile"
    fields = ("torch_compile", "cache_implementation")
    summary = "compile the model; with a static KV cache, decode runs as CUDA graphs"
    sources = SOURCES
    order = 70

    def active(self, setup: Any) -> bool:
        return bool(setup.torch_compile)

    def label_word(self, setup: Any) -> str | None:
        return "compile" if setup.torch_compile and setup.task == "train" else None

    def kernel_factors(self, setup: Any) -> KernelFactors:
        if not setup.torch_compile:
            return KernelFactors()
        decode = inference_data().static_compile_overhead_factor.value if setup.cache_implementation == "static" else 1.0
        return KernelFactors(launches=constant("compile_kernel_fraction"),
                             elementwise=float(fact_value("efficiency", "compile_elementwise_factor")), decode_overhead=decode,
                             fused_blocks=True)

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"torch_compile": True} if ctx.setup.torch_compile else {}


def compile_seconds(spec: Any, setup: Any) -> float:
    """One-off compile time of a run (not per step); matters for short runs. Zero without torch_compile."""
    if not setup.torch_compile:
        return 0.0
    layer_types = 2 if spec.sliding_window and spec.model_type in ("gemma2", "gemma3") else 1
    return constant("compile_seconds_base") + layer_types * constant("compile_seconds_per_layer_type")


TECHNIQUES = (TorchCompile(),)
