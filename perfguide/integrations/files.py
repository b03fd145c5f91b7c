"""Writing generated files without losing the user's: all-or-nothing, no overwrite unless asked, no symlink followed.

A config a user edited by hand is state; replacing it silently (or writing through a symlink into a file
elsewhere) loses it. Every target is checked before anything is written, so a refused call leaves no
half-written set behind; new files are created with O_EXCL (``open(..., "x")``), which fails on any existing
path, a dangling symlink included, and replacements go through perfguide._files.write_atomic (a temporary file
and ``os.replace``, which swaps the directory entry itself and never writes into a symlink's target).
"""

from __future__ import annotations

from pathlib import Path

from .._files import write_atomic
from ..errors import OutputExistsError, PerfGuideError


def check_writable(paths: list[Path], overwrite: bool) -> None:
    """Refuse, in one line, the first path that exists (or is a symlink) unless ``overwrite``; never a directory."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            raise OutputExistsError(f"{path} is a directory; pass a file path (e.g. {path / 'accelerate.yaml'})")
        if not overwrite and (path.exists() or path.is_symlink()):
            kind = "a symlink" if path.is_symlink() else "a file"
            raise OutputExistsError(f"{path} already exists ({kind}); it is kept: pass overwrite=True (CLI: --force) to replace it, "
                                    "or choose another path")


def _create(path: Path, text: str) -> None:
    try:
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError:  # created by someone else since the check
        raise OutputExistsError(f"{path} appeared while writing; it is kept: pass overwrite=True (CLI: --force) to replace it") from None
    except OSError as exc:
        raise PerfGuideError(f"cannot write {path} ({exc.strerror or exc}); pass a writable path") from None


def write_files(files: dict[Path, str], overwrite: bool = False) -> list[Path]:
    """Write every ``{path: text}`` or none of them; returns the paths in order."""
    texts = {Path(p).expanduser(): text for p, text in files.items()}
    paths = list(texts)
    check_writable(paths, overwrite)
    for path in paths:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # a new run folder is made
        except OSError as exc:
            raise PerfGuideError(f"cannot write {path}: folder {path.parent} cannot be made ({exc.strerror or exc}); "
                                 "pass a path in a writable folder") from None
    for path, text in texts.items():
        if overwrite:
            write_atomic(path, text, "config")  # temporary file + os.replace: replaces a symlink, never writes through
        else:
            _create(path, text)
    return paths
