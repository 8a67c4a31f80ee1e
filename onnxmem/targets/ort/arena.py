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
each step's outputs and its kernel's scratch (the provider's kernel_scratch: on CPU, cpu/tables.KERNEL_SCRATCH: LSTM,
contrib Attention, BiasGelu, Where), allocated and freed, then the buffers that die there. The same code runs the CPU
and the CUDA providers' arenas; what the CUDA provider's kernels allocate besides (cuBLAS and cuDNN workspaces, their
own scratch) is not modelled.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx

from onnxmem.ir.dtypes import element_bits
from onnxmem.ir.graph import WEIGHT, ModelGraph
from onnxmem.passes.liveness import Timeline, pattern_block_bytes
from onnxmem.targets.ort.cpu.tables import (
    ARENA_COPIED_INITIALIZER_BYTES,
    CONV_SYM_GROUP_ALIGNMENT,
    CONV_SYM_INPUT_ALIGNMENT,
    CONV_SYM_OUTPUT_ALIGNMENT,
    CONV_SYM_OUTPUT_PACK,
    FLOAT16_WEIGHTS_AS_FLOAT32,
    KERNEL_SCRATCH,
    NBITS_BLOCK_SUM_COLUMNS,
    NBITS_COMPUTE,
    NBITS_INT8_EXTRA_BYTES,
    PREPACK_PADDED_COLUMNS,
    PREPACKED,
    PREPACKED_IN_REGIONS,
    QGEMM_BUFFER_ALIGNMENT,
    QGEMM_COLUMN_ALIGNMENT,
    QGEMM_PACKED_K,
    QUANTIZED_PREPACKED,
    SCRATCH_BEFORE_OUTPUTS,
    SCRATCH_ELEMENT_INPUT,
    SCRATCH_KNOWN_SCALARS,
    SYMMETRIC_CONV,
    qlinear_conv_scratch,
)

if TYPE_CHECKING:
    from onnxmem.targets.ort.base import ExecutionProvider

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


@dataclass(frozen=True)
class ArenaWeights:
    """The weights onnxruntime's CPU arena holds from session creation on."""

    reserved: int  # bytes reserved at their exact size outside the regions (most prepacked weights, small copies)
    in_regions: tuple[int, ...]  # sizes allocated in its regions at session creation (PREPACKED_IN_REGIONS)
    held: frozenset[int]  # the initializers (tensor indices) these stand for: packed or copied into the arena


def arena_weight_bytes(graph: ModelGraph, model: onnx.ModelProto, given: onnx.ModelProto | None = None) -> int:
    """Give the weight bytes onnxruntime's CPU arena holds: prepacked weights (rules.inference.PREPACKED,
    QUANTIZED_PREPACKED) and initializers stored in the model too small to be used in place
    (ARENA_COPIED_INITIALIZER_BYTES). `model`: the graph's model; `given`: the model as the user gave it, whose
    external initializers onnxruntime loads outside the arena (its saved optimized model marks none external)."""
    weights = arena_weights(graph, model, given)
    return weights.reserved + sum(weights.in_regions)


