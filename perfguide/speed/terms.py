"""The GPU training step's terms that are not matmul FLOPs: bytes moved by memory-bound kernels, fused attention.

A training step on a GPU is matmuls at an achievable tensor-core (or CUDA-core) rate plus kernels that are bound
by memory bandwidth: the elementwise ops around the matmuls (norms, activations, dropout, residual adds, the
eager attention softmax over s x s scores, the fp32 loss over the vocabulary), the dequantization of a 4-bit
base, the LoRA adapters' input copies. Each is written here as bytes moved, so a test can count them by hand
and a technique (fused kernels, compile, liger) can contribute a factor on one named term. Constants:
perfguide/data/efficiency.json, each with its source (the fitted ones name the published rows they came from).
These terms read the techniques' kernel factors (recomputed forwards, fused passes), so they sit in the cost-model
fold above the techniques; the rates they divide by are speed/rates.py's. They price training micro-steps only
(speed/training.py's; the task is dispatched once, at perfguide.speed.estimate_speed).
"""

from __future__ import annotations

from typing import Literal

from .. import techniques
from ..hardware.types import GPU
from ..memory.activations import block_dims
from ..memory.kbit import kbit_fp32_parts
from ..memory.linear_attention import deltanet_share
from ..model.types import ModelSpec
from ..setup import Setup
from . import rates, traffic
from .rates import constant

_QUANT_BYTES = {"nf4": 0.5, "int8": 1.0}

#: a training stack's loss path where it is not transformers' (``loss_bytes``): torchtune's two losses
LossImpl = Literal["upcast_in_model", "chunked_upcast_in_loss"]


def fused_attention_seconds(spec: ModelSpec, setup: Setup, gpu: GPU, peak_tflops: float, attn_flops: float,
                            kernel: str | None = None) -> float:
    """Seconds the fused attention kernels of one micro-step take: the executed (causal) share of the counted
    FLOPs at the kernel's own fraction of peak (FlashAttention-2's by GPU generation; ``kernel`` names an older
    one, priced relative to it, as is FlashAttention-3 on Hopper). The stack term does not apply: the kernel, not the stack, decides its speed."""
    if not rates.fused_attention(setup) or attn_flops <= 0:
        return 0.0
    arch = rates.attention_arch(gpu)
    fraction = rates.class_constant("attention_peak_fraction", arch, gpu)
    if kernel is None and setup.attn_implementation == "flash_attention_3" and arch == "hopper":
        kernel = "flash_v3_hopper"   # FlashAttention-3 uses Hopper's wgmma / TMA, which FlashAttention-2 does not
    if kernel is not None:
        fraction *= float(constant("attention_kernel_speed")[kernel])
    if setup.packed_doc_len is not None:
        fraction *= flex_attention_speed(setup)
    return attn_flops * rates.causal_fraction(spec, setup) * flash_backward_factor(setup) / (peak_tflops * 1e12 * fraction)


def flex_attention_speed(setup: Setup) -> float:
    """FlexAttention's speed relative to FlashAttention-2 over one training micro-step's attention: its forward and
    backward fractions (``flex_attention_speed``) weighted by the executed FLOPs of each - 1 forward (+1 recomputed)
    and ``flash_backward_ratio`` backward - as a harmonic mean, since the times add. Document-masked packs
    (``Setup.packed_doc_len``) run it: torchtune hands a BlockMask to a compiled flex_attention."""
    speed = constant("flex_attention_speed")
    forward = 1.0 + techniques.kernel_factors(setup).recompute
    backward = float(constant("flash_backward_ratio"))
    return (forward + backward) / (forward / float(speed["forward"]) + backward / float(speed["backward"]))


def flash_backward_factor(setup: Setup) -> float:
    """Executed over counted attention FLOPs of a training micro-step: a flash kernel keeps no s x s matrix, so its
    backward recomputes the scores and runs 5 matmuls where the forward ran 2 (``flash_backward_ratio`` = 2.5 x the
    forward, not the 2x the MFU convention counts): (1 + 2.5 [+ 1 recompute]) / (1 + 2 [+ 1])."""
    recompute = techniques.kernel_factors(setup).recompute   # forwards re-run in backward (checkpointing)
    return (1.0 + float(constant("flash_backward_ratio")) + recompute) / (3.0 + recompute)


