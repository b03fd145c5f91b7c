"""The order in which a traced step creates and frees tensor storages, as the caching allocator replay reads it.

Shared by the replays (scripts/trace_allocator_replay.py, trace_swift_replay.py, trace_trl_gemma_replay.py): each op's
output whose storage is new is an allocation of that storage's bytes, and the storage's death (a weakref finalizer,
so frees come in the order Python drops the last reference, as the CUDA allocator sees them) is its free. Fake
tensors carry real storage sizes, so a step at a model's real shape logs its real requests without the memory.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

#: ("a", id, bytes) for an allocation, ("f", id, 0) for its free
Event = tuple[str, int, int]


class AllocationLog:
    """Storages seen, in order. ``note(id, op, tensor)`` is called for each new storage (what made it, to read a replay)."""

    def __init__(self, note: Callable[[int, str, Any], None] | None = None) -> None:
        self.events: list[Event] = []
        self.seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.note = note
        self._count = 0
        #: the CUDA stream new storages are requested on (0: the default stream), and each storage's stream where not 0
        self.stream = 0
        self.streams: dict[int, int] = {}

    @classmethod
    def noting(cls, ops: dict[int, tuple[str, tuple[int, ...], str, str]], phase: list[str]) -> AllocationLog:
        """A log that records, per storage, the op, shape, dtype and the current ``phase[0]`` that made it in ``ops``
        (what the replays print at an OOM or a peak)."""
        return cls(lambda i, op, t: ops.__setitem__(i, (op, tuple(t.shape), str(t.dtype).removeprefix("torch."),
                                                        phase[0])))

    def existing(self, tensors: Any) -> None:
        """Storages allocated before the logged region (weights, states): never replayed, their frees ignored."""
        for t in tensors:
            self.seen[t.untyped_storage()] = 0

    def charge(self, t: Any, op: str = "") -> None:
        storage = t.untyped_storage()
        if storage in self.seen or storage.nbytes() == 0:
            return
        self._count += 1
        self.seen[storage] = self._count
        self.events.append(("a", self._count, storage.nbytes()))
        if self.stream:
            self.streams[self._count] = self.stream
        if self.note is not None:
            self.note(self._count, op, t)
        weakref.finalize(storage, self.events.append, ("f", self._count, 0))

    @contextlib.contextmanager
    def on_stream(self, stream: int) -> Iterator[None]:
        """Storages made inside are requested on ``stream`` (a side stream's ``with torch.cuda.stream(s):`` block)."""
        before, self.stream = self.stream, stream
        try:
            yield
        finally:
            self.stream = before

    def mode(self) -> Any:
        """A TorchDispatchMode charging every op's non-meta tensor outputs."""
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        log = self

        class Log(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.device.type != "meta":
                        log.charge(t, str(func))
                return out

        return Log()


def live_peak(events: list[Event]) -> tuple[int, dict[int, int]]:
    """The most bytes alive at once, and the storages alive then (key -> bytes)."""
    live = peak = 0
    sizes: dict[int, int] = {}
    at: dict[int, int] = {}
    for kind, key, nbytes in events:
        if kind == "a":
            sizes[key] = nbytes
            live += nbytes
            if live > peak:
                peak, at = live, dict(sizes)
        else:
            live -= sizes.pop(key)
    return peak, at


def live_at(events: list[Event], index: int) -> dict[int, int]:
    """The storages alive after the first ``index`` events (key -> bytes)."""
    sizes: dict[int, int] = {}
    for kind, key, nbytes in events[:index]:
        if kind == "a":
            sizes[key] = nbytes
        else:
            del sizes[key]
    return sizes
