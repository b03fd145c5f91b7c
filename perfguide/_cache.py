"""Where perfguide keeps what it learns on a machine (trace results, calibration)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$PERFGUIDE_CACHE_DIR``, else ``$XDG_CACHE_HOME/perfguide``, else ``~/.cache/perfguide``."""
    root = os.environ.get("PERFGUIDE_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "perfguide"
