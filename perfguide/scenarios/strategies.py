"""Data-parallel layouts for multi-GPU training: which ones a setup may use, in which order, and what they cost.

A *layout* is a strategy plus its offload flags. Layouts come in levels ordered by what they cost in
communication (transformers perf_train_gpu_many and deepspeed "ZeRO stage" guides: DeepSpeed's escalation order): replicate (DDP) -> shard gradients and
optimizer states (FSDP SHARD_GRAD_OP, ZeRO-2, ZeRO-1) -> shard everything (FSDP FULL_SHARD, ZeRO-3) -> CPU
offload. Every layout keeps the training semantics, so the multi-GPU ladder tries all levels of a semantics
rung (exact AMP, lighter optimizer, ...) before giving up precision: sharding costs time, not accuracy. The on-GPU
levels of a rung are one search tier ranked by predicted step time (``layout_tier``): sharding can be the faster
layout, not only the one that fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..errors import ConflictingConstraintsError, unknown_value
from ..model.types import ModelSpec
from ..optimizer_facts import row as optimizer_row
from ..setup import STRATEGIES, TRAIN_STRATEGIES, Setup
from ..speed.rates import trainable_params
from ..techniques.cpu_offload import LAYOUTS as OFFLOAD_LAYOUTS
from ..techniques.precision import pure_half
from .search import Priced, Rung, rank

#: FSDP2 is preferred over a DeepSpeed layout of the same level unless the latter is predicted this much faster:
#: the speed model's communication terms are not more accurate than that, and FSDP2 is native torch, the
#: Trainer's default FSDP version, and needs no extra package or JSON config.
FSDP_TIE_TOLERANCE = 0.10
#: a deeper-sharded layout (DDP < shard grads+optimizer < shard everything < offload) is chosen over a shallower one only
#: when predicted more than this much faster: every extra collective has a latency the model does not price
SHARDING_TIE_TOLERANCE = 0.01
#: the layout level whose states live in host RAM (its own search tier: see ``layout_tier``)
OFFLOAD_LEVEL = "CPU offload"
#: sharding strategies one GPU may be asked for (check_forced; train_gpu_one accepts the ZeRO ones), and the level
#: that runs one of them with every state on the GPU
ONE_GPU_SHARDED = ("zero2", "zero3", "fsdp")
#: what train_gpu_one accepts as a strategy: ZeRO-Offload on one GPU (DeepSpeed stage 2/3), or nothing sharded
ONE_GPU_STRATEGIES = ("single", "zero2", "zero3")
ONE_GPU_LEVEL = "no offload (one GPU)"


@dataclass(frozen=True)
class Layout:
    strategy: str
    offload_optimizer: bool = False
    offload_params: bool = False
    hybrid: bool = False        # FSDP2 HSDP: shard within each node, replicate across nodes
    #: FSDP reduce-scatters on every accumulation micro-step (accelerate's sync_each_batch) instead of holding the
    #: unsharded gradients under no_sync until the last one: less memory, (accumulation - 1) more reduce-scatters
    sync_each_micro_step: bool = False
    #: ranks that split each sequence (DeepSpeed Ulysses through accelerate's sp_size: techniques/sequence_parallel.py)
    sequence_parallel: int = 1

    @property
    def name(self) -> str:
        if self.hybrid:
            return f"{self.strategy} hybrid (HSDP)"
        off = ("optimizer+params" if self.offload_params else "optimizer") if self.offload_optimizer else ("params" if self.offload_params else "")
        return (self.strategy + (f" + offload {off}" if off else "") + (" + sync each micro-step" if self.sync_each_micro_step else "")
                + (f" + Ulysses SP {self.sequence_parallel}" if self.sequence_parallel > 1 else ""))

    @property
    def backend(self) -> str:
        facts = STRATEGIES[self.strategy]
        return "DeepSpeed ZeRO" if facts.zero_stage is not None else "FSDP2" if facts.fsdp else "torch DDP"

    def apply(self, s: Setup) -> Setup:
        # a sharded step follows the reduce-scatter, so it is never inside backward (fp8 under DeepSpeed is not
        # carried over as bf16: incompatible() refuses that pair, so a forced fp8=True is never quietly dropped)
        keep: dict[str, object] = {"optimizer_in_backward": False} if self.strategy != "single" else {}
        return s.replace(strategy=self.strategy, offload_optimizer=self.offload_optimizer, offload_params=self.offload_params,
                         hybrid_shard=self.hybrid, sync_grads_each_micro_step=self.sync_each_micro_step,
                         sequence_parallel=self.sequence_parallel, **keep)


def layout_of(s: Setup) -> Layout:
    return Layout(s.strategy, s.offload_optimizer, s.offload_params, s.hybrid_shard, s.sync_grads_each_micro_step, s.sequence_parallel)


def with_synced_variant(layouts: tuple[Layout, ...]) -> tuple[Layout, ...]:
    """Each FSDP layout (HSDP too) followed by its sync-each-micro-step twin, so the search weighs no_sync's unsharded
    gradients against the collectives it saves (memory/sharding.defers_grad_sync; under HSDP the reduce-scatter and the
    cross-node all-reduce alike); without accumulation the two are the same plan, and the first, no_sync, is kept on
    the tie."""
    return tuple(v for lay in layouts for v in ((lay, replace(lay, sync_each_micro_step=True))
                                                if STRATEGIES[lay.strategy].fsdp else (lay,)))


def unsynced(layout: Layout) -> Layout:
    """The layout without its sync-each-micro-step flag: the sharding it names, however it accumulates."""
    return replace(layout, sync_each_micro_step=False)


@dataclass(frozen=True)
class Level:
    name: str
    tradeoff: str
    layouts: tuple[Layout, ...]


@dataclass(frozen=True)
class Split:
    """The sequence-parallel sizes a ladder offers (``sequence_splits``): none, the sizes searched after every
    unsplit on-GPU layout of a rung, or ``only`` one size that every layout must use (``sequence_parallel=N`` asked)."""

    sizes: tuple[int, ...] = ()
    only: bool = False


#: the layout level that splits each sequence over several GPUs; DeepSpeed runs it (accelerate's sp_backend is
#: 'deepspeed' only), ZeRO-3 as the ALST recipes and TRL's example config run it
SEQUENCE_LEVEL = "split each sequence"
SEQUENCE_STRATEGY = "zero3"
#: the split with ZeRO-3's states in host RAM, as ALST's recipes run it (optimizer offload): a tier after CPU offload
SPLIT_OFFLOAD_LEVEL = "split each sequence + CPU offload"


def is_offload_level(name: str) -> bool:
    """Whether a level keeps states in host RAM (its own search tier, after every on-GPU one)."""
    return name in (OFFLOAD_LEVEL, SPLIT_OFFLOAD_LEVEL)


def _split_levels(split: Split, allow_offload: bool) -> list[Level]:
    """The sequence-parallel level, and, where ``sequence_parallel=N`` was asked, its ZeRO-3 offload layouts."""
    out = [Level(SEQUENCE_LEVEL, "each sequence is split over several GPUs (DeepSpeed Ulysses: an all-to-all before and after "
                 "attention), model states fully sharded (ZeRO-3)",
                 tuple(Layout(SEQUENCE_STRATEGY, sequence_parallel=n) for n in split.sizes))]
    if split.only and allow_offload:
        out.append(Level(OFFLOAD_LEVEL, "states live in pinned host RAM, cross PCIe every step, and the CPU runs the optimizer",
                         _split_offload_layouts(split)))
    return out


def _split_offload_layouts(split: Split) -> tuple[Layout, ...]:
    return tuple(Layout(st, oo, op, sequence_parallel=n) for st, oo, op in OFFLOAD_LAYOUTS if st == SEQUENCE_STRATEGY for n in split.sizes)


def levels(world: int, allow_offload: bool, nodes: int = 1, forced: str | None = None, split: Split = Split()) -> tuple[Level, ...]:
    """The layout ladder for ``world`` ranks on ``nodes`` nodes; FSDP2 first inside a level (the tie-break keeps it
    on near-ties).

    One GPU has nothing to shard, so its ladder is the plain replica and CPU offload; a sharding strategy asked for there
    (``forced``: ZeRO-2/3 or FSDP on one rank) also runs with every state on the GPU, so that layout is priced beside
    its offload layouts and the fastest that fits wins.

    Several nodes add HSDP to the first sharding level: FULL_SHARD inside each node (NVLink), replicas across nodes,
    so only an all-reduce of 1/g of the gradients crosses the network, less than even DDP sends; it is ranked by
    predicted step time against the layouts that shard across every rank. FSDP offload is all-or-nothing (params,
    grads and optimizer together), so it carries both flags.

    ``split`` adds the sequence-parallel level after the unsplit on-GPU ones (a tier of its own: ``layout_tier``), or,
    when one size was asked for, makes it the whole ladder.
    """
    sharded = world > 1
    if split.only and sharded:
        return tuple(_split_levels(split, allow_offload))
    out = [Level("replicate", "a full replica per GPU, one gradient all-reduce per step",
                 (Layout("ddp" if sharded else "single"),))]
    if sharded:
        hsdp = (Layout("fsdp", hybrid=True),) if nodes > 1 and world > nodes else ()
        out.append(Level("shard grads+optimizer", "parameters stay whole on every GPU (or, HSDP, within each node); gradients and "
                         "optimizer states are sharded", with_synced_variant((*hsdp, Layout("fsdp_shard_grad_op"), Layout("zero2"), Layout("zero1")))))
        out.append(Level("shard everything", "parameters are sharded too and all-gathered layer by layer in forward and backward",
                         with_synced_variant((Layout("fsdp"), Layout("zero3")))))
        if split.sizes and forced in (None, SEQUENCE_STRATEGY):
            out += _split_levels(split, allow_offload)
    elif forced in ONE_GPU_SHARDED:
        out.append(Level(ONE_GPU_LEVEL, f"{forced} on a single rank: nothing is sharded, every state stays on the GPU",
                         (Layout(forced),)))
    if allow_offload:
        out.append(Level(OFFLOAD_LEVEL, "states live in pinned host RAM, cross PCIe every step, and the CPU runs the optimizer",
                         with_synced_variant(tuple(Layout(*lay) for lay in OFFLOAD_LAYOUTS))))
    if allow_offload and sharded and split.sizes and forced in (None, SEQUENCE_STRATEGY):
        out.append(Level(SPLIT_OFFLOAD_LEVEL, "each sequence split over several GPUs, ZeRO-3's optimizer (and parameters) in host "
                         "RAM, as the ALST recipes run it", _split_offload_layouts(split)))
    return tuple(out)


def incompatible(t: Setup, lay: Layout) -> str | None:
    """Why ``lay`` cannot run the semantics of template ``t`` (None when it can), with the public source that says so.

    QLoRA runs fully sharded, and offloaded where that is what fits, as the published 70B-on-two-24GB recipes
    run it (sources.FSDP_QLORA: FSDP + ``bnb_4bit_quant_storage`` + CPU offload; sources.ZERO3_QLORA: ZeRO-3), and
    under ZeRO-1/2 with bitsandbytes' default uint8 storage (sources.ZERO12_QLORA: the engine's module.half() /
    bfloat16() casts floating tensors only, so the packed 4-bit base stays as it is, replicated like DDP's).
    """
    if lay.sequence_parallel > 1 and (why := split_conflict(t, lay.sequence_parallel)):
        return why
    if t.optimizer_in_backward and lay.strategy != "single":
        return ("the optimizer steps inside backward on one process (transformers: LOMO fused_backward / layer-wise hooks, no "
                "accumulation); a ZeRO or FSDP layout steps after its reduce-scatter")
    if t.autocast == "fp8" and STRATEGIES[lay.strategy].zero_stage is not None:
        return ("fp8 training runs through accelerate's torchao float8 backend, which DeepSpeed plans do not use "
                "(DeepSpeed runs bf16 here): fp8 is planned with DDP or FSDP2")
    if pure_half(t) and lay.strategy not in ("ddp", "single"):
        why = pure_half_unsupported(t, lay)
        if why:
            return why
    facts = optimizer_row(t.optimizer) if t.optimizer is not None else None
    if facts is not None:
        if (lay.offload_optimizer or lay.offload_params) and not facts.offloadable:
            return f"an offloaded optimizer steps on the CPU (DeepSpeed CPU AdamW / torch AdamW); {t.optimizer} needs CUDA tensors"
        if STRATEGIES[lay.strategy].fsdp and not facts.fsdp2:
            return f"{t.optimizer} is offered only where it sees plain tensors (DDP, DeepSpeed's flat partitions), not FSDP2's DTensor shards"
    return None


def split_conflict(t: Setup, size: int) -> str | None:
    """Why the template cannot split its sequences over ``size`` ranks (the sequence-parallel technique's own rules:
    world size, attention kernel, objective), None when it can."""
    from .. import techniques

    return techniques.get("sequence_parallel").conflict(t.model_copy(update={"sequence_parallel": size, "strategy": SEQUENCE_STRATEGY}))


def pure_half_unsupported(t: Setup, lay: Layout) -> str | None:
    """Why a sharded layout cannot keep pure 16-bit weights (None: it can).

    FSDP2 keeps bf16 shards, gradients and optimizer states when accelerate's mixed precision is "no" (it
    upcasts to fp32 only under a mixed-precision policy: fsdp2_prepare_model); perfguide emits exactly that.
    DeepSpeed 0.19 keeps bf16 masters, gradients and optimizer states with ``bf16.bf16_master_weights_and_grads`` +
    ``bf16_optimizer_states`` (runtime/precision_config.py), which perfguide emits; with ZeRO-Offload it then needs
    DeepSpeedCPUAdam built with ``fp32_optimizer_states=False`` (runtime/base_optimizer.py), which the Trainer's
    DeepSpeed optimizer block does not build, so offloaded layouts keep fp32 masters.
    """
    if t.weights_dtype == "fp16":
        return "pure fp16 weights need fp32 masters for the GradScaler; only bf16 weights train without a master copy"
    if STRATEGIES[lay.strategy].zero_stage is not None and (lay.offload_optimizer or lay.offload_params):
        return ("DeepSpeed's bf16 master weights with ZeRO-Offload need DeepSpeedCPUAdam(fp32_optimizer_states=False), which the "
                "Trainer does not build (deepspeed runtime/base_optimizer.py); pure bf16 under ZeRO is planned without offload")
    if STRATEGIES[lay.strategy].fsdp and t.fsdp_version != 2:
        return "pure bf16 under FSDP is planned for FSDP2 (fully_shard keeps each bf16 parameter as its own DTensor shard), not FSDP1"
    return None


def check_forced(forced: str | None, world: int, mode: str) -> None:
    """A requested strategy must be a training strategy that this world size and fine-tuning mode can run."""
    if forced is None:
        return
    if forced not in TRAIN_STRATEGIES:
        raise unknown_value("strategy", forced, TRAIN_STRATEGIES, ConflictingConstraintsError)
    if forced == "single" and world > 1:
        raise ConflictingConstraintsError(f"strategy='single' trains on one GPU but this plan has {world}; "
                                          "use scenario='train_gpu_one', or num_gpus=1")
    if forced != "single" and world == 1 and forced not in ("zero2", "zero3", "fsdp"):
        raise ConflictingConstraintsError(f"strategy={forced!r} needs several GPUs (world size is 1); "
                                          "on one GPU only zero2/zero3/fsdp with CPU offload make sense")


def allowed_levels(world: int, allow_offload: bool, forced: str | None, nodes: int = 1, split: Split = Split()) -> tuple[Level, ...]:
    """The ladder, cut to the requested strategy (its offload variants, and HSDP for 'fsdp', included)."""
    out = []
    for lv in levels(world, allow_offload, nodes, forced, split):
        lays = tuple(lay for lay in lv.layouts if forced is None or lay.strategy == forced)
        if lays:
            out.append(Level(lv.name, lv.tradeoff, lays))
    return tuple(out)


def layout_tier(rung: Rung) -> tuple[str, str]:
    """The search tier of an expanded rung: its semantics rung, and the kind of its level. All the unsplit on-GPU
    levels of one semantics rung (replicate, shard grads+optimizer, shard everything) are one tier ranked by predicted
    step time, so a sharded layout that is faster than DDP is found; splitting each sequence is the next tier (tried
    only when no unsplit layout of the rung fits: its all-to-alls are not validated against a published step time, and
    the ALST paper uses it where the sequence does not fit otherwise); CPU offload stays a later tier (it spends host
    RAM, which for a named target is an assumed figure, and is slower wherever something on-GPU fits)."""
    semantics, _, level = rung.name.rpartition(", ")
    return semantics, level if level in (OFFLOAD_LEVEL, SEQUENCE_LEVEL, SPLIT_OFFLOAD_LEVEL) else "on GPU"


def expand(rungs: list[Rung], ladder: tuple[Level, ...], forced: str | None, world: int = 2) -> list[Rung]:
    """Each semantics rung x each on-GPU layout level, rung by rung; then the CPU-offload levels, rung by rung: offload
    is the ladder's rung after lighter states, pure bf16 and the step in backward (docs/concepts.md), so an on-GPU
    layout of a later rung (Mixtral on 8x A100: pure bf16 under FSDP, 59.5 GiB, 3.97 s/step) wins over offloading an
    earlier one (exact AMP with its states offloaded: 6.25 s/step)."""
    on_gpu: list[Rung] = []
    offloaded: list[Rung] = []
    for r in rungs:
        for lv in ladder:
            ts = tuple(lay.apply(t) for t in r.templates for lay in lv.layouts if incompatible(t, lay) is None)
            if ts:
                (offloaded if is_offload_level(lv.name) else on_gpu).append(Rung(f"{r.name}, {lv.name}", f"{r.tradeoff}; {lv.tradeoff}", ts))
    out = on_gpu + offloaded
    if not out:  # every layout left is incompatible with what was asked: say why instead of searching nothing
        why = next((w for r in rungs for t in r.templates for lv in ladder for lay in lv.layouts
                    if (w := incompatible(t, lay))), "no layout can run these settings")
        asked = f"strategy={forced!r}" if forced else "these constraints"
        templates = [t for r in rungs for t in r.templates]
        others = [s for s in (TRAIN_STRATEGIES if world > 1 else ONE_GPU_STRATEGIES)
                  if s != forced and any(incompatible(t, Layout(s)) is None for t in templates)]
        raise ConflictingConstraintsError(f"{asked} cannot train what was asked: {why}; use another strategy "
                                          f"(accepted here: {', '.join(others)}) or drop the conflicting constraint")
    return out


def layout_search(world: int, allow_offload: bool, forced: str | None, nodes: int = 1, split: Split = Split()) -> dict[str, Any]:
    """``plan_training``'s hooks that search layouts: each semantics rung crossed with the allowed levels (``expand``),
    the on-GPU levels one tier (``layout_tier``), the fastest fitting layout with the shallow / FSDP2 tie-breaks
    (``prefer_fsdp``). train_gpu_many always; train_gpu_one when a ZeRO stage is asked for."""
    ladder = allowed_levels(world, allow_offload, forced, nodes, split)
    return {"expand": lambda rungs: expand(rungs, ladder, forced, world), "choose": prefer_fsdp, "tier": layout_tier}


def prefer_fsdp(fitting: list[Priced]) -> Priced:
    """The fastest fitting option, the shallowest layout kept on a near-tie (SHARDING_TIE_TOLERANCE), and FSDP2 kept
    over a DeepSpeed pick within FSDP_TIE_TOLERANCE (a DDP pick stays: it is native torch too, and shards nothing)."""
    ranked = rank(fitting)
    # near-ties go to the shallower layout: sharding adds collectives whose latency the step-time model does not price
    near = [p for p in ranked if p.step_time <= ranked[0].step_time * (1 + SHARDING_TIE_TOLERANCE)]
    depth = min(sharding_depth(p.setup) for p in near)
    ranked = [p for p in ranked if sharding_depth(p.setup) >= depth]
    first = next(p for p in ranked if sharding_depth(p.setup) == depth)
    fsdp = next((p for p in ranked if p.setup.is_fsdp), None)
    if (fsdp is not None and first.setup.is_deepspeed
            and fsdp.step_time <= first.step_time * (1 + FSDP_TIE_TOLERANCE)):
        return fsdp
    return first


def sharding_depth(s: Setup) -> int:
    """0 replicate, 1 shard grads+optimizer (HSDP included), 2 shard everything, 3 offload: on an exact tie of
    predicted step time the shallower layout wins (fewer collectives whose latency the model does not price)."""
    if s.offload_optimizer or s.offload_params:
        return 3
    if s.hybrid_shard:
        return 1
    return {"ddp": 0, "single": 0, "zero1": 1, "zero2": 1, "fsdp_shard_grad_op": 1}.get(s.strategy, 2)


def level_index(ladder: tuple[Level, ...], lay: Layout) -> int:
    return next((i for i, lv in enumerate(ladder) if lay in lv.layouts), len(ladder))


# --- communication ------------------------------------------------------------------------------------

def comm_bytes(spec: ModelSpec, s: Setup) -> float:
    """Bytes one rank sends per optimizer step in the data-parallel collectives.

    Ring collectives send (n-1)/n of the payload per pass; an all-reduce is two passes (reduce-scatter +
    all-gather). DDP / ZeRO-1: one all-reduce of the gradients per step. ZeRO-2: gradients reduce-scattered
    every micro-batch, updated parameters all-gathered once. SHARD_GRAD_OP: parameters gathered and gradients
    scattered every micro-batch. ZeRO-3 / FULL_SHARD: parameters gathered twice (forward and backward) and
    gradients scattered every micro-batch. Gradient elements are 16-bit where the sharding reduces the compute
    copy, the parameter dtype under DDP (fp32 master grads with AMP; fp32 adapters with LoRA).
    """
    n, ga = s.world_size, s.gradient_accumulation_steps
    if n == 1 or s.strategy in ("single", "device_map", "tp"):
        return 0.0
    if s.hybrid_shard:  # intra-node FULL_SHARD collectives, then an all-reduce of the 1/g gradient shard across nodes
        g, half = s.num_gpus, (2 if s.autocast else min(4, s.weight_bytes))
        grads, params = trainable_params(spec, s) * half, spec.total_params * half
        return ga * ((2 * params + grads) * (g - 1) / g + 2 * grads / g * (s.nodes - 1) / s.nodes)
    wbytes = s.weight_bytes
    half = 2 if s.autocast else min(4, wbytes)
    trainable = trainable_params(spec, s)
    grads = trainable * ((4 if s.lora else wbytes) if s.strategy == "ddp" else (2 if s.autocast else wbytes))
    params = spec.total_params * half
    passes = {
        "ddp": 2 * grads, "zero1": 2 * grads, "zero2": ga * grads + params,
        "fsdp_shard_grad_op": ga * (params + grads), "zero3": ga * (2 * params + grads), "fsdp": ga * (2 * params + grads),
    }[s.strategy]
    return passes * (n - 1) / n
