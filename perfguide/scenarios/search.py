"""Candidate enumeration, pricing and ranking shared by the training scenarios.

A *rung* is a set of Setup templates with the same training semantics (exact AMP; a lighter optimizer;
pure half weights; LoRA; QLoRA). Rungs are tried in the order of what they give up; inside the first rung
that has anything fitting, candidates are ranked by predicted step time. For each template the micro-batch
is searched over the divisors of the per-rank batch, so micro x accumulation x world == global always.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from .._base import GiB
from ..errors import ConflictingConstraintsError, PerfGuideError
from ..hardware.types import GPU, Hardware
from ..memory import Factors, estimate_memory
from ..memory.types import MemoryEstimate
from ..model.types import ModelSpec
from ..optimizer_facts import steps_in_backward
from ..setup import Setup
from ..speed import estimate_speed
from ..speed.types import Throughput
from ..techniques import Rung
from .types import Candidate

TENSOR_CORE_MULTIPLE = 8


@dataclass(frozen=True)
class Priced:
    """A candidate's memory, and its speed priced on first use: most candidates a search prices do not fit, and
    their speed (the dearer half) is never read, so it is computed only for those shown or compared."""

    setup: Setup
    memory: MemoryEstimate
    speed: Throughput | Callable[[], Throughput] = field(repr=False, compare=False)

    @cached_property
    def throughput(self) -> Throughput:
        return self.speed if isinstance(self.speed, Throughput) else self.speed()

    @property
    def step_time(self) -> float:
        return self.throughput.step_time_s


@dataclass(frozen=True)
class Option:
    """One template's outcome: the fastest fitting micro-batch and the smallest one that does not fit."""

    template: Setup
    best: Priced | None
    too_big: Priced | None


@dataclass
class SearchResult:
    chosen: Priced | None
    rung: Rung | None
    options: list[tuple[Rung, Option]] = field(default_factory=list)

    def option(self, **match: object) -> Option | None:
        """The evaluated option whose template has these field values (e.g. gradient_checkpointing=True)."""
        for _, opt in self.options:
            if all(getattr(opt.template, k) == v for k, v in match.items()):
                return opt
        return None


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def gib_over(need: float, usable: float) -> str:
    """'need > usable' in GiB with as many decimals as it takes for the printed numbers to say it: 71.24 GiB over
    71.2 GiB, both shown at one decimal, read '71.2 GiB > 71.2 GiB', a comparison the reader sees as false."""
    for digits in (1, 2, 3):
        a, b = f"{need / GiB:.{digits}f}", f"{usable / GiB:.{digits}f}"
        if float(a) > float(b):
            return f"{a} GiB > {b} GiB"
    return f"{need:,.0f} B > {usable:,.0f} B"


def usable_bytes(memory: MemoryEstimate, headroom: float) -> int | None:
    """Device memory a plan may fill: capacity (already what a probe saw free) minus the headroom fraction.
    Training and inference rules both judge 'fits' by it, so a plan and its report never disagree."""
    return None if memory.capacity is None else int(memory.capacity * (1 - headroom))


def usable_ram(hardware: Hardware, headroom: float) -> int:
    """Host RAM offloaded states may fill on one node (all its ranks together), less the headroom fraction."""
    return int(hardware.cpu.ram_available * (1 - headroom))


def fits_ram(memory: MemoryEstimate, hardware: Hardware, headroom: float) -> bool:
    """Offloaded states (``cpu_ram``, summed over the node's ranks) must fit the node's host RAM; 0 always fits."""
    return memory.cpu_ram == 0 or memory.cpu_ram <= usable_ram(hardware, headroom)


def fits(memory: MemoryEstimate, hardware: Hardware, headroom: float) -> bool:
    """The footprint that decides an OOM (``needed``: the allocator releases its cache before it raises), not the
    steady-state total nvidia-smi shows, within the usable bytes; and offloaded states within host RAM."""
    usable = usable_bytes(memory, headroom)
    return memory.kernel_limit is None and (usable is None or memory.needed <= usable) and fits_ram(memory, hardware, headroom)


def quiet_speed(spec: ModelSpec, setup: Setup, hardware: Hardware, factors: Factors | None = None) -> Throughput:
    """Speed of a candidate without its warnings: only the chosen setup's warnings reach the plan."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return estimate_speed(spec, setup, hardware, factors)


def speed_warnings(spec: ModelSpec, setup: Setup, hardware: Hardware, factors: Factors | None = None) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimate_speed(spec, setup, hardware, factors)
    return list(dict.fromkeys(str(w.message) for w in caught))


def price(spec: ModelSpec, setup: Setup, hardware: Hardware, factors: Factors | None = None) -> Priced:
    """``factors``: this machine's calibration for this model (Request.calibration); None for other machines."""
    return Priced(setup, estimate_memory(spec, setup, hardware, factors), lambda: quiet_speed(spec, setup, hardware, factors))


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


