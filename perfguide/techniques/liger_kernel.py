"""Liger kernels (``TrainingArguments(use_liger_kernel=True)``, also TRL): Triton kernels that fuse the LM head
with the cross-entropy (no full-vocabulary logits: one chunk of rows at a time), plus RMSNorm, RoPE and SwiGLU.

Memory: the loss path shrinks from ~b*s*V*16 bytes to one [chunk, V] tile (``memory``): the chunk is
``next_pow2(ceil(BT / ceil(V / H)))`` rows (src/liger_kernel/ops/fused_linear_cross_entropy.py), so the live tile is
about the size of the [BT, H] hidden states. Speed: the head GEMMs run on smaller chunks (lower efficiency at small
batch, where Liger's own issues report slowdowns) but the fp32 logits never stream through memory (``speed``);
both are priced, so the search takes it
only where it pays or where it is what fits. Liger patches only the model types in its dispatch table
(liger_kernel/transformers/monkey_patch.py ``MODEL_TYPE_TO_APPLY_LIGER_FN``); for any other type it logs and
does nothing, so perfguide never counts its savings there. The fused RMSNorm/SwiGLU kernels keep fewer tensors for
backward (``block_savings``), priced on the blocks that are not checkpointed and on the one a checkpointed run
recomputes in backward.
"""

from __future__ import annotations

from typing import Any

from ..data.techniques import constant
from .base import HF_TRAINERS, EmitContext, LadderContext, Requires, Technique
from .effects import MemoryContext, MemoryTerms, SpeedContext, StepSeconds
from .fused import chain_seconds_saved
from .tiled_mlp import tiles_mlp

SOURCES = (
    "https://github.com/linkedin/Liger-Kernel (src/liger_kernel/ops/fused_linear_cross_entropy.py, transformers/monkey_patch.py)",
    "Hsu et al. 2024, Liger Kernel: Efficient Triton Kernels for LLM Training (arXiv:2410.10989)",
    "https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments.use_liger_kernel",
)

#: HF model types Liger patches (MODEL_TYPE_TO_APPLY_LIGER_FN, linkedin/Liger-Kernel @ 00218a0635f3b6285ab478b631618346f9ad5ce7)
MODEL_TYPES = frozenset({
    "deepseek_v3", "gemma", "gemma2", "gemma3_text", "gemma3", "glm4", "gpt_oss", "llama", "llama4_text", "llama4", "granite",
    "mllama", "ministral", "mistral", "mixtral", "nemotron", "olmo2", "olmo3", "qwen2", "qwen3", "qwen3_moe", "qwen2_vl",
    "qwen2_5_vl", "qwen3_next", "smollm3", "phi3", "paligemma", "falcon_h1", "exaone4",
})


#: data/techniques.json rows of the bytes per token per FFN unit one block keeps less, by the dtype its MLP runs in
#: (``block_savings``; the norms' share is ``norm_savings``)
SAVED_LESS = {
    "fp32_stream": "liger_saved_less_fp32_stream_per_ffn_unit",
    "half": "liger_saved_less_half_per_ffn_unit",
    "fp32": "liger_saved_less_fp32_per_ffn_unit",
}


def supported(model_type: str) -> bool:
    return model_type in MODEL_TYPES


