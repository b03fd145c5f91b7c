"""Decisions for the technique stack: each technique the chosen Setup uses says what it bought, priced against the
same plan without it (memory, step time), with its public sources; the report shows them next to the ladder's.
"""

from __future__ import annotations

from .. import techniques
from ..decisions import Alternative, Decision
from ..setup import Setup
from .search import Priced, gib, price
from .types import Request


def _without(setup: Setup, t: techniques.Technique) -> Setup | None:
    """The chosen Setup with ``t`` turned off (``Technique.off``), and with it any other technique that cannot run
    without what ``t`` provided (CPU offload's off is one GPU, where syncing FSDP gradients each micro-step means
    nothing); None where the Setup still refuses the combination."""
    changes = dict(t.off())
    unchecked = setup.model_copy(update=changes)
    for other in techniques.active(setup):
        if other is not t and other.off() and other.conflict(unchecked):
            changes.update(other.off())
    try:
        return setup.replace(**changes)
    except ValueError:
        return None


def _reason(name: str, chosen: Priced, other: Priced | None) -> str:
    s, m, t = chosen.setup, chosen.memory, chosen.throughput
    extra = ""
    if name == "cpu_offload":
        extra = f"; host RAM {gib(m.cpu_ram)} per node, {t.offload_time_s:.3g} s/step over PCIe and the CPU optimizer"
    elif name == "activation_offloading" and other is not None:
        extra = f"; {gib(max(0, m.cpu_ram - other.memory.cpu_ram))} of activations in pinned host RAM"
    elif name == "padding_free":
        extra = (f"; pays for {s.avg_seq_len} real tokens per sample instead of seq_len={s.seq_len}" if s.avg_seq_len is not None
                 else f"; priced at full rows of seq_len={s.seq_len} (avg_seq_len not given: the gain comes with shorter samples)")
    elif name == "optimizer_in_backward":
        extra = "; needs gradient_accumulation_steps=1 and max_grad_norm=0 (Trainer(optimizers=rec.optimizers(model, args)))"
    if other is None:
        return f"{techniques.get(name).summary}{extra}"
    return (f"{techniques.get(name).summary}: {gib(m.device_total)} and {t.step_time_s:.3g} s/step, against "
            f"{gib(other.memory.device_total)} and {other.step_time:.3g} s/step without it{extra}")


def technique_decisions(request: Request, chosen: Priced) -> list[Decision]:
    """One Decision per technique the chosen Setup uses that can be turned off (``Technique.off``)."""
    out = []
    for t in techniques.active(chosen.setup):
        if not t.off() or t.own_decision:
            continue
        off = _without(chosen.setup, t)
        other = price(request.model, off, request.hardware, request.calibration) if off is not None else None
        alts = () if other is None else (Alternative(
            value=False, number=other.memory.device_total, unit="bytes",
            why_not=f"{gib(other.memory.device_total)} per device, {other.step_time:.3g} s/step"),)
        saved = None if other is None else other.memory.device_total - chosen.memory.device_total
        out.append(Decision(setting=t.name, value=True, reason=_reason(t.name, chosen, other), number=saved,
                            unit="bytes saved" if saved is not None else None, source=t.source, alternatives=alts))
    return out