class ForcedMicro(list[int]):
    """The micro-batch the user asked for, as the one choice: a layout that multiplies the per-rank batch (sequence
    parallelism) keeps it, where it widens searched choices to the new batch's divisors."""


def micro_batch_choices(per_rank_batch: int, forced: int | None) -> list[int]:
    """Micro-batches that divide the per-rank batch exactly (so the global batch never changes)."""
    if forced is not None:
        if per_rank_batch % forced:
            raise ConflictingConstraintsError(
                f"micro_batch_size={forced} does not divide the per-device batch {per_rank_batch}; "
                f"pick one of {', '.join(map(str, divisors(per_rank_batch)))} or change global_batch_size")
        return ForcedMicro([forced])
    return divisors(per_rank_batch)


def with_micro(template: Setup, micro: int, per_rank_batch: int) -> Setup:
    """The template (already validated) at one micro-batch. No conflict rule reads the micro-batch, and the one that
    reads accumulation (optimizer_in_backward needs 1) is met by ``best_for_template``'s choices, so the copy skips
    re-validation: hundreds of candidates per request, each validated again, were a fifth of a large plan's time."""
    accumulation = per_rank_batch // micro
    if template.optimizer_in_backward and accumulation != 1:
        return template.replace(micro_batch_size=micro, gradient_accumulation_steps=accumulation)  # raises, as before
    return template.model_copy(update={"micro_batch_size": micro, "gradient_accumulation_steps": accumulation})


def _speed_key(p: Priced) -> tuple[float, int, str]:
    """Fastest first; ties go to tensor-core-friendly (multiple of 8 / power of two) micro-batches, then the label."""
    micro = p.setup.micro_batch_size
    friendly = micro % TENSOR_CORE_MULTIPLE == 0 or (micro & (micro - 1)) == 0
    return (round(p.step_time, 12), 0 if friendly else 1, p.setup.label)


def _widest_split_fits(spec: ModelSpec, template: Setup, hardware: Hardware, per_rank_batch: int, headroom: float,
                       factors: Factors | None, floors: dict[Setup, bool]) -> bool:
    """Whether the template split over every GPU of its node, at micro-batch 1, fits: a split trims only what scales with
    the tokens a rank holds, so no narrower split of the same template fits where this one does not (one pricing per
    semantics template, kept in ``floors``, instead of one per split size: the split tiers are searched whenever no
    unsplit layout fits, and a model too big for the node's GPUs would price each of them for nothing)."""
    widest = template.model_copy(update={"sequence_parallel": template.num_gpus, "micro_batch_size": 1,
                                         "gradient_accumulation_steps": per_rank_batch * template.num_gpus})
    if widest not in floors:
        floors[widest] = fits(price(spec, widest, hardware, factors).memory, hardware, headroom)
    return floors[widest]


