"""Training step time: FLOPs at an achievable rate, plus what cannot hide behind them.

Conventions (so numbers can be compared with papers): a token costs 2*N FLOPs forward and 4*N backward
(input grads 2*N + weight grads 2*N) over the matmul parameters N; attention scores and values cost
4*L*d_attn*s per token forward (the PaLM/Megatron count, no causal halving), twice that backward.
A recomputed forward (checkpointing, ``KernelFactors.recompute``) costs a forward's FLOPs again. LoRA skips the weight-grad half for frozen weights (~4*N);
LoRA on a MoE's fused experts runs on a merged weight instead, its experts' weight gradients included (speed/moe_lora.py).
The step is ``GA x (micro-step compute + exposed micro-step communication/offload) + step-level
communication + optimizer step``; communication hides behind compute only up to ``comm_overlap``.
"""

from __future__ import annotations

import warnings
from functools import cache

from .. import techniques
from ..errors import InvalidSetupError
from ..hardware.types import GPU, Hardware
from ..memory.analytic import training_memory
from ..memory.ledger import ledger
from ..memory.sharding import defers_grad_sync, installed_accelerate
from ..memory.types import MemoryEstimate
from ..model.code import built_by
from ..model.types import ModelSpec
from ..setup import Setup
from . import dequant, dora, moe_lora, rates, sequence_split, stacks, terms, traffic
from .rates import (
    attention_flops_fwd,
    constant,
    cpu_path,
    cpu_peak_gflops,
    efficiency,
    gpu_peak_tflops,
    half_bytes,
    host_bandwidth_gbps,
    matmul_params,
    optimizer_bytes,
    pcie_gbps,
    recomputed_matmul_params,
    ring_time,
    trainable_params,
)
from .types import Throughput


def weight_traffic_bytes(spec: ModelSpec, setup: Setup) -> float:
    """Weight bytes one micro-step streams through the GEMMs (the memory side of the roofline), LoRA's merged MoE
    expert stacks and their gradients included."""
    passes = constant("weight_passes")
    recompute = techniques.kernel_factors(setup).recompute
    n = passes["lora" if setup.lora is not None else "train"] + passes["recompute"] * recompute
    cbytes = 4 if setup.compute_dtype in ("fp32", "tf32") else 2
    return n * matmul_params(spec) * cbytes + _merged(spec, setup).bytes + _dora(spec, setup).bytes


def _merged(spec: ModelSpec, setup: Setup) -> moe_lora.MergedCost:
    return moe_lora.merged_cost(spec, setup, techniques.step_shape(setup).matmul_tokens, techniques.kernel_factors(setup).recompute)


def _dora(spec: ModelSpec, setup: Setup) -> dora.DoraCost:
    return dora.dora_cost(spec, setup, techniques.step_shape(setup).matmul_tokens, techniques.kernel_factors(setup).recompute)


def usable_bandwidth(gpu: GPU) -> float:
    """Bytes per second a step's memory-bound kernels reach: the datasheet bandwidth times memory_bandwidth_fraction."""
    return (gpu.memory_bandwidth_gbps or 0) * 1e9 * constant("memory_bandwidth_fraction")


def merged_expert_seconds(spec: ModelSpec, setup: Setup, hardware: Hardware, tp: Throughput) -> tuple[moe_lora.MergedCost, float]:
    """(one micro-step's merged-weight cost, its seconds per optimizer step) of LoRA on a MoE's fused experts
    (speed/moe_lora.py), for the plan to say what all-linear costs: its FLOPs at the step's achievable rate (``tp``)
    plus its bytes at the GPU's usable bandwidth (perfguide's plans run under HF Trainer); 0 s without a GPU."""
    merged, gpu = _merged(spec, setup), hardware.smallest_gpu
    if not merged.flops or gpu is None or setup.device == "cpu" or not tp.achievable_tflops:
        return merged, 0.0
    bw = usable_bandwidth(gpu)
    micro = merged.flops / (tp.achievable_tflops * 1e12) + (merged.bytes / bw if bw else 0.0)
    return merged, setup.gradient_accumulation_steps * micro


# --- step parts -----------------------------------------------------------------------------------

