"""Exact memory mode: run one real training step of the HF modules on fake tensors and read the peak.

Nothing is allocated and no weights are needed: the model is built on ``meta`` from its config and every op
runs on fake tensors that carry only shape and dtype, while a dispatch-mode tracker sums live storage bytes.
Deep stacks are traced at one and two block patterns and extrapolated phase by phase (blocks are identical, so
each phase's bytes are exactly linear in depth); results are cached on disk. Parts that cannot run on fake
tensors (bitsandbytes 8-bit optimizer kernels, quantized weights) come from the analytic model and say so.
"""

from __future__ import annotations

import logging
from typing import Any

from ..hardware.types import Hardware
from ..model.types import ModelSpec
from ..setup import Setup
from ..techniques import traced_fields
from .overhead import to_estimate
from .tracing import cache
from .tracing.build import depth_keys, depth_period, with_depth
from .tracing.step import TRACED_OPTIMIZERS, PhasePeak, StepTrace
from .types import MemoryEstimate

logger = logging.getLogger("perfguide.memory.trace")

#: Setup fields that change what a single device holds; the rest (world size, host knobs) do not.
#: The traced model is built as its techniques prepare it (tracing/build.py), so their fields join the key (shape_of).
_SHAPE_FIELDS = ("micro_batch_size", "seq_len", "target_len", "weights_dtype", "autocast", "optimizer", "attn_implementation", "lora",
                 "device")
#: Model types whose HF config keys match the ModelSpec fields, for specs that arrive without a raw config.
_SPEC_KEYS = {"hidden_size": "hidden_size", "intermediate_size": "intermediate_size", "num_hidden_layers": "num_layers",
              "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_key_value_heads",
              "head_dim": "head_dim", "vocab_size": "vocab_size", "tie_word_embeddings": "tie_word_embeddings"}


def trace_memory(spec: ModelSpec, setup: Setup, hardware: Hardware | None = None) -> MemoryEstimate:
    """Per-device memory of one steady-state training step of ``spec`` under ``setup``, traced on fake tensors."""
    from .._interrupt import deferred_sigint

    with deferred_sigint():  # Ctrl-C stops the trace between ops, never inside a finalizer (see perfguide._interrupt)
        return _trace_memory(spec, setup, hardware)


def _trace_memory(spec: ModelSpec, setup: Setup, hardware: Hardware | None) -> MemoryEstimate:
    setup = Setup.parse(setup)
    if setup.task != "train" or setup.strategy not in ("single", "ddp"):
        return _analytic(spec, setup, hardware, f"trace mode covers single-device and DDP training; task={setup.task!r}, "
                                                  f"strategy={setup.strategy!r} priced analytically")
    notes: list[str] = []
    config = spec.config if spec.config else _config_from_spec(spec, notes)
    traced_setup = setup
    if setup.optimizer is not None and setup.optimizer not in TRACED_OPTIMIZERS:
        traced_setup = setup.replace(optimizer=None)
    if setup.weights_dtype in ("int8", "nf4"):
        traced_setup = traced_setup.model_copy(update={"weights_dtype": "bf16"})
    step = traced_step(config, traced_setup, notes)
    phases = dict(step.phases)
    cpu_ram = 0
    if traced_setup.optimizer != setup.optimizer:
        phases, cpu_ram = _add_analytic_optimizer(phases, step, setup.optimizer, notes, setup.bnb_embedding_override)
    if setup.weights_dtype in ("int8", "nf4"):
        phases = _quantized_weights(phases, spec, setup, hardware, notes)
    if setup.strategy == "ddp" and setup.world_size > 1:
        phases = _ddp_buckets(phases, setup, step, notes)
    name, peak = max(phases.items(), key=lambda kv: kv[1].total)
    notes.append(f"peak in the {name.replace('_', ' ')} phase; SDPA kernels emulated: "
                 + ", ".join(f"{k}={v}" for k, v in step.sdpa_kernels.items() if v) if any(step.sdpa_kernels.values())
                 else f"peak in the {name.replace('_', ' ')} phase")
    p = peak.parts
    return to_estimate(
        setup=setup, hardware=hardware, weights=p.get("weights", 0), gradients=p.get("gradients", 0),
        optimizer_states=p.get("optimizer_states", 0), activations=p.get("activations", 0), logits=p.get("logits", 0),
        other=p.get("temporaries", 0) + p.get("optimizer_temporaries", 0), peak_allocated=peak.total,
        cpu_ram=cpu_ram, method="trace", notes=tuple(notes),
    )


