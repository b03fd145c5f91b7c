"""The fast analytic memory model of one training step, per device.

Every term follows from the Setup: weight storage from ``weights_dtype`` (int8/nf4 only for block Linears),
trainable tensors from ``lora``, optimizer state from ``optimizer`` (optimizers.py), activations from the
per-family coefficients (activations.py), then sharding (sharding.py), the techniques' hooks (CPU offload's
``place``, checkpointing's and the others' ``memory``: techniques/) and the allocator/context
layers (overhead.py). The peak is the maximum over the step's phases, not the sum of components:

* end of forward / start of backward: weights + optimizer state + activations + loss buffers
  (+ gradients when accumulating over several micro-batches: they survive between micro-batches; with
  checkpointing + the rotary pair(s) and the batch, block_backward.step_input_bytes);
* with checkpointing, the first recompute in backward: the same minus the loss buffers plus one block's full
  activations. The loss buffers die with the head's backward, before autograd reaches the top block and
  re-runs it (torch.utils.checkpoint recomputes lazily, on the first unpack of a saved tensor); traced
  steps show the two never coincide;
* end of backward: weights + optimizer state + all gradients (+ the last checkpointed block's recompute, its input
  and its incoming gradient: block_backward.recompute_start_bytes, which also prices the top block's incoming
  gradient, the rotary cos / sin and the batch at the first recompute);
* optimizer step: weights + gradients + state + the step's temporaries (foreach AdamW: a parameter-sized
  sqrt buffer). On the first step the state is created here, so steady state and first step coincide.

Autocast with fp32 weights: torch autocast casts each weight per op; the 16-bit copy is saved for backward
by the matmul, so without checkpointing every block's Linear copies stay alive until backward
(a FakeTensor trace of the step, memory/trace.py: +6.6 GiB forward peak for a 7B model). We count them as activations; with
checkpointing only the recomputed block's copies exist. Not under FSDP or DeepSpeed mixed precision
(``Setup.computes_on_16bit_copy``): they run the model on 16-bit copies, so autocast casts nothing
(activations.regime; traced in scripts/trace_fsdp_mixed_precision.py).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache, partial

from .. import techniques
from ..errors import InvalidSetupError
from ..hardware.types import Hardware
from ..model.code import built_by
from ..model.linears import linear_params, linear_shapes
from ..model.types import ModelSpec
from ..setup import QUANTIZED, Setup
from . import activations as act
from . import block_backward, eras
from .audio import front_end_bytes
from .autocast_copies import adapter_cast_bytes, autocast_cached_casts, head_cast_bytes
from .block_backward import block_backward_bytes, expert_loop_saved_bytes, first_step_pending_params, recompute_start_bytes, step_input_bytes
from .bnb_inputs import quantized_matmul_keeps_inputs
from .fsdp_window import Window, fsdp_window, traced_runtime, unit_grad_bytes
from .ledger import DTYPE_BYTES, NF4_BLOCK, Ledger, ledger, nf4_quant_state_bytes, quantized_weight_bytes
from .linear_attention import linear_block_excess
from .lora_activations import dora_norm_bytes, lora_layer_bytes
from .loss_path import forward_loss_bytes, installed_transformers, release_delta_bytes
from .masks import checkpointed_mask_bytes, eager_backward_transient_bytes, sdpa_bias_bytes
from .moe_lora import expert_lora_block_excess, expert_lora_bytes, merged_stack_grad_bytes
from .optimizers import OptimizerCost, optimizer_cost
from .overhead import to_estimate
from .seq2seq import stack_activation_bytes
from .sharding import (
    DEEPSPEED,
    States,
    deepspeed_bf16_master,
    deepspeed_half,
    idle_grad_pool_bytes,
    installed_accelerate,
    no_sync_grads,
    offload_staging_bytes,
    per_device,
    per_tensor_state_tails,
    unsharded_compute_copies,
)
from .t5_releases import t5_release_bytes
from .top_of_stack import block_dequant_bytes, final_norm_bytes, loss_peak_dequant_bytes
from .types import MemoryEstimate
from .zero3_window import zero3_buffer_bytes, zero3_copy_bytes, zero3_knobs, zero3_step_release
from .zero_runtime import backward_only_bucket_bytes, early_head_grad_bytes, installed_deepspeed, step_only_fp32_grads, sub_group_step_bytes


def _gather_bytes(spec: ModelSpec, setup: Setup, checkpointed: bool = True) -> tuple[int, int]:
    """(ZeRO-3/FSDP per-rank gathered bytes through backward, full unsharded 16-bit weights for SHARD_GRAD_OP);
    ``checkpointed``: ZeRO-3's trace with the blocks' recompute (training_memory prices the other trace once it knows
    nothing is recomputed). FULL_SHARD FSDP holds less at the loss: ``_loss_gather_bytes``."""
    per_block = sum(i * o * n for _, i, o, n in linear_shapes(spec)) // spec.total_layers
    largest = max(per_block, spec.embedding_params, spec.lm_head_params)
    cbytes, stored = _gathered_widths(setup)
    if setup.strategy == "zero3":   # the coordinator's gathered window (QLoRA's packed storage), the ipg bucket, one gradient in flight
        trainable = ledger(spec, setup).trainable
        knobs, release = zero3_knobs(spec), installed_deepspeed()   # the release: offloaded gathers' copies
        return (zero3_buffer_bytes(spec, setup, trainable, knobs, checkpointed=checkpointed, release=release,
                                   params_offloaded=techniques.weights_on_host(setup)),
                int(spec.total_params * stored))
    if (window := _fsdp_windows(spec, setup)) is not None:
        return window.backward, int(spec.total_params * stored)
    # current + prefetched unit in compute dtype, plus the unit's unsharded gradient before reduce-scatter (FSDP1 over
    # quantized weights: not traced live)
    return 2 * largest * cbytes + largest * 4, spec.total_params * cbytes


def _gathered_widths(setup: Setup) -> tuple[int, float]:
    """(compute bytes per element, bytes per element as a unit is gathered: packed for 8- and 4-bit storage)."""
    cbytes = 2 if (setup.autocast or setup.weights_dtype != "fp32") else 4
    return cbytes, (0.5 + 4 / NF4_BLOCK) if setup.weights_dtype == "nf4" else 1.0 if setup.weights_dtype == "int8" else cbytes


def _fsdp_windows(spec: ModelSpec, setup: Setup) -> Window | None:
    """FULL_SHARD FSDP's (at the loss, through backward) bytes (memory/fsdp_window.py), where traced: 16- and 32-bit
    weights, and FSDP2 LoRA, which gathers each parameter as stored (NF4 stays packed: 0.5 B + absmax per 64, frozen
    weights get no unsharded gradient; torch distributed/fsdp/_fully_shard, per-parameter DTensor), on torch 2.x's
    runtime (fsdp_window.traced_runtime), sharded over more than one GPU (one rank gathers nothing: FSDP1 there runs
    NO_SHARD, sharding.unsharded_compute_copies). None otherwise."""
    fsdp2_lora = setup.lora is not None and setup.fsdp_version == 2
    if not (setup.is_fsdp and setup.gathers_params and setup.shard_degree > 1 and (setup.weights_dtype in DTYPE_BYTES or fsdp2_lora)
            and traced_runtime()):
        return None
    cbytes, stored = _gathered_widths(setup)
    per_block = sum(i * o * n for _, i, o, n in linear_shapes(spec)) // spec.total_layers
    adapters = ledger(spec, setup).trainable_params // spec.total_layers if setup.lora is not None else 0
    # FSDP1 LoRA: the whole unit gets a gradient (frozen_params_get_grads); FSDP2 LoRA: its adapters
    trained = adapters if fsdp2_lora else per_block + adapters
    return fsdp_window(spec, setup, stored, 2 if fsdp2_lora else cbytes, trained, adapters * cbytes)


def _loss_gather_bytes(spec: ModelSpec, setup: Setup, through_backward: int) -> tuple[int, int]:
    """(allocated, reserved beside it on the all-gather stream) of the gathered window at the loss: FULL_SHARD FSDP's
    root unit alone and its decoder units' idle blocks (fsdp_window.Window); ZeRO-3's and the untraced layouts'
    window as through backward (``through_backward``), nothing beside it."""
    window = _fsdp_windows(spec, setup)
    return (through_backward, 0) if window is None else (window.at_loss, window.idle_pool)


def frozen_params_get_grads(setup: Setup) -> bool:
    """FSDP1 LoRA whose adapters share their block's unit (``use_orig_params=True`` under accelerate's transformer wrap
    alone, Lightning Fabric: ``Setup.fsdp_adapter_units``): frozen weights get grads. The HF Trainer wraps each
    trainable leaf apart (peft's fsdp_auto_wrap_policy), and FSDP2 (``fully_shard``, perfguide's plans) shards each
    parameter on its own: frozen ones get none there. PEFT's FSDP guide says why its example sets
    ``use_orig_params: false`` and that policy ("to realize GPU memory savings"), and measures Llama-2-70B LoRA on
    8 x H100 at 72-80 GB per GPU (docs/source/accelerate/fsdp.md), which the frozen gradients would put at 251 GiB.

    The frozen base and the adapters share each block's FlatParameter, which then requires grad; in forward
    FSDP hands the module plain views of it (``_use_unsharded_views(as_params=False)``, torch
    distributed/fsdp/_flat_param.py), so autograd computes and FSDP reduce-scatters a gradient for every
    weight of a unit holding an adapter (not the all-frozen root: _states), and each frozen Linear keeps its
    input. The FSDP docs say it: mixing frozen and trainable parameters in one unit makes "the gradient memory
    usage ... equivalent to not
    freezing those parameters". Measured: litgpt LoRA + FSDP rows (https://github.com/Lightning-AI/litgpt/blob/main/tutorials/resource-tables.md) barely drop with N.
    """
    wrapped_apart = setup.fsdp_adapter_units if setup.fsdp_adapter_units is not None else setup.model_code != "litgpt"
    return (setup.lora is not None and setup.is_fsdp and setup.weights_dtype in DTYPE_BYTES and setup.fsdp_version == 1
            and not wrapped_apart)


def _states(spec: ModelSpec, setup: Setup, led: Ledger) -> tuple[States, OptimizerCost]:
    def cost_at(param_bytes: int | None) -> OptimizerCost:
        """The trainable tensors' state cast to ``param_bytes`` (DeepSpeed's masters), or each at its own width (None)."""
        groups = list(led.trainable) if param_bytes is None else [replace(g, width=None) for g in led.trainable]
        return optimizer_cost(setup.optimizer, groups, param_bytes or led.param_bytes, embedding_32bit=setup.bnb_embedding_override)

    if setup.strategy in DEEPSPEED and setup.lora is None and setup.weights_dtype == "bf16":   # pure bf16, bf16 masters
        cost = cost_at(2)
        return deepspeed_bf16_master(led.param_count, led.trainable_params, cost.states, setup.zero_stage or 1), cost
    if setup.strategy in DEEPSPEED and setup.weights_dtype in QUANTIZED and setup.lora is not None:
        # QLoRA under ZeRO-3 (PEFT's recipe): the packed 4-bit storage (bnb_4bit_quant_storage=bf16) is partitioned as
        # it is stored, the rest of the base and the adapters are cast to 16 bit, and the optimizer keeps fp32 masters
        # and fp32 gradients of the adapters only (deepspeed_half's 2 + 4 + 4 + states per trainable parameter)
        cost = cost_at(4)
        base = quantized_weight_bytes(spec, setup.weights_dtype, upcast=False, experts=setup.quantized_experts)
        return States(base + 2 * led.trainable_params, 2 * led.trainable_params, cost.states + 8 * led.trainable_params,
                      led.trainable_params, 2), cost
    if setup.strategy in DEEPSPEED and (setup.autocast or setup.weights_dtype in ("bf16", "fp16")):
        cost = cost_at(4)
        return deepspeed_half(led.param_count, led.trainable_params, cost.states), cost
    cost = cost_at(None)
    grads, elements = led.trainable_bytes, led.trainable_params
    if frozen_params_get_grads(setup):
        # the root unit (embedding, head) holds no adapter, so its FlatParameter needs no gradient (traced: FSDP1 LoRA
        # reduce-scatters none for it, scripts/trace_fsdp_live_peak.py), unless modules_to_save trains a copy there
        frozen = spec.total_params - (0 if setup.lora and setup.lora.modules_to_save else spec.embedding_params + spec.lm_head_params)
        grads += frozen * DTYPE_BYTES[setup.weights_dtype]
        elements += frozen
    return States(led.weight_bytes, grads, cost.states, led.trainable_params, led.param_bytes, elements), cost


#: where a 4-bit base comes from: bitsandbytes (perfguide's plans: BitsAndBytesConfig) or torchao's NF4Tensor (torchtune)
NF4_LIBRARIES = ("bitsandbytes", "torchao")


def replicated_quant_state(spec: ModelSpec, setup: Setup, nf4_library: str = "bitsandbytes", *, offloaded: bool) -> int:
    """Bytes of bnb's 4-bit statistics each FSDP rank holds on its device beyond the share the ledger gives it.

    FSDP flattens, shards and CPU-offloads ``nn.Parameter`` s only: FSDP1 builds its FlatParameter from the unit's
    parameters and, with ``offload_params``, moves just that flat shard to the CPU (torch distributed/fsdp/
    _init_utils.py ``_init_param_handle_from_params``: ``handle.shard()`` then ``handle.flat_param_to(cpu)``),
    after ``_move_module_to_device`` put the whole module on the GPU, where ``Params4bit.to`` carried its
    ``quant_state`` along (bitsandbytes nn/modules.py). The absmax statistics (ledger.nf4_quant_state_bytes) are a
    Python attribute, so every rank keeps the whole model's on its GPU: sharded runs hold ``QS - QS/N`` more than
    an even split, offloaded runs hold all of ``QS`` (Llama-2-70B: 1.09 GB per GPU) although their weights are on
    the CPU. torchao's NF4Tensor is itself the parameter and shards its scalers (torchtune), so nothing extra.
    DeepSpeed ZeRO-3 likewise partitions and offloads parameters only (``_convert_to_zero_parameters`` takes
    ``module.parameters()``; 0.14.4 has no bitsandbytes case), and transformers quantizes the model onto each rank's GPU
    before ``deepspeed.initialize`` (no ``zero.Init`` for a quantized model), so QLoRA under ZeRO-3 keeps it whole too.
    """
    if nf4_library not in NF4_LIBRARIES:
        raise InvalidSetupError(f"nf4_library must be one of {', '.join(NF4_LIBRARIES)}, not {nf4_library!r}")
    if not ((setup.is_fsdp or setup.strategy == "zero3") and setup.weights_dtype == "nf4" and nf4_library == "bitsandbytes"):
        return 0
    qs = nf4_quant_state_bytes(spec)
    return qs if offloaded else qs - qs // setup.shard_degree   # ``offloaded``: CPU offload placed the flat shards on the host


def zero3_load_bytes(spec: ModelSpec, setup: Setup) -> int:
    """Under ZeRO-3 a model not built under zero.Init is whole on every GPU before DeepSpeed partitions it:
    ``deepspeed.initialize`` casts it to the engine's 16-bit dtype and moves it whole to the device, and only then
    does ZeRO-3 split it (runtime/engine.py ``_configure_distributed_model``: 0.8.0 ``module.half()`` /
    ``.bfloat16()`` then ``module.to(device)``; 0.19.8 skips the move only where a parameter has ``ds_id``).
    transformers builds under zero.Init only when a ZeRO-3 config exists as from_pretrained runs, never for a
    bitsandbytes model (huggingface/peft#2016, bitsandbytes-foundation/bitsandbytes#1249: 'parameters first fully
    loaded to each GPU and then sharded'), so a quantized base always loads whole. A lower bound: the stored
    weights, without peft's fp32 upcast that the engine later casts back."""
    if setup.strategy != "zero3" or (setup.zero3_init and not setup.quantized):
        return 0
    led = ledger(spec, setup)
    if setup.quantized or setup.autocast not in ("bf16", "fp16"):
        return led.weight_bytes   # the ledger already holds the engine's cast of a quantized base's fp32 parts
    return int(led.param_count * DTYPE_BYTES[setup.autocast])   # every floating parameter cast first, adapters too


def training_memory(spec: ModelSpec, setup: Setup, hardware: Hardware | None = None, *,
                    loss_bytes: int | None = None, bnb_version: str | None = None,
                    grads_persist: bool = False, nf4_library: str = "bitsandbytes", resident_bytes: int = 0,
                    block_code_bytes: int = 0, accelerate_version: str | None = None) -> MemoryEstimate:
    """Per-device memory of one step of ``setup`` for ``spec`` (see the module docstring for the phases).

    ``loss_bytes`` replaces the loss-path buffers (default: HF's fp32 cross-entropy on full logits, see
    activations.logits_bytes) for training loops that compute their loss differently, e.g. a benchmark's
    ``logits.sum()`` or litgpt's chunked cross-entropy; the phase maximum is then taken with it.
    ``bnb_version`` is the bitsandbytes release of a quantized run (None: a current one), see
    quantized_matmul_keeps_inputs. ``grads_persist``: the loop zeroes gradients in place instead of freeing them
    (``zero_grad(set_to_none=False)``, torch.optim's and nn.Module's default before PyTorch 2.0, which HF Trainer
    and accelerate loops of that time called), so the previous step's gradients are allocated through forward.
    ``nf4_library``: which library quantized an nf4 base (replicated_quant_state). ``accelerate_version``: the
    accelerate release that drove the loop (None: the installed one), which decides whether FSDP2 accumulates
    unsharded gradients (sharding.no_sync_grads). ``block_code_bytes``: what the
    run's own block code saves for backward beyond transformers' modules (a framework's attention), counted with the
    activations.
    """
    if setup.task != "train":
        raise InvalidSetupError(f"training_memory prices training steps, not task={setup.task!r}; perfguide.memory.estimate_memory prices both")
    if setup.strategy in ("device_map", "tp"):
        raise InvalidSetupError(f"strategy {setup.strategy!r} is for inference; for training use single, ddp, zero1, zero2, zero3, fsdp or fsdp_shard_grad_op")
    spec = built_by(spec, setup.model_code, setup.linearized_experts)   # the layout the running code builds (litgpt: an LM head of its own)
    split = setup.sequence_ranks   # ranks that split each sequence (a technique's)
    setup = techniques.per_rank(setup)   # sequence parallelism: one rank's slice of each sequence
    led = ledger(spec, setup)
    states, cost = _states(spec, setup, led)
    gather, unsharded = _gather_bytes(spec, setup)
    on_device = per_device(states, setup, gather, unsharded)
    dev = techniques.placed(setup, on_device)   # CPU offload moves states to host RAM
    offloaded = dev.cpu_ram > on_device.cpu_ram   # read from the placement, not from the offload technique's switches
    # the caching allocator's unsplit segment tails of per-parameter state tensors (sharding.unsplit_tail_bytes)
    state_tails, grad_tails = (0, 0) if offloaded else per_tensor_state_tails(spec, setup, led, dev.optimizer)
    staging = offload_staging_bytes(spec, setup, params_offloaded=dev.weights < on_device.weights)   # H2D copies' pool
    params_off = dev.weights < on_device.weights   # ZeRO-3 can offload the optimizer alone; the absmax follows the weights
    kept = replicated_quant_state(spec, setup, nf4_library, offloaded=params_off)   # bnb's absmax: whole on every GPU under FSDP / ZeRO-3
    if kept:
        # the even share placed() sent to host RAM with the offloaded weights stays on the device instead
        moved = nf4_quant_state_bytes(spec) // setup.shard_degree if params_off else 0
        dev = replace(dev, weights=dev.weights + kept, cpu_ram=max(0, dev.cpu_ram - moved * setup.num_gpus),
                      notes=(*dev.notes, f"bnb 4-bit absmax replicated on every GPU under FSDP and ZeRO-3 (+{kept / 1e9:.2f} GB)"))

    shape = techniques.shaped(setup)   # padding-free: the micro-batch as one row of its real tokens
    # under FSDP1 + LoRA every frozen Linear keeps its input for the weight gradient FSDP computes anyway (the input
    # an uncast, undropped adapter keeps too: lora_activations.lora_layer_bytes ``base_keeps_inputs``)
    lora_extra = lora_layer_bytes(shape, led.lora_inputs_per_layer, led.lora_rank_per_layer, led.dora_outputs_per_layer,
                                  led.dora_weights_per_layer, padded_outputs_per_layer=led.padded_outputs_per_layer,
                                  shared_inputs_per_layer=led.shared_inputs_per_layer, base_keeps_inputs=frozen_params_get_grads(setup),
                                  attention_output_inputs_per_layer=led.attention_output_inputs_per_layer)
    act_setup = shape.replace(lora=None) if frozen_params_get_grads(setup) else shape
    keeps_inputs = quantized_matmul_keeps_inputs(setup, bnb_version)
    expert_args = (spec, shape, led.experts, led.param_bytes, act_setup.lora is not None and not keeps_inputs, act.regime(shape))
    lora_extra += expert_lora_bytes(*expert_args)
    acts, per_layer = stack_activation_bytes(spec, act_setup, lora_extra, keeps_inputs)
    if kv_extra := block_backward.replicated_kv_bytes(spec, shape, split):   # Ulysses' repeated K/V heads, saved per block
        acts, per_layer = acts + kv_extra * spec.num_layers, per_layer + kv_extra
    per_layer += linear_block_excess(spec, act_setup, act.regime(act_setup))   # one block: a hybrid's largest
    per_layer += act.widest_layer_excess(spec, act_setup, keeps_inputs)   # Gemma-4's full-attention layers
    step_temp = 0 if dev.optimizer == 0 else cost.step_temp // (setup.world_size if setup.strategy in ("zero1", "zero2", "zero3", "fsdp", "fsdp_shard_grad_op") else 1)
    largest = max((g.numel for g in led.trainable), default=0)
    # the largest gradient's width: its own where the step keeps the ledger's widths (not DeepSpeed's 16-bit casts)
    grad_elem = led.largest_width if states.grad_elem_bytes == led.param_bytes else states.grad_elem_bytes
    shares = cache(partial(act.mlp_shares, spec, act_setup, keeps_inputs))   # read where a hook or the flash term needs them
    ctx = techniques.MemoryContext(spec, setup, shape, largest, grad_elem, led.trainable_params, cost.states,
                                   dev.optimizer, per_layer, shares)
    base_logits = act.logits_bytes(spec, shape)
    terms = techniques.memory_terms(ctx, techniques.MemoryTerms(
        activations=acts, extra_activations=0, logits=base_logits, grads=dev.grads, step_temp=step_temp,
        optimizer_on_device=dev.optimizer, cpu_ram=dev.cpu_ram,
        weight_casts=linear_params(spec) * 2 if act.regime(setup) == "amp" else 0))
    acts = terms.activations + terms.extra_activations + terms.weight_casts + (head_cast_bytes(spec, setup) if terms.head_cast_saved else 0)
    acts += block_code_bytes
    acts += unsharded_compute_copies(spec, setup, gather, params_offloaded=dev.weights < on_device.weights)   # FSDP1 on one rank with offload keeps every copy
    recompute = terms.recompute
    acts += front_end_bytes(spec, shape, checkpointed=recompute > 0)   # Whisper's log-mel batch and conv chain (memory/audio.py)
    recompute += expert_lora_block_excess(*expert_args) if recompute else 0   # the recomputed block an adapted MoE layer
    era = eras.attention_era_bytes(spec, shape, installed_transformers() or "0", checkpointed=recompute > 0)   # older attention code (OPT < 4.49)
    era += t5_release_bytes(spec, shape, installed_transformers() or "0", checkpointed=recompute > 0)   # T5 softmax, fp16 clamp
    era += expert_loop_saved_bytes(spec, shape, installed_transformers(), checkpointed=recompute > 0)   # transformers 4's MoE loop
    acts, recompute = (acts, recompute + era) if recompute else (acts + era, recompute)
    adapter_casts = adapter_cast_bytes(shape, led.linear_adapter_params)   # saved, or cached to the forward's end
    cached_casts = autocast_cached_casts(spec, setup, terms.weight_casts) + adapter_casts if recompute else 0
    acts += 0 if recompute else adapter_casts
    acts += checkpointed_mask_bytes(spec, shape) if recompute else 0   # the 4-D masks checkpointed blocks keep (masks.py)
    acts += 0 if recompute else sdpa_bias_bytes(spec, shape, checkpointed=False)   # each sliding layer's SDPA bias
    logits = loss_bytes if loss_bytes is not None else terms.logits
    release_notes: tuple[str, ...] = ()
    hf_loss = loss_bytes is None and terms.logits == base_logits   # HF's own loss: the installed release decides its copies
    if hf_loss:
        release = installed_transformers()
        delta = release_delta_bytes(spec, shape, release)
        logits += delta
        if delta:
            release_notes = (f"transformers {release} keeps one more copy of the logits at batch > 1 than the release "
                             f"the loss term was traced on (+{delta / 2**30:.1f} GiB)",)
        logits += eras.training_cache_bytes(spec, shape, release, checkpointed=recompute > 0) if release else 0   # a returned KV cache (old GPT-2)
    dequant = block_dequant_bytes(spec, setup)   # a block's matmul, beside its recompute (top_of_stack.py)
    # or, recomputed, a DoRA Linear's weight norm (its forward runs in the recompute; lora_activations.dora_norm_bytes)
    dequant = max(dequant, dora_norm_bytes(shape, led.dora_largest) if recompute else 0)
    in_flight = block_backward_bytes(spec, shape, installed_transformers(), terms.fused_swiglu, terms.mlp_tokens) if recompute else 0   # its gradients (block_backward.py)
    in_flight = max(in_flight, merged_stack_grad_bytes(led.experts, act.regime(shape)))   # or an adapted MoE stack's gradient
    if flash := block_backward.flash_backward_bytes(spec, shape, split) if recompute else 0:   # or its attention's, the MLP half freed by then
        in_flight = max(in_flight, per_layer - shares()[1] - terms.attention_saved_less + flash - terms.recompute)
    in_flight += sdpa_bias_bytes(spec, shape, checkpointed=True) if recompute else 0   # + its SDPA bias, recompute to backward
    grads, step_temp, optimizer_on_device, cpu_ram = terms.grads, terms.step_temp, terms.optimizer_on_device, terms.cpu_ram
    grad32 = step_only_fp32_grads(setup, led.trainable_params) if optimizer_on_device else 0   # + its flat 16-bit copy in step()
    optimizer_on_device, step_temp = optimizer_on_device - grad32, sub_group_step_bytes(setup, led.trainable_params, led.trainable, step_temp + grad32 * 3 // 2)
    # resident_bytes: held beside the weights in every phase, e.g. an older release's per-block mask buffers (a benchmark)
    ipg_priced = backward_only_bucket_bytes(setup, states.trainable_params, states.grad_elem_bytes)   # in dev.buffers
    ipg = backward_only_bucket_bytes(setup, states.trainable_params, states.grad_elem_bytes, installed_deepspeed())   # ZeRO-1/2: backward only
    buffers = dev.buffers - ipg_priced + resident_bytes + eras.attention_buffer_bytes(spec, shape, installed_transformers() or "0")
    buffers -= gather - _gather_bytes(spec, setup, checkpointed=False)[0] if setup.strategy == "zero3" and not recompute else 0
    resident = dev.weights + terms.extra_weights + optimizer_on_device + buffers + state_tails
    # FSDP no_sync: unsharded until the last micro-step (FSDP2: from the accelerate release that turns its sync off)
    accumulated = grads if terms.grads_synced_each_micro_step else no_sync_grads(
        setup, states, grads, accelerate_version or installed_accelerate())
    # ZeRO's own zero_grad sets every .grad to None after the reduce (set_grads_to_None=True), whatever torch's default
    held_grads = accumulated if setup.gradient_accumulation_steps > 1 or (grads_persist and not setup.is_deepspeed) else 0
    # none for a task head or ZeRO-2's bucketed one; FSDP's waits unsharded, at the compute width, for the root's hook
    head_grad = early_head_grad_bytes(spec, setup, grads, unit_grad_bytes(setup) if setup.is_fsdp and traced_runtime() else states.grad_elem_bytes)
    early_grads = held_grads + max(head_grad - held_grads, 0)
    grad_tail = grad_tails if grads else 0   # the allocator tails travel with the whole gradient set
    held_tail = grad_tail if held_grads else 0
    top = final_norm_bytes(spec, shape, checkpointed=recompute > 0) + loss_peak_dequant_bytes(spec, setup)
    top += step_input_bytes(spec, shape) if recompute else 0   # the rotary pair(s) and the batch, to the end of backward
    # no block Linear runs at the loss peak; FULL_SHARD FSDP then holds its root unit alone (fsdp_window.py)
    loss_gather, idle_gather_pool = _loss_gather_bytes(spec, setup, gather) if setup.gathers_params else (gather, 0)
    # ZeRO-3's offloaded gathers copy partitions to the GPU only inside the all-gather call: never beside the loss path
    copy = zero3_copy_bytes(spec, setup, led.trainable, zero3_knobs(spec), checkpointed=recompute > 0, release=installed_deepspeed(),
                            params_offloaded=techniques.weights_on_host(setup))
    loss_cut, over = gather - loss_gather + copy, max(copy - logits, 0)
    # autocast's cache empties as the model returns: its casts sit beside the loss's forward, not its backward
    beside = forward_loss_bytes(spec, shape, installed_transformers()) if hf_loss else 0
    forward = resident - loss_cut + early_grads + held_tail + acts + max(logits, beside + cached_casts) + top + over
    # checkpointing: the top block is recomputed only once the loss buffers are gone (traced: never together)
    # a tied head's gradient waits in autograd's input buffer for the embedding's (one AccumulateGrad, two inputs) to the
    # end of backward; where .grad already exists (kept or accumulating) that wait is a buffer beside it (torch InputBuffer)
    tied = held_grads and spec.tie_word_embeddings and not spec.lm_head_params
    tied_wait = min(head_grad, spec.vocab_size * spec.hidden_size * states.grad_elem_bytes) if tied else 0
    # as a block's recompute starts: its incoming gradient, the rotary pair, the batch (+ block 0's input at the end)
    top_held, end_held = (recompute_start_bytes(spec, shape, first_block=b, release=installed_transformers()) if recompute else 0
                          for b in (False, True))
    backward_start = (resident + early_grads + held_tail + tied_wait + acts + recompute + dequant + ipg + top_held
                      + (block_peak := max(in_flight, eager_backward_transient_bytes(spec, shape))))   # MLP's, eager's: apart
    # a first micro-step has not made block 0's gradients nor an untied embedding's at block 0's peak (block_backward.py)
    pending = min(accumulated, first_step_pending_params(spec, setup) * states.grad_elem_bytes) if recompute and not held_grads else 0
    backward_end = resident + accumulated - pending + grad_tail + recompute + block_peak + dequant + ipg + end_held
    # FULL_SHARD FSDP has resharded every unit and freed each unsharded gradient after its reduce-scatter by the end of
    # backward (torch fsdp/_runtime_utils.py _should_free_in_backward: True once gradients sync), so its gather window
    # is not alive through the optimizer step; ZeRO-3's step partitions every gathered parameter first (zero3_window)
    step_gather = gather if setup.is_fsdp and setup.gathers_params else zero3_step_release(
        spec, setup, led.trainable, gather, checkpointed=recompute > 0, release=installed_deepspeed(),
        params_offloaded=techniques.weights_on_host(setup))
    step = resident - step_gather + grads + grad_tail + step_temp
    peak = max(forward, backward_start, backward_end, step)

    phase = ("forward/loss" if peak == forward else "checkpoint recompute" if peak == backward_start
             else "end of backward" if peak == backward_end else "optimizer step")
    # what the peak phase holds beyond the reported weights, gradients, states, activations and logits
    phase_other = {"forward/loss": held_tail + top - loss_cut + over, "checkpoint recompute": held_tail + dequant + ipg + block_peak + top_held,
                   "end of backward": grad_tail + dequant + ipg + in_flight + end_held, "optimizer step": grad_tail + dequant + step_temp - step_gather}
    notes = (f"peak in {phase}", *dev.notes, *terms.notes, *release_notes,
             *((f"FSDP no_sync keeps unsharded gradients between accumulation micro-steps ({accumulated / 1e9:.2f} GB)",)
               if accumulated > grads else ()))
    if staging:
        notes = (*notes, f"offloaded shards are staged on a stream of their own: +{staging / 1e9:.2f} GB reserved")
    if (load := zero3_load_bytes(spec, setup)) > peak:
        notes = (*notes, f"loading holds more: the {'quantized ' if setup.quantized else ''}model whole on every GPU before "
                         f"ZeRO-3 partitions it ({load / 1e9:.2f} GB)" + ("" if setup.quantized else
                         "; build it under zero.Init: create TrainingArguments(deepspeed=...) (or HfDeepSpeedConfig, or "
                         "the Accelerator with its ZeRO-3 plugin) before from_pretrained"))
    return to_estimate(
        setup=setup, hardware=hardware, weights=dev.weights + terms.extra_weights, gradients=accumulated - (pending if phase == "end of backward" else 0), optimizer_states=dev.optimizer,
        activations=acts + recompute, logits=logits, other=buffers + state_tails + phase_other[phase],
        peak_allocated=peak, cpu_ram=cpu_ram, notes=notes,
        side_stream_reserved=staging + idle_grad_pool_bytes(setup, grads, phase in ("forward/loss", "checkpoint recompute"), grads_persist)
        + (idle_gather_pool if phase == "forward/loss" else 0),
        load_allocated=load,
    )