def best_for_template(spec: ModelSpec, template: Setup, hardware: Hardware, per_rank_batch: int,
                      choices: list[int], headroom: float, factors: Factors | None = None,
                      floors: dict[Setup, bool] | None = None) -> Option:
    """The smallest micro-batch first, then a binary search for the largest fitting one (memory grows with the
    micro-batch), then the fastest fitting one.

    ``per_rank_batch`` is the global batch over the world size; a layout that splits each sequence over ``sp`` ranks
    has ``world / sp`` data-parallel groups, so each group (each of its ranks runs a slice of every sample) takes ``sp``
    times that many samples (transformers Trainer.get_total_train_batch_size: micro x accumulation x world / sp)."""
    if template.sequence_ranks > 1:
        if floors is not None and not _widest_split_fits(spec, template, hardware, per_rank_batch, headroom, factors, floors):
            return Option(template, None, None)
        per_rank_batch *= template.sequence_ranks
        choices = choices if isinstance(choices, ForcedMicro) else divisors(per_rank_batch)
    if template.optimizer_in_backward:   # no accumulation: the micro-batch is the whole per-device batch
        choices = [c for c in choices if c == per_rank_batch]
        if not choices:
            return Option(template, None, None)
    # the smallest micro-batch first: when even it does not fit (most templates of a model too big for the node),
    # it is the option's too_big, as the search below would end on it, and nothing else needs pricing
    def whole_batch() -> Priced | None:
        """FSDP accumulation holds the unsharded gradients between micro-steps (memory/sharding.no_sync_grads), so memory
        is not monotone in the micro-batch: without accumulation the whole per-device batch can fit where a smaller
        micro-batch does not. That batch when it fits, else None."""
        if not template.is_fsdp or len(choices) < 2:
            return None
        whole = price(spec, with_micro(template, choices[-1], per_rank_batch), hardware, factors)
        return whole if fits(whole.memory, hardware, headroom) else None

    smallest = price(spec, with_micro(template, choices[0], per_rank_batch), hardware, factors)
    if not fits(smallest.memory, hardware, headroom):
        return Option(template, whole_batch(), smallest)
    lo, hi = 1, len(choices) - 1
    largest, too_big = smallest, None
    while lo <= hi:
        mid = (lo + hi) // 2
        p = price(spec, with_micro(template, choices[mid], per_rank_batch), hardware, factors)
        if fits(p.memory, hardware, headroom):
            largest, lo = p, mid + 1
        else:
            too_big, hi = p, mid - 1
    whole = whole_batch() if largest.setup.micro_batch_size < choices[-1] else None   # where the binary search stopped lower
    if whole is not None and whole.step_time < largest.step_time:
        return Option(template, whole, too_big)
    # a smaller micro-batch can be faster; the smallest one's speed is priced already
    timed = [] if largest is smallest else [(smallest.throughput, smallest.setup)]
    timed += [(quiet_speed(spec, s, hardware, factors), s) for s in (with_micro(template, c, per_rank_batch) for c in choices[1:]
                                                                     if c < largest.setup.micro_batch_size)]
    faster = [(t, s) for t, s in timed if t.step_time_s < largest.step_time]
    if faster:
        t, s = min(faster, key=lambda ts: ts[0].step_time_s)
        largest = smallest if s is smallest.setup else Priced(s, estimate_memory(spec, s, hardware, factors), t)
    return Option(template, largest, too_big)


def rank(priced: list[Priced]) -> list[Priced]:
    return sorted(priced, key=_speed_key)


def search(spec: ModelSpec, rungs: list[Rung], hardware: Hardware, per_rank_batch: int,
           choices: list[int], headroom: float, choose: Callable[[list[Priced]], Priced] | None = None,
           factors: Factors | None = None, tier: Callable[[Rung], object] | None = None) -> SearchResult:
    """Walk the rungs; stop at the first tier with a fitting candidate and choose its fastest (or what ``choose`` picks).

    A tier is a run of consecutive rungs with the same ``tier(rung)`` key (default: each rung its own tier): rungs
    that keep the same training semantics and differ only in how they are laid out (DDP, sharded) are one tier, so
    the fastest of them wins, not the first that fits (a sharded layout can be faster than DDP when the optimizer
    step and the gradient all-reduce shrink with the shards)."""
    result = SearchResult(chosen=None, rung=None)
    floors: dict[Setup, bool] = {}
    i = 0
    while i < len(rungs):
        key = tier(rungs[i]) if tier else i
        group = [rungs[i]]
        while tier and i + len(group) < len(rungs) and tier(rungs[i + len(group)]) == key:
            group.append(rungs[i + len(group)])
        i += len(group)
        fitting: list[tuple[Rung, Priced]] = []
        for rung in group:
            opts = [best_for_template(spec, t, hardware, per_rank_batch, choices, headroom, factors, floors) for t in rung.templates]
            result.options += [(rung, o) for o in opts]
            fitting += [(rung, o.best) for o in opts if o.best is not None]
        if fitting:
            result.chosen = (choose or (lambda ps: rank(ps)[0]))([p for _, p in fitting])
            result.rung = next(r for r, p in fitting if p is result.chosen)
            return result
    return result


def least_memory(result: SearchResult) -> Priced:
    """What to show when nothing fits: the evaluated setup closest to fitting, unsplit where one was priced (a split that
    does not make the plan fit is no answer: it only trims activations, and the report would send the user to Ulysses
    for a plan bound by its weights or its host RAM)."""
    pool = [p for _, o in result.options if (p := o.best or o.too_big) is not None]
    pool = [p for p in pool if p.setup.sequence_ranks == 1] or pool
    return min(pool, key=lambda p: (p.memory.device_total, p.setup.label))


