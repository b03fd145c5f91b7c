"""Which release of a package is installed next to perfguide, read once per process.

The memory model prices what a plan made here will run: the transformers loss path and attention code of its
release, DeepSpeed's bucket sizing, torch's CUDA module loading. importlib.metadata scans every distribution on
sys.path for each question (~0.5 ms), and a plan prices hundreds of setups, so each answer is kept.
"""

from __future__ import annotations

from functools import cache


@cache
def installed_release(name: str) -> str | None:
    """The installed release of distribution ``name`` (e.g. "torch"), or None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
