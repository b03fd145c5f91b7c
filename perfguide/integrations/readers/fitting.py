"""The smallest change that makes a user's Setup fit: one edit, else two, else three, from the knobs a user turns.

"Smallest" is counted in edits the user makes (splitting the micro-batch while keeping the global batch is one), and
among as few edits, the fastest fitting Setup wins. Every candidate is priced by the same cost model as the verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import combinations
from typing import Any

from ...errors import PerfGuideError
from ...setup import Setup

#: optimizers with fewer or smaller states, in the order a user would try them (data/optimizers.json rows)
LEANER_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit", "adafactor")
MAX_EDITS = 3


def single_edits(s: Setup, bf16_ok: bool, fixed: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Each one knob, turned toward less memory, as the user's configs can express it (``fixed``: fields they have no
    key for, never turned)."""
    edits: list[dict[str, Any]] = []
    if s.task != "train":
        return edits
    if not s.gradient_checkpointing:
        edits.append({"gradient_checkpointing": True})
    mb, ga = s.micro_batch_size, s.gradient_accumulation_steps
    while mb > 1:
        mb, ga = mb // 2, ga * 2 if mb % 2 == 0 else ga
        if (mb * ga) == s.micro_batch_size * s.gradient_accumulation_steps:
            edits.append({"micro_batch_size": mb, "gradient_accumulation_steps": ga})
    edits.append({"micro_batch_size": 1, "gradient_accumulation_steps": s.gradient_accumulation_steps * s.micro_batch_size})
    edits += [{"optimizer": o} for o in LEANER_OPTIMIZERS if s.optimizer != o and s.lora is None]
    if s.device == "cuda" and not s.liger_kernel:
        edits.append({"liger_kernel": True})
    if s.autocast is None and s.weights_dtype == "fp32" and bf16_ok:
        edits.append({"autocast": "bf16"})
    if s.weights_dtype == "fp32" and bf16_ok and s.lora is None:
        edits.append({"weights_dtype": "bf16", "autocast": "bf16"})
    if s.world_size > 1:
        order = ("ddp", "zero1", "zero2", "fsdp_shard_grad_op", "zero3", "fsdp")
        here = order.index(s.strategy) if s.strategy in order else 0
        edits += [{"strategy": name} for name in order[here + 1:] if name not in ("zero1", "fsdp_shard_grad_op")]
    if s.facts.offloads_optimizer and not s.offload_optimizer:
        edits.append({"offload_optimizer": True} if not s.is_fsdp else {"offload_optimizer": True, "offload_params": True})
    if s.facts.offloads_params and not s.offload_params and not s.is_fsdp:
        edits.append({"offload_params": True, "offload_optimizer": True})
    return [dict(e) for e in {tuple(sorted(e.items())): e for e in edits}.values() if not set(e) & fixed]


def _valid(s: Setup, changes: dict[str, Any]) -> Setup | None:
    try:
        return s.replace(**changes)
    except (ValueError, PerfGuideError):
        return None


def _merged(parts: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    """Several edits at once; two that set the same field differently do not combine."""
    out: dict[str, Any] = {}
    for part in parts:
        for k, v in part.items():
            if out.get(k, v) != v:
                return None
            out[k] = v
    return out


def candidates(s: Setup, bf16_ok: bool, extra: tuple[dict[str, Any], ...] = (),
               fixed: frozenset[str] = frozenset()) -> Iterator[tuple[int, dict[str, Any], Setup]]:
    singles = [*single_edits(s, bf16_ok, fixed), *extra]
    for n in range(1, MAX_EDITS + 1):
        for parts in combinations(singles, n):
            changes = _merged(parts)
            if changes is None:
                continue
            new = _valid(s, changes)
            if new is not None:
                yield n, changes, new


def smallest_fit(s: Setup, bf16_ok: bool, fits: Callable[[Setup], bool], speed: Callable[[Setup], float],
                 extra: tuple[dict[str, Any], ...] = (), fixed: frozenset[str] = frozenset()) -> tuple[dict[str, Any], Setup] | None:
    """The fitting change with the fewest edits, the fastest among those; None when three edits are not enough.
    ``extra``: more single edits the configs allow (every GPU of the machine for a sharded recipe run as one process)."""
    best: tuple[float, dict[str, Any], Setup] | None = None
    level = None
    for n, changes, new in candidates(s, bf16_ok, extra, fixed):
        if level is not None and n > level:
            break
        if not fits(new):
            continue
        level = n
        rate = speed(new)
        if best is None or rate > best[0]:
            best = (rate, changes, new)
    return (best[1], best[2]) if best else None
