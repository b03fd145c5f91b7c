"""Writing a user-named output file: whole or not at all, and one line when it cannot be written.

Every file perfguide writes on request (a plot, an accelerate/DeepSpeed config) goes through here: the bytes go
to a temporary file in the same folder and replace the target with ``os.replace``, so Ctrl-C or a full disk
never leaves half a file behind, and a directory, a missing folder or a read-only path is a PerfGuideError
naming the path rather than an OSError from deep inside matplotlib or yaml.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import PerfGuideError


def output_path(path: str | os.PathLike[str], what: str) -> Path:
    """The target as a Path, refused early when it cannot be a file we may write."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise PerfGuideError(f"cannot write the {what} to {str(p)!r}: it is a directory; pass a file path such as {str(p / 'name')!r}")
    if not p.parent.is_dir():
        raise PerfGuideError(f"cannot write the {what} to {str(p)!r}: folder {str(p.parent)!r} does not exist; pass a path in an existing folder")
    return p


def write_atomic(path: str | os.PathLike[str], data: str | bytes, what: str) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path written."""
    p = output_path(path, what)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as exc:
        raise PerfGuideError(f"cannot write the {what} to {str(p)!r} ({exc.strerror or exc}); pass a writable path") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, p)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise PerfGuideError(f"cannot write the {what} to {str(p)!r} ({exc.strerror or exc}); pass a writable path") from None
    except BaseException:  # Ctrl-C while writing: no partial file, and the interrupt goes on
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
