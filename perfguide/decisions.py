"""A decision and its evidence: what was chosen, why in one sentence, and the number that decided it."""

from __future__ import annotations

from typing import Any

from ._base import Model


class Alternative(Model):
    value: Any
    why_not: str
    number: float | None = None
    unit: str | None = None


class Decision(Model):
    setting: str                      # e.g. "per_device_train_batch_size", "optim", "strategy"
    value: Any
    reason: str                       # one sentence, says why
    number: float | None = None       # the number that decided it (bytes, seconds, ratio)
    unit: str | None = None           # "bytes", "s", "x", ...
    source: str | None = None         # doc / measurement the rule rests on
    alternatives: tuple[Alternative, ...] = ()