def _hybrid_time(params: float, grads: float, setup: Setup, hardware: Hardware, gpu: GPU) -> float:
    """HSDP per micro-step: FULL_SHARD's gathers and reduce-scatter run inside the node (its ring only), then each rank
    all-reduces its 1/g gradient shard with the same shard of the other nodes' replicas (torch fully_shard with a
    2-D (replicate, shard) mesh reduce-scatters in the shard group, then all-reduces in the replicate group)."""
    bus = constant("comm_bus_fraction")
    g, n = setup.num_gpus, setup.nodes
    intra_bw = hardware.intra_node_bandwidth_gbps or pcie_gbps(gpu)
    inter_bw = hardware.inter_node_bandwidth_gbps or constant("unknown_inter_node_gbps")
    intra = (2 * params + grads) * (g - 1) / g / (intra_bw * 1e9 * bus)
    return intra + 2 * (n - 1) / n * (grads / g) / (inter_bw * 1e9 * bus)


def communication(spec: ModelSpec, setup: Setup, hardware: Hardware, gpu: GPU) -> tuple[float, float, float]:
    """(seconds per micro-step, seconds per optimizer step, the part of the micro-step's that is the gradient sync) of
    data-parallel collectives, before overlap. The third is what FSDP's no_sync skips on the micro-steps before the
    last (``sharding.defers_grad_sync``)."""
    micro, step = _collectives(spec, setup, hardware, gpu)
    if not micro or not defers_grad_sync(setup, installed_accelerate()):
        return micro, step, 0.0
    if keeps_gathered_under_no_sync(setup):
        return micro, step, micro
    gathers, _ = _collectives(spec, setup, hardware, gpu, with_grads=False)
    return micro, step, micro - gathers


def keeps_gathered_under_no_sync(setup: Setup) -> bool:
    """FSDP1 SHARD_GRAD_OP under no_sync frees no unsharded parameter in backward (torch fsdp/_runtime_utils.py
    ``_should_free_in_backward``: "we do not free for strategies that do not reshard after forward as a *heuristic* to
    tradeoff higher memory for higher throughput"), so the next micro-step's forward gathers nothing: per optimizer
    step one all-gather (the first micro-step's) and one reduce-scatter (the last's), the count of one micro-step's
    collectives; the GA - 1 skipped are counted as ``deferred``. FSDP2 reshards after backward unless told not to
    (``set_reshard_after_backward``, which accelerate does not call). The memory is already the plan's: SHARD_GRAD_OP
    holds every gathered unit at the end of forward, and no_sync the unsharded gradients (memory/sharding.py)."""
    return setup.strategy == "fsdp_shard_grad_op" and setup.fsdp_version == 1


def _collectives(spec: ModelSpec, setup: Setup, hardware: Hardware, gpu: GPU, *, with_grads: bool = True) -> tuple[float, float]:
    """(seconds per micro-step, seconds per optimizer step) of the strategy's collectives; ``with_grads=False``: the
    parameter gathers alone."""
    if setup.world_size == 1 or setup.strategy in ("single", "device_map", "tp"):
        return 0.0, 0.0
    sharded_grads = 2 if setup.autocast else setup.weight_bytes
    grads = trainable_params(spec, setup) * (sharded_grads if setup.strategy != "ddp" else (4 if setup.lora else setup.weight_bytes)) if with_grads else 0
    params = spec.total_params * half_bytes(setup)

    def ring(nbytes: float, factor: float) -> float:
        return ring_time(nbytes, setup, hardware, gpu, factor)

    if setup.strategy in ("ddp", "zero1"):
        return 0.0, ring(grads, 2)
    if setup.strategy == "zero2":
        return ring(grads, 1), ring(params, 1)
    if setup.strategy == "fsdp_shard_grad_op":
        return ring(params, 1) + ring(grads, 1), 0.0
    if setup.hybrid_shard:
        return _hybrid_time(params, grads, setup, hardware, gpu), 0.0
    return 2 * ring(params, 1) + ring(grads, 1), 0.0      # zero3 / fsdp: gather fwd + bwd, scatter grads


