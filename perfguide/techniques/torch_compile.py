"""torch.compile: fuse the model's graph; with a static KV cache, decode replays CUDA graphs.

Training: fewer kernels per layer (fused elementwise chains) and fewer passes of the memory-bound kernels
(``kernel_factors``), plus a one-off compile time that matters for short runs (``compile_seconds``); fewer bytes
kept for backward where the compiled block was traced (``memory``: Inductor's partition recomputes the RMSNorms'
upcasts and SiLU rather than saving them, as Liger's fused kernels do). For serving
it pays when latency is preferred and decode is launch-overhead or bandwidth bound; every new shape recompiles,
so it is not chosen for throughput serving with varied batches.
"""

from __future__ import annotations

from typing import Any

from .._data import fact_value
from ..data.techniques import compiled_blocks, constant
from ..memory.activations import regime
from ..memory.inference import inference_data
from .base import EmitContext, Technique
from .effects import KernelFactors, MemoryContext, MemoryTerms
from .liger_kernel import block_savings

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

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        """A compiled block keeps less for backward: AOTAutograd's min-cut partitioner saves each RMSNorm's 16-bit
        input and one fp32 rstd per row where eager autograd keeps the fp32 upcast and the normalised 16-bit copy,
        and it recomputes SiLU(gate) from the saved gate: exactly the tensors Liger's fused RMSNorm and SwiGLU leave
        out (``liger_kernel.block_savings``: 8 B per hidden unit and 2 B per FFN unit per token in a 16-bit block).
        Traced (scripts/trace_compiled_block.py, data/techniques.json ``compiled_blocks``): transformers'
        LlamaDecoderLayer at Llama-3.2-3B's widths keeps 131,176 B per token eager, 90,216 compiled, 40,960 less
        = 8 x 3,072 + 2 x 8,192. Priced on the blocks that are not checkpointed and on the one a checkpointed run
        recomputes (its forward runs the compiled graph again); only where traced: the model types in
        ``compiled_blocks``, 16-bit weights without autocast, every parameter trained. With Liger on, its kernels
        already keep only these tensors."""
        setup, shape, spec = ctx.setup, ctx.shape, ctx.spec
        if not (self.active(setup) and setup.task == "train" and traced_block(spec, shape)) or setup.liger_kernel:
            return terms
        saved = 0 if shape.gradient_checkpointing else block_savings(spec, shape) * spec.total_layers
        recomputed = block_savings(spec, shape, recomputed=True) if terms.recompute and shape.gradient_checkpointing else 0
        if not (saved or recomputed):
            return terms
        return terms.changed("torch.compile: Inductor recomputes the blocks' norm upcasts and SiLU instead of saving them",
                             activations=max(0, terms.activations - saved), recompute=max(0, terms.recompute - recomputed))

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"torch_compile": True} if ctx.setup.torch_compile else {}


def traced_block(spec: Any, shape: Any) -> bool:
    """Whether a compiled block of ``spec`` was traced in ``shape``'s regime: its transformers model type in
    techniques.json ``compiled_blocks``, 16-bit weights without autocast, a full fine-tune (no adapters)."""
    return (f"transformers:{spec.model_type}" in compiled_blocks().blocks and regime(shape) == "half"
            and shape.lora is None)


def compile_seconds(spec: Any, setup: Any) -> float:
    """One-off compile time of a run (not per step); matters for short runs. Zero without torch_compile."""
    if not setup.torch_compile:
        return 0.0
    layer_types = 2 if spec.sliding_window and spec.model_type in ("gemma2", "gemma3") else 1
    return constant("compile_seconds_base") + layer_types * constant("compile_seconds_per_layer_type")


TECHNIQUES = (TorchCompile(),)
