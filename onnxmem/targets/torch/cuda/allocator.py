"""A replay of PyTorch's CUDA caching allocator: what torch.cuda.memory_allocated and memory_reserved read over a
sequence of allocations and frees.

Written from c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch at 001074d25084fdb87a799823e395a50f5ec044d3,
DeviceCachingAllocator), with the default configuration (PYTORCH_CUDA_ALLOC_CONF unset), one device, one stream:

- `round_size`: a request is rounded up to a multiple of kMinBlockSize (512 bytes; at least 512). With
  roundup_power2_divisions set, sizes above 512 x divisions round to the next division of their power-of-two
  interval instead (`roundup_power2_next_division`); off by default.
- `get_pool`: a rounded request of at most kSmallSize (1 MiB) is served from the small pool, a larger one from the
  large pool; a block never moves between pools.
- `get_allocation_size`: a request no block of its pool fits makes a segment (cudaMalloc) of kSmallBuffer (2 MiB)
  for a small request, kLargeBuffer (20 MiB) for a request under kMinLargeAlloc (10 MiB), else the request rounded
  up to kRoundLarge (2 MiB).
- `get_free_block`: best fit: the free block of the pool that is the smallest of those at least as large as the
  request, the lowest address among equals (BlockComparatorSize orders by stream, size, address). With
  max_split_size set (default: unlimited), a request under it takes no block of max_split_size or more, and a
  request of it or more takes no block kLargeBuffer or more larger than itself.
- `should_split`: the block found is split, the request taking its front and the rest going back to the pool, where
  the rest is at least kMinBlockSize in the small pool, and over kSmallSize in the large pool (and the request
  under max_split_size). An unsplit block is handed out whole: memory_allocated counts the block's size, not the
  request's.
- `free_block` / `try_merge_blocks`: a freed block merges with its free neighbours of the same segment (the
  blocks split from one cudaMalloc) and goes back to its pool.
- memory_reserved is the sum of the segments; a segment is never returned to the device here (that takes
  torch.cuda.empty_cache(), or a cudaMalloc that fails: `release_available_cached_blocks` and
  `release_cached_blocks` run only then, and this replay has no device limit).

Not replayed: several streams (a block freed on one is not reused by another, record_stream's events), expandable
segments, CUDA graph pools, the garbage collection threshold, per-process memory fractions. Segment addresses are
taken in the order the segments are made (cudaMalloc's addresses are the device's: they only break ties between
free blocks of equal size).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: "all sizes are rounded to at least 512 bytes"
K_SMALL_SIZE = 1_048_576  # kSmallSize: "largest 'small' allocation is 1 MiB"
K_SMALL_BUFFER = 2_097_152  # kSmallBuffer: "'small' allocations are packed in 2 MiB blocks"
K_LARGE_BUFFER = 20_971_520  # kLargeBuffer: "'large' allocations may be packed in 20 MiB blocks"
K_MIN_LARGE_ALLOC = 10_485_760  # kMinLargeAlloc: "allocations between 1 and 10 MiB may use kLargeBuffer"
K_ROUND_LARGE = 2_097_152  # kRoundLarge: "round up large allocations to 2 MiB"


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Give `size` rounded up to the next of `divisions` equal steps between the powers of two around it
    (roundup_power2_next_division: 1200 in 4 divisions of 1024-2048 is 1280)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def round_size(size: int, roundup_power2_divisions: int = 0) -> int:
    """Give the bytes a request of `size` asks the pools for (round_size)."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if roundup_power2_divisions > 1 and size > K_MIN_BLOCK_SIZE * roundup_power2_divisions:
        return roundup_power2_next_division(size, roundup_power2_divisions)
    return K_MIN_BLOCK_SIZE * -(-size // K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """Give the bytes of the segment a rounded request makes when no cached block fits it (get_allocation_size)."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * -(-size // K_ROUND_LARGE)


@dataclass(eq=False)
class Block:
    """A block of a segment: handed out (allocated) or cached in its pool."""

    address: int
    size: int
    small: bool  # in the small pool
    allocated: bool = False
    prev: Block | None = None  # the blocks before and after it in its segment
    next: Block | None = None

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


@dataclass
class CachingAllocator:
    """The allocator's state over a replay: its two pools of cached blocks, the segments it holds, and the
    statistics memory_allocated and memory_reserved read, with their peaks."""

    max_split_size: int | None = None  # PYTORCH_CUDA_ALLOC_CONF max_split_size_mb, in bytes; None: unlimited
    roundup_power2_divisions: int = 0  # roundup_power2_divisions; 0: off
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    segments: int = 0
    small_reserved: int = 0  # the small pool's segments (reserved_bytes.small_pool), and their count
    small_segments: int = 0
    _pools: dict[bool, list[tuple[int, int, Block]]] = field(default_factory=lambda: {True: [], False: []})
    _next_address: int = 0

    def malloc(self, nbytes: int) -> Block:
        """Give the block a request of `nbytes` is handed (DeviceCachingAllocator::malloc)."""
        size = round_size(nbytes, self.roundup_power2_divisions)
        small = size <= K_SMALL_SIZE
        block = self._free_block(small, size)
        if block is None:  # alloc_block: cudaMalloc a segment
            segment = allocation_size(size)
            block = Block(self._next_address, segment, small)
            self._next_address += segment
            self.reserved += segment
            self.segments += 1
            if small:
                self.small_reserved += segment
                self.small_segments += 1
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        if self._should_split(block, size):  # alloc_found_block: the request takes the front
            rest = Block(block.address + size, block.size - size, small, prev=None, next=block.next)
            front = block
            front.size = size
            if rest.next is not None:
                rest.next.prev = rest
            rest.prev, front.next = front, rest
            self._insert(rest)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def reset_peaks(self) -> None:
        """Start the peaks again from the current figures (torch.cuda.reset_peak_memory_stats)."""
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def free(self, block: Block) -> None:
        """Give `block` back to its pool, merged with its free neighbours (free, free_block, try_merge_blocks)."""
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is None or neighbour.allocated:
                continue
            self._remove(neighbour)
            if neighbour is block.prev:  # [neighbour block]
                block.address = neighbour.address
                block.prev = neighbour.prev
                if block.prev is not None:
                    block.prev.next = block
            else:  # [block neighbour]
                block.next = neighbour.next
                if block.next is not None:
                    block.next.prev = block
            block.size += neighbour.size
        self._insert(block)

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.small:
            return remaining >= K_MIN_BLOCK_SIZE
        return (self.max_split_size is None or size < self.max_split_size) and remaining > K_SMALL_SIZE

    def _free_block(self, small: bool, size: int) -> Block | None:
        """Take the best-fit cached block of the pool for a rounded request, or None (get_free_block)."""
        pool = self._pools[small]
        at = bisect.bisect_left(pool, (size, -1))
        if at == len(pool):
            return None
        found = pool[at][2]
        limit = self.max_split_size
        if limit is not None and size < limit and found.size >= limit:
            return None  # "Do not return an oversized block for a large request"
        if limit is not None and size >= limit and found.size >= size + K_LARGE_BUFFER:
            return None  # "Allow oversized block size to be rounded up but within a limit"
        del pool[at]
        return found

    def _insert(self, block: Block) -> None:
        bisect.insort(self._pools[block.small], (block.size, block.address, block))

    def _remove(self, block: Block) -> None:
        pool = self._pools[block.small]
        del pool[bisect.bisect_left(pool, (block.size, block.address))]


@dataclass(frozen=True)
class AllocatorPeaks:
    """The peaks of a replay: memory_allocated's (blocks handed out) and memory_reserved's (segments held)."""

    allocated: int
    reserved: int
    segments: int  # segments held at the end (none is returned)
    small_reserved: int = 0  # the small pool's part of reserved at the end, and its segments
    small_segments: int = 0


def replay(events: Iterable[tuple[int, bool]], max_split_size: int | None = None,
           roundup_power2_divisions: int = 0) -> AllocatorPeaks:
    """Give the allocator's peaks over events (bytes, is a free), in order: an allocation of `bytes`, or the free of
    the latest live allocation of that many bytes."""
    allocator = CachingAllocator(max_split_size, roundup_power2_divisions)
    live: dict[int, list[Block]] = {}
    for nbytes, is_free in events:
        if is_free:
            blocks = live.get(nbytes)
            if not blocks:
                raise ValueError(f"a free of {nbytes} bytes with no live allocation of that size")
            allocator.free(blocks.pop())
        else:
            live.setdefault(nbytes, []).append(allocator.malloc(nbytes))
    return AllocatorPeaks(allocator.peak_allocated, allocator.peak_reserved, allocator.segments,
                          allocator.small_reserved, allocator.small_segments)


def replay_named(events: Iterable[tuple[Hashable, int, bool]], held: Iterable[int] = (),
                 max_split_size: int | None = None, roundup_power2_divisions: int = 0) -> AllocatorPeaks:
    """Give the allocator's peaks over events (name, bytes, is a free), in order: an allocation of `bytes` named
    `name`, or the free of the live allocation of that name. `held`: requests made before the events and never
    freed (what a process allocated before: a library's workspaces, whose segments' spare room serves the events);
    the figures given are above them (memory_allocated and memory_reserved minus what they were before the
    events).

    A free names its block: freeing "the latest live allocation of that size" instead picks another block of the
    same size whenever several are live (a step's activations are), and which block goes back to the pool decides
    what later requests split and which segments they make."""
    phases = replay_phases((("", name, nbytes, is_free) for name, nbytes, is_free in events), held, max_split_size,
                           roundup_power2_divisions)
    return phases.get("", AllocatorPeaks(0, 0, 0))


def replay_phases(events: Iterable[tuple[str, Hashable, int, bool]], held: Iterable[int] = (),
                  max_split_size: int | None = None, roundup_power2_divisions: int = 0) -> dict[str, AllocatorPeaks]:
    """Give each phase's peaks over events (phase, name, bytes, is a free), as replay_named does, the peaks started
    again where a new phase begins (torch.cuda.reset_peak_memory_stats between phases) and the segment figures
    those held at the phase's end; the phases in the order they begin. A phase's peak reserved includes what the
    phases before it reserved (a segment is never returned)."""
    allocator = CachingAllocator(max_split_size, roundup_power2_divisions)
    for nbytes in held:
        allocator.malloc(nbytes)
    base = (allocator.allocated, allocator.reserved, allocator.segments, allocator.small_reserved,
            allocator.small_segments)
    live: dict[Hashable, Block] = {}
    peaks: dict[str, AllocatorPeaks] = {}
    phase: str | None = None

    def close() -> None:
        if phase is None:
            return
        earlier = peaks.get(phase)  # a phase that begins again: the larger peaks of its parts
        peaks[phase] = AllocatorPeaks(
            max(allocator.peak_allocated - base[0], earlier.allocated if earlier else 0),
            max(allocator.peak_reserved - base[1], earlier.reserved if earlier else 0),
            allocator.segments - base[2], allocator.small_reserved - base[3], allocator.small_segments - base[4])

    for event_phase, name, nbytes, is_free in events:
        if event_phase != phase:
            close()
            phase = event_phase
            allocator.reset_peaks()
        if is_free:
            block = live.pop(name, None)
            if block is None:
                raise ValueError(f"a free of {name!r} ({nbytes} bytes) with no live allocation of that name")
            allocator.free(block)
        elif name in live:
            raise ValueError(f"an allocation of {name!r} ({nbytes} bytes) while one of that name is live")
        else:
            live[name] = allocator.malloc(nbytes)
    close()
    return peaks