def elementwise_bytes(spec: ModelSpec, setup: Setup, framework: str = "hf_trainer", loss: LossImpl | None = None) -> float:
    """Bytes the memory-bound kernels of one micro-step move: every block's non-GEMM ops and the head's loss
    path, as traced on the real modules (perfguide/speed/traffic.py, data/traffic.json), times
    ``elementwise_traffic_factor`` (such small kernels reach less of the bandwidth than a streaming copy);
    checkpointing re-runs the forward's share; fused or compiled kernels cut it (``Technique.kernel_factors``).
    A stack whose eager block code differs from transformers' (``framework``) moves its own traced bytes in eager
    (``eager_block_traffic``); compiled, the fused graph's bytes do not depend on how the eager code was spelled.
    A stack whose loss path is not transformers' (``loss``) moves the bytes counted from its code (``loss_bytes``).
    Eager attention's s x s chain is ``eager_score_bytes``."""
    kernels = techniques.kernel_factors(setup)
    tokens = setup.micro_batch_size * setup.seq_len
    blocks = traffic.block_bytes(spec, setup, tokens, kernels.recompute) * eager_block_traffic(setup, framework)
    return traffic.priced(blocks * kernels.elementwise + loss_bytes(spec, setup, loss))


def loss_bytes(spec: ModelSpec, setup: Setup, loss: LossImpl | None = None) -> float:
    """Memory-bound bytes of the head's loss path in one micro-step, before ``elementwise_traffic_factor``.

    ``None``: transformers' loss (upcast and cross-entropy inside the model's forward): the traced eager bytes, cut
    by the same kernel factors as the blocks (a compiled model compiles its loss with it). The other paths are
    torchtune's (recipes/full_finetune_single_device.py), counted per logit from its code
    (efficiency.json ``compiled_loss_bytes_per_logit``): ``upcast_in_model`` - nn.CrossEntropyLoss, the model's
    forward returning ``self.output(h).float()``, so the fp32 cast stays eager outside the compiled layers and
    only the loss is compiled; ``chunked_upcast_in_loss`` - CEWithChunkedOutputLoss, the head run on
    ``chunked_loss_chunks`` slices of the tokens and the upcast compiled with each slice's cross-entropy. Eager,
    both run transformers' ops (a cast, then cross-entropy). Chunking also sums the head weight's gradient over
    the slices when the head trains (full fine-tuning): the autograd engine adds each slice's V x h gradient into
    its buffer (chunks - 1 adds, each reading two gradients and writing one), whether compiled or not."""
    kernels = techniques.kernel_factors(setup)
    traced = traffic.head_bytes(spec, setup)
    if loss is None:
        return traced * kernels.elementwise
    path = traffic.logit_count(spec, setup) * float(constant("compiled_loss_bytes_per_logit")[loss]) if kernels.fused_blocks else traced
    if loss != "chunked_upcast_in_loss" or setup.lora is not None:   # LoRA freezes the head: no weight gradient
        return path
    adds = float(constant("chunked_loss_chunks")) - 1
    return path + adds * 3 * spec.logits_width * spec.hidden_size * setup.weight_bytes


def eager_block_traffic(setup: Setup, framework: str) -> float:
    """The stack's eager block bytes over transformers' traced block (efficiency.json framework_eager_block_traffic,
    counted by bench/throughput_traffic.py); 1.0 for transformers' own modules and for any compiled block."""
    traced = constant("framework_eager_block_traffic")
    if techniques.kernel_factors(setup).fused_blocks or framework not in traced:
        return 1.0
    return float(traced[framework]) / float(traced["transformers"])


def eager_score_bytes(spec: ModelSpec, setup: Setup) -> float:
    """Eager attention runs a chain of kernels over the b x heads x s x s scores (QK^T output, scale, mask,
    softmax - in fp32 under autocast -, dropout, the cast back for AV, and each one's backward), every one a
    full read and write of the score tensor; fused kernels (SDPA, flash) keep the scores on chip. The bytes per
    score element are traced (eager minus SDPA, data/traffic.json) and priced like the other memory-bound kernels."""
    if setup.attn_implementation != "eager":
        return 0.0
    return traffic.priced(traffic.eager_score_bytes(spec, setup, techniques.kernel_factors(setup).recompute))


