"""Errors users see: one line, naming what was wrong and what is accepted.

All derive from :class:`PerfGuideError` (a ``ValueError``) so callers can catch one type,
and the CLI can print the message without a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PerfGuideError(ValueError):
    """Base class of every error perfguide raises on purpose."""


class UnknownScenarioError(PerfGuideError):
    pass


class UnknownHardwareError(PerfGuideError):
    pass


class InvalidModelError(PerfGuideError):
    pass


class OfflineError(PerfGuideError):
    pass


class InvalidSetupError(PerfGuideError):
    pass


class ConflictingConstraintsError(PerfGuideError):
    pass


class DataFileError(PerfGuideError):
    """A bundled data file (perfguide/data/*.json) does not match its schema: a packaging bug, named in one line."""


class WrongMachineError(PerfGuideError):
    """Raised when an object can only be built on the hardware the plan targets."""


class OutputExistsError(PerfGuideError):
    """A file perfguide would write is already there (or is a symlink); it is kept unless overwriting was asked."""


def did_you_mean(word: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ' Did you mean: a, b?' (or '') for the closest accepted values."""
    close = difflib.get_close_matches(str(word).lower(), [c.lower() for c in choices], n=n, cutoff=0.5)
    lookup = {c.lower(): c for c in choices}
    return f" Did you mean: {', '.join(lookup[c] for c in close)}?" if close else ""


def unknown_value(kind: str, value: object, accepted: Iterable[str], error: type[PerfGuideError] = PerfGuideError) -> PerfGuideError:
    """Build the standard 'unknown X' error: value, suggestion, and the accepted list."""
    accepted = sorted(set(accepted))
    shown = ", ".join(accepted[:30]) + (", ..." if len(accepted) > 30 else "")
    return error(f"unknown {kind} {value!r}.{did_you_mean(str(value), accepted)} Accepted: {shown}.")