def _compute_split(spec: ModelSpec, setup: Setup) -> tuple[float, float, float]:
    """(matmul FLOPs, attention FLOPs, model FLOPs without recompute) of one micro-step on one device."""
    shape = techniques.step_shape(setup)
    n, blocks = matmul_params(spec), recomputed_matmul_params(spec)
    tokens = shape.matmul_tokens * stacks.matmul_factor(spec, setup, n, n - blocks)   # an encoder-decoder's two lengths
    fwd_mm = 2.0 * n * tokens
    fwd_attn = attention_flops_fwd(spec, *shape.attention) * stacks.score_factor(spec, setup)
    merged = _merged(spec, setup)   # LoRA on fused MoE experts: merged weights, no per-token branch for those adapters
    weight_grads = 2.0 * n * tokens if setup.lora is None else 6.0 * (trainable_params(spec, setup) - merged.adapter_params) * tokens
    extra = _dora(spec, setup)   # DoRA's weight norm, and its base matmul again where dropout is on (speed/dora.py)
    mm = fwd_mm + 2.0 * n * tokens + weight_grads + merged.model_flops + extra.model_flops
    attn = 3.0 * fwd_attn
    model = mm + attn
    mm += merged.flops - merged.model_flops + extra.flops - extra.model_flops   # the recomputed forwards' merges, norms
    recompute = techniques.kernel_factors(setup).recompute   # forwards re-run in backward (checkpointing)
    block_tokens = shape.matmul_tokens * stacks.matmul_factor(spec, setup, blocks, 0)
    mm += recompute * 2.0 * blocks * block_tokens   # the blocks re-run; the head does not
    attn += recompute * fwd_attn
    return mm, attn, model


def _launch_ops(spec: ModelSpec, setup: Setup) -> float:
    """Eager ops the host dispatches per micro-step: the block's own, plus each LoRA-adapted Linear's adapter ops,
    peft's ParamWrapper ops on a MoE's fused experts and router, and a hybrid's DeltaNet chunk loop (averaged over the
    layers)."""
    led = ledger(spec, setup)
    per_layer = constant("cuda_ops_per_layer") + terms.lora_ops_per_layer(setup, led.lora_rank_per_layer)
    per_layer += terms.deltanet_chunk_ops(spec, setup)   # a hybrid's DeltaNet chunk loop (transformers' reference code)
    if led.experts is not None:
        per_layer += constant("param_wrapper_ops_per_moe_layer") * led.experts.moe_layers / spec.total_layers
    kernels = techniques.kernel_factors(setup)
    per_layer *= constant("recompute_ops_factor") ** kernels.recompute * kernels.launches
    per_layer *= constant("autocast_ops_factor") if setup.autocast else 1.0
    return per_layer * spec.total_layers


def training_speed(spec: ModelSpec, setup: Setup, hardware: Hardware, *, framework: str = "hf_trainer",
                   attention_kernel: str | None = None, optimizer_impl: str | None = None,
                   loss: terms.LossImpl | None = None) -> Throughput:
    """Predicted step time and tokens/s of one training Setup, before calibration: the way in is
    ``perfguide.speed.estimate_speed``, which dispatches on the task once and applies the calibration factors.

    ``framework`` is the training stack the step runs under (perfguide's plans: HF Trainer / accelerate); the
    throughput bench passes the stack each published row was measured with (efficiency.json framework_efficiency).
    ``attention_kernel`` names a fused attention kernel other than the FlashAttention-2 class that HF's sdpa and
    flash_attention_2 run (efficiency.json attention_kernel_speed): the bench's rows measured with older kernels.
    ``optimizer_impl`` names how the optimizer step is dispatched where it differs from what the Setup's optimizer
    runs today (efficiency.json optimizer_host_ops_per_tensor: pre-2.0 per-tensor loops in the bench's older rows,
    bitsandbytes before its per-parameter synchronize). ``loss`` names a loss path other than transformers'
    (torchtune's plain and chunked cross-entropy, terms.loss_bytes).
    """
    if setup.task != "train":
        raise InvalidSetupError(f"training_speed prices training steps, not task={setup.task!r}; perfguide.speed.estimate_speed prices both")
    spec = built_by(spec, setup.model_code, setup.linearized_experts)   # the layout the running code builds (litgpt: an LM head of its own)
    if setup.device == "cpu" or not hardware.has_gpu:
        return _cpu_training(spec, setup, hardware)
    local = techniques.per_rank(setup)   # sequence parallelism: each rank runs its slice, then attends over the whole
    tp = _gpu_training(spec, local, hardware, framework, attention_kernel, optimizer_impl, loss)
    if local is setup:
        return tp
    attention = _compute_split(spec, local)[1]
    return sequence_split.widened(spec, setup, local, hardware, tp, attention, attention_kernel)