def dequant_bytes(spec: ModelSpec, setup: Setup, matmul_params: float) -> float:
    """bitsandbytes dequantizes a 4/8-bit base to 16 bit before every matmul that uses it: it reads the
    packed weights and writes a 16-bit copy, in forward, in the input-gradient pass, and again in the recompute."""
    q = _QUANT_BYTES.get(setup.weights_dtype)
    if q is None:
        return 0.0
    return dequant_passes(setup) * matmul_params * (q + 2) * float(constant("dequant_traffic_factor"))


def dequant_passes(setup: Setup) -> float:
    """Times a micro-step dequantizes each k-bit weight: forward, the input-gradient pass, and each recompute."""
    return 2 + techniques.kernel_factors(setup).recompute


def l2_bytes(spec: ModelSpec, setup: Setup, gpu: GPU) -> float:
    """Of the bytes one micro-step's matmuls read (``weight_traffic_bytes``), those read back from the GPU's L2
    instead of DRAM: bitsandbytes writes each Linear's dequantized 16-bit weight with one kernel (``dequant_bytes``)
    and the matmul reads it with the next, so where the in x out x 2 bytes fit in ``traffic.l2_room`` (the L2 is
    write-back: the line the dequantize wrote is still there), that read is served at ``traffic.l2_rate``, in every
    pass that dequantizes (forward, input gradient, recompute). The dequantize's own read and write stay at the DRAM
    rate. A MoE's experts are not Linears bnb quantizes one by one: left out. Chains of pointwise kernels over small
    activations were looked at and are not priced here (docs/validation.md section 52)."""
    room = traffic.l2_room(gpu)
    if not room or setup.weights_dtype not in _QUANT_BYTES:
        return 0.0
    fits = sum(n * sum(2 * i * o for name, (i, o) in linears.items() if not name.startswith("experts.") and 2 * i * o <= room)
               for linears, n in spec.linear_stacks())
    return dequant_passes(setup) * fits


def kbit_cast_bytes(spec: ModelSpec, setup: Setup, framework: str) -> float:
    """HF + PEFT QLoRA runs its residual stream in fp32: peft's prepare_model_for_kbit_training (``kbit_upcast``)
    casts the embeddings and norms to fp32, and each bitsandbytes Linear4bit casts its input to the compute dtype and
    its output back to fp32 (``kbit_cast_bytes_per_element``). In a Llama block q, k, v, gate and up cast the fp32 norm
    output (5h), down the fp32 act(gate) * up (i); q, k, v, gate, up and down cast their outputs (q + 2kv + 2i + h);
    o_proj reads attention's compute-dtype output under autocast and casts nothing. Forward, the gradients' casts in
    backward, and the recompute. Stacks that keep the base 16-bit (fsdp_qlora, torchtune, litgpt) pay none."""
    if setup.weights_dtype != "nf4" or not kbit_fp32_parts(setup) or framework != "hf_trainer":
        return 0.0
    d = block_dims(spec)
    elements = 6 * d["h"] + 3 * d["i"] + d["q"] + 2 * d["kv"]
    passes = 2 + techniques.kernel_factors(setup).recompute
    tokens = setup.micro_batch_size * setup.seq_len
    per_element = float(constant("kbit_cast_bytes_per_element"))
    return traffic.priced(passes * tokens * spec.total_layers * elements * per_element)


def lora_bytes(setup: Setup, lora_inputs_per_layer: int, layers: int) -> float:
    """Each adapted Linear copies its input through the adapter's dropout and (on a 16-bit base) an fp32 cast,
    and the backward reads and writes those copies again: ``lora_passes`` x tokens x input width x 4 bytes."""
    if setup.lora is None or not lora_inputs_per_layer:
        return 0.0
    tokens = setup.micro_batch_size * setup.seq_len
    return float(constant("lora_passes")) * tokens * lora_inputs_per_layer * layers * 4


def lora_ops_per_layer(setup: Setup, lora_rank_per_layer: int) -> float:
    """Extra eager ops per block a PEFT LoRA adds: every adapted Linear runs dropout, lora_A, lora_B, the scaling
    multiply and the add in forward, and their gradients (A's and B's weight grads included) in backward -
    ``lora_ops_per_adapted_linear`` host dispatches each, whatever the tensor size (counted by bench/host_ops.py);
    DoRA ``dora_ops_per_adapted_linear`` more (scripts/count_dora_bytes.py).
    ``lora_rank_per_layer`` is r x adapted Linears of one block (the memory ledger's count)."""
    if setup.lora is None or not lora_rank_per_layer:
        return 0.0
    per_linear = float(constant("lora_ops_per_adapted_linear"))
    if setup.lora.use_dora:   # DoRA's norm and rescaling (speed/dora.py), DoRA adapting Linears only
        per_linear += float(constant("dora_ops_per_adapted_linear")["dropout" if setup.lora.dropout > 0 else "no_dropout"])
    return per_linear * lora_rank_per_layer / setup.lora.r


