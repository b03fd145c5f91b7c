"""Writing generated config files without losing the user's: all-or-nothing, no overwrite unless asked.

A config a user edited by hand is state; replacing it silently (or writing through a symlink into a file
elsewhere) loses it. perfguide._files.write_all checks every target before writing any, creates new files
without ever replacing one that appeared meanwhile, and replaces (under ``overwrite``) the directory entry
itself, never a symlink's target; a new run folder is made, and removed again when the write fails.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from .._files import write_all


def write_files(files: Mapping[Path, str | bytes], overwrite: bool = False, what: str = "config",
                replace: Collection[Path] = ()) -> list[Path]:
    """Write every ``{path: text}`` or none of them (making missing folders); returns the paths in order."""
    return write_all(files, what, overwrite=overwrite, replace=replace, make_folders=True)
