"""Loads the bundled data files (GPU specs, architecture catalog, calibration) once."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def load(name: str) -> Any:
    """Parse ``perfguide/data/<name>.json``; cached so every caller shares one copy."""
    text = resources.files("perfguide.data").joinpath(f"{name}.json").read_text(encoding="utf-8")
    return json.loads(text)
