"""Ctrl-C at a safe point.

A SIGINT's KeyboardInterrupt is raised wherever Python happens to be, including inside a weakref finalizer or
a ``__torch_dispatch__`` hook that C++ is calling; an exception there can end in ``std::terminate`` (a C++
``what():`` abort, exit -6: raising from the tracker's dispatch hook inside ``torch.embedding`` did) or be
swallowed (exit 0). Inside ``deferred_sigint()`` the signal only sets a flag; code calls ``check()`` only where
the caller is plain Python (the tracer: as each module's forward starts, and between forward, backward and the
optimizer step; never from a dispatch hook), and the interrupt is raised at the latest when the block ends, so
the command still stops and exits 130, leaving no half-written file.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_pending = False


def _handler(signum: int, frame: FrameType | None) -> None:
    global _pending
    _pending = True


def check() -> None:
    """Raise the deferred KeyboardInterrupt now, if one arrived."""
    global _pending
    if _pending:
        _pending = False
        raise KeyboardInterrupt


@contextmanager
def deferred_sigint() -> Iterator[None]:
    """SIGINT is remembered, not raised, until ``check()`` or the end of the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is _handler:
        yield
        return
    previous = signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    check()