def _gpu_training(spec: ModelSpec, setup: Setup, hardware: Hardware, framework: str, kernel: str | None,
                  opt_impl: str | None = None, loss: terms.LossImpl | None = None) -> Throughput:
    gpu = hardware.smallest_gpu
    assert gpu is not None, "training_speed routes GPU-less machines to the CPU model"
    peak, note = gpu_peak_tflops(gpu, setup.compute_dtype)
    if note:
        warnings.warn(note, stacklevel=3)
    tokens = techniques.step_shape(setup).matmul_tokens
    asymptote = rates.asymptote(gpu, setup)
    half = rates.half_saturation(setup, gpu)
    eff = efficiency(asymptote, tokens, spec.hidden_size, half)
    stack = rates.framework_efficiency(framework)
    rate = peak * 1e12 * eff
    mm, attn, model = _compute_split(spec, setup)
    slow = constant("quantized_matmul_slowdown").get(setup.weights_dtype, 1.0)
    gemm_attn = 0.0 if rates.fused_attention(setup) else attn * rates.causal_fraction(spec, setup) / rates.attention_efficiency(setup)
    gpu_time = mm * slow / rate + gemm_attn / rate
    fp32_rerun = _dora(spec, setup).fp32_flops   # DoRA's re-run matmul in fp32 on a pure 16-bit step: at the fp32 rate
    if fp32_rerun:
        gpu_time += fp32_rerun / (gpu_peak_tflops(gpu, "fp32")[0] * 1e12 * eff) - fp32_rerun * slow / rate
    bw = usable_bandwidth(gpu)
    pcie = pcie_gbps(gpu) * 1e9

    def gemm_rate(peak_tflops: float, fraction: float, rows: int) -> float:
        return peak_tflops * 1e12 * efficiency(fraction, rows, spec.hidden_size, half)

    @cache
    def memory() -> MemoryEstimate:
        return training_memory(spec, setup, hardware)

    extra = techniques.step_seconds(techniques.SpeedContext(spec, setup, hardware, gpu, tokens, peak, asymptote, rate, bw, pcie, gemm_rate, memory))
    gpu_time += extra.compute
    if bw:
        led = ledger(spec, setup)
        moved = weight_traffic_bytes(spec, setup) + terms.elementwise_bytes(spec, setup, framework, loss) + terms.eager_score_bytes(spec, setup)
        moved += terms.kbit_cast_bytes(spec, setup, framework)
        moved += terms.lora_bytes(setup, led.lora_inputs_per_layer, spec.total_layers)
        if setup.autocast and setup.weights_dtype == "fp32" and not setup.computes_on_16bit_copy:
            moved += 6 * matmul_params(spec) * (1 + techniques.kernel_factors(setup).recompute)   # fp32->half weight casts
        cached = terms.l2_bytes(spec, setup, gpu)   # dequantized weights the matmuls read back from L2, not DRAM
        gpu_time += (moved - cached) / bw + (cached / traffic.l2_rate(gpu) if cached else 0.0)
        gpu_time += dequant.dequant_seconds(spec, setup, gpu, bw, dequant.dequantized_params(spec, setup))   # bytes or ALU
    gpu_time = gpu_time / stack + terms.fused_attention_seconds(spec, setup, gpu, peak, attn, kernel)
    launch = _launch_ops(spec, setup) * constant("kernel_launch_s")
    micro = max(gpu_time, launch)
    comm_micro, comm_step, deferred = communication(spec, setup, hardware, gpu)
    deferred = 0.0 if extra.grads_synced_each_micro_step else deferred
    comm_micro += extra.comm   # collectives a technique adds (DPO's sharded reference gathers its weights)
    overlap = constant("comm_overlap")
    backward = micro * 2 / 3
    ga = setup.gradient_accumulation_steps
    # the micro-steps before the last skip the gradient sync under no_sync (deferred); the last one runs it
    exposed_micro = (max(0.0, comm_micro - overlap * micro) + (ga - 1) * max(0.0, comm_micro - deferred - overlap * micro)) / ga
    exposed_step = max(0.0, comm_step - overlap * backward) if setup.strategy in ("ddp", "zero1") else comm_step
    # PCIe traffic of offloading techniques; a layer's copy back waits on an idle GPU where the step drains it in backward
    fetch = extra.fetch if terms.drains_in_backward(setup) else 0.0
    off_micro = fetch + max(0.0, extra.transfer - fetch - overlap * micro)
    off_step = extra.per_step
    opt = _optimizer_seconds(spec, setup, bw, opt_impl, framework)
    parts = {
        "compute": ga * gpu_time,
        "launch-overhead": ga * max(0.0, launch - gpu_time),
        "communication": ga * exposed_micro + exposed_step,
        "offload": ga * off_micro + off_step,
        "memory-bandwidth": opt,
    }
    return _throughput(setup, parts, ga * (mm + attn), ga * model, peak, eff, comm_total=ga * comm_micro - (ga - 1) * deferred + comm_step)


