"""onnxruntime's BFC arena, simulated: the bytes it holds from the device (its regions) after a sequence of
allocations and frees, as onnxruntime/core/framework/bfc_arena.cc makes them.

The arena rounds a request up to 256 B; it takes the smallest free chunk that holds it (the lowest address among
equals: its bins keep free chunks ordered by size, then address), splits off the rest where the chunk is at least
twice the request or wastes 128 MiB or more, and coalesces a freed chunk with its free neighbours in the same
region. Where no free chunk holds a request it extends by a region (kNextPowerOfTwo, the default): the current
region size, doubled until it holds the request, and doubled once more after a region that needed no doubling;
the first region size is 1 MiB (initial_chunk_size_bytes). Memory it reserves (Reserve: most of onnxruntime's
prepacked weights at session creation) is held at its exact size, outside the regions; a kernel that packs its
weight with a plain allocation (ConvTranspose) puts it in a region. The events replayed are the estimate's own:
each step's outputs, then its kernel's scratch (rules.inference.KERNEL_SCRATCH: LSTM, contrib Attention, BiasGelu),
allocated and freed, then the buffers that die there. The same code runs the CPU and the CUDA providers' arenas;
what the CUDA provider's kernels allocate besides (cuBLAS and cuDNN workspaces) is its own and not modelled.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import onnx

from .dtypes import element_bits
from .graph import ModelGraph
from .liveness import Timeline
from .rules.inference import KERNEL_SCRATCH

MIN_ALLOCATION = 256  # kMinAllocationSize
INITIAL_REGION = 1 << 20  # initial_chunk_size_bytes (the default arena config)
MAX_DEAD_BYTES = 128 << 20  # max_dead_bytes_per_chunk


def rounded(nbytes: int) -> int:
    """Give a request's size as the arena allocates it (a multiple of 256 B)."""
    return -(-nbytes // MIN_ALLOCATION) * MIN_ALLOCATION


@dataclass
class _Chunk:
    address: int
    size: int
    region: int
    in_use: bool = False
    prev: _Chunk | None = field(default=None, repr=False)
    next: _Chunk | None = field(default=None, repr=False)


class BFCArena:
    """The arena's regions and chunks (see the module's docstring): alloc() gives an address, free() takes it."""

    def __init__(self, initial_region: int = INITIAL_REGION) -> None:
        self.region_bytes = rounded(initial_region)  # curr_region_allocation_bytes_
        self.regions: list[int] = []  # sizes
        self.reserved = 0
        self._free: list[tuple[int, int]] = []  # (size, address) of free chunks, sorted
        self._chunks: dict[int, _Chunk] = {}  # address -> chunk
        self._end = 0  # the next region's address (regions never touch: a gap between them)

    @property
    def held_bytes(self) -> int:
        """Give the bytes the arena holds from the device: its regions and what it reserved."""
        return sum(self.regions) + self.reserved

    def reserve(self, nbytes: int) -> None:
        """Hold `nbytes` outside the regions, at their exact size (BFCArena::Reserve)."""
        self.reserved += nbytes

    def alloc(self, nbytes: int) -> int:
        """Give the address of a chunk that holds `nbytes` (a 0-byte request takes nothing: address -1)."""
        if nbytes <= 0:
            return -1
        size = rounded(nbytes)
        chunk = self._take(size)
        if chunk is None:
            self._extend(size)
            chunk = self._take(size)
            assert chunk is not None
        return chunk.address

    def free(self, address: int) -> None:
        """Give the chunk at `address` back, coalesced with its free neighbours."""
        if address < 0:
            return
        chunk = self._chunks[address]
        chunk.in_use = False
        following = chunk.next
        if following is not None and not following.in_use:
            self._unlist(following)
            self._merge(chunk, following)
        previous = chunk.prev
        if previous is not None and not previous.in_use:
            self._unlist(previous)
            self._merge(previous, chunk)
            chunk = previous
        self._list(chunk)

    def _take(self, size: int) -> _Chunk | None:
        i = bisect.bisect_left(self._free, (size, -1))
        if i == len(self._free):
            return None
        _, address = self._free.pop(i)
        chunk = self._chunks[address]
        if chunk.size >= 2 * size or chunk.size - size >= MAX_DEAD_BYTES:
            rest = _Chunk(chunk.address + size, chunk.size - size, chunk.region, prev=chunk, next=chunk.next)
            if chunk.next is not None:
                chunk.next.prev = rest
            chunk.next = rest
            chunk.size = size
            self._chunks[rest.address] = rest
            self._list(rest)
        chunk.in_use = True
        return chunk

    def _extend(self, size: int) -> None:
        grown = False
        while size > self.region_bytes:
            self.region_bytes *= 2
            grown = True
        region = self.region_bytes
        if not grown:
            self.region_bytes *= 2
        chunk = _Chunk(self._end, region, len(self.regions))
        self._end += region + MIN_ALLOCATION
        self.regions.append(region)
        self._chunks[chunk.address] = chunk
        self._list(chunk)

    def _merge(self, first: _Chunk, second: _Chunk) -> None:
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        del self._chunks[second.address]

    def _list(self, chunk: _Chunk) -> None:
        bisect.insort(self._free, (chunk.size, chunk.address))

    def _unlist(self, chunk: _Chunk) -> None:
        i = bisect.bisect_left(self._free, (chunk.size, chunk.address))
        del self._free[i]


def held_after(events: Iterable[tuple[str, int, int]], reserved: int = 0,
               initial_region: int = INITIAL_REGION) -> int:
    """Give the bytes the arena holds after `events`: ("alloc", buffer id, bytes) and ("free", buffer id, 0) in
    order, on top of `reserved` bytes reserved before them."""
    arena = BFCArena(initial_region)
    arena.reserve(reserved)
    addresses: dict[int, int] = {}
    for kind, buffer, nbytes in events:
        if kind == "alloc":
            addresses[buffer] = arena.alloc(nbytes)
        else:
            arena.free(addresses.pop(buffer, -1))
    return arena.held_bytes


def kernel_scratch(graph: ModelGraph, model: onnx.ModelProto) -> dict[int, tuple[int, ...]]:
    """Give, per op index, the bytes of the scratch its CPU kernel allocates from the arena while it runs, in
    order (rules.inference.KERNEL_SCRATCH); ops without a rule, or whose shapes are not known, are left out.
    `model`: the model the graph was built from (its nodes' attributes; op i is node i)."""
    scratch: dict[int, tuple[int, ...]] = {}
    for op in graph.ops:
        rule = KERNEL_SCRATCH.get(op.op_type if op.domain in ("", "ai.onnx") else f"{op.domain}::{op.op_type}")
        if rule is None or op.index >= len(model.graph.node):
            continue
        node = model.graph.node[op.index]
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        inputs = [_shape(graph, t) for t in op.inputs]
        outputs = [_shape(graph, t) for t in op.outputs]
        first = graph.tensors[op.inputs[0]] if op.inputs and op.inputs[0] >= 0 else None
        element = (element_bits(first.dtype) or 0) // 8 if first is not None else 0
        if element:
            sizes = tuple(n for n in rule(inputs, outputs, element, attributes) if n > 0)
            if sizes:
                scratch[op.index] = sizes
    return scratch


def _shape(graph: ModelGraph, tensor: int) -> tuple[int, ...] | None:
    """A slot's shape for a scratch rule: None where the slot is omitted, () where its shape is not known."""
    if tensor < 0:
        return None
    shape = graph.tensors[tensor].shape
    return tuple(d for d in shape if isinstance(d, int)) if shape is not None and \
        all(isinstance(d, int) for d in shape) else ()


def _scratch_events(sizes: Sequence[int], first_id: int) -> list[tuple[str, int, int]]:
    """A kernel's scratch: allocated in order, freed when it returns."""
    ids = range(first_id, first_id - len(sizes), -1)
    return [*(("alloc", i, n) for i, n in zip(ids, sizes, strict=True)), *(("free", i, 0) for i in reversed(ids))]


def first_run_events(graph: ModelGraph, timeline: Timeline,
                     scratch: Mapping[int, Sequence[int]] | None = None) -> list[tuple[str, int, int]]:
    """Give the arena's allocations and frees of a first run (no memory pattern) in the timeline's order: at each
    step the op's output buffers in output order, then its kernel's scratch (`scratch`: kernel_scratch), allocated
    and freed, then the buffers whose last step it is (graph outputs and unread outputs stay to the end)."""
    ending: dict[int, list[int]] = {}
    for t, first in enumerate(timeline.first_step):
        if first >= 0:
            ending.setdefault(timeline.last_step[t], []).append(t)
    events: list[tuple[str, int, int]] = []
    scratch_id = _SCRATCH_IDS - len(graph.tensors)
    for step, op in enumerate(timeline.order):
        for t in graph.ops[op].outputs:
            if t >= 0 and timeline.first_step[t] == step:
                events.append(("alloc", t, graph.tensors[t].nbytes or 0))
        if scratch and op in scratch:
            events.extend(_scratch_events(scratch[op], scratch_id))
            scratch_id -= len(scratch[op])
        events.extend(("free", t, 0) for t in ending.get(step, ()))
    return events


def later_run_events(graph: ModelGraph, timeline: Timeline, pattern_bytes: int,
                     scratch: Mapping[int, Sequence[int]] | None = None) -> list[tuple[str, int, int]]:
    """Give the arena's allocations and frees up to a later run with the memory pattern: the first run's (see
    first_run_events), everything it left freed at its end (its outputs go back with their results), then the
    pattern block in one allocation and, step by step, the graph outputs made there (allocated outside the block)
    and the kernels' scratch."""
    events = first_run_events(graph, timeline, scratch)
    held: set[int] = set()
    for kind, buffer, _ in events:
        if kind == "alloc":
            held.add(buffer)
        else:
            held.discard(buffer)
    events.extend(("free", t, 0) for t in sorted(held))
    events.append(("alloc", -1, pattern_bytes))
    made: dict[int, list[int]] = {}
    for t in graph.outputs:
        producer = graph.tensors[t].producer
        if timeline.buffer_of[t] == t and producer is not None:
            made.setdefault(producer, []).append(t)
    scratch_id = _SCRATCH_IDS - 2 * len(graph.tensors) - sum(len(s) for s in (scratch or {}).values())
    placed: set[int] = set()
    for op in timeline.order:
        for t in made.get(op, ()):
            events.append(("alloc", -2 - t, graph.tensors[t].nbytes or 0))
            placed.add(t)
        if scratch and op in scratch:
            events.extend(_scratch_events(scratch[op], scratch_id))
            scratch_id -= len(scratch[op])
    events.extend(("alloc", -2 - t, graph.tensors[t].nbytes or 0) for t in graph.outputs
                  if timeline.buffer_of[t] == t and t not in placed)
    return events


_SCRATCH_IDS = -(1 << 40)  # buffer ids of kernel scratch: apart from tensors (>= 0), the block and outputs (< 0)