class LigerKernel(Technique):
    name = "liger_kernel"
    fields = ("liger_kernel",)
    summary = "fused linear cross-entropy (no full logits) and fused RMSNorm/RoPE/SwiGLU Triton kernels"
    sources = SOURCES
    requires = Requires(devices=("cuda",), tasks=("train",), packages=("liger-kernel",), binding=True,
                        trainers=HF_TRAINERS, model_codes=("transformers",))
    order = 36
    label_order = 62
    axis = True
    switch = "liger_kernel"

    def active(self, setup: Any) -> bool:
        return bool(setup.liger_kernel)

    def label_word(self, setup: Any) -> str | None:
        return "liger" if self.active(setup) else None

    def why_not(self, setup: Any, hardware: Any = None, model: Any = None) -> str | None:
        base = super().why_not(setup, hardware, model)
        if base:
            return base
        if model is not None and not supported(model.model_type):
            return f"liger-kernel has no kernels for model type {model.model_type!r} (it patches {', '.join(sorted(MODEL_TYPES)[:8])}, ...)"
        return None

    def off(self) -> dict[str, Any]:
        return {"liger_kernel": False}

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not (self.active(ctx.setup) and supported(ctx.spec.model_type)):
            return terms  # apply_liger_kernel logs and patches nothing for a model type it has no kernels for
        saved = fused_activation_savings(ctx.spec, ctx.shape)
        # checkpointed: the one block recomputed in backward runs the same kernels and keeps the same less
        recomputed = block_savings(ctx.spec, ctx.shape, recomputed=True) if terms.recompute and ctx.shape.gradient_checkpointing else 0
        note = ("Liger fused RMSNorm/SwiGLU keep fewer tensors for backward"
                + (" (in the recomputed block)" if recomputed else "")) if saved or recomputed else None
        logits = loss_bytes(ctx.spec, ctx.shape) + accumulating_head_grad_bytes(ctx.spec, ctx.setup, ctx.grad_elem_bytes)
        # the attention half keeps its norm's share of the saving (input_layernorm; the MLP half's is freed by then)
        attention = norm_bytes(ctx.spec, ctx.shape, recomputed=True) if recomputed else 0
        return terms.changed(note, logits=logits, activations=max(0, terms.activations - saved),
                             recompute=max(0, terms.recompute - recomputed), fused_swiglu=not tiles_mlp(ctx.shape),
                             attention_saved_less=terms.attention_saved_less + attention)

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        if not (self.active(ctx.setup) and ctx.setup.task == "train" and supported(ctx.spec.model_type)):
            return StepSeconds()  # an unpatched model runs HF's own loss and modules: nothing changes
        chunk_rate = ctx.gemm_rate(ctx.peak_tflops, ctx.asymptote, chunk_rows(ctx.spec, ctx.tokens))
        # under Cut Cross-Entropy Liger's fused cross-entropy is switched off (``training_args``): CCE prices the loss
        loss = 0.0 if ctx.setup.cut_cross_entropy else loss_seconds(ctx.spec, ctx.setup, ctx.tokens, ctx.rate, chunk_rate, ctx.bandwidth)
        # under torch.compile the step model already charges the chains at compile_elementwise_factor of their eager
        # bytes; Liger's kernels (opaque to Inductor) bring them the rest of the way to one fused pass
        from . import kernel_factors  # the folded factors of every active technique (compile's among them)

        scale = kernel_factors(ctx.setup).elementwise
        fused = chain_seconds_saved(ctx.spec, ctx.setup, ctx.bandwidth, eager_scale=scale)
        return StepSeconds(compute=loss - fused)

    def axis_values(self, ctx: LadderContext) -> list[dict[str, Any]]:
        wanted = ctx.wants.get("liger_kernel")
        if wanted is False or ctx.base.device != "cuda" or ctx.base.task != "train" or (ctx.model is None and not wanted):
            return [{}]
        problem = self.why_not(ctx.base, ctx.hardware, ctx.model)
        if problem:
            if wanted:
                from ..errors import ConflictingConstraintsError

                raise ConflictingConstraintsError(f"liger_kernel=True cannot run here: {problem}; use liger_kernel=False")
            return [{}]
        return [{"liger_kernel": True}] if wanted else [{}, {"liger_kernel": True}]

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        if not self.active(ctx.setup):
            return {}
        # Cut Cross-Entropy patches the model's forward (prepare_model); Liger's fused cross-entropy would patch it again
        off = {"liger_kernel_config": {"fused_linear_cross_entropy": False}} if ctx.setup.cut_cross_entropy else {}
        return {"use_liger_kernel": True, **off}

    def trl_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"use_liger_kernel": self.active(ctx.setup)}   # SFTConfig: written out both ways


