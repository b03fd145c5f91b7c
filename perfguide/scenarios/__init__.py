"""One rules module per scenario; each exposes ``plan(request) -> Plan``; registry.py says which is which."""

from __future__ import annotations

from collections.abc import Callable

from .registry import get
from .types import Plan, Request


def planner(scenario: str) -> Callable[[Request], Plan]:
    """The ``plan`` function of a scenario, imported on first use."""
    return get(scenario).plan
