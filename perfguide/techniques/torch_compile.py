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
from ..memory.ledger import ledger
from ..memory.lora_activations import adapter_dtype_bytes
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
        already keep only these tensors.

        PEFT LoRA on the frozen 16-bit block (traced, ``compiled_blocks`` keys ``...:lora:...``): the frozen norms
        keep their fp32 upcast eager (no normalised copy: the weight takes no gradient) and their 16-bit input
        compiled, 2 B per hidden unit per norm, SiLU(gate) 2 B per FFN unit (``block_savings`` with adapters); and
        fp32 adapters without dropout each cast their input to fp32 eager, which the graph casts once per tensor
        (q / k / v, gate / up: ``lora_cast_savings``). Dropout gives each adapter its own mask and dropped copy, which
        the graph keeps as eager does. Not priced: LoRA with checkpointing (the recomputed block's peak is
        memory/block_backward.py's in-flight term, not traced compiled), DoRA, a k-bit base (QLoRA: bitsandbytes'
        4-bit matmul does not run on CPU), autocast."""
        setup, shape, spec = ctx.setup, ctx.shape, ctx.spec
        if not (self.active(setup) and setup.task == "train" and traced_block(spec, shape)) or setup.liger_kernel:
            return terms
        if shape.lora is not None and shape.gradient_checkpointing:
            return terms
        per_block = block_savings(spec, shape) + lora_cast_savings(spec, shape)
        saved = 0 if shape.gradient_checkpointing else per_block * spec.total_layers
        recomputed = block_savings(spec, shape, recomputed=True) if terms.recompute and shape.gradient_checkpointing else 0
        if not (saved or recomputed):
            return terms
        return terms.changed("torch.compile: Inductor recomputes the blocks' norm upcasts and SiLU instead of saving them",
                             activations=max(0, terms.activations - saved), recompute=max(0, terms.recompute - recomputed))

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"torch_compile": True} if ctx.setup.torch_compile else {}


def traced_block(spec: Any, shape: Any) -> bool:
    """Whether a compiled block of ``spec`` was traced in ``shape``'s regime: its transformers model type in
    techniques.json ``compiled_blocks``, 16-bit weights without autocast; a full fine-tune, or PEFT LoRA (fp32 or
    the base's 16-bit adapters, any targets and dropout) on a 16-bit base where a ``<code>:<type>:lora:`` block was
    traced, not DoRA, transformers' model code."""
    blocks = compiled_blocks().blocks
    if f"transformers:{spec.model_type}" not in blocks or regime(shape) != "half":
        return False
    lora = shape.lora
    if lora is None:
        return True
    return (any(k.startswith(f"transformers:{spec.model_type}:lora:") for k in blocks) and not lora.use_dora
            and shape.weights_dtype in ("bf16", "fp16") and shape.autocast is None and shape.model_code == "transformers"
            and not spec.is_encoder_decoder)


def lora_cast_savings(spec: Any, shape: Any) -> int:
    """Bytes per micro-step one compiled LoRA block keeps less than eager for its adapters' inputs: fp32 adapters
    without dropout keep each adapted Linear's fp32 cast of its input eager (peft ``_cast_input_dtype``, a new tensor
    per Linear), and the compiled graph one cast per input tensor (the casts of one tensor are one node after
    tracing): 4 B per element of the reads that share a tensor (ledger ``shared_inputs_per_layer``). 16-bit adapters
    share the tensor eager too (lora_activations.input_is_shared); dropout makes a copy per adapter either way."""
    if shape.lora is None or shape.lora.dropout > 0 or adapter_dtype_bytes(shape) != 4:
        return 0
    return shape.micro_batch_size * shape.seq_len * ledger(spec, shape).shared_inputs_per_layer * 4


def compile_seconds(spec: Any, setup: Any) -> float:
    """One-off compile time of a run (not per step); matters for short runs. Zero without torch_compile."""
    if not setup.torch_compile:
        return 0.0
    layer_types = 2 if spec.sliding_window and spec.model_type in ("gemma2", "gemma3") else 1
    return constant("compile_seconds_base") + layer_types * constant("compile_seconds_per_layer_type")


TECHNIQUES = (TorchCompile(),)
