"""Writing user-named output files: every file of a request or none of them, and one line when it cannot be done.

Every file perfguide writes (a plot, accelerate/DeepSpeed configs, ``--write-configs``' set, the calibration store)
goes through ``write_all``, in three steps, so a full disk, a read-only or foreign folder, an over-long name or
Ctrl-C leaves each folder as it was:

1. check every destination before writing any (a directory, a missing folder, an existing file without
   ``overwrite``, a name longer than the filesystem allows, the same path twice): one PerfGuideError line;
2. write each file's bytes to a short temporary name in its own folder (so the rename in step 3 never copies);
3. with Ctrl-C deferred, move every temporary file into place: a new file by ``os.link`` (which never replaces a
   file that appeared meanwhile), an existing one by ``os.replace`` after a hard-link backup; if any step fails,
   the files already moved are taken back (the backups restored) and the temporaries removed.

``os.replace`` swaps the directory entry, so a symlink at the target is replaced, never written through; a file
replaced under ``overwrite`` keeps its permission bits; a new file gets the mode ``open()`` would give it (0666
less the umask).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from ._interrupt import deferred_sigint
from .errors import OutputExistsError, PerfGuideError

#: fallbacks where pathconf cannot say (Linux's limits)
NAME_MAX, PATH_MAX = 255, 4096


@dataclass
class _Target:
    path: Path
    data: bytes
    existing_mode: int | None  # permission bits of the file it replaces; None for a new file (or a replaced symlink)
    exists: bool
    overwrite: bool
    tmp: Path | None = None
    backup: Path | None = None
    placed: bool = False


def _name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return NAME_MAX


def _refuse(what: str, path: Path, why: str, fix: str = "pass a writable path") -> PerfGuideError:
    return PerfGuideError(f"cannot write the {what} to {str(path)!r}: {why}; nothing was written: {fix}")


def _os_refusal(what: str, path: Path, exc: OSError) -> PerfGuideError:
    return _refuse(what, path, exc.strerror or type(exc).__name__)


def _nearest_folder(path: Path) -> Path:
    """The closest ancestor of ``path`` that exists (folders above it are made by write_all)."""
    folder = path.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def check_target(path: str | os.PathLike[str], what: str, overwrite: bool, make_folders: bool = False) -> Path:
    """``path`` as a Path, refused in one line when it cannot become the file asked for."""
    try:
        p = Path(path).expanduser()
        absolute = os.path.abspath(p)
        os.fsencode(absolute)
        if "\x00" in str(p):
            raise ValueError("embedded null byte")
    except (ValueError, RuntimeError, UnicodeError) as exc:  # an embedded NUL, an unknown ~user, unencodable text
        raise PerfGuideError(f"cannot write the {what} to {str(path)!r}: {exc}; pass an ordinary file path") from None
    folder = _nearest_folder(p) if make_folders else p.parent
    limit = _name_max(folder if folder.is_dir() else Path("/"))
    too_long = next((part for part in p.parts if len(os.fsencode(part)) > limit), None)
    if too_long is not None:
        raise _refuse(what, p, f"the name {too_long[:40]!r}... is {len(os.fsencode(too_long))} bytes, over this filesystem's "
                      f"{limit}", "pass a shorter file name")
    if len(os.fsencode(absolute)) >= PATH_MAX:
        raise _refuse(what, p, f"the path is {len(os.fsencode(absolute))} bytes, over the system's {PATH_MAX - 1}", "pass a shorter path")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a parent that is a file (ENOTDIR), a folder we may not search (EACCES)
        raise _os_refusal(what, p, exc) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputExistsError(f"cannot write the {what} to {str(p)!r}: it is a directory; pass a file path such as "
                                f"{str(p / 'name')!r}")
    if st is not None and not overwrite:
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a file"
        raise OutputExistsError(f"{p} already exists ({kind}); it is kept: pass overwrite=True (CLI: --force) to replace it, "
                                "or choose another path")
    if not folder.is_dir():
        why = f"folder {str(folder)!r} does not exist" if not os.path.lexists(folder) else f"{str(folder)!r} is not a folder"
        raise _refuse(what, p, why, "pass a path in an existing folder")
    return p


def output_path(path: str | os.PathLike[str], what: str) -> Path:
    """Early refusal of a single replaceable output (before a slow plot is drawn)."""
    return check_target(path, what, overwrite=True)


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _temp_in(folder: Path, suffix: str) -> Path:
    """A short unused name in ``folder`` (short, so a target near the name limit still gets a temporary)."""
    return folder / f".pg-{secrets.token_hex(6)}{suffix}"


def _write_temp(target: _Target) -> None:
    while True:
        tmp = _temp_in(target.path.parent, ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:
            continue
    target.tmp = tmp
    try:
        if target.existing_mode is not None:
            os.fchmod(fd, target.existing_mode)
        _write_fd(fd, target.data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _place(target: _Target, keep_backup: bool) -> None:
    assert target.tmp is not None
    if not target.overwrite:
        os.link(target.tmp, target.path)  # FileExistsError if it appeared since the check: never replaced
        target.placed = True
        os.unlink(target.tmp)
        target.tmp = None
        return
    if keep_backup and target.exists:
        backup = _temp_in(target.path.parent, ".bak")
        os.link(target.path, backup, follow_symlinks=False)
        target.backup = backup
    os.replace(target.tmp, target.path)
    target.tmp = None
    target.placed = True


def _undo(targets: list[_Target], made: list[Path]) -> None:
    """Put every folder back as it was: placed files removed or restored, temporaries and made folders gone."""
    with deferred_sigint():
        _undo_now(targets, made)


def _undo_now(targets: list[_Target], made: list[Path]) -> None:
    for t in reversed(targets):
        try:
            if t.placed and t.backup is not None:
                os.replace(t.backup, t.path)
                t.backup = None
            elif t.placed and not t.exists:
                os.unlink(t.path)
        except OSError:
            pass
        for leftover in (t.tmp, t.backup):
            if leftover is not None:
                leftover.unlink(missing_ok=True)
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:
            pass


def _make_folders(targets: list[_Target], what: str) -> list[Path]:
    made: list[Path] = []
    for t in targets:
        missing = [f for f in (t.path.parent, *t.path.parent.parents) if not os.path.lexists(f)]
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                _undo([], made)
                raise _refuse(what, t.path, f"folder {str(folder)!r} cannot be made ({exc.strerror or exc})",
                              "pass a path in a writable folder") from None
            made.append(folder)
    return made


def _targets(files: Mapping[Path, str | bytes], what: str, overwrite: bool, replace: Collection[Path],
             make_folders: bool) -> list[_Target]:
    targets: list[_Target] = []
    seen: set[str] = set()
    for raw, data in files.items():
        replaceable = overwrite or raw in replace
        path = check_target(raw, what, replaceable, make_folders)
        if os.path.abspath(path) in seen:
            raise PerfGuideError(f"{str(path)!r} was asked for twice; nothing was written: give each output its own path")
        seen.add(os.path.abspath(path))
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        mode = stat.S_IMODE(st.st_mode) if st is not None and stat.S_ISREG(st.st_mode) else None
        targets.append(_Target(path, data.encode("utf-8") if isinstance(data, str) else data, mode, st is not None, replaceable))
    return targets


def check_all(paths: Collection[Path], what: str, *, overwrite: bool = False, replace: Collection[Path] = (),
              make_folders: bool = False) -> None:
    """Refuse, before anything slow is computed or written, the first path write_all would refuse."""
    _targets(dict.fromkeys(paths, b""), what, overwrite, replace, make_folders)


def write_all(files: Mapping[Path, str | bytes], what: str, *, overwrite: bool = False, replace: Collection[Path] = (),
              make_folders: bool = False) -> list[Path]:
    """Write every ``{path: text or bytes}`` or none of them; returns the paths written, in order.

    An existing file is replaced only under ``overwrite`` or when its path is in ``replace`` (a plot, which is
    redrawn on every run); ``make_folders`` makes missing folders (and removes them again on failure)."""
    targets = _targets(files, what, overwrite, replace, make_folders)
    made = _make_folders(targets, what) if make_folders else []
    current = targets[0] if targets else None
    try:
        for current in targets:
            _write_temp(current)
        with deferred_sigint():
            for current in targets:
                _place(current, keep_backup=len(targets) > 1)
    except FileExistsError:
        _undo(targets, made)
        assert current is not None
        raise OutputExistsError(f"{current.path} appeared while writing; it is kept and nothing was written: pass "
                                "overwrite=True (CLI: --force) to replace it") from None
    except OSError as exc:
        _undo(targets, made)
        assert current is not None
        if exc.errno == errno.ENAMETOOLONG:
            raise _refuse(what, current.path, "the name is too long for this filesystem", "pass a shorter path") from None
        raise _os_refusal(what, current.path, exc) from None
    except BaseException:  # Ctrl-C while the temporaries were written: the folders go back as they were
        _undo(targets, made)
        raise
    for t in targets:
        if t.backup is not None:
            t.backup.unlink(missing_ok=True)
    return [t.path for t in targets]


def write_atomic(path: str | os.PathLike[str], data: str | bytes, what: str) -> Path:
    """Write (or replace) one file whole or not at all; returns the path written."""
    return write_all({Path(path): data}, what, overwrite=True)[0]
