"""What DeepSpeed ZeRO-3 gathers and buffers on a rank beyond its partitions, read in DeepSpeed 0.14.4 (the release rows
770/771 ran; runtime/zero/stage3.py, partitioned_param_coordinator.py, partition_parameters.py) and checked on that
release's own run (scripts/trace_zero3_window.py: two CPU ranks, tiny Llama, LoRA).

The old price, the two largest units gathered and an fp32 gradient of one, counted a gradient no frozen parameter
gets and none of what the coordinator does: its prefetcher keeps gathering ahead until its own count reaches
``stage3_max_live_parameters``, and that count runs below the true one by what was still gathered when the last step
ended; the optimizer keeps an ipg bucket of ``reduce_bucket_size`` elements for good.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..model.linears import decoder_only_linears, linear_shapes
from ..model.types import ModelSpec
from ..setup import Setup
from .ledger import full_groups
from .loss_path import version_tuple
from .optimizers import TensorGroup


@dataclass(frozen=True)
class Zero3Knobs:
    """The ``zero_optimization`` values that size ZeRO-3's runtime buffers (elements)."""

    reduce_bucket_size: int
    prefetch_bucket_size: int           # stage3_prefetch_bucket_size
    param_persistence_threshold: int    # stage3_param_persistence_threshold
    max_live_parameters: int = 10**9    # stage3_max_live_parameters (DeepSpeed's default and perfguide's emitted value)
    max_reuse_distance: int = 10**9     # stage3_max_reuse_distance (the same)


#: DeepSpeed's own defaults (runtime/zero/config.py): what runs when the config leaves the keys out, e.g. the one
#: accelerate's DeepSpeedPlugin builds from an accelerate config file (only stage, offload devices and the 16-bit save)
DEEPSPEED_DEFAULT_KNOBS = Zero3Knobs(500_000_000, 50_000_000, 100_000)


def trainer_auto_knobs(hidden_size: int) -> Zero3Knobs:
    """The values HF Trainer fills for ``"auto"`` (transformers integrations/deepspeed.py ``trainer_config_finalize``):
    hidden^2, 0.9 hidden^2 and 10 hidden; perfguide's own ZeRO-3 configs and LLaMA-Factory's ds_z3 configs say auto."""
    return Zero3Knobs(hidden_size * hidden_size, int(0.9 * hidden_size * hidden_size), 10 * hidden_size)


def zero3_knobs(spec: ModelSpec) -> Zero3Knobs:
    """The knobs a perfguide plan runs with (integrations/deepspeed.py emits "auto" for the three sizes)."""
    return trainer_auto_knobs(spec.hidden_size)


def stored_per_element(setup: Setup) -> int:
    """Parameters per element DeepSpeed partitions and gathers of a block Linear: 4 for bitsandbytes 4-bit packed in
    16-bit storage (``bnb_4bit_quant_storage=bfloat16``, the only way PEFT's docs run QLoRA under ZeRO-3), else 1.

    DeepSpeed has no bitsandbytes case: ``_convert_to_zero_parameters`` partitions whatever tensor the parameter holds
    and sets ``ds_numel = param.numel()`` (runtime/zero/partition_parameters.py, 0.14.4), here the packed
    ``Params4bit`` of ``in x out / 4`` bf16 elements (two 4-bit values a byte, two bytes an element), so the
    coordinator's window, prefetch bucket and persistence threshold all count packed elements (checked on 0.14.4:
    scripts/trace_zero3_qlora_numel.py). The absmax statistics are ``quant_state``, a Python attribute: never
    partitioned nor gathered. transformers loads a quantized
    model without ``zero.Init`` (``get_init_context``: ``is_deepspeed_zero3_enabled() and not is_quantized``) and
    bitsandbytes leaves the embedding and ``lm_head`` unquantized, so they are gathered in the 16-bit dtype. int8
    (``Int8Params``, 1-byte elements) counts one element a parameter and is priced at the 16-bit element size: an
    upper bound, as no published recipe runs LLM.int8 under ZeRO-3.
    """
    return 4 if setup.weights_dtype == "nf4" else 1


