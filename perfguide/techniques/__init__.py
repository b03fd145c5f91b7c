"""Techniques as a registry: one module per technique, each declaring what it owns and emits (base.py).

``names()`` lists them, ``get(name)`` returns one; the search builds its fit ladder with ``ladder(ctx)`` and
the adapters merge what the techniques a Setup uses emit with ``emit(kind, ctx)``; the cost model folds their
effects with ``shaped``, ``step_shape``, ``memory_terms``, ``kernel_factors`` and ``step_seconds``. Modules in
this package are discovered, so a new technique is one file here (plus its Setup field).
"""

from __future__ import annotations

import pkgutil
from functools import cache, lru_cache
from importlib import import_module
from itertools import product
from typing import TYPE_CHECKING, Any

from ..errors import PerfGuideError, unknown_value
from ..setup import add_technique_field, use_technique_rules
from .base import EmitContext, LadderContext, Requires, Rung, Technique
from .effects import KernelFactors, MemoryContext, MemoryTerms, SpeedContext, StepSeconds, StepShape

if TYPE_CHECKING:
    from ..memory.sharding import PerDevice
    from ..setup import Setup

__all__ = ["EmitContext", "KernelFactors", "LadderContext", "MemoryContext", "MemoryTerms", "Requires", "Rung",
           "SpeedContext", "StepSeconds", "StepShape", "Technique", "active", "emit", "get", "kernel_factors", "ladder",
           "memory_terms", "names", "per_rank", "placed", "registry", "shaped", "step_seconds", "step_shape", "traced_fields",
           "traced_model"]

_NOT_TECHNIQUES = frozenset({"base", "effects"})


@cache
def registry() -> tuple[Technique, ...]:
    """Every technique, in emission order; each module lists its instances in ``TECHNIQUES``."""
    found: list[Technique] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in _NOT_TECHNIQUES:
            continue
        found += list(getattr(import_module(f"{__name__}.{info.name}"), "TECHNIQUES", ()))
    seen: dict[str, Technique] = {}
    owner: dict[str, str] = {}
    for t in found:
        if t.name in seen:
            raise PerfGuideError(f"two techniques are named {t.name!r}")
        for f in t.fields:
            if f in owner:
                raise PerfGuideError(f"Setup field {f!r} is owned by both {owner[f]!r} and {t.name!r}")
            owner[f] = t.name
        seen[t.name] = t
        for name, (annotation, default, description) in t.setup_fields.items():
            add_technique_field(name, annotation, default, description)
    return tuple(sorted(found, key=lambda t: (t.order, t.name)))


def names() -> list[str]:
    """The registered technique names, in emission order."""
    return [t.name for t in registry()]


def get(name: str) -> Technique:
    for t in registry():
        if t.name == name:
            return t
    raise unknown_value("technique", name, names())


def active(setup: Setup) -> list[Technique]:
    """The techniques ``setup`` uses, in emission order."""
    return [t for t in registry() if t.active(setup)]


def emit(kind: str, ctx: EmitContext) -> dict[str, Any]:
    """Merge one adapter's keys (``kind`` is a Technique method: training_args, model_kwargs, fsdp_config...)
    from every technique, in emission order. Every technique is asked: one that is off may still emit a
    key (fsdp_config's activation_checkpointing=False)."""
    out: dict[str, Any] = {}
    for t in registry():
        out.update(getattr(t, kind)(ctx))
    return out


def ladder(ctx: LadderContext) -> list[Rung]:
    """The fit ladder: every rung techniques add, in ``ladder_order``, each template crossed with the axes
    (e.g. checkpointing off/on) so axes are tried inside a rung before the next rung gives more up."""
    axes = [t.axis_values(ctx) for t in registry() if t.axis]
    combos = [dict(kv for part in parts for kv in part.items()) for parts in product(*axes)]
    rung_makers = sorted((t for t in registry() if t.ladder_order is not None), key=lambda t: (t.ladder_order, t.name))
    out: list[tuple[float, int, Rung]] = []
    for t in rung_makers:
        for rung in t.rungs(ctx):
            templates = tuple(dict.fromkeys(combined for s in rung.templates for c in combos if (combined := _combined(s, c)) is not None))
            order = rung.order if rung.order is not None else float(t.ladder_order)  # type: ignore[arg-type]
            out.append((order, len(out), Rung(rung.name, rung.tradeoff, templates)))
    return [r for _, _, r in sorted(out, key=lambda x: (x[0], x[1]))]