def candidates(result: SearchResult, hardware: Hardware, headroom: float) -> tuple[Candidate, ...]:
    """The table the report shows: each template's best (chosen / fits) and its first micro-batch that does not fit."""
    out: list[Candidate] = []
    for rung, opt in result.options:
        if opt.best is not None:
            chosen = result.chosen is not None and opt.best.setup == result.chosen.setup
            why = f"{rung.name}: {'fastest that fits' if chosen else f'{opt.best.step_time:.3g} s/step'}"
            out.append(Candidate(setup=opt.best.setup, memory=opt.best.memory, throughput=opt.best.throughput,
                                 verdict="chosen" if chosen else "fits", why=why))
        if opt.too_big is not None:
            why = f"{rung.name}: {not_fitting_why(opt.too_big.memory, hardware, headroom)}"
            out.append(Candidate(setup=opt.too_big.setup, memory=opt.too_big.memory, throughput=opt.too_big.throughput,
                                 verdict="does-not-fit", why=why))
    return tuple(out)


def broken_limit(memory: MemoryEstimate, hardware: Hardware, headroom: float) -> tuple[str, int]:
    """Which limit a setup breaks, in words and as the bytes that break it: device memory, or (offload) the
    node's host RAM; or an attention kernel that cannot index the setup's q at any memory (the bytes it would need)."""
    if memory.kernel_limit is not None:
        return memory.kernel_limit, memory.needed
    usable = usable_bytes(memory, headroom)
    if (usable is None or memory.needed <= usable) and not fits_ram(memory, hardware, headroom):
        need, ram = gib_over(memory.cpu_ram, usable_ram(hardware, headroom)).split(" > ")
        return f"offload needs {need} host RAM per node > {ram} usable", memory.cpu_ram
    return f"needs {gib_over(memory.needed, usable or 0)} usable", memory.needed


def not_fitting_why(memory: MemoryEstimate, hardware: Hardware, headroom: float) -> str:
    return broken_limit(memory, hardware, headroom)[0]


# --- "does not fit here: here is what would" ------------------------------------------------------

@lru_cache(maxsize=1)
def _named_gpus() -> tuple[tuple[str, Hardware], ...]:
    """Single-GPU named targets, smallest memory first; empty if the hardware table is unavailable."""
    try:
        from ..hardware.named import known_names

        hws = [(n, Hardware.from_name(n)) for n in known_names() if n != "cpu"]
    except (PerfGuideError, ImportError):
        return ()
    # node types (dgx-h100, p5.48xlarge) are several GPUs: not a "bigger GPU"
    return tuple(sorted(((n, h) for n, h in hws if h.gpu_count == 1), key=lambda nh: (nh[1].gpus[0].memory_total, nh[0])))


#: the smallest memory ratio that makes another card "bigger" (named cards of one class differ by a few MiB)
BIGGER = 1.05


def bigger_gpu(spec: ModelSpec, setup: Setup, hardware: Hardware, headroom: float) -> tuple[str, Priced] | None:
    """The smallest named GPU with more memory than this one on which ``setup`` fits. A card of the same nominal size
    is no answer (an RTX 3090's 24,576 MiB against an RTX 4090's 24,564): bigger means at least ``BIGGER`` times."""
    gpu = hardware.smallest_gpu
    for name, hw in _named_gpus():
        if gpu is not None and (hw.gpus[0].memory_total < gpu.memory_total * BIGGER or hw.gpus[0].vendor != gpu.vendor):
            continue  # a bigger card of the same vendor: the user's software stack stays the same
        if "bf16" in (setup.autocast, setup.weights_dtype) and not hw.gpus[0].supports_bf16:
            continue  # the setup priced is a bf16 one: a V100 would run another (fp16) setup
        p = price(spec, setup, hw)
        if fits(p.memory, hw, headroom):
            return name, p
    return None


def sharded_gpus_needed(spec: ModelSpec, setup: Setup, gpu: GPU, hardware: Hardware, headroom: float,
                        strategy: str = "fsdp", max_gpus: int = 64, per_node: int = 8) -> tuple[int, Priced] | None:
    """Fewest identical GPUs (powers of two) over which a fully sharded ``setup`` fits per device."""
    if steps_in_backward(setup.optimizer):
        return None   # LOMO / layer-wise optimizers step inside backward on one process: they cannot shard
    n = 2
    while n <= max_gpus:
        nodes = max(1, n // per_node)
        hw = hardware.model_copy(update={"gpus": (gpu,) * min(n, per_node), "nodes": nodes})
        # a sharded run steps after the reduce-scatter: no optimizer step inside backward there
        s = setup.replace(strategy=strategy, num_gpus=min(n, per_node), nodes=nodes, optimizer_in_backward=False)
        p = price(spec, s, hw)
        if fits(p.memory, hw, headroom):
            return n, p
        n *= 2
    return None