def block_savings(spec: Any, shape: Any, recomputed: bool = False) -> int:
    """Bytes per micro-step one block keeps less for backward under Liger's fused RMSNorm and SwiGLU/GeGLU than
    under HF's eager modules: per token, per FFN unit (data/techniques.json ``liger_saved_less_*``) and per hidden
    unit (``norm_savings``, two norms per block).

    HF's MLP keeps ``act(gate)`` for the multiply; Liger's ``LigerSiLUMulFunction`` keeps only gate and up and
    recomputes the activation in backward (ops/swiglu.py): one intermediate-sized tensor less, in the MLP's dtype
    (fp32 in peft's kbit fp32 stream, where bitsandbytes' Linear4bit returns its fp32 input's dtype:
    activations.stream_regime). RoPE saves nothing per layer either way (cos/sin are shared). ``recomputed``: the
    block a checkpointed run recomputes in backward, where Liger's saved norm inputs are alive anyway.

    Liger's SwiGLU backward writes d(gate) and d(up) into the saved gate and up buffers. Under LoRA the gradients one
    recomputed block's backward holds at its peak do not change: traced (scripts/trace_block_backward.py --liger),
    that peak is down_proj's input-gradient sum, before the SwiGLU runs. In a full fine-tune the peak is the SwiGLU's
    backward, where HF holds the product's gradient and its factors' and Liger only the product's (traced --full):
    memory/block_backward.py prices both, told by this hook (MemoryTerms.fused_swiglu) that Liger runs the MLP.
    """
    if not supported(spec.model_type):
        return 0
    from ..memory.activations import kbit_fp32_stream, regime

    fp32_stream = kbit_fp32_stream(shape)
    case = "fp32_stream" if fp32_stream else "fp32" if regime(shape) == "fp32" else "half"
    mlp = constant(SAVED_LESS[case]) * spec.active_intermediate_size if spec.gated_mlp and not tiles_mlp(shape) else 0
    return 2 * norm_bytes(spec, shape, recomputed) + int(shape.micro_batch_size * shape.seq_len * mlp)


def norm_bytes(spec: Any, shape: Any, recomputed: bool = False) -> int:
    """Bytes per micro-step one of a block's two RMSNorms keeps less under Liger's kernel (``norm_savings``)."""
    from ..memory.activations import kbit_fp32_stream, regime

    fp32 = kbit_fp32_stream(shape) or regime(shape) != "half"
    return int(shape.micro_batch_size * shape.seq_len * norm_savings(fp32, shape.lora is None, recomputed) * spec.hidden_size)


def norm_savings(fp32_input: bool, trainable: bool, recomputed: bool) -> int:
    """Bytes per hidden unit per token one RMSNorm keeps less under Liger's kernel than HF's ``LlamaRMSNorm``.

    HF's norm computes ``weight * (x.to(float32) * rsqrt(...)).to(x.dtype)``: autograd keeps the fp32 ``x`` (a
    copy, 4 B, when ``x`` is 16-bit; ``x`` itself when it is fp32) and, when the weight is trainable, the
    normalised tensor in ``x``'s dtype. Liger's keeps ``x`` and one fp32 rstd per row (ops/rms_norm.py
    ``save_for_backward(X, RSTD)``): a 16-bit ``x`` is 2 B HF does not save, an fp32 ``x`` both keep. That is the
    whole difference wherever the block's in-flight term is measured above Liger's own saved tensors: outside the
    recomputed block, and in it for a full fine-tune (memory/block_backward.py ``full_finetune_per_token["liger"]``).
    Under LoRA the recomputed block's in-flight term is HF's for both (``in_flight_per_token``), measured above HF's
    saved tensors, and there Liger's 16-bit ``x`` is the checkpoint's input or the attention's residual sum, alive at
    HF's peak too: the hook then prices the peak difference, without Liger's 2 B.
    Traced on real CPU tensors with the liger-kernel 0.8.5 stand-ins of scripts/liger_standins.py, per hidden unit
    for a block's two norms: the recompute's saved tensors (scripts/trace_block_backward.py ``--full``, reference
    ``saved_tensors_hooks``): bf16 full fine-tune 8, fp32 weights with or without autocast 8; the peak under LoRA on
    a bf16 base 8 (``--liger``); without checkpointing (scripts/trace_liger_unchecked.py) LoRA on a bf16 base 4,
    bf16 full fine-tune 8, fp32 weights 8; nf4 in peft's fp32 stream 0. Stop 35 priced the bf16 full fine-tune's
    recompute 12, measured against the live bytes as the recompute ended (which hold the residual sum HF does not
    save), while its in-flight term left the same 4 B out."""
    if fp32_input:
        return 4 if trainable else 0
    liger_input = 0 if recomputed and not trainable else 2
    return 4 + (2 if trainable else 0) - liger_input


