"""A replay of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, torch 2.2 defaults) over a
sequence of tensor allocations and frees, to read the reserved bytes a step's own order of requests leaves behind.

Rules replayed, each from the allocator's source (constants as named there):

* every request rounds up to 512 B (``kMinBlockSize``); requests up to 1 MiB (``kSmallSize``) go to the small pool,
  larger ones to the large pool, and a block never serves the other pool;
* a request takes the smallest cached free block of its pool that is large enough (``get_free_block``: the pool is a
  set ordered by size, then address, searched with ``lower_bound``);
* a free block is split when the rest is worth keeping (``should_split``: 512 B or more in the small pool, more than
  1 MiB in the large one; ``max_split_size`` is unlimited by default), the request taking the front;
* with no fitting block a new segment is reserved (``get_allocation_size``): 2 MiB for a small request, 20 MiB
  (``kLargeBuffer``) for a large one under 10 MiB (``kMinLargeAlloc``), else the request rounded up to 2 MiB
  (``kRoundLarge``);
* a freed block merges with free neighbours in its segment (``try_merge_blocks``); segments are returned to CUDA
  only when a cudaMalloc fails or on ``empty_cache()``, neither of which a run below the card's capacity does, so
  the reserved bytes only grow.

With a cap (``limit``, as ``set_per_process_memory_fraction`` sets it), a new segment that would take the reserved
bytes over it fails as cudaMalloc would; the allocator then returns every cached free segment that is whole (not
split: ``release_cached_blocks``) and tries once more, and a second failure is an out-of-memory error.

Streams: a block belongs to the stream its request was made on, and a free block serves only requests of that stream
(the pools are ordered by stream first: ``BlockComparator``, and ``get_free_block`` gives up when the block found is
another stream's); a segment is reserved for one stream. A replay tags a request with its stream through ``streams``
(tensor id -> stream; 0, the default stream, otherwise). What is not replayed is time: ``record_stream`` keeps a
freed block from reuse until the other stream's recorded events complete (``process_events``), and the replay frees
it at once, so a multi-stream replay is optimistic there.

The expandable-segments mode (off by default) and the garbage-collection threshold (unset by default) are not
replayed.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(size: int) -> int:
    """The bytes a request takes (``round_size`` with roundup_power2_divisions unset)."""
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * -(-size // MIN_BLOCK)


def allocation_size(size: int) -> int:
    """The segment reserved for a request no cached block can serve (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


class OutOfMemory(Exception):
    """A request the capped allocator could not serve after releasing its cached whole segments."""

    def __init__(self, allocator: Allocator, size: int, key: int) -> None:
        super().__init__(f"cannot reserve {size} B for tensor {key}: {allocator.reserved} B reserved of {allocator.limit}")
        self.allocator, self.size, self.key = allocator, size, key


@dataclass(eq=False)
class Block:
    """One block of a segment: [ptr, ptr + size), allocated or cached free."""

    ptr: int
    size: int
    small: bool
    stream: int = 0
    free: bool = True
    prev: Block | None = None
    next: Block | None = None


@dataclass
class Allocator:
    """The caching allocator's state: the pools of free blocks (small or large, per stream), the live blocks by tensor
    id, and its counters."""

    pools: dict[tuple[bool, int], list[tuple[int, int, Block]]] = field(default_factory=dict)
    live: dict[int, Block] = field(default_factory=dict)
    reserved: int = 0
    allocated: int = 0
    peak_reserved: int = 0
    peak_allocated: int = 0
    segments: int = 0
    limit: int | None = None
    _next_ptr: int = 0

    def _pool(self, small: bool, stream: int) -> list[tuple[int, int, Block]]:
        return self.pools.setdefault((small, stream), [])

    def _insert(self, block: Block) -> None:
        bisect.insort(self._pool(block.small, block.stream), (block.size, block.ptr, block))

    def _remove(self, block: Block) -> None:
        pool = self._pool(block.small, block.stream)
        i = bisect.bisect_left(pool, (block.size, block.ptr))
        while pool[i][2] is not block:
            i += 1
        pool.pop(i)

    def malloc(self, key: int, nbytes: int, stream: int = 0) -> None:
        """Serve tensor ``key``'s request of ``nbytes`` made on ``stream``."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._pool(small, stream)
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            block = pool.pop(i)[2]
        else:
            seg = allocation_size(size)
            if self.limit is not None and self.reserved + seg > self.limit:
                self.release_cached()
                if self.reserved + seg > self.limit:
                    raise OutOfMemory(self, seg, key)
            block = Block(self._next_ptr, seg, small, stream)
            self._next_ptr += seg + (1 << 40)   # segments are never adjacent: no merge across them
            self.reserved += seg
            self.segments += 1
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            tail = Block(block.ptr + size, rest, small, block.stream, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._insert(tail)
        block.free = False
        self.live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def release_cached(self) -> None:
        """Return every free block that is a whole segment to CUDA, of every stream (``release_cached_blocks``); split
        segments stay."""
        for pool_key, pool in self.pools.items():
            keep = []
            for entry in pool:
                block = entry[2]
                if block.prev is None and block.next is None:
                    self.reserved -= block.size
                    self.segments -= 1
                else:
                    keep.append(entry)
            self.pools[pool_key] = keep

    def free(self, key: int) -> None:
        """Return tensor ``key``'s block to its pool, merged with its free neighbours."""
        block = self.live.pop(key)
        self.allocated -= block.size
        block.free = True
        for other in (block.prev, block.next):
            if other is not None and other.free:
                self._remove(other)
                if other is block.prev:
                    other.size += block.size
                    other.next = block.next
                    if block.next is not None:
                        block.next.prev = other
                    block = other
                else:
                    block.size += other.size
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
        self._insert(block)

    def replay(self, events: list[tuple[str, int, int]], streams: dict[int, int] | None = None) -> None:
        """Apply ``("a", key, nbytes)`` / ``("f", key, 0)`` events in order, each request on ``streams[key]`` (default 0)."""
        streams = streams or {}
        for kind, key, nbytes in events:
            if kind == "a":
                self.malloc(key, nbytes, streams.get(key, 0))
            else:
                self.free(key)


def replay_under(events: list[tuple[str, int, int]], cap: int | None,
                 describe: Callable[[int], object] | None = None,
                 streams: dict[int, int] | None = None) -> tuple[bool, Allocator]:
    """Replay ``events`` (on ``streams``, see ``Allocator.replay``) under ``cap``: (True, the allocator after them) or
    (False, the allocator at the OOM), printing the failed request with ``describe(key)`` (what made the tensor) when
    given."""
    allocator = Allocator(limit=cap)
    try:
        allocator.replay(events, streams)
        return True, allocator
    except OutOfMemory as e:
        if describe is not None:
            print(f"  OOM: a {e.size / 2**30:.3f} GiB segment for {describe(e.key)}", flush=True)
        return False, e.allocator


def largest_fitting(fits: Callable[[int], tuple[bool, Allocator]], start: int, label: Callable[[int], str]) -> int:
    """The largest batch that fits: up from ``start`` while it fits, down while it does not (0 if even 1 fails);
    each try printed as ``label(batch)`` with its peaks."""
    b, largest, smallest_oom = start, 0, 0
    while True:
        ok, a = fits(b)
        print(f"{label(b)}: {'fits' if ok else 'OOM'} peak allocated {a.peak_allocated / 2**30:.3f} "
              f"reserved {a.peak_reserved / 2**30:.3f}", flush=True)
        largest, smallest_oom = (b, smallest_oom) if ok else (largest, b)
        if (largest and smallest_oom) or (b == 1 and not ok):
            break
        b = b + 1 if ok else b - 1
    print(f"largest fitting batch: {largest}")
    return largest
