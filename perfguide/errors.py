"""Errors users see: one line, naming what was wrong and what is accepted.

All derive from :class:`PerfGuideError` (a ``ValueError``) so callers can catch one type,
and the CLI can print the message without a traceback.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

from ._text import clean

P = ParamSpec("P")
T = TypeVar("T")


class PerfGuideError(ValueError):
    """Base class of every error perfguide raises on purpose.

    Its message is cleaned as it is made (no terminal escapes, control or bidi characters, one line), so text a
    config or a library put into it (a model_type, transformers' own message) reaches no terminal, log or
    ``--json`` error raw, whoever raised it."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(clean(a) if isinstance(a, str) else a for a in args))


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


class MissingDependencyError(PerfGuideError):
    """A library an output needs is not installed here: named in one line, with the install command."""


#: the ``pip install`` that brings each library a perfguide output builds objects of
INSTALL = {"torch": "pip install 'torch>=2.4'", "transformers": "pip install 'transformers>=5,<6'",
           "accelerate": "pip install 'accelerate>=1.0'", "peft": "pip install 'peft>=0.19'",
           "bitsandbytes": "pip install 'bitsandbytes>=0.46.1'", "trl": "pip install 'perfguide[trl]'",
           "deepspeed": "pip install 'perfguide[deepspeed]'", "matplotlib": "pip install 'perfguide[plot]'",
           "rich": "pip install 'perfguide[rich]'", "yaml": "pip install pyyaml",
           "cut_cross_entropy": "pip install 'cut-cross-entropy[transformers]'"}


def needs_packages(method: Callable[P, T]) -> Callable[P, T]:
    """An output method whose library is missing raises MissingDependencyError naming it and how to install it,
    instead of a ModuleNotFoundError from inside the adapter."""
    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except ModuleNotFoundError as exc:
            root = (exc.name or "").split(".")[0]
            if root not in INSTALL:
                raise
            raise MissingDependencyError(f"{method.__name__}() needs {root}, which is not installed here: "
                                         f"{INSTALL[root]}") from None
    return wrapper


def did_you_mean(word: str, choices: Iterable[str], n: int = 3, key: Callable[[str], str] = str.lower) -> str:
    """Return ' Did you mean: a, b?' (or '') for the closest accepted values, compared by ``key`` (the first
    spelling of a key is the one shown)."""
    lookup: dict[str, str] = {}
    for c in choices:
        lookup.setdefault(key(c), c)
    close = difflib.get_close_matches(key(str(word)), list(lookup), n=n, cutoff=0.5)
    return f" Did you mean: {', '.join(lookup[c] for c in close)}?" if close else ""


def unknown_value(kind: str, value: object, accepted: Iterable[str], error: type[PerfGuideError] = PerfGuideError) -> PerfGuideError:
    """Build the standard 'unknown X' error: value, suggestion, and the accepted list."""
    accepted = sorted(set(accepted))
    shown = ", ".join(accepted[:30]) + (", ..." if len(accepted) > 30 else "")
    return error(f"unknown {kind} {value!r}.{did_you_mean(str(value), accepted)} Accepted: {shown}.")