def fused_activation_savings(spec: Any, shape: Any) -> int:
    """Bytes per micro-step Liger's fused kernels keep less for backward across the blocks that are not
    checkpointed (``block_savings`` per block). Checkpointed blocks keep only their input, so nothing changes between
    them; the one block recomputed in backward keeps ``block_savings`` less (the ``memory`` hook, on the recompute)."""
    if shape.gradient_checkpointing:
        return 0
    return block_savings(spec, shape) * spec.total_layers


def chunk_rows(spec: Any, tokens: int) -> int:
    """Rows of logits Liger's fused linear cross-entropy materialises at once."""
    inc = -(-spec.vocab_size // max(1, spec.hidden_size))
    rows = -(-tokens // max(1, inc))
    return min(tokens, 1 << max(0, (rows - 1).bit_length()))


def loss_bytes(spec: Any, shape: Any) -> int:
    """Loss-path bytes under Liger FLCE for the computed ``shape``: one [chunk, V] logits tile and its in-place
    gradient in the compute dtype, the [BT, H] input gradient computed in forward, and the fp32 per-token loss.
    The head's weight gradient is produced here too; it is the head gradient the ledger already counts."""
    tokens = shape.micro_batch_size * shape.seq_len
    cbytes = 4 if shape.compute_dtype in ("fp32", "tf32") else 2
    return chunk_rows(spec, tokens) * spec.vocab_size * cbytes * 2 + tokens * spec.hidden_size * cbytes + tokens * 4


def accumulating_head_grad_bytes(spec: Any, setup: Any, grad_elem_bytes: int) -> int:
    """The head-weight gradient buffer Liger's fused linear cross-entropy allocates in forward
    (``grad_weight = torch.zeros_like(weight)``, ops/fused_linear_cross_entropy.py) where the head's ``.grad`` is
    already there: on every micro-step after the first of an accumulation. Autograd adds it into ``.grad`` in place
    as backward begins (AccumulateGrad) and frees it, so it lives beside the held gradients through the loss peak;
    on a first micro-step it becomes ``.grad`` itself, the head gradient the fold already counts there.

    Liger-Kernel's own benchmark measures exactly this: its FLCE rows (bench/results/kernels.md) hold the previous
    call's weight ``.grad`` and this buffer, V x H each. Priced where the head trains (no adapter) and ``.grad``
    persists whole between micro-steps: one GPU or DDP. Under FSDP and DeepSpeed the gradient's life follows their
    own hooks (sharded, or moved to buckets and ``.grad`` set to None), which this term does not price."""
    if setup.lora is not None or setup.gradient_accumulation_steps <= 1 or setup.shards_grads or setup.is_deepspeed:
        return 0
    return int(spec.vocab_size * spec.hidden_size * grad_elem_bytes)


def loss_seconds(spec: Any, setup: Any, tokens: int, rate_at: float, rate_chunk: float, bandwidth: float) -> float:
    """Seconds per micro-step Liger FLCE adds (positive) or saves (negative) against HF's loss path: the head GEMMs
    on chunks instead of all rows, minus HF's traced loss-path bytes (data/traffic.json) net of the chunk logits
    Liger writes and rewrites in place. ``rate_at`` / ``rate_chunk``: achievable FLOP/s at the full token count and
    at Liger's chunk."""
    from ..speed import traffic

    head_flops = 6.0 * tokens * spec.hidden_size * spec.vocab_size
    gemm = head_flops / rate_chunk - head_flops / rate_at
    liger = tokens * spec.vocab_size * constant("liger_flce_bytes_per_logit")
    return gemm - traffic.seconds(max(0.0, traffic.head_bytes(spec, setup) - liger), bandwidth)


TECHNIQUES = (LigerKernel(),)