def _optimizer_seconds(spec: ModelSpec, setup: Setup, bw: float, impl: str | None, framework: str = "hf_trainer") -> float:
    """The optimizer step on the GPU: the bytes it streams at the memory bandwidth, or the host time of dispatching
    its ops when that is longer (a per-tensor loop over hundreds of small tensors); fp16's GradScaler adds its pass,
    a stack's loop its own (``framework``: torchtune rescales the gradients instead of clipping them).
    bitsandbytes synchronizes after every parameter, so there its host time adds to the bytes' (terms.optimizer_sync_seconds)."""
    on_device = techniques.kernel_factors(setup).device_optimizer
    if not bw or not on_device:
        return 0.0
    moved = optimizer_bytes(spec, setup) + terms.grad_scaler_bytes(spec, setup, trainable_params(spec, setup))
    moved += terms.recipe_grad_bytes(spec, setup, framework)   # a stack's own gradient passes (torchtune's rescale)
    # today's bnb syncs per parameter, so its host work cannot overlap; ``impl`` names an older dispatch (no sync)
    drained = terms.optimizer_sync_seconds(spec, setup) if impl is None else 0.0
    if drained:
        return (moved / bw + drained) * on_device
    host = terms.optimizer_host_ops(spec, setup, impl) * constant("kernel_launch_s")
    return max(moved / bw, host) * on_device


def _cpu_training(spec: ModelSpec, setup: Setup, hardware: Hardware) -> Throughput:
    cpu = hardware.cpu
    bf16 = setup.autocast == "bf16" or setup.weights_dtype == "bf16"
    peak_g, note = cpu_peak_gflops(cpu, bf16, setup.cpu_threads)
    if note:
        warnings.warn(note, stacklevel=3)
    tokens = setup.micro_batch_size * setup.seq_len
    eff = efficiency(constant("cpu_peak_fraction")[cpu_path(cpu, bf16)], tokens, spec.hidden_size, constant("cpu_hidden_half_saturation"))
    rate = peak_g * 1e9 * eff
    mm, attn, model = _compute_split(spec, setup)
    slow = constant("quantized_matmul_slowdown").get(setup.weights_dtype, 1.0)
    compute = mm * slow / rate + attn / (rate * constant("attention_efficiency").get(setup.attn_implementation, 1.0))
    compute += weight_traffic_bytes(spec, setup) / (host_bandwidth_gbps(cpu) * 1e9)
    overhead = _launch_ops(spec, setup) * constant("cpu_op_overhead_s")
    opt = optimizer_bytes(spec, setup) / (host_bandwidth_gbps(cpu) * 1e9)
    ga = setup.gradient_accumulation_steps
    parts = {"compute": ga * compute, "launch-overhead": ga * overhead, "communication": 0.0, "offload": 0.0, "memory-bandwidth": opt}
    return _throughput(setup, parts, ga * (mm + attn), ga * model, peak_g / 1e3, eff)


def _throughput(setup: Setup, parts: dict[str, float], flops: float, model_flops: float, peak_tflops: float, eff: float,
                comm_total: float = 0.0) -> Throughput:
    """Assemble the Throughput; ``bound`` names the largest part of the step; ``comm_total`` is every collective
    before overlap (``parts['communication']`` is the exposed part)."""
    step = sum(parts.values())
    tokens = techniques.step_shape(setup).real_tokens * setup.gradient_accumulation_steps * setup.world_size
    mfu = model_flops / (step * peak_tflops * 1e12) if step > 0 else 0.0
    return Throughput(
        step_time_s=step,
        tokens_per_s=tokens / step if step > 0 else 0.0,
        flops_per_step=flops,
        compute_time_s=parts["compute"] + parts["launch-overhead"],
        comm_time_s=parts["communication"],
        comm_total_s=comm_total,
        offload_time_s=parts["offload"],
        achievable_tflops=peak_tflops * eff,
        mfu=min(1.0, mfu),
        bound=max(parts, key=lambda k: parts[k]),
    )