def _combined(template: Setup, update: dict[str, Any]) -> Setup | None:
    """The template with one combination of axis values, or None where the Setup refuses it (fp8 under DeepSpeed,
    Liger on a model type it does not patch...): such a combination is not a candidate."""
    if not update:
        return template
    try:
        return template.replace(**update)
    except ValueError:
        return None


# --- the cost model's view: every technique's effect, folded in emission order ------------------------

def placed(setup: Setup, dev: PerDevice) -> PerDevice:
    """The per-device model states after every technique placed them (offloaded parts in host RAM)."""
    for t in registry():
        dev = t.place(setup, dev)
    return dev


def weights_on_host(setup: Setup) -> bool:
    """Whether the techniques' placement moves the weights off the device (CPU offload's hook), asked of the placement
    itself so a cost-model module need not read the switch."""
    from ..memory.sharding import PerDevice

    return placed(setup, PerDevice(weights=1, grads=0, optimizer=0, buffers=0, cpu_ram=0)).weights == 0


def per_rank(setup: Setup) -> Setup:
    """The Setup one rank computes where a technique splits each sequence over ranks (``Technique.per_rank``)."""
    for t in registry():
        setup = t.per_rank(setup)
    return setup


def shaped(setup: Setup) -> Setup:
    """The Setup whose (batch, sequence) the model really computes on, for the memory model: one rank's slice, then
    each technique's reshaping (padding-free's one row)."""
    setup = per_rank(setup)
    for t in registry():
        setup = t.shape(setup)
    return setup


def step_shape(setup: Setup) -> StepShape:
    """Matmul tokens, attention shape and real tokens of one micro-step, for the speed model."""
    padded = setup.micro_batch_size * setup.seq_len
    real = setup.micro_batch_size * (setup.avg_seq_len or setup.seq_len)   # tokens/s counts tokens with signal
    shape = StepShape(padded, (setup.micro_batch_size, setup.seq_len), real)
    for t in registry():
        shape = t.step_shape(setup, shape)
    return shape


def memory_terms(ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
    for t in registry():
        terms = t.memory(ctx, terms)
    return terms


def kernel_factors(setup: Setup) -> KernelFactors:
    """The product (sum for recomputed forwards) of every technique's factors; the cost model asks it several times
    per candidate, so it is kept per (Setup, registry)."""
    return _kernel_factors(setup, registry())


@lru_cache(maxsize=1024)
def _kernel_factors(setup: Setup, techniques: tuple[Technique, ...]) -> KernelFactors:
    launches = elementwise = decode = device_optimizer = 1.0
    recompute = 0.0
    fused = per_tensor = False
    for t in techniques:
        f = t.kernel_factors(setup)
        fused = fused or f.fused_blocks
        per_tensor = per_tensor or f.step_per_tensor
        launches *= f.launches
        elementwise *= f.elementwise
        decode *= f.decode_overhead
        recompute += f.recompute
        device_optimizer *= f.device_optimizer
    return KernelFactors(launches, elementwise, decode, recompute, device_optimizer, fused, per_tensor)


def step_seconds(ctx: SpeedContext) -> StepSeconds:
    compute = transfer = per_step = fetch = comm = 0.0
    synced = False
    for t in registry():
        s = t.speed(ctx)
        compute += s.compute
        transfer += s.transfer
        per_step += s.per_step
        fetch += s.fetch
        comm += s.comm
        synced = synced or s.grads_synced_each_micro_step
    return StepSeconds(compute, transfer, per_step, fetch, comm, synced)


def traced_model(setup: Setup, model: Any) -> Any:
    """The memory tracer's meta model as every technique ``setup`` uses would change it (``Technique.trace_model``)."""
    for t in registry():
        model = t.trace_model(setup, model)
    return model


def traced_fields() -> tuple[str, ...]:
    """Setup fields that change the traced model: those of every technique with a ``trace_model`` hook."""
    return tuple(f for t in registry() if type(t).trace_model is not Technique.trace_model for f in t.fields)


use_technique_rules(lambda: registry())   # every Setup obeys the techniques' conflicts and lists their label words