#: first DeepSpeed release whose ``all_gather_coalesced`` gathers nothing on a single partition: 0.9.0 returns
#: ``_no_gather_coalesced(params)`` when ``num_partitions == 1`` (``param.data = param.ds_tensor.data.to(device)``),
#: where 0.7.2 to 0.8.3 all-gather at world size 1 too, copying the whole offloaded parameter to the GPU first and
#: gathering it into a second whole-size buffer (runtime/zero/partition_parameters.py, read in each release's sdist)
NO_GATHER_AT_ONE_PARTITION_SINCE = (0, 9, 0)


def offload_copy_shards(setup: Setup, release: str | None, params_offloaded: bool) -> int:
    """What a ZeRO-3 gather's partition copies are divided by (``zero3_live_elements`` ``copy_shards``): the shard
    degree when the parameters are offloaded (``offload_param``: ``ds_tensor`` lives in host memory, and
    ``all_gather_coalesced`` passes ``param.ds_tensor.to(device)`` to the all-gather), else 0 (``.to`` of a partition
    already on the GPU is the partition itself). On one GPU from 0.9.0 nothing is gathered (the partition's copy *is*
    the parameter): 0. ``release``: the DeepSpeed release that runs (None: a current one); ``params_offloaded``: CPU
    offload's placement moved the partitions to host RAM (the cost model asks the placement, not the switch)."""
    if setup.strategy != "zero3" or not params_offloaded:
        return 0
    if setup.shard_degree == 1 and (release is None or version_tuple(release) >= NO_GATHER_AT_ONE_PARTITION_SINCE):
        return 0
    return setup.shard_degree


def zero3_trace(spec: ModelSpec, checkpointed: bool, embedding_trainable: bool,
                pack: int = 1) -> tuple[tuple[tuple[str, int], ...], int]:
    """One training step's parameter uses in the order DeepSpeed's coordinator records them, and where backward starts.

    Each entry is (parameter, elements) of a module that owns parameters: the embedding, each block Linear in forward
    order, the head; backward runs the head, then per block (last first) the checkpoint's recompute (the block's
    forward again) and the block's Linears in reverse; the embedding's backward only when it has a gradient. Norms,
    biases and LoRA adapters are left out: below the persistence threshold they stay gathered (``ds_persist``) and
    their elements move the reuse walk by under 0.1% of a Linear. A MoE block's experts are one entry: ZeRO-3 runs
    MoE models with the sparse block set as a leaf module (``deepspeed.utils.set_z3_leaf_modules``, which
    LLaMA-Factory's model/model_utils/moe.py applies under ZeRO-3), else ranks routing differently fetch in different
    orders, so the whole block is gathered at once.
    """
    return _trace(_shape(spec, pack), checkpointed, embedding_trainable)


Shape = tuple[tuple[tuple[str, int, int, int], ...], int, int, int, bool, int, tuple[str, ...]]


def _shape(spec: ModelSpec, pack: int = 1) -> Shape:
    """What the trace reads of a spec, hashable (a plan prices hundreds of candidates of one model)."""
    tied = bool(spec.tie_word_embeddings or not spec.lm_head_params)
    decoder = tuple(name for name, *_ in decoder_only_linears(spec))
    return tuple(linear_shapes(spec)), spec.total_layers, spec.vocab_size, spec.hidden_size, tied, pack, decoder