def deltanet_chunk_ops(spec: ModelSpec, setup: Setup) -> float:
    """Extra eager ops per block (the depth's mean) of gated-DeltaNet layers on transformers' PyTorch reference code,
    which loops over 64-token chunks in Python: ``deltanet_reference_ops_per_chunk`` host dispatches per chunk and
    micro-step (counted by bench/host_ops.py), at the share of DeltaNet layers; flash-linear-attention's chunk kernel
    runs a sequence in a few launches (none priced here)."""
    if setup.linear_attention_kernels != "torch":
        return 0.0
    share = deltanet_share(spec)
    return share * float(constant("deltanet_reference_ops_per_chunk")) * -(-setup.seq_len // 64) if share else 0.0


def trainable_tensors(spec: ModelSpec, setup: Setup) -> int:
    """Parameter tensors the optimizer steps, the count a per-tensor optimizer loop dispatches kernels for: LoRA's
    A and B of every adapted Linear, or every block's Linear weights and norms (plus their biases in the families
    whose blocks carry them, ``biased_block_families``) and the embeddings / final norm / head outside the blocks."""
    from ..memory.ledger import ledger

    if setup.lora is not None:
        adapted = ledger(spec, setup).lora_rank_per_layer // setup.lora.r
        return 2 * adapted * spec.total_layers
    per = 2 if traffic.family_of(spec) in constant("biased_block_families") else 1
    blocks = sum((len(linears) + 2) * n for linears, n in spec.linear_stacks())   # Linears and each block's two norms
    return per * blocks + int(constant("edge_param_tensors"))


def optimizer_impl(setup: Setup) -> str:
    """How the optimizer's step is dispatched, a key of ``optimizer_host_ops_per_tensor``: torch's AdamW/SGD run one
    multi-tensor (foreach) kernel per op since torch 2.0, ``adamw_torch_fused`` one fused kernel; bitsandbytes and
    torchao step each tensor with one kernel of their own; transformers' Adafactor and the projection optimizers
    (GaLore, APOLLO, LOMO) loop over the tensors in Python, several kernels each."""
    from ..optimizer_facts import row

    assert setup.optimizer is not None
    if setup.optimizer.endswith("_fused"):
        return "fused"
    family = row(setup.optimizer).family
    return {"torch": "foreach", "bnb": "per_tensor_kernel", "torchao": "per_tensor_kernel",
            "adafactor": "adafactor"}.get(family, "per_tensor_loop")


def optimizer_host_ops(spec: ModelSpec, setup: Setup, impl: str | None = None) -> float:
    """Host-dispatched ops of one optimizer step (with the step's gradient clipping and zeroing): tensors x ops per
    tensor of the implementation (``impl``: the bench's rows measured with pre-2.0 per-tensor loops name it; None:
    what the Setup's optimizer runs today). Each costs ``kernel_launch_s`` of host time, so a model of many small
    tensors waits on the CPU, not on the bytes its step streams."""
    if setup.optimizer is None:
        return 0.0
    per_tensor = float(constant("optimizer_host_ops_per_tensor")[impl or optimizer_impl(setup)])
    return trainable_tensors(spec, setup) * per_tensor


def grad_scaler_bytes(spec: ModelSpec, setup: Setup, trainable: int) -> float:
    """fp16 autocast's GradScaler unscales the fp32 gradients once per optimizer step (one in-place foreach multiply
    with the inf check: read and write 4 bytes each); bf16 needs no scaler."""
    return 8.0 * trainable if setup.autocast == "fp16" else 0.0


def optimizer_sync_seconds(spec: ModelSpec, setup: Setup) -> float:
    """Seconds the GPU idles in one bitsandbytes optimizer step because bnb drains it after every parameter.

    ``Optimizer8bit.step`` (bitsandbytes/optim/optimizer.py, every bnb optimizer, 8- and 32-bit) loops over the
    parameters and calls ``torch.cuda.synchronize()`` after each one's update kernel; a paged optimizer first
    prefetches the parameter's two state tensors (``prefetch_state``: two ``cudaMemPrefetchAsync`` calls) and
    synchronizes once more at the end of every ``step()`` call (bitsandbytes PR #2050, 2026-08, removes the
    per-parameter sync for non-paged CUDA states only). With the queue drained each time, the next parameter's host
    work (its ``optimizer_host_ops_per_tensor`` ops and the prefetch calls, ``kernel_launch_s`` each) and the sync's
    round trip (``cuda_sync_s``) run with the GPU idle: they add to the bytes' time instead of hiding behind it.
    ``optimizer_in_backward`` (torchtune's ``optimizer_in_bwd``, one optimizer per parameter stepped from its
    gradient hook) calls ``step()`` once per parameter, so a paged optimizer pays the end-of-step sync per
    parameter too; stepped at the end of the step, it pays it once."""
    if not syncs_per_parameter(setup):
        return 0.0
    assert setup.optimizer is not None
    paged = int(rates.optimizer_row(setup.optimizer).paged)
    tensors = trainable_tensors(spec, setup)
    syncs = tensors + (tensors if techniques.kernel_factors(setup).step_per_tensor else 1) * paged
    host_ops = tensors * (float(constant("optimizer_host_ops_per_tensor")["per_tensor_kernel"]) + 2 * paged)
    return syncs * constant("cuda_sync_s") + host_ops * constant("kernel_launch_s")


def syncs_per_parameter(setup: Setup) -> bool:
    """bitsandbytes' optimizers (every bnb family row of data/optimizers.json) call ``torch.cuda.synchronize()``
    after each parameter's update (``optimizer_sync_seconds``)."""
    return setup.optimizer is not None and rates.optimizer_row(setup.optimizer).family == "bnb"


def drains_in_backward(setup: Setup) -> bool:
    """The GPU's queue is empty each time backward moves to the next layer, so what that layer's backward first
    waits on (``StepSeconds.fetch``: activation offloading's copy back) runs on an idle GPU instead of behind the
    previous layer's queued kernels.

    torchtune's ``optimizer_in_bwd`` (training/memory.py register_optim_in_bwd_hooks) steps each parameter from its
    post-accumulate-grad hook; autograd runs AccumulateGrad nodes first (torch/csrc/autograd/function.h, NOTE
    [Sequence Number]: their sequence_nr is UINT64_MAX), so a layer's hooks run - and a bnb step drains the queue -
    before the engine reaches the next layer's node, whose saved-tensor unpack (OffloadActivations) only then
    issues the host->device copy the compute stream waits for. Without the sync (torch's AdamW stepped the same
    way), the host is ahead of the GPU there and the copy overlaps the queued backward."""
    return syncs_per_parameter(setup) and techniques.kernel_factors(setup).step_per_tensor


def recipe_grad_bytes(spec: ModelSpec, setup: Setup, framework: str) -> float:
    """Bytes of a training loop's own passes over the gradients between backward and the update, relative to the one
    ``clip_grad_norm_`` read the optimizer's bytes count (rates.optimizer_bytes: the Trainer clips by default).

    torchtune's single-device recipes (recipes/full_finetune_single_device.py and lora_finetune_single_device.py
    since pytorch/torchtune#1917, 2024-10-31; at 1814feb1, the 2024-11 README's commit) multiply the loss by the
    batch's token count and, unless ``optimizer_in_bwd``, rescale every gradient once the step's backward is done:
    ``training.scale_grads(model, 1 / num_tokens)``, an in-place ``p.grad *= scaler`` per parameter (read and write
    each gradient: 2 passes). Their configs leave ``clip_grad_norm`` unset (None), so nothing reads the norm; with
    ``optimizer_in_bwd`` the recipe does neither (0 passes). Before #1917 (the 2024-09 README rows) the recipes did
    not rescale; those priced rows are LoRA, whose adapters' pass is under 0.1 ms, so the key is the stack, not the
    release."""
    if framework != "torchtune" or setup.optimizer is None:
        return 0.0
    passes = 0 if techniques.kernel_factors(setup).step_per_tensor else 2
    return (passes - 1) * rates.trainable_bytes(spec, setup)
