"""Engines as a registry: one module per engine (base.py says what an engine declares).

``names()`` lists them, ``get(name)`` returns one, ``default()`` is the one a plan uses when none is named,
``servers()`` the ones with their own server. Modules in this package are discovered (each exports
``ENGINE``), so a new engine is one file here plus its data row; ``register`` adds one defined elsewhere
(a user's module, a test's toy engine) for the life of the process.
"""

from __future__ import annotations

import pkgutil
from importlib import import_module

from ..errors import PerfGuideError, unknown_value
from .base import Engine, Flag, LibraryEngine, ServerEngine

__all__ = ["Engine", "Flag", "LibraryEngine", "ServerEngine", "default", "get", "names", "register", "server", "servers",
           "unregister"]

_NOT_ENGINES = frozenset({"base", "checkpoint"})
_found: dict[str, Engine] = {}
_added: dict[str, Engine] = {}


def _discovered() -> dict[str, Engine]:
    if not _found:
        for info in pkgutil.iter_modules(__path__):
            if info.name.startswith("_") or info.name in _NOT_ENGINES:
                continue
            engine = getattr(import_module(f"{__name__}.{info.name}"), "ENGINE", None)
            if not isinstance(engine, Engine):
                raise PerfGuideError(f"perfguide/engines/{info.name}.py must export ENGINE, an Engine instance")
            _found[engine.name] = engine
    return _found


def registry() -> tuple[Engine, ...]:
    """Every engine, the package's and the registered ones, in their declared order."""
    return tuple(sorted({**_discovered(), **_added}.values(), key=lambda e: (e.order, e.name)))


def names() -> list[str]:
    return [e.name for e in registry()]


def get(name: str) -> Engine:
    for e in registry():
        if e.name == name:
            return e
    raise unknown_value("engine", name, names())


def server(name: str) -> ServerEngine:
    """The serving engine ``name``; a library engine (or an unknown name) is one line naming the servers."""
    engine = get(name)
    if not isinstance(engine, ServerEngine):
        raise PerfGuideError(f"engine {name!r} runs in your own script and has no server settings; "
                             f"use one of {', '.join(e.name for e in servers())}")
    return engine


def servers() -> list[ServerEngine]:
    return [e for e in registry() if isinstance(e, ServerEngine)]


def default() -> Engine:
    """The engine a plan uses when the user names none (exactly one declares itself the default)."""
    marked = [e for e in registry() if e.default]
    if len(marked) != 1:
        raise PerfGuideError(f"exactly one engine must be the default, found {[e.name for e in marked]}")
    return marked[0]


def register(engine: Engine) -> Engine:
    """Add an engine defined outside this package (its module's ``ENGINE``); a name taken by another is refused."""
    if not isinstance(engine, Engine):
        raise PerfGuideError(f"register() takes an Engine instance (perfguide.engines.ServerEngine subclass), not {type(engine).__name__}")
    taken = {e.name: e for e in registry()}
    if engine.name in taken and taken[engine.name] is not engine:
        raise PerfGuideError(f"an engine named {engine.name!r} is already registered; pick another name")
    _added[engine.name] = engine
    return engine


def unregister(name: str) -> None:
    """Drop an engine added with ``register`` (the package's own stay)."""
    _added.pop(name, None)
