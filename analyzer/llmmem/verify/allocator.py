"""The CUDA caching allocator's bookkeeping, replayed over a step's allocations.

`max_memory_reserved` and nvidia-smi read more than `max_memory_allocated` because torch's caching
allocator (c10/cuda/CUDACachingAllocator.cpp; the rules below hold from torch 1.10 to 2.13 with
the default `PYTORCH_CUDA_ALLOC_CONF`: no `max_split_size_mb`, no `expandable_segments`, no
garbage-collection threshold) never gives memory back within a run and serves a request only from
a cached block at least as large:

- a request is rounded up to a multiple of 512 bytes;
- requests up to 1 MiB come from the small pool, carved from 2 MiB segments; larger ones from the
  large pool, from a 20 MiB segment below 10 MiB and otherwise from a segment of exactly the
  request rounded up to 2 MiB;
- the smallest cached free block of the pool that fits is used (best fit, lowest address among
  equals) and split when what is left is more than 1 MiB (large pool) or at least 512 bytes
  (small pool); otherwise the whole block serves the request;
- a freed block merges with its free neighbours in the same segment and goes back to its pool;
- only when cudaMalloc fails are the cached segments that hold nothing returned to the driver,
  and the allocation is tried again.

So the reserved peak depends on the order of allocations: a block freed early that is too small
for the next large request stays reserved beside the new segment made for it. `CachingAllocator`
replays a sequence of (allocate, free) events through these rules; `StorageTracker` records such a
sequence from a CPU or simulated step (`events`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # largest request served by the small pool
SMALL_BUFFER = 2 << 20  # a small-pool segment
LARGE_BUFFER = 20 << 20  # the segment a large request under MIN_LARGE_ALLOC gets
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def rounded(nbytes: int) -> int:
    """A request's size as the allocator books it."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The cudaMalloc a request of `size` (rounded) makes when no cached block fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class OutOfMemory(Exception):
    pass


@dataclass(eq=False)
class _Block:
    address: int
    size: int
    small: bool
    segment: int
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None


@dataclass
class CachingAllocator:
    """Replays allocations through the caching allocator's rules; `capacity` (bytes the device
    can give) makes a failing cudaMalloc release the empty cached segments, as torch does."""

    capacity: int | None = None
    reserved: int = 0
    allocated: int = 0  # the blocks in use, at their booked (rounded or unsplit) size
    peak_reserved: int = 0
    peak_allocated: int = 0
    _pools: dict[bool, list[tuple[int, int, int]]] = field(
        default_factory=lambda: {True: [], False: []}
    )
    _blocks: dict[int, _Block] = field(default_factory=dict)  # id -> free block in a pool
    _live: dict[object, _Block] = field(default_factory=dict)  # caller's key -> block
    _segments: dict[int, _Block] = field(default_factory=dict)  # segment -> its first block
    _next_address: int = 0
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    # the cached free blocks (sizes, largest first) when the reserved peak was last raised
    free_at_peak: list[int] = field(default_factory=list)
    events_seen: int = 0
    peak_event: int = 0
    peak_request: int = 0  # the request that made the segment of the reserved peak

    # -- pools ---------------------------------------------------------------------------------

    def _pool_add(self, block: _Block) -> None:
        key = id(block)
        self._blocks[key] = block
        bisect.insort(self._pools[block.small], (block.size, block.address, key))

    def _pool_remove(self, block: _Block) -> None:
        pool = self._pools[block.small]
        entry = (block.size, block.address, id(block))
        i = bisect.bisect_left(pool, entry)
        if i < len(pool) and pool[i] == entry:
            del pool[i]
        self._blocks.pop(id(block), None)

    def _best_fit(self, size: int, small: bool) -> _Block | None:
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i == len(pool):
            return None
        return self._blocks[pool[i][2]]

    # -- segments ------------------------------------------------------------------------------

    def _new_segment(self, size: int, small: bool) -> _Block:
        grow = segment_size(size)
        if self.capacity is not None and self.reserved + grow > self.capacity:
            self._release_empty_segments()
            if self.reserved + grow > self.capacity:
                raise OutOfMemory(
                    f"tried to allocate {size} bytes with {self.reserved} reserved of "
                    f"{self.capacity}"
                )
        segment = next(self._ids)
        block = _Block(self._next_address, grow, small, segment)
        self._next_address += grow
        self._segments[segment] = block
        self.reserved += grow
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
            self.peak_event = self.events_seen
            self.peak_request = size
            self.free_at_peak = sorted(
                (entry[0] for pool in self._pools.values() for entry in pool), reverse=True
            )
        return block

    def _release_empty_segments(self) -> None:
        for segment, first in list(self._segments.items()):
            if first.free and first.next is None:
                self._pool_remove(first)
                self.reserved -= first.size
                del self._segments[segment]

    # -- the two calls -------------------------------------------------------------------------

    def malloc(self, key: object, nbytes: int) -> None:
        if nbytes <= 0:
            return  # a zero-size storage allocates nothing
        size = rounded(nbytes)
        small = size <= SMALL_SIZE
        block = self._best_fit(size, small)
        if block is not None:
            self._pool_remove(block)
        else:
            block = self._new_segment(size, small)
        remaining = block.size - size
        if (small and remaining >= MIN_BLOCK) or (not small and remaining > SMALL_SIZE):
            rest = _Block(block.address + size, remaining, small, block.segment)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._pool_add(rest)
        block.free = False
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: object) -> None:
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._pool_remove(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    if self._segments.get(block.segment) is block:
                        self._segments[block.segment] = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._pool_add(block)

    def replay(self, events: Iterable[tuple[object, int]]) -> CachingAllocator:
        """Events as `StorageTracker` records them: (key, bytes) allocates, (key, -1) frees."""
        for key, nbytes in events:
            self.events_seen += 1
            if nbytes < 0:
                self.free(key)
            else:
                self.malloc(key, nbytes)
        return self


def replay_step(events: Iterable[tuple[object, int]], workspace_bytes: int) -> CachingAllocator:
    """A recorded step as a GPU would allocate it: cuBLAS's two workspaces (one per handle: the
    forward thread's and autograd's backward thread's) come from the same allocator at their
    first matmul, before the step's own tensors."""
    workspaces: list[tuple[object, int]] = [
        ("cublas-forward", workspace_bytes),
        ("cublas-backward", workspace_bytes),
    ]
    return CachingAllocator().replay([*workspaces, *events])


__all__ = ["CachingAllocator", "OutOfMemory", "replay_step", "rounded", "segment_size"]