@lru_cache(maxsize=64)
def _trace(shape: Shape, checkpointed: bool, embedding_trainable: bool) -> tuple[tuple[tuple[str, int], ...], int]:
    linears, layers, vocab_size, hidden, tied, pack, decoder = shape
    head = "embed" if tied else "head"
    per_block: list[tuple[str, int]] = []
    for name, i, o, n in linears:
        if name in decoder:   # an encoder-decoder's cross-attention runs in the decoder blocks, after the encoder's
            continue
        if name.startswith("experts."):   # a MoE block is a ZeRO-3 leaf module: all its experts gathered at once
            if not per_block or per_block[-1][0] != "experts":
                per_block.append(("experts", 0))
            per_block[-1] = ("experts", per_block[-1][1] + i * o // pack * (n // layers))
        else:
            per_block += [(f"{name}.{k}", i * o // pack) for k in range(max(1, n // layers))]
    cross = [(name, i * o // pack, n) for name, i, o, n in linears if name in decoder]
    blocks = [[(f"{layer}.{name}", numel) for name, numel in per_block]
              + [(f"{layer}.{name}", numel) for name, numel, n in cross if layer >= layers - n] for layer in range(layers)]
    vocab = vocab_size * hidden
    forward = [("embed", vocab)] + [use for block in blocks for use in block] + [(head, vocab)]
    backward = [(head, vocab)]
    for block in reversed(blocks):
        backward += (block if checkpointed else []) + block[::-1]
    # the embedding's backward hook gathers it when its output needs a gradient: a trained embedding, or the
    # input-grad hook HF/PEFT add for checkpointing (enable_input_require_grads)
    backward += [("embed", vocab)] if embedding_trainable or checkpointed else []
    return tuple(forward + backward), len(forward)


@lru_cache(maxsize=64)
def zero3_live_elements(trace: tuple[tuple[str, int], ...], backward_from: int, knobs: Zero3Knobs,
                        persistent: int = 0, copy_shards: int = 0) -> tuple[int, int]:
    """(forward, backward) peak of gathered elements on a rank in a steady-state step, as DeepSpeed 0.14's
    PartitionedParameterCoordinator decides them.

    - ``fetch_sub_module`` (every hooked module: the Linear and, before it, its parent, a decoder layer, its attention
      or MLP, or PEFT's LoRA wrapper) gathers the module's own parameters, then prefetches from the recorded trace
      while fewer than ``min(max_live_parameters - counter, prefetch_bucket_size)`` elements are in flight, the last
      one overshooting, marking each available parameter it passes with its later use. Two fetches per Linear
      prefetch more than one Linear uses, so the window runs ahead until the counter meets max_live_parameters.
    - the counter: ``reset_step`` zeroes it at the end of backward, then ``step()``'s ``release_and_reset_all``
      subtracts what is still gathered, the embedding its backward hook fetched (its post-backward hook never runs:
      its input, the token ids, needs no gradient). Each forward starts that far below the true count, and the window
      holds max_live_parameters plus the embedding and the ``persistent`` elements (``ds_persist``: at most
      ``stage3_param_persistence_threshold`` each), which ``_post_step`` gathers again uncounted and which stay whole
      on every rank beside their partition (counted here as live).
    - ``release_sub_module`` keeps a parameter that is persistent, that the prefetcher marked for a later use, or that
      a module within ``max_reuse_distance`` elements of the trace ahead uses again (``__params_to_release``).
    - a prefetch of several parameters is one ``all_gather_coalesced``: its flat buffer stays with the handle until
      the last member is waited on, and the first wait copies every member out of it (``AllGatherCoalescedHandle``).

    - ``copy_shards`` (``offload_copy_shards``): with the parameters offloaded each gather first copies the rank's
      partition of every parameter it gathers to the GPU (``param.ds_tensor.to(device)``, the single gather's input;
      the coalesced one's ``torch.cat([p.ds_tensor.to(device) for p in params], out=...)``), beside the buffer it
      gathers into until the call returns: ``ceil(elements / copy_shards)`` each, a transient on top of the window.
      0: no copy (the partitions already live on the GPU).

    Checked on DeepSpeed 0.14.4 itself (scripts/trace_zero3_window.py, tests/test_zero3_window.py). Each Linear sits
    inside a parent module DeepSpeed also hooks, so two parameter uses never have adjacent step ids (``> step_id``).
    """
    n = len(trace)
    prefix = [0]
    for _, numel in trace:
        prefix.append(prefix[-1] + numel)
    nxt: list[int | None] = [None] * n   # the index of each entry's next use of the same parameter
    seen: dict[str, int] = {}
    for i in range(n - 1, -1, -1):
        nxt[i] = seen.get(trace[i][0])
        seen[trace[i][0]] = i
    size = dict(trace)
    persist = {p for p, numel in trace if numel <= knobs.param_persistence_threshold}
    available: set[str] = set()
    marked: dict[str, int] = {}
    carried = trace[-1][1] if trace[-1][0] == "embed" and n > backward_from else 0
    counter = -(carried + persistent)   # what step() released uncounted
    head, live, flat = 0, 0, 0
    group_of: dict[str, int] = {}                   # a prefetched parameter -> its coalesced all-gather
    groups: dict[int, tuple[int, set[str]]] = {}    # all-gather -> (elements, members not yet waited on)
    copied: set[int] = set()
    peaks = [0, 0]

    def copies(params: list[str]) -> int:   # the partitions a gather copies to the GPU first (param offload)
        return sum(-(-size[p] // copy_shards) for p in params) if copy_shards else 0

    def prefetch(i: int, phase: int) -> None:   # one fetch_sub_module's prefetch: a bucket, or to the max_live test
        nonlocal head, live, counter
        budget = min(knobs.max_live_parameters - counter, knobs.prefetch_bucket_size)
        chosen: list[str] = []
        prefetched = 0
        while head < n and prefetched < budget:
            ahead, ahead_numel = trace[head]
            marked[ahead] = max(marked.get(ahead, -1), head)
            if ahead not in available:
                available.add(ahead)
                chosen.append(ahead)
                prefetched += ahead_numel
            head += 1
        live += prefetched
        counter += prefetched
        peaks[phase] = max(peaks[phase], persistent + live + flat + copies(chosen))
        if len(chosen) > 1:   # one all_gather_coalesced call; a single parameter is gathered in place
            groups[i] = (prefetched, set(chosen))
            group_of.update((p, i) for p in chosen)

    for i, (param, numel) in enumerate(trace):
        phase = int(i >= backward_from)
        prefetch(-i - 1, phase)   # the parent module's fetch (a decoder layer, its attention / MLP, PEFT's LoRA wrapper)
        if param not in available:
            available.add(param)
            live += numel
            counter += numel
            peaks[phase] = max(peaks[phase], persistent + live + flat + copies([param]))
        if param in group_of:   # the handle's first wait() cats every member out of the flat buffer the handle keeps
            gid = group_of.pop(param)
            elements, left = groups[gid]
            if gid not in copied:
                copied.add(gid)
                flat += elements
            left.discard(param)
            if not left:   # the last member popped off the in-flight registry: the handle and its buffer go
                flat -= elements
                del groups[gid]
        if marked.get(param, -1) < i:   # pop this use off the queue (the prefetcher may have done it already)
            marked[param], head = i, max(head, i + 1)
        prefetch(i, phase)
        peaks[phase] = max(peaks[phase], persistent + live + flat)
        later = nxt[i]
        reused = later is not None and prefix[later] - prefix[i + 1] < knobs.max_reuse_distance
        if param not in persist and marked[param] <= i and not reused:
            available.discard(param)
            live -= size[param]
            counter -= size[param]
    return peaks[0], peaks[1]


def persistent_elements(spec: ModelSpec, adapters: tuple[TensorGroup, ...], knobs: Zero3Knobs) -> int:
    """Elements ZeRO-3 keeps whole on every rank (``ds_persist``: tensors of at most the persistence threshold, as
    ``Init`` marks them): the model's small tensors (norms, biases: full_groups' 1-D rest, a MoE router) and LoRA's
    adapters. DeepSpeed prints the sum ("Total persistent parameters: 35072 in 25 params" for the traced tiny Llama)."""
    groups = [*full_groups(spec), *adapters]
    return sum(g.total for g in groups if g.numel <= knobs.param_persistence_threshold)


def zero3_buffer_bytes(spec: ModelSpec, setup: Setup, trainable: tuple[TensorGroup, ...], knobs: Zero3Knobs, *,
                       checkpointed: bool, release: str | None = None, params_offloaded: bool = False) -> int:
    """Bytes ZeRO-3 holds on a rank beyond its partitions, priced in every phase (the larger of forward and backward).

    - gathered parameters: ``zero3_live_elements`` in the compute dtype (16-bit under bf16/fp16, else fp32), the
      persistent tensors' whole copies included, a QLoRA base's Linears as their packed storage
      (``stored_per_element``); a frozen parameter is gathered like a trainable one and gets no
      gradient; with the parameters offloaded, each gather's partition copies on top (``offload_copy_shards``, for
      the DeepSpeed ``release`` that runs: on one GPU before 0.9.0 a whole second copy of what a gather fetches);
    - the ipg bucket: ``torch.empty(reduce_bucket_size, dtype=self.dtype)`` built in ``DeepSpeedZeroOptimizer_Stage3
      .__init__`` when contiguous_gradients (the default) and kept until ``destroy()``, however few parameters train;
    - one gradient in flight: autograd's full-size 16-bit gradient of a trainable parameter, alive until the
      reduce hook copies it into the bucket or, larger than the bucket, reduce-scatters it in place
      (``__add_grad_to_ipg_bucket``, ``reduce_scatter_coalesced``); the largest trainable tensor's.
    The 16-bit gradient partitions (``grad_partitions_flat_buffer``, grad_accum_dtype = the model's 16-bit dtype under
    ZeRO) and the fp32 master partitions are the model states sharding.py divides. ``trainable``: the ledger's
    trainable tensors (LoRA's adapters, or every tensor); ``checkpointed``: the step recomputes its blocks (the trace
    then holds the recompute and the embedding's input-grad backward).
    """
    return _buffer_bytes(spec, setup, trainable, knobs, checkpointed, offload_copy_shards(setup, release, params_offloaded))


def zero3_copy_bytes(spec: ModelSpec, setup: Setup, trainable: tuple[TensorGroup, ...], knobs: Zero3Knobs, *,
                     checkpointed: bool, release: str | None = None, params_offloaded: bool = False) -> int:
    """Bytes of ``zero3_buffer_bytes`` that are offloaded gathers' partition copies (``offload_copy_shards``): alive
    only while an all-gather call runs, so never beside the loss path, which no gather interrupts. 0 without them."""
    shards = offload_copy_shards(setup, release, params_offloaded)
    if not shards:
        return 0
    return (_buffer_bytes(spec, setup, trainable, knobs, checkpointed, shards)
            - _buffer_bytes(spec, setup, trainable, knobs, checkpointed, 0))


def _buffer_bytes(spec: ModelSpec, setup: Setup, trainable: tuple[TensorGroup, ...], knobs: Zero3Knobs,
                  checkpointed: bool, shards: int) -> int:
    elem = 2 if (setup.autocast or setup.weights_dtype in ("bf16", "fp16")) else 4
    adapters = trainable if setup.lora is not None else ()
    gathered = _gathered(_shape(spec, stored_per_element(setup)), checkpointed, setup.lora is None, knobs,
                         persistent_elements(spec, adapters, knobs), shards)
    largest = max((g.numel for g in trainable), default=0)
    return elem * (gathered + knobs.reduce_bucket_size + largest)


def zero3_step_release(spec: ModelSpec, setup: Setup, trainable: tuple[TensorGroup, ...], window: int, *, checkpointed: bool,
                       release: str | None = None, params_offloaded: bool = False) -> int:
    """Bytes of ZeRO-3's ``window`` (``zero3_buffer_bytes`` as the phases before the step price it) that ``step()``
    no longer holds: stage3.py 0.16.5 ``step`` starts with ``_partition_all_parameters`` (``release_and_reset_all``:
    every gathered parameter partitioned again, its full copy freed; a parameter left available raises), and no
    gradient is in flight any more. What stays is the persistent tensors' whole copies (``ds_persist``: never
    partitioned) and the ipg bucket (kept until ``destroy()``). 0 off ZeRO-3. ``checkpointed``: as ``window`` was
    priced (without recompute the bytes the forward walk holds)."""
    if setup.strategy != "zero3":
        return 0
    knobs = zero3_knobs(spec)
    if not checkpointed:
        window = zero3_buffer_bytes(spec, setup, trainable, knobs, checkpointed=False, release=release,
                                    params_offloaded=params_offloaded)
    elem = 2 if (setup.autocast or setup.weights_dtype in ("bf16", "fp16")) else 4
    adapters = trainable if setup.lora is not None else ()
    return max(window - elem * (persistent_elements(spec, adapters, knobs) + knobs.reduce_bucket_size), 0)


@lru_cache(maxsize=256)
def _gathered(shape: Shape, checkpointed: bool,
              embedding_trainable: bool, knobs: Zero3Knobs, persistent: int, copy_shards: int = 0) -> int:
    """The larger of the walk's forward and backward peaks, kept per model shape (hashing a whole trace costs more)."""
    return max(zero3_live_elements(*_trace(shape, checkpointed, embedding_trainable), knobs, persistent, copy_shards))