def arena_weights(graph: ModelGraph, model: onnx.ModelProto, given: onnx.ModelProto | None = None) -> ArenaWeights:
    """Give the weights onnxruntime's CPU arena holds (see ArenaWeights and arena_weight_bytes)."""
    # The graph keeps no attributes; a Gemm's transB, which says which way its weight is packed, is read here.
    transposed = {n.name for n in model.graph.node if n.op_type in ("Gemm", "FusedGemm", "FusedMatMul")
                  and any(a.name == "transB" and a.i == 1 for a in n.attribute)}
    external = {t.name for t in (given or model).graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL}
    total = 0
    in_regions: list[int] = []
    packed: set[int] = set()
    for op in graph.ops:
        key = op.op_type if op.domain in ("", "ai.onnx") else f"{op.domain}::{op.op_type}"
        for slot in PREPACKED.get(key, ()):
            if slot >= len(op.inputs) or op.inputs[slot] < 0:
                continue
            weight = graph.tensors[op.inputs[slot]]
            if weight.kind != WEIGHT or weight.index in packed or weight.dtype != onnx.TensorProto.FLOAT \
                    or weight.shape is None or weight.nbytes is None:
                continue
            packed.add(weight.index)
            alignment = PREPACK_PADDED_COLUMNS.get(key)
            if alignment is None or len(weight.shape) != 2:
                if key in PREPACKED_IN_REGIONS:
                    in_regions.append(weight.nbytes)
                else:
                    total += weight.nbytes
                continue
            rows, columns = weight.shape
            assert isinstance(rows, int) and isinstance(columns, int)
            if op.name in transposed:
                rows, columns = columns, rows
            total += rows * (-(-columns // alignment) * alignment) * 4
    total += _quantized_prepacked_bytes(graph, model, packed, in_regions)
    for op in graph.ops:
        key = op.op_type if op.domain in ("", "ai.onnx") else f"{op.domain}::{op.op_type}"
        for slot in FLOAT16_WEIGHTS_AS_FLOAT32.get(key, ()):
            if slot >= len(op.inputs) or op.inputs[slot] < 0:
                continue
            weight = graph.tensors[op.inputs[slot]]  # (each kernel converts its own copy: one per op reading it)
            if weight.kind == WEIGHT and weight.dtype == onnx.TensorProto.FLOAT16 and weight.nbytes is not None:
                packed.add(weight.index)
                total += weight.nbytes * 2
    copied = set()
    for weight in graph.tensors:
        if weight.kind == WEIGHT and weight.index not in packed and weight.nbytes is not None \
                and weight.nbytes < ARENA_COPIED_INITIALIZER_BYTES and weight.producer is None \
                and weight.name not in external:
            total += weight.nbytes
            copied.add(weight.index)
    return ArenaWeights(total, tuple(in_regions), frozenset(packed | copied))


def _quantized_prepacked_bytes(graph: ModelGraph, model: onnx.ModelProto, packed: set[int],
                               in_regions: list[int]) -> int:
    """Give the bytes the quantized kernels' PrePack reserves in the arena (rules.inference.QUANTIZED_PREPACKED);
    add the sizes it allocates in the arena's regions to `in_regions` (MLAS's symmetric conv packs:
    QLinearConv::TryConvSymPrepack allocates them with a plain Alloc), and the weights they pack to `packed`."""
    total = 0
    nodes: dict[str, onnx.NodeProto] | None = None  # the model's nodes by name, read where a quantized op is met
    initializers: dict[str, onnx.TensorProto] = {}
    for op in graph.ops:
        key = op.op_type if op.domain in ("", "ai.onnx") else f"{op.domain}::{op.op_type}"
        rule = QUANTIZED_PREPACKED.get(key)
        if rule is None:
            continue
        slot, how = rule
        if slot >= len(op.inputs) or op.inputs[slot] < 0:
            continue
        weight = graph.tensors[op.inputs[slot]]
        if weight.kind != WEIGHT or weight.index in packed or weight.shape is None \
                or not all(isinstance(d, int) for d in weight.shape):
            continue
        if nodes is None:
            nodes = {n.name: n for n in model.graph.node}
            initializers = {t.name: t for t in model.graph.initializer}
        node = nodes.get(op.name)
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} if node else {}
        shape = [d for d in weight.shape if isinstance(d, int)]  # (all ints: checked above)
        signed = weight.dtype == onnx.TensorProto.INT8
        size: int | None
        if how == "nbits":
            nbits = _nbits_pack_bytes(attributes)
            if nbits is None:
                continue
            size, in_region = nbits, False
        elif how == "gemm":
            if len(shape) != 2:
                continue
            rows, columns = (shape[1], shape[0]) if attributes.get("transB", 0) == 1 else (shape[0], shape[1])
            size, in_region = _qgemm_pack_bytes(columns, rows, signed), False
        else:
            conv = _qlinear_conv_pack_bytes(shape, int(attributes.get("group", 1)), signed,
                                            signed and _symmetric(graph, op.inputs, initializers))
            if conv is None:
                continue
            size, in_region = conv
        packed.add(weight.index)
        if in_region:
            in_regions.append(size)
        else:
            total += size
    return total


def _nbits_pack_bytes(attributes: Mapping[str, object]) -> int | None:
    """Give the bytes MatMulNBits::PrePack reserves for its weight (see NBITS_COMPUTE), from the node's K, N,
    block_size, bits and accuracy_level; None where it packs nothing."""
    try:
        k, n, block = (int(attributes[name]) for name in ("K", "N", "block_size"))  # type: ignore[call-overload]
        bits = int(attributes.get("bits", 4))  # type: ignore[call-overload]
        level = int(attributes.get("accuracy_level", 0))  # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError):
        return None
    compute = NBITS_COMPUTE.get(bits, {}).get(level == 4)
    if compute is None or k <= 0 or n <= 0 or block <= 0:
        return None
    blocks = -(-k // block)
    size = n * blocks * block * bits // 8
    if compute == "int8":
        size += n * blocks * 4 + -(-n // NBITS_BLOCK_SUM_COLUMNS) * NBITS_BLOCK_SUM_COLUMNS * blocks * 4 + \
            NBITS_INT8_EXTRA_BYTES
    return size


def _qgemm_pack_bytes(columns: int, rows: int, signed: bool) -> int:
    """Give MlasGemmPackBSize's bytes for a [rows, columns] quantized weight (see QUANTIZED_PREPACKED)."""
    aligned_columns = -(-columns // QGEMM_COLUMN_ALIGNMENT) * QGEMM_COLUMN_ALIGNMENT
    packed_k = QGEMM_PACKED_K[signed]
    aligned_rows = -(-rows // packed_k) * packed_k
    size = aligned_columns * 4 + aligned_columns * aligned_rows
    return -(-size // QGEMM_BUFFER_ALIGNMENT) * QGEMM_BUFFER_ALIGNMENT


def _qlinear_conv_pack_bytes(shape: list[int], groups: int, signed: bool,
                             symmetric: bool) -> tuple[int, bool] | None:
    """Give the bytes QLinearConv::PrePack allocates for a weight of `shape` (see QUANTIZED_PREPACKED; `signed`: an
    int8 weight, `symmetric`: one whose zero points are all zero) and whether it allocates them in the arena's
    regions (the symmetric conv packs) rather than reserving them; None where it packs nothing (a weight of rank 2
    or less, output channels not a multiple of the groups)."""
    if len(shape) <= 2 or groups < 1 or shape[0] % groups:
        return None
    outputs, inputs = shape[0], shape[1]
    kernel = 1
    for d in shape[2:]:
        kernel *= d
    group_outputs = outputs // groups
    if symmetric:
        if groups == 1 and outputs >= CONV_SYM_OUTPUT_PACK and inputs % CONV_SYM_INPUT_ALIGNMENT == 0 \
                and outputs % CONV_SYM_OUTPUT_ALIGNMENT == 0:
            return -(-outputs // CONV_SYM_OUTPUT_PACK) * CONV_SYM_OUTPUT_PACK * inputs * kernel, True
        if groups > 1 and inputs == 1 and group_outputs == 1 and groups % CONV_SYM_GROUP_ALIGNMENT == 0:
            return groups * kernel, True
    if inputs != 1 or group_outputs != 1:
        return groups * _qgemm_pack_bytes(group_outputs, inputs * kernel, signed), False
    return outputs * inputs * kernel, False  # the reordered weight of a depthwise conv


def _symmetric(graph: ModelGraph, inputs: Sequence[int], initializers: Mapping[str, onnx.TensorProto]) -> bool:
    """Say whether a QLinearConv takes MLAS's symmetric path: its input zero point (slot 2) a constant and its
    weight zero points (slot 5) all zero; a zero point whose data the file does not hold counts as zero (the
    onnxruntime quantizer's default for int8 weights)."""
    if len(inputs) <= 5 or inputs[2] < 0 or inputs[5] < 0:
        return False
    if graph.tensors[inputs[2]].kind != WEIGHT or graph.tensors[inputs[5]].kind != WEIGHT:
        return False
    zero_point = initializers.get(graph.tensors[inputs[5]].name)
    if zero_point is None or zero_point.data_location == onnx.TensorProto.EXTERNAL:
        return True
    from onnx import numpy_helper

    return not numpy_helper.to_array(zero_point).any()


def held_after(events: Iterable[tuple[str, int, int]], reserved: int = 0,
               initial_region: int = INITIAL_REGION) -> int:
    """Give the bytes the arena holds after `events`: ("alloc", buffer id, bytes) and ("free", buffer id, 0) in
    order, on top of `reserved` bytes reserved before them."""
    arena = BFCArena(initial_region)
    arena.reserve(reserved)
    return _replay(arena, {}, events)


def _replay(arena: BFCArena, addresses: dict[int, int], events: Iterable[tuple[str, int, int]]) -> int:
    """Run `events` on the arena (`addresses`: where each live buffer id is, kept across calls); give the bytes it
    holds after them."""
    for kind, buffer, nbytes in events:
        if kind == "alloc":
            addresses[buffer] = arena.alloc(nbytes)
        else:
            arena.free(addresses.pop(buffer, -1))
    return arena.held_bytes


def kernel_scratch(graph: ModelGraph, model: onnx.ModelProto,
                   shape_of: Callable[[int], tuple[int, ...] | None] | None = None) -> dict[int, tuple[int, ...]]:
    """Give, per op index, the bytes of the scratch its CPU kernel allocates from the arena while it runs, in
    order (rules.inference.KERNEL_SCRATCH); ops without a rule, or whose shapes are not known, are left out.
    `model`: the model the graph was built from (its nodes' attributes; op i is node i); `shape_of`: a tensor's
    shape (None: omitted, (): not known) where the graph's own shapes are not the ones to use."""
    shape = shape_of or (lambda t: _shape(graph, t))
    scratch: dict[int, tuple[int, ...]] = {}
    for op in graph.ops:
        key = op.op_type if op.domain in ("", "ai.onnx") else f"{op.domain}::{op.op_type}"
        rule = KERNEL_SCRATCH.get(key)
        if rule is None or op.index >= len(model.graph.node):
            continue
        node = model.graph.node[op.index]
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if rule is qlinear_conv_scratch:
            attributes[SYMMETRIC_CONV] = _symmetric_conv(graph, model, op.inputs, attributes)
        inputs = [shape(t) if t >= 0 else None for t in op.inputs]
        if key in SCRATCH_KNOWN_SCALARS:
            inputs = [(1,) if t >= 0 and graph.tensors[t].shape == () else found
                      for t, found in zip(op.inputs, inputs, strict=True)]
        outputs = [shape(t) if t >= 0 else None for t in op.outputs]
        slot = SCRATCH_ELEMENT_INPUT.get(key, 0)
        first = graph.tensors[op.inputs[slot]] if len(op.inputs) > slot and op.inputs[slot] >= 0 else None
        element = (element_bits(first.dtype) or 0) // 8 if first is not None else 0
        if element:
            sizes = tuple(n for n in rule(inputs, outputs, element, attributes) if n > 0)
            if sizes:
                scratch[op.index] = sizes
    return scratch


def _symmetric_conv(graph: ModelGraph, model: onnx.ModelProto, inputs: Sequence[int],
                    attributes: Mapping[str, object]) -> bool:
    """Say whether a QLinearConv's constant weight is packed for MLAS's symmetric conv kernels (see
    _qlinear_conv_pack_bytes: the packs it allocates in a region)."""
    if len(inputs) <= 3 or inputs[3] < 0 or graph.tensors[inputs[3]].kind != WEIGHT:
        return False
    weight = graph.tensors[inputs[3]]
    shape = [d for d in weight.shape or () if isinstance(d, int)]
    if weight.shape is None or len(shape) != len(weight.shape):
        return False
    signed = weight.dtype == onnx.TensorProto.INT8
    groups = attributes.get("group", 1)
    initializers = {t.name: t for t in model.graph.initializer if t.name == graph.tensors[inputs[5]].name} \
        if len(inputs) > 5 and inputs[5] >= 0 else {}
    packed = _qlinear_conv_pack_bytes(shape, groups if isinstance(groups, int) else 1, signed,
                                      signed and _symmetric(graph, inputs, initializers))
    return packed is not None and packed[1]


def _shape(graph: ModelGraph, tensor: int) -> tuple[int, ...] | None:
    """A slot's shape for a scratch rule: None where the slot is omitted, () where its shape is not known."""
    if tensor < 0:
        return None
    shape = graph.tensors[tensor].shape
    return tuple(d for d in shape if isinstance(d, int)) if shape is not None and \
        all(isinstance(d, int) for d in shape) else ()


def _scratch_events(sizes: Sequence[int], first_id: int, outputs: Sequence[tuple[str, int, int]] = (),
                    before_outputs: bool = False) -> list[tuple[str, int, int]]:
    """A kernel's outputs and scratch: the scratch allocated in order, after the outputs (or before them, where
    the kernel makes its outputs from its scratch: rules.inference.SCRATCH_BEFORE_OUTPUTS), freed when it
    returns."""
    ids = range(first_id, first_id - len(sizes), -1)
    allocated = [("alloc", i, n) for i, n in zip(ids, sizes, strict=True)]
    ordered = [*allocated, *outputs] if before_outputs else [*outputs, *allocated]
    return [*ordered, *(("free", i, 0) for i in reversed(ids))]


def _scratch_first(graph: ModelGraph, op: int) -> bool:
    """Say whether the op's kernel allocates its scratch before its outputs."""
    found = graph.ops[op]
    return (found.op_type if found.domain in ("", "ai.onnx") else f"{found.domain}::{found.op_type}") \
        in SCRATCH_BEFORE_OUTPUTS


def first_run_events(graph: ModelGraph, timeline: Timeline, scratch: Mapping[int, Sequence[int]] | None = None,
                     sizes: Sequence[int | None] | None = None,
                     loops: Mapping[int, Callable[[Sequence[int]], Sequence[tuple[str, int, int]]]] | None = None,
                     ) -> list[tuple[str, int, int]]:
    """Give the arena's allocations and frees of a first run (no memory pattern) in the timeline's order: at each
    step the op's output buffers in output order, then its kernel's scratch (`scratch`: kernel_scratch), allocated
    and freed, then the buffers whose last step it is (graph outputs and unread outputs stay to the end).
    `sizes`: each tensor's bytes, where not the graph's own; `loops`: per Loop op, its run's events given the
    outputs it allocates (loops.loop_run: its body's iterations, then its outputs), in place of its outputs."""
    nbytes = sizes if sizes is not None else [t.nbytes for t in graph.tensors]
    ending: dict[int, list[int]] = {}
    for t, first in enumerate(timeline.first_step):
        if first >= 0:
            ending.setdefault(timeline.last_step[t], []).append(t)
    events: list[tuple[str, int, int]] = []
    scratch_id = _SCRATCH_IDS - len(graph.tensors)
    for step, op in enumerate(timeline.order):
        outputs = [("alloc", t, nbytes[t] or 0) for t in graph.ops[op].outputs
                   if t >= 0 and timeline.first_step[t] == step]
        if loops and op in loops:
            events.extend(loops[op]([t for _, t, _ in outputs]))
        elif scratch and op in scratch:
            events.extend(_scratch_events(scratch[op], scratch_id, outputs, _scratch_first(graph, op)))
            scratch_id -= len(scratch[op])
        else:
            events.extend(outputs)
        events.extend(("free", t, 0) for t in ending.get(step, ()))
    return events


def later_run_events(graph: ModelGraph, timeline: Timeline, pattern_bytes: int,
                     scratch: Mapping[int, Sequence[int]] | None = None) -> list[tuple[str, int, int]]:
    """Give the arena's allocations and frees up to a later run with the memory pattern: the first run's (see
    first_run_events), everything it left freed at its end (its outputs go back with their results), then the
    pattern block in one allocation and, step by step, the graph outputs made there (allocated outside the block)
    and the kernels' scratch."""
    first = first_run_events(graph, timeline, scratch)
    return [*first, *_later_run(graph, timeline, pattern_bytes, scratch, first)]


def _later_run(graph: ModelGraph, timeline: Timeline, pattern_bytes: int, scratch: Mapping[int, Sequence[int]] | None,
               first: Sequence[tuple[str, int, int]], inputs: Sequence[int] = (),
               sizes: Sequence[int | None] | None = None,
               loops: Mapping[int, Callable[[Sequence[int]], Sequence[tuple[str, int, int]]]] | None = None,
               ) -> list[tuple[str, int, int]]:
    """The events of later_run_events after the first run's (`first`); `inputs`: the bytes of graph inputs each
    run copies into the arena before it starts (the CUDA provider's feeds); `sizes`, `loops` as first_run_events
    (a Loop's intermediate outputs are in the pattern's block)."""
    nbytes = sizes if sizes is not None else [t.nbytes for t in graph.tensors]
    held: set[int] = set()
    for kind, buffer, _ in first:
        if kind == "alloc":
            held.add(buffer)
        else:
            held.discard(buffer)
    events: list[tuple[str, int, int]] = [("free", t, 0) for t in sorted(held)]
    copied = _INPUT_IDS - len(graph.tensors)
    events.extend(("alloc", copied - i, n) for i, n in enumerate(inputs))
    events.append(("alloc", -1, pattern_bytes))
    made: dict[int, list[int]] = {}
    for t in graph.outputs:
        producer = graph.tensors[t].producer
        if timeline.buffer_of[t] == t and producer is not None:
            made.setdefault(producer, []).append(t)
    scratch_id = _SCRATCH_IDS - 2 * len(graph.tensors) - sum(len(s) for s in (scratch or {}).values())
    placed: set[int] = set()
    for op in timeline.order:
        outputs = [("alloc", -2 - t, nbytes[t] or 0) for t in made.get(op, ())]
        placed.update(made.get(op, ()))
        if loops and op in loops:  # (its own outputs: graph outputs, ids -2 - tensor as above)
            own = set(made.get(op, ()))
            events.extend((kind, -2 - buffer if buffer in own and buffer >= 0 else buffer, size)
                          for kind, buffer, size in loops[op](sorted(own)))
        elif scratch and op in scratch:
            events.extend(_scratch_events(scratch[op], scratch_id, outputs, _scratch_first(graph, op)))
            scratch_id -= len(scratch[op])
        else:
            events.extend(outputs)
    events.extend(("alloc", -2 - t, nbytes[t] or 0) for t in graph.outputs
                  if timeline.buffer_of[t] == t and t not in placed)
    return events


def session_held_bytes(graph: ModelGraph, timeline: Timeline, model: onnx.ModelProto, provider: ExecutionProvider,
                       given: onnx.ModelProto | None = None, mem_pattern: bool = True,
                       sizes: Sequence[int | None] | None = None,
                       shape_of: Callable[[int], tuple[int, ...] | None] | None = None) -> tuple[int, int]:
    """Give the bytes onnxruntime's arena holds from the device after a first run and after a later one (the
    memory pattern's block from the second run on, where `mem_pattern`), simulated on the timeline: the weights the
    provider holds from session creation and the graph inputs it copies in each run (its session_weights; `given`:
    the model as the user gave it), each run's allocations and frees, its kernels' scratch (its kernel_scratch).
    `model`: the model the graph was built from; `sizes`, `shape_of`: each tensor's bytes and shape where not the
    graph's own (the graph of a family sized at another value: its weights are the same)."""
    weights = provider.session_weights(graph, model, given, sizes)
    reserved, in_regions, inputs = weights.reserved, weights.in_regions, weights.inputs_per_run
    scratch = provider.kernel_scratch(graph, model, shape_of)
    first_loops, later_loops = _loop_events(graph, model, mem_pattern)
    creation = [("alloc", _CREATION_IDS - len(graph.tensors) - i, n) for i, n in enumerate(in_regions)]
    copied = [("alloc", _INPUT_IDS - len(graph.tensors) - i, n) for i, n in enumerate(inputs)]
    first = [*copied, *first_run_events(graph, timeline, scratch, sizes, first_loops),
             *(("free", buffer, 0) for _, buffer, _ in copied)]
    arena = BFCArena()
    arena.reserve(reserved)
    addresses: dict[int, int] = {}
    after_first = _replay(arena, addresses, [*creation, *first])
    if not mem_pattern:
        return after_first, after_first
    later = _later_run(graph, timeline, pattern_block_bytes(graph, timeline, sizes=sizes), scratch, first, inputs,
                       sizes, later_loops)
    return after_first, _replay(arena, addresses, later)


def _loop_events(graph: ModelGraph, model: onnx.ModelProto, mem_pattern: bool) -> tuple[
        dict[int, Callable[[Sequence[int]], list[tuple[str, int, int]]]],
        dict[int, Callable[[Sequence[int]], list[tuple[str, int, int]]]]]:
    """Give, per Loop whose trip count the model states and per If, its first run's and its later run's events
    given the outputs it allocates in the arena (loops.loop_run, loops.branch_run; the body's pattern, traced in
    the first run, serves the second)."""
    from onnxmem.passes.loops import branch_run, loop_run, loop_trip_counts, replayed
    from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES

    trips = loop_trip_counts(graph, model)
    ids = itertools.count(_LOOP_IDS - len(graph.tensors), -1)
    traced: dict[int, set[tuple[object, ...]]] = {index: set() for index in trips}

    def run(index: int) -> Callable[[Sequence[int]], list[tuple[str, int, int]]]:
        return lambda own: replayed(loop_run(graph, graph.ops[index], trips[index], DEFAULT_INFERENCE_RULES,
                                             traced[index], mem_pattern, ids, own).events)

    def branch(index: int) -> Callable[[Sequence[int]], list[tuple[str, int, int]]]:
        return lambda own: replayed(branch_run(graph, graph.ops[index], DEFAULT_INFERENCE_RULES,
                                               traced.setdefault(index, set()), mem_pattern, ids, own).events)

    first = {index: run(index) for index in trips if graph.ops[index].subgraphs}
    first.update((op.index, branch(op.index)) for op in graph.ops
                 if op.op_type == "If" and op.domain in ("", "ai.onnx") and op.subgraphs)
    return first, dict(first)


# buffer ids apart from tensors (>= 0), the pattern block (-1) and graph outputs (-2 - tensor): kernel scratch,
# weights allocated at session creation, graph inputs copied in
_SCRATCH_IDS = -(1 << 40)
_CREATION_IDS = -(1 << 50)
_INPUT_IDS = -(1 << 55)
_LOOP_IDS = -(1 << 58)  # a Loop body's buffers, its scalars and pattern blocks
