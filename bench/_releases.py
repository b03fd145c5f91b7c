"""Price a published row with the package release it ran, not the one installed here.

perfguide reads a package's installed release through one cached function per package (``installed_trl``,
``installed_bitsandbytes``); a bench row names the release of its own run, so the bench swaps that function for the
row's duration. One place, so every such reading restores the installed release the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType


@contextmanager
def release_as(module: ModuleType, reader: str, release: str | None) -> Iterator[None]:
    """Inside the block ``module.reader()`` answers ``release`` (None: the package is not installed)."""
    saved = getattr(module, reader)
    setattr(module, reader, lambda: release)
    try:
        yield
    finally:
        setattr(module, reader, saved)
