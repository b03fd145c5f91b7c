"""One rules module per scenario; each exposes ``plan(request) -> Plan``."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

from ..errors import UnknownScenarioError, unknown_value
from .types import SCENARIOS, Plan, Request


def planner(scenario: str) -> Callable[[Request], Plan]:
    """The ``plan`` function of a scenario, imported on first use."""
    if scenario not in SCENARIOS:
        raise unknown_value("scenario", scenario, SCENARIOS, UnknownScenarioError)
    return import_module(f"{__name__}.{scenario}").plan
