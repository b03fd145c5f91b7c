"""Per-device division of model states under DDP, ZeRO-1/2/3 and FSDP, plus their buffers (CPU offload then moves
parts of them to host RAM: techniques/cpu_offload.py's ``place`` hook).

Two things live here: ``per_device`` (what perfguide believes each rank holds, used by the estimate) and
exact re-implementations of the published formulas (ZeRO paper; DeepSpeed's own
``estimate_zero2/3_model_states_mem_needs``) so tests and the accuracy bench can anchor against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .._data import fact_value
from .._packages import installed_release
from ..model.linears import linear_shapes
from ..model.types import ModelSpec
from ..setup import STRATEGIES, Setup
from .kbit import kbit_fp32_parts
from .ledger import DTYPE_BYTES, KBIT_PREPARED_REST_BYTES, Ledger, full_groups
from .loss_path import version_tuple
from .optimizers import TensorGroup

#: Strategy families, derived from the one table in setup.py (Setup.is_deepspeed / Setup.is_fsdp per Setup).
#: ZeRO-1/2 bucket (elements) perfguide emits for one-GPU ZeRO-Offload: the gradient buckets only stage copies to
#: the CPU there (no collective to amortise), so 5e7 instead of DeepSpeed's 5e8 default saves ~1.7 GiB of fp16 buffers
ONE_GPU_BUCKET = 50_000_000
DEEPSPEED = frozenset(k for k, f in STRATEGIES.items() if f.zero_stage is not None)
FSDP = frozenset(k for k, f in STRATEGIES.items() if f.fsdp)


@dataclass(frozen=True)
class States:
    """Model states of the whole model as a single device would hold them (bytes)."""

    weights: int
    grads: int
    optimizer: int            # optimizer state, plus fp32 master / fp32 grad partitions under DeepSpeed
    trainable_params: int
    grad_elem_bytes: int
    grad_elements: int | None = None   # elements behind ``grads`` where their widths differ; None: grads // grad_elem_bytes


@dataclass(frozen=True)
class PerDevice:
    weights: int
    grads: int
    optimizer: int
    buffers: int              # communication buckets, gathered parameters, unsharded copies
    cpu_ram: int              # host RAM per node for offloaded states
    notes: tuple[str, ...] = ()


def _const(name: str) -> float:
    return float(fact_value("calibration", name))


def deepspeed_half(param_count: int, trainable: int, optimizer_state_fp32: int) -> States:
    """DeepSpeed with fp16/bf16 enabled: 16-bit params and grads on GPU, fp32 master + fp32 grads in the optimizer.

    The engine casts the whole module to 16 bit and builds fp32 flat master params regardless of the load
    dtype, running the optimizer on them: state is fp32 (``optimizer_state_fp32``) and 4 + 4 bytes per
    trainable parameter join it. This is the 2 + 18/N of ``estimate_zero2_model_states_mem_needs``
    (2 grads16 + 4 grads32 + 4 master + 8 Adam).
    """
    return States(weights=2 * param_count, grads=2 * trainable, optimizer=optimizer_state_fp32 + 8 * trainable,
                  trainable_params=trainable, grad_elem_bytes=2)


def deepspeed_bf16_master(param_count: int, trainable: int, optimizer_state_bf16: int, stage: int) -> States:
    """DeepSpeed with ``bf16.bf16_master_weights_and_grads`` and ``bf16_optimizer_states`` (deepspeed 0.19,
    runtime/precision_config.py): the optimizer's master partition, its gradient and its states are bf16.

    ZeRO-1/2 still clone the rank's bf16 partition as the flat master the optimizer steps (stage_1_and_2.py
    ``weights_partition = ...clone().to(master_weights_and_grads_dtype)``): 2 bytes per trainable parameter, divided
    with the optimizer; ZeRO-3 reuses its 16-bit partition when the dtypes match (stage3.py), so no copy.
    """
    master = 0 if stage == 3 else 2 * trainable
    return States(weights=2 * param_count, grads=2 * trainable, optimizer=optimizer_state_bf16 + master,
                  trainable_params=trainable, grad_elem_bytes=2)


def bucket_bytes(setup: Setup, trainable: int, grad_elem_bytes: int) -> int:
    """Communication buffers allocated through the caching allocator on each rank.

    DDP's Reducer keeps one flat copy of every gradient (``bucket.gradients``, traced: scripts/trace_ddp_phases.py).
    ZeRO-1/2's ipg buffers are ``torch.empty(int(self.reduce_bucket_size))`` each, whatever the trainable count: a
    LoRA run under the 5e8 default holds 1 GB per buffer for a few million adapter gradients (stage_1_and_2.py v0.7.2
    ``backward``, 0.19.8 ``setup_buckets``).
    """
    if setup.world_size == 1 and setup.strategy in ("single", "ddp"):
        return 0
    if setup.strategy == "ddp":
        # DDP (accelerate default gradient_as_bucket_view=False) keeps flat bucket copies of all gradients
        return trainable * grad_elem_bytes
    if setup.is_deepspeed and not setup.gathers_params:
        return int(deepspeed_bucket_elements(setup) * grad_elem_bytes * ipg_buffers(setup.overlap_comm))
    return 0


def ipg_buffers(overlap_comm: bool) -> int:
    """How many ``reduce_bucket_size`` ipg buffers ZeRO-1/2's ``backward()`` allocates: ``buf_0`` whenever
    contiguous_gradients is on (the default), ``buf_1`` only "if self.overlap_comm" ("double buffers to avoid data
    access conflict"; stage_1_and_2.py v0.7.2 ``backward``, 0.19.8 ``setup_buckets``). DeepSpeed's own default is
    ``overlap_comm = stage == 3`` (zero/config.py ``overlap_comm_valid``, v0.7.2 and 0.19.8), so a ZeRO-2 config that
    leaves the key out (accelerate's DeepSpeedPlugin builds one) runs a single buffer (``Setup.overlap_comm``)."""
    return 2 if overlap_comm else 1


def deepspeed_bucket_elements(setup: Setup) -> int:
    """ZeRO-1/2 ``reduce_bucket_size``: DeepSpeed's default; one GPU reduces nothing, so the plan emits small buckets
    there (techniques/cpu_offload.py ONE_GPU_BUCKET)."""
    return ONE_GPU_BUCKET if setup.world_size == 1 else int(_const("deepspeed_bucket_elements"))


def per_device(states: States, setup: Setup, gather_bytes: int, unsharded_weights: int) -> PerDevice:
    """Divide ``states`` over the data-parallel ranks (all on the device: offload is the techniques' ``place``).

    ``gather_bytes``: parameters (and their gradients) one rank materialises at once under ZeRO-3 / FSDP
    (the current and the prefetched unit). ``unsharded_weights``: the full compute-dtype parameter set that
    FSDP SHARD_GRAD_OP keeps between forward and backward.
    """
    n = setup.shard_degree   # HSDP: one copy per node, sharded over that node's GPUs
    # FSDP shards parameters at rest under either strategy; SHARD_GRAD_OP only skips resharding between forward
    # and backward, holding the unsharded compute-dtype copy instead (torch FSDP docs; accelerate
    # concept_guides/fsdp_and_deepspeed.md). ZeRO-1/2 keep the full 16-bit parameters on every rank.
    w_div = n if setup.shards_params else 1
    g_div = n if setup.shards_grads else 1
    o_div = n if setup.shards_optimizer else 1
    weights, grads, opt = states.weights // w_div, states.grads // g_div, states.optimizer // o_div
    buffers = bucket_bytes(setup, states.trainable_params, states.grad_elem_bytes)
    if setup.gathers_params:
        buffers += gather_bytes
    elif setup.shards_params:
        buffers += unsharded_weights
    return PerDevice(weights, grads, opt, buffers, 0)


#: the first accelerate release whose ``Accelerator.no_sync`` turns an FSDP2 module's gradient sync off
#: (``set_requires_gradient_sync(False)``: huggingface/accelerate ec92b1af, PR #3762, 2025-09-07, first tagged v1.11.0);
#: before it ``no_sync`` looked for a ``no_sync`` method, which ``fully_shard`` modules lack, so every micro-step
#: reduce-scattered and only the 1/N shard of the gradients was held (axolotl's gpt-oss FSDP2 examples ran on v1.10)
ACCELERATE_FSDP2_NO_SYNC = (1, 11)


@lru_cache(maxsize=1)
def installed_accelerate() -> str | None:
    """The accelerate release installed next to perfguide (the one a plan made here trains with); looked up once, as
    a metadata lookup costs more than a whole analytic estimate."""
    return installed_release("accelerate")


def defers_grad_sync(setup: Setup, accelerate: str | None = None) -> bool:
    """Whether an FSDP step skips its gradient reduce-scatter on every accumulation micro-step but the last (no_sync,
    see ``no_sync_grads``): FSDP with accumulation, and for FSDP2 an accelerate from 1.11 (``accelerate``: the release
    driving the loop; None: a current one). The memory model holds the unsharded gradients for it, the speed model
    skips those reduce-scatters; a loop told to sync each micro-step (techniques/sync_grads_each_micro_step.py) turns
    both off through its hooks."""
    if not (setup.is_fsdp and setup.gradient_accumulation_steps > 1):
        return False
    return not (setup.fsdp_version == 2 and accelerate is not None and version_tuple(accelerate)[:2] < ACCELERATE_FSDP2_NO_SYNC)


def no_sync_grads(setup: Setup, states: States, sharded_grads: int, accelerate: str | None = None) -> int:
    """Gradient bytes a rank holds through an accumulation micro-step under FSDP: the whole unsharded set.

    Loops that accumulate under FSDP skip the reduce-scatter on all but the last micro-step, and the unsharded
    gradients stay on every rank until then. FSDP1's ``no_sync()`` docstring: "FSDP will accumulate the full model
    gradients (instead of gradient shards) until the eventual sync", and with CPU offload "the gradients will not be
    offloaded to CPU when inside the context manager" (Lightning/litgpt ``fabric.no_backward_sync``; accelerate's
    ``accumulate``, which HF Trainer calls). FSDP2's ``set_requires_gradient_sync(False)`` is "the equivalence of
    ``no_sync`` in FSDP1": ``FSDPParamGroup.post_backward`` returns before the reduce-scatter, keeping each
    parameter's unsharded ``.grad`` (torch distributed/fsdp/_fully_shard/_fsdp_param_group.py), and accelerate's
    ``Accelerator.no_sync`` calls it for FSDP2 modules. So ``states.grads`` (every parameter whose gradient exists:
    the frozen base too under FSDP1 use_orig_params=True LoRA, analytic.frozen_params_get_grads) replaces the 1/N
    share until the last micro-step's backward. Under autocast FSDP runs on 16-bit gathered parameters (accelerate's
    MixedPrecision param_dtype = reduce_dtype = the autocast dtype), so autograd's unsharded gradients are 16-bit:
    2 bytes for every gradient element, whatever width each tensor is stored at (fp32 LoRA adapters beside a
    modules_to_save copy: FSDP2 casts each group to ``param_dtype``, and with ``reduce_dtype`` the same, its
    ``to_accumulated_grad_if_needed`` keeps the 16-bit ``.grad``; torch _fully_shard/_fsdp_param.py).
    """
    if not defers_grad_sync(setup, accelerate):
        return sharded_grads
    elements = states.grads // states.grad_elem_bytes if states.grad_elements is None else states.grad_elements
    full = elements * 2 if setup.autocast in ("bf16", "fp16") else states.grads
    return max(full, sharded_grads)


def idle_grad_pool_bytes(setup: Setup, sharded_grads: int, peak_before_backward: bool, grads_persist: bool) -> int:
    """Reserved bytes of the reduce-scatter stream's pool while the compute stream peaks before backward.

    FSDP reduce-scatters on a stream of its own and the sharded gradients are allocated there (FSDP1 ``_reduce_grad``
    under ``_post_backward_stream``: ``new_sharded_grad`` becomes ``_saved_grad_shard`` and then ``.grad``; FSDP2's
    ``foreach_reduce`` output on its reduce-scatter stream, the ``.grad`` DTensors views of it). ``zero_grad``
    frees them, but the caching allocator keeps those blocks for that stream, so a peak in forward or in the first
    recompute of the next step sees them reserved, not allocated. Nothing extra when the gradients stay allocated
    (``grads_persist``) or live on the CPU (``sharded_grads`` 0 under CPU offload).
    """
    if not (setup.is_fsdp and peak_before_backward) or grads_persist:
        return 0
    return sharded_grads


#: torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, the same constants in 1.12 and 2.x): a request
#: of kMinLargeAlloc (10 MiB) or more gets a segment of its own rounded up to kRoundLarge (2 MiB); its block is the
#: request rounded to kMinBlockSize (512 B), split off the segment only when more than kSmallSize (1 MiB) would remain
#: (should_split: ``remaining > kSmallSize`` for the large pool)
MIN_BLOCK, SMALL_SIZE, MIN_LARGE_ALLOC, ROUND_LARGE = 512, 1 << 20, 10 << 20, 2 << 20


def unsplit_tail_bytes(nbytes: int) -> int:
    """Bytes the caching allocator allocates beyond a tensor of ``nbytes``: the tail of a large segment too small to
    split off stays in the tensor's block, so ``max_memory_allocated`` (and what must fit) counts it. 1280 x 5120 fp32
    (GPT-2-large's MLP weight, 25 MiB) takes a 26 MiB block; 4096 x 4096 bf16 (32 MiB) none; a tail over 1 MiB is a
    free block of its own (reserved, not allocated) and smaller requests take their blocks from shared segments."""
    if nbytes < MIN_LARGE_ALLOC:
        return 0
    block = -(-nbytes // MIN_BLOCK) * MIN_BLOCK
    tail = -(-nbytes // ROUND_LARGE) * ROUND_LARGE - block
    return tail if tail <= SMALL_SIZE else 0


def _tails(groups: list[TensorGroup] | tuple[TensorGroup, ...], elem_bytes: int) -> int:
    return sum(g.count * unsplit_tail_bytes(g.numel * (g.width or elem_bytes)) for g in groups)


def per_tensor_state_tails(spec: ModelSpec, setup: Setup, led: Ledger, optimizer_states: int) -> tuple[int, int]:
    """(weights + optimizer state, gradients): the allocator's unsplit tails (unsplit_tail_bytes) of the model states
    of a layout that keeps one tensor per parameter (one GPU, DDP): every weight in its storage dtype, and per
    trainable tensor its gradient and each optimizer state of the parameter's shape and dtype (AdamW: two). FSDP and
    DeepSpeed flatten parameters into a few large buffers, quantized weights are packed: 0 for those, and for
    optimizers whose state is not whole copies of the parameters."""
    if setup.is_fsdp or setup.is_deepspeed or setup.weights_dtype not in DTYPE_BYTES:
        return 0, 0
    grads = _tails(led.trainable, led.param_bytes)
    per = led.trainable_bytes
    copies = optimizer_states // per if per and optimizer_states % per == 0 else 0
    return _tails(full_groups(spec), DTYPE_BYTES[setup.weights_dtype]) + copies * grads, grads


def size_wrap_splits_tied_head(spec: ModelSpec, min_num_params: int) -> bool:
    """Whether FSDP1's size-based auto-wrap puts a tied input embedding and LM head in two units, so that each
    unit flattens a copy of the one weight and the run trains two (V x h more weights, gradients and optimizer
    state, sharded like the rest).

    torch 1.12's ``_recursive_wrap`` recurses into a module whose parameters reach ``min_num_params`` and wraps it
    when what its children left unwrapped still does (``default_auto_wrap_policy``; ModuleList never wrapped). A
    wrapped unit's FlattenParamsWrapper ``torch.cat`` s its parameters into a new FlatParameter and deletes the
    module attributes, but dedups shared parameters only inside its own module; the head is the root's sibling
    child of the base model, and FSDP takes every parameter that is not yet a FlatParameter (``params = [p for p in
    module.parameters() if ... not isinstance(p, FlatParameter)]``), so the head's reference to the original
    embedding weight is flattened a second time, by its own unit (when it reaches the threshold) or by the root.
    The tie is split as soon as a module holding the embedding but not the head is wrapped: the embedding itself
    (a leaf over the threshold) or the base model (its leftover over the threshold). accelerate's maintainer on
    GPT-2 under size-based wrap: "shared embedding layers should belong to the same FSDP unit and sized_based_wrap
    puts them in different units" (huggingface/accelerate#570). No policy (``min_num_params`` 0) or a threshold over
    the whole model: one unit, the tie kept. FSDP2 and the transformer-layer policy keep the pair in the root.
    """
    if not (spec.tie_word_embeddings and spec.head == "lm") or not 0 < min_num_params <= spec.total_params:
        return False
    if spec.vocab_size * spec.hidden_size >= min_num_params:
        return True   # the embedding, a leaf over the threshold, becomes a unit of its own
    block = spec.outside_embeddings // max(1, spec.total_layers)
    leaves = sum(i * o for _, i, o, _ in linear_shapes(spec) if i * o >= min_num_params)
    wrapped = spec.total_layers * (block if block >= min_num_params else leaves)
    return spec.total_params - wrapped >= min_num_params   # the base model wrapped with its leftover, embedding included


def size_wrapped_spec(spec: ModelSpec, min_num_params: int) -> ModelSpec:
    """``spec`` as FSDP1's size-based auto-wrap trains it: untied, with a head of its own, where the wrap splits the
    tie (size_wrap_splits_tied_head); otherwise ``spec`` itself."""
    if not size_wrap_splits_tied_head(spec, min_num_params):
        return spec
    head = spec.vocab_size * spec.hidden_size
    trainable = None if spec.trainable_params is None else spec.trainable_params + head
    return spec.model_copy(update={"tie_word_embeddings": False, "lm_head_params": head,
                                   "total_params": spec.total_params + head, "trainable_params": trainable})


#: bytes per stored element of a block's frozen Linear weights as FSDP flattens them (bnb packs nf4 two to a byte
#: into its quant_storage dtype; the absmax is an attribute, not part of the FlatParameter)
_STORED_LINEAR_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "nf4": 0.5}


def offload_staging_bytes(spec: ModelSpec, setup: Setup, params_offloaded: bool) -> int:
    """Device bytes the side stream that stages CPU-offloaded shards keeps reserved: the largest unit's shard.

    With parameter offload FSDP copies a unit's CPU shard to the GPU before all-gathering it, and allocates that
    copy on a stream of its own: FSDP1's ``_pre_unshard_stream`` ("allocations and writes for CPU offloading (H2D
    copy)", torch distributed/fsdp/_runtime_utils.py ``_init_streams``; ``FlatParamHandle.pre_unshard`` then
    ``flat_param_to(device)``), FSDP2's all-gather copy-in stream (``FSDPParam.all_gather_inputs``:
    ``sharded_param_data.to(device)`` inside ``foreach_all_gather``'s copy-in stream). The caching allocator keeps
    a freed block for the stream it was allocated on, so that stream's pool stays reserved at its largest copy
    while the compute stream's peak comes later: reserved, not allocated. The largest unit is the root one
    (embeddings, LM head, final norm, kept in 16 bit or, after peft's kbit preparation, fp32) unless one block's
    weights are larger. Llama-2-70B QLoRA on 2 GPUs: (262,144,000 x 2) x 2 B / 2 = 524,288,000 B. A lower bound:
    the next unit's copy may overlap the current one's.
    """
    if not (setup.is_fsdp and params_offloaded):   # ``params_offloaded``: the placement (CPU offload's hook) moved them
        return 0
    wd = setup.weights_dtype
    rest_bytes = DTYPE_BYTES.get(wd) or (KBIT_PREPARED_REST_BYTES if kbit_fp32_parts(setup) else 2)
    root = (spec.embedding_params + spec.lm_head_params) * rest_bytes
    block = sum(i * o * n for _, i, o, n in linear_shapes(spec)) // max(1, spec.total_layers) * _STORED_LINEAR_BYTES[wd]
    return int(max(root, block)) // setup.shard_degree


# ---- published formulas (anchors) -------------------------------------------------------------------------

def zero_paper_bytes(stage: int, psi: int, n: int, k: int = 12) -> float:
    """ZeRO paper (Rajbhandari et al. 2019) per-GPU model states, mixed-precision Adam (K = 12)."""
    if stage == 0:
        return (4 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi / n
    if stage == 2:
        return 2 * psi + (2 + k) * psi / n
    if stage == 3:
        return (4 + k) * psi / n
    raise ValueError(f"ZeRO stage must be 0..3, got {stage}")


def deepspeed_zero2_estimate(total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                             cpu_offload: bool = True, additional_buffer_factor: float = 1.5,
                             legacy: bool = False) -> tuple[int, int]:
    """(cpu_bytes, gpu_bytes) exactly as DeepSpeed's ``estimate_zero2_model_states_mem_needs``.

    ``legacy=True`` gives the pre-PR#5099 multipliers (4 + 16/N), which DeepSpeed's own memory.rst example
    output (15.93 GB for t5-3b on 8 GPUs) still shows.
    """
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu = 2 * total_params
        cpu = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu = (4 * total_params + int(16 * total_params / total_gpus)) if legacy else (2 * total_params + int(18 * total_params / total_gpus))
        cpu = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu), int(gpu)


def deepspeed_zero3_estimate(total_params: int, largest_layer_params: int, num_gpus_per_node: int = 1,
                             num_nodes: int = 1, cpu_offload: bool = True, cpu_offload_params: bool = True,
                             zero_init: bool = True, additional_buffer_factor: float = 1.5) -> tuple[int, int, int]:
    """(cpu_bytes, gpu_bytes, largest_layer_bytes) exactly as DeepSpeed's ``estimate_zero3_model_states_mem_needs``."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest = 4 * largest_layer_params
    if cpu_offload:
        k = 18 if cpu_offload_params else 16
        gpu = largest if cpu_offload_params else largest + int(2 * total_params / total_gpus)
        cpu = total_params * (k * gpus_factor if zero_init else max(4 * num_gpus_per_node, k * gpus_factor))
        cpu *= additional_buffer_factor
    else:
        gpu = largest + int(18 * total_params / total_gpus)
        cpu = (largest_layer_params if zero_init else total_params) * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu), int(gpu), largest


def unsharded_compute_copies(spec: ModelSpec, setup: Setup, gathered: int, *, params_offloaded: bool) -> int:
    """Bytes of the weights' GPU copies that FSDP1 on one rank with CPU offload leaves to autograd until backward.

    At world size 1 FSDP1 does not shard (torch 1.12 ``_is_sharded = world_size > 1``; since 2.x it clamps the
    strategy to NO_SHARD), so ``offload_params`` makes each unit's forward run on a fresh GPU copy of its flat
    parameter (1.12 ``_rebuild_full_params``: ``p.data = p.data.to(self.compute_device)``; 2.x ``pre_unshard``:
    ``flat_param_to(self.device)``, "a new tensor distinct from any attributes"), then points the parameter back at
    its CPU shard (``_use_param_local_shard`` / ``_use_sharded_flat_param``) without freeing that copy:
    ``_free_full_params`` skips unsharded parameters. A sharded rank frees its all-gathered copy by resizing the
    storage to 0, which empties the views autograd saved; here nothing does, so every unit whose weights a Linear /
    Conv1D / LayerNorm saved (all of a transformer's) keeps its whole fp32 copy from its forward to its backward.
    ``gathered``: what the sharding model already counts for the units in use (current + prefetched copy and the
    unit's unsharded gradient), which these copies replace at world size 1 (nothing is all-gathered there).
    Only fp32 weights without autocast: under autocast a matmul saves its own 16-bit cast instead.
    ``params_offloaded``: the placement (CPU offload's hook) moved the weights to host RAM.
    """
    if not (setup.is_fsdp and setup.fsdp_version == 1 and params_offloaded and setup.shard_degree == 1
            and setup.weights_dtype == "fp32" and not setup.autocast):
        return 0
    return max(0, spec.total_params * 4 - gathered)