def traced_step(config: dict[str, Any], setup: Setup, notes: list[str] | None = None) -> StepTrace:
    """The step at full depth: traced at one and two block patterns and extrapolated, or traced whole."""
    notes = notes if notes is not None else []
    keys = depth_keys(config)
    depth = config[keys[0]]
    period = depth_period(config)
    if period is None or depth <= 2 * period:
        if period is None:
            notes.append("blocks differ along depth (or stacks differ in depth): traced the full stack")
        return _cached_step(config, depth, setup)
    one, two = _cached_step(config, period, setup), _cached_step(config, 2 * period, setup)
    notes.append(f"traced {period} and {2 * period} block(s), extrapolated linearly to {depth}")
    return extrapolate(one, two, depth // period)


def extrapolate(one: StepTrace, two: StepTrace, n: int) -> StepTrace:
    """Each phase's peak and parts at ``n`` block patterns from the traces at 1 and 2 patterns."""
    def lin(a: int, b: int) -> int:
        return max(0, a + (n - 1) * (b - a))

    phases = {}
    for name in one.phases.keys() & two.phases.keys():
        a, b = one.phases[name], two.phases[name]
        parts = {k: lin(a.parts.get(k, 0), b.parts.get(k, 0)) for k in a.parts.keys() | b.parts.keys()}
        phases[name] = PhasePeak(total=lin(a.total, b.total), parts=parts)
    groups_a = {(r, c, k): cnt for r, c, k, cnt in one.trainable_groups}
    groups_b = {(r, c, k): cnt for r, c, k, cnt in two.trainable_groups}
    groups = [(r, c, k, lin(groups_a.get((r, c, k), 0), groups_b.get((r, c, k), 0))) for r, c, k in sorted(groups_a.keys() | groups_b.keys())]
    return StepTrace(
        phases=phases, params=lin(one.params, two.params), trainable_params=lin(one.trainable_params, two.trainable_params),
        sdpa_kernels={k: lin(one.sdpa_kernels.get(k, 0), two.sdpa_kernels.get(k, 0)) for k in one.sdpa_kernels},
        optimizer_traced=one.optimizer_traced, trainable_groups=[g for g in groups if g[3] > 0],
        trainable_bytes_per_param=one.trainable_bytes_per_param,
    )


def shape_of(setup: Setup) -> dict[str, Any]:
    """The part of a Setup that a single-device trace depends on (the cache key's setup half)."""
    shape = {k: getattr(setup, k) for k in (*_SHAPE_FIELDS, *traced_fields())}
    shape["lora"] = setup.lora.model_dump(mode="json") if setup.lora else None
    shape["accumulating"] = setup.gradient_accumulation_steps > 1
    return shape


def _cached_step(config: dict[str, Any], depth: int, setup: Setup) -> StepTrace:
    from .tracing.step import run_step

    key = cache.cache_key(config, depth, shape_of(setup))
    hit = cache.load(key)
    if hit is not None:
        return hit
    logger.debug("tracing %s at depth %d (%s)", config.get("model_type"), depth, setup.label)
    step = run_step(with_depth(config, depth), setup)
    cache.store(key, step)
    return step


def _shift(phases: dict[str, PhasePeak], part: str, delta: int, only: str | None = None) -> dict[str, PhasePeak]:
    """Add ``delta`` bytes of ``part`` to every phase (or one), the way a tensor live throughout the step would."""
    out = {}
    for name, ph in phases.items():
        if only is not None and name != only:
            out[name] = ph
            continue
        parts = dict(ph.parts)
        parts[part] = max(0, parts.get(part, 0) + delta)
        out[name] = PhasePeak(total=max(0, ph.total + delta), parts=parts)
    return out


def _add_analytic_optimizer(phases: dict[str, PhasePeak], step: StepTrace, name: str | None, notes: list[str],
                            embedding_32bit: bool = True) -> tuple[dict[str, PhasePeak], int]:
    """Optimizer state for optimizers whose kernels have no fake implementation, counted per traced tensor."""
    from .optimizers import TensorGroup, optimizer_cost

    groups = [TensorGroup(count=n, rows=r, cols=c, kind=k) for r, c, k, n in step.trainable_groups]  # type: ignore[arg-type]
    cost = optimizer_cost(name, groups, step.trainable_bytes_per_param, embedding_32bit=embedding_32bit)
    notes.append(f"optimizer {name!r} cannot run on fake tensors (bitsandbytes/paged kernels): its state "
                 f"({cost.states / 2**30:.2f} GiB) is the analytic term over the traced trainable tensors")
    if cost.paged:
        notes.append("paged optimizer state lives in unified memory and is counted as host RAM")
        return phases, cost.states
    phases = _shift(phases, "optimizer_states", cost.states)
    if cost.step_temp and "optimizer" in phases:
        phases = _shift(phases, "optimizer_temporaries", cost.step_temp, only="optimizer")
    return phases, 0


def _quantized_weights(phases: dict[str, PhasePeak], spec: ModelSpec, setup: Setup, hardware: Hardware | None,
                       notes: list[str]) -> dict[str, PhasePeak]:
    """bitsandbytes int8/nf4 weights: traced with 16-bit stand-ins, then their bytes replaced by the analytic term."""
    from . import estimate_memory

    analytic = estimate_memory(spec, setup, hardware).weights
    traced = next(iter(phases.values())).parts.get("weights", 0)
    notes.append(f"{setup.weights_dtype} base weights cannot run on fake tensors: traced with bf16 stand-ins, weight "
                 f"bytes ({analytic / 2**30:.2f} GiB) from the analytic model; dequantization scratch not included")
    return _shift(phases, "weights", analytic - traced)


def _ddp_buckets(phases: dict[str, PhasePeak], setup: Setup, step: StepTrace, notes: list[str]) -> dict[str, PhasePeak]:
    from .sharding import bucket_bytes

    grad_bytes = step.trainable_bytes_per_param
    extra = bucket_bytes(setup, step.trainable_params, grad_bytes)
    if extra:
        notes.append(f"DDP gradient buckets ({extra / 2**30:.2f} GiB) added analytically")
    return _shift(phases, "temporaries", extra)


def _analytic(spec: ModelSpec, setup: Setup, hardware: Hardware | None, why: str) -> MemoryEstimate:
    from . import estimate_memory

    est = estimate_memory(spec, setup, hardware)
    return est.model_copy(update={"notes": (*est.notes, why)})


def _config_from_spec(spec: ModelSpec, notes: list[str]) -> dict[str, Any]:
    """A Llama-style HF config from the spec's numbers, for specs built without a raw config (e.g. "7b")."""
    from transformers import CONFIG_MAPPING

    model_type = spec.model_type if spec.model_type in CONFIG_MAPPING else "llama"
    if model_type != spec.model_type:
        notes.append(f"no HF config for {spec.name!r}: traced a Llama-shaped stand-in with its dimensions")
    config: dict[str, Any] = {"model_type": model_type}
    config.update({k: getattr(spec, v) for k, v in _SPEC_KEYS.items()})
    if spec.max_position_embeddings:
        config["max_position_embeddings"] = spec.max_position_embeddings
    return config
