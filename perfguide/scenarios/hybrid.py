"""HSDP or full sharding across nodes: the decision, priced from the two layouts the multi-GPU planner compared.

FSDP2 with a 2-D (replicate, shard) device mesh keeps one sharded copy of the model states per node: its
all-gathers and reduce-scatters stay on the node's NVLink, and only an all-reduce of each rank's 1/g gradient
shard crosses the network. Full sharding over every rank divides the states by all of them but sends each
layer's parameters and gradients over the slower inter-node links every micro-step. accelerate spells HSDP as
``ParallelismConfig(dp_replicate_size=nodes, dp_shard_size=gpus_per_node)`` (accelerate parallelism_config.py;
YAML ``parallelism_config``); torch's ``fully_shard`` docs describe the 2-D mesh.
"""

from __future__ import annotations

from ..decisions import Alternative, Decision
from ..model.types import ModelSpec
from ..setup import Setup
from ..speed.rates import trainable_params
from .search import Option, Priced, gib, not_fitting_why
from .strategies import Layout, Level, layout_of, unsynced
from .types import Request

SOURCE = ("https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html (mesh: 2-D for HSDP); "
          "https://github.com/huggingface/accelerate/blob/main/src/accelerate/parallelism_config.py (dp_replicate_size x dp_shard_size)")


def internode_bytes(spec: ModelSpec, s: Setup) -> float:
    """Bytes one rank sends over the inter-node links per optimizer step (ring collectives, FSDP2 layouts)."""
    if s.nodes == 1 or not s.is_fsdp:
        return 0.0
    half = 2 if s.autocast else min(4, s.weight_bytes)
    grads, params = trainable_params(spec, s) * half, spec.total_params * half
    frac = (s.nodes - 1) / s.nodes
    if s.hybrid_shard:
        return s.gradient_accumulation_steps * 2 * frac * grads / s.num_gpus
    gathers = 2 if s.gathers_params else 1
    return s.gradient_accumulation_steps * frac * (gathers * params + grads)


def _facts(request: Request, p: Priced) -> str:
    t = p.throughput
    return (f"{gib(p.memory.device_total)} per GPU, {t.step_time_s:.3g} s/step ({t.comm_time_s:.3g} s exposed communication, "
            f"{gib(internode_bytes(request.model, p.setup))} per rank across nodes)")


def _best(compared: list[tuple[Layout, Level, Option | None, str | None]], layout: Layout) -> Option | None:
    """The layout's option as the search weighed it, with or without gradient sync on every micro-step: the faster
    fitting twin, else the first priced (its smallest batch that does not fit)."""
    opts = [opt for lay, _, opt, why in compared if unsynced(lay) == layout and why is None and opt is not None]
    fitting = [o for o in opts if o.best is not None]
    return min(fitting, key=lambda o: o.best.step_time) if fitting else (opts[0] if opts else None)  # type: ignore[union-attr]


def hybrid_decision(request: Request, chosen: Priced, compared: list[tuple[Layout, Level, Option | None, str | None]]) -> list[Decision]:
    """Multi-node FSDP2 plans: HSDP against FULL_SHARD over every rank, both priced at their best micro-batch."""
    s = chosen.setup
    if s.nodes == 1 or s.num_gpus == 1:
        return []
    hsdp, full = _best(compared, Layout("fsdp", hybrid=True)), _best(compared, Layout("fsdp"))
    if hsdp is None or full is None:
        return []
    mine = unsynced(layout_of(s)) == Layout("fsdp", hybrid=True)
    shape = f"{s.nodes} nodes x {s.num_gpus} GPUs"
    if hsdp.best is None:
        why = not_fitting_why(hsdp.too_big.memory, request.hardware, request.constraints.headroom) if hsdp.too_big else "does not fit"
        reason = f"HSDP keeps one copy of the states per node of {s.num_gpus} GPUs and {why}; sharding over all {s.world_size} ranks is needed"
        other = hsdp.too_big
    else:
        ref = chosen if mine else hsdp.best
        vs = full.best
        if vs is None:
            reason = f"HSDP ({shape}): {_facts(request, ref)}; full sharding over all {s.world_size} ranks does not fit better here"
        else:
            gain = vs.step_time / ref.step_time if ref.step_time else 1.0
            reason = (f"HSDP ({shape}) is predicted {gain:.2f}x {'faster' if gain >= 1 else 'slower'} than FULL_SHARD over all "
                      f"{s.world_size} ranks: {_facts(request, ref)} vs {_facts(request, vs)}; only gradient shards cross the network")
        other = full.best if mine else hsdp.best
    if mine:
        reason += (f"; emitted as accelerate parallelism_config dp_replicate_size={s.nodes}, dp_shard_size={s.num_gpus} "
                   "(launch with the generated YAML, or pass TrainingArguments(parallelism_config=...))")
    alts = (Alternative(value=not mine, number=other.memory.device_total, unit="bytes", why_not=_facts(request, other)),) if other else ()
    return [Decision(setting="hybrid_shard", value=mine, reason=reason, number=chosen.step_time, unit="s/step",
                     source=SOURCE, alternatives=alts)]
