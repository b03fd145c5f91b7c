"""What a training plan that does not fit offers instead, each priced by planning again (``plan``: the scenario's,
without its own suggestions) and said only when it fits: the reference log-probs precomputed (DPO), the knobs a user
forced freed, the longest sequence that fits. The user's own values are never replaced."""

from __future__ import annotations

from collections.abc import Callable

from .search import gib
from .types import Plan, Request


def precomputed_reference(request: Request, plan: Callable[[Request], Plan]) -> tuple[str, ...]:
    """A DPO plan that does not fit, planned again (``plan``: the scenario's, without its own suggestions) with the
    reference log-probs computed before training (TRL's precompute_ref_log_probs): the same objective, no reference
    model or reference forward in the step. Said only when that fits."""
    cons = request.constraints
    if cons.objective != "dpo" or cons.precompute_ref_log_probs:
        return ()
    p = plan(request.model_copy(update={"constraints": cons.model_copy(update={"precompute_ref_log_probs": True})}))
    if not p.fits:
        return ()
    return (f"precompute_ref_log_probs=True fits: the reference log-probs computed once before training, no reference model "
            f"in the step: {gib(p.memory.device_total)} per device, {p.throughput.step_time_s:.3g} s/step ({p.setup.label})",)


#: switches whose forced "off" can be what keeps a plan's activations off the card
_SAVING_SWITCHES = ("gradient_checkpointing", "liger_kernel", "activation_offloading")


def freed_knobs(request: Request, plan: Callable[[Request], Plan]) -> tuple[str, ...]:
    """A plan that does not fit because of a forced micro-batch, checkpointing off, Liger off or activation offloading
    off, planned again (``plan``: the scenario's, without its own suggestions) with those knobs left to perfguide: the
    value that fits at the same global batch. Said only when that fits; the user's value is never replaced."""
    cons = request.constraints
    forced: dict[str, object] = {k: False for k in _SAVING_SWITCHES if getattr(cons, k) is False}
    if cons.micro_batch_size is not None:
        forced["micro_batch_size"] = cons.micro_batch_size
    if not forced:
        return ()
    p = plan(request.model_copy(update={"constraints": cons.model_copy(update=dict.fromkeys(forced))}))
    if not p.fits or all(getattr(p.setup, k) == v for k, v in forced.items()):   # the knobs were not what kept it off
        return ()
    asked = ", ".join(f"{k}={v!r}" for k, v in forced.items())
    chosen = ", ".join(f"{k}={getattr(p.setup, k)!r}" for k in forced)
    return (f"{chosen} fits (instead of the requested {asked}; global batch {request.global_batch_size} kept with "
            f"gradient_accumulation_steps={p.setup.gradient_accumulation_steps}): {gib(p.memory.device_total)} per device, "
            f"{p.throughput.step_time_s:.3g} s/step ({p.setup.label})",)


#: the sequence-length grid a shorter-context suggestion searches on (tokenizers' padding multiples divide it)
_SEQ_STEP = 256


def longest_sequence(request: Request, plan: Callable[[Request], Plan]) -> tuple[str, ...]:
    """The longest sequence (a multiple of 256 below the request's) at which the scenario's plan (``plan``: without
    its own suggestions) fits at the same global batch: what a long-context user asks first. Offered, never chosen."""
    if request.seq_len <= _SEQ_STEP or request.constraints.avg_seq_len is not None:
        return ()

    def fitting(steps: int) -> Plan | None:
        p = plan(request.model_copy(update={"seq_len": steps * _SEQ_STEP}))
        return p if p.fits else None

    lo, hi = 0, (request.seq_len - 1) // _SEQ_STEP   # fits at lo steps (0: none known), hi the most to try
    best: Plan | None = None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        p = fitting(mid)
        if p is not None:
            lo, best = mid, p
        elif lo == 0 and mid > 1:   # nothing known to fit yet: the shortest length settles a model too big at any
            shortest = fitting(1)   # length in one more plan, where bisecting down to it takes log2(steps) (each a search)
            if shortest is None:
                return ()
            lo, best, hi = 1, shortest, mid - 1
        else:
            hi = mid - 1
    if best is None:
        return ()
    return (f"seq_len={lo * _SEQ_STEP} is the longest that fits this setup (a multiple of {_SEQ_STEP}, global batch "
            f"{request.global_batch_size} kept): {gib(best.memory.device_total)} per device, "
            f"{best.throughput.step_time_s:.3g} s/step ({best.setup.label})",)
