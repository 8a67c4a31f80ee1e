"""A decoder's KV cache, found once for every view: the past key/value inputs a step reads and the present outputs
it writes in their place (names as optimum, onnxruntime-genai and torch.onnx write them, or the wiring: an input
that reaches a graph output through the attention's Concat or an attention op's past input).

kv_cache_of gives its bytes as onnxruntime holds them in one step: the past inputs the caller feeds (held through
the run) and the present outputs the step allocates (past + the step's positions, held from their Concat to the end
of the run), both held when the step ends. resized_cache gives the same graph with the cache tensors at another
element size or head count: the what-ifs of a lower-precision or grouped-query cache (plan.kv).
shared_buffer_size gives the cache as a server that updates it in place holds it: onnxruntime-genai
(past_present_share_buffer) feeds each GroupQueryAttention past buffers of max_length positions and binds the
presents to the same buffers, so the step allocates no present.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from onnxmem.ir.dtypes import dtype_name, element_bits
from onnxmem.ir.graph import INPUT, OUTPUT, ModelGraph, Tensor
from onnxmem.ir.load import read_small_text
from onnxmem.views.report import KVCache, Warning

if TYPE_CHECKING:
    from onnxmem.shapes.dims import InputDim

# names as exporters write them: past_key_values.0.key, past.0.value, past_key_0, cache_key.3 (inputs);
# present.0.key, present_key_values.1.value, cache_value.3 (outputs)
_PAST_NAME = re.compile(r"(^|[._/])(past|cache)[._]?(key|value|k|v|\d)", re.IGNORECASE)
_PRESENT_NAME = re.compile(r"(^|[._/])(present|cache)[._]?(key|value|k|v|\d)", re.IGNORECASE)
# ops a cache passes through unchanged in content on its way to or from the attention (the CPU provider's Casts)
_PASSES = frozenset({"Cast", "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze"})
# ops that read the past cache and write the present one themselves (onnxruntime's contrib attention ops): the
# present outputs are their outputs after the first
_ATTENTION = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention", "DecoderMaskedMultiHeadAttention",
                        "DecoderMaskedSelfAttention", "PackedMultiHeadAttention", "SparseAttention"})
# ops that repeat a shared cache for the query heads that read it (grouped-query attention in plain ops)
_REPEATS = frozenset({"Expand", "Tile"})
# attention ops whose present output may be the past input's buffer (the kernel writes the new positions into it
# where the caller binds both to one buffer of max_length positions: onnxruntime's GroupQueryAttention, as
# onnxruntime-genai runs the model builder's decoders; measured, benchmarks/kv_exports.py genai)
_IN_PLACE_ATTENTION = frozenset({"GroupQueryAttention"})
_REPEAT_PASSES = _PASSES | {"Slice"}  # what the walk to the repeat goes through (a Slice over all heads included)
_COMPUTES = frozenset({"MatMul", "Einsum", "Softmax", "Gemm"})
_DEPTH = 6


@dataclass(frozen=True)
class CacheTensors:
    """The cache's tensors in one graph: past inputs and present outputs (tensor indices), and each pair's axes."""

    past: tuple[int, ...]
    present: tuple[int, ...]
    # per (past, present) pair found by the wiring: the sequence axis (where their shapes differ) and the heads axis
    # (the other of axes 1 and 2 of a rank-4 cache: [batch, heads, seq, head] or [batch, seq, heads, head])
    heads_axes: dict[int, int]
    shared: bool  # the attention repeats the cache for its query heads (grouped-query) or says it shares it
    # every present is written by an attention op that can write it into its past's buffer (_IN_PLACE_ATTENTION)
    in_place: bool = False


def _float(t: Tensor) -> bool:
    return t.dtype in (1, 10, 11, 16) and t.shape is not None and len(t.shape) >= 3


def _forward(graph: ModelGraph, start: int, stop: Callable[[int], bool],
             passes: frozenset[str] = _PASSES) -> list[int]:
    """Give the ops `stop` accepts that read `start` directly or through `passes` ops (as their data input)."""
    found, frontier, depth = [], [start], 0
    while frontier and depth < _DEPTH:
        following = []
        for t in frontier:
            for c in graph.tensors[t].consumers:
                op = graph.ops[c]
                if stop(c):
                    found.append(c)
                elif op.op_type in passes and op.inputs and op.inputs[0] == t and op.outputs[0] >= 0:
                    following.append(op.outputs[0])
        frontier, depth = following, depth + 1
    return found


def _to_output(graph: ModelGraph, start: int, outputs: set[int]) -> int:
    """Give the graph output `start` is, or reaches through _PASSES ops; -1 where none."""
    frontier, depth = [start], 0
    while frontier and depth < _DEPTH:
        following = []
        for t in frontier:
            if t in outputs:
                return t
            for c in graph.tensors[t].consumers:
                op = graph.ops[c]
                if op.op_type in _PASSES and op.inputs and op.inputs[0] == t and op.outputs[0] >= 0:
                    following.append(op.outputs[0])
        frontier, depth = following, depth + 1
    return -1


def cache_tensors(graph: ModelGraph) -> CacheTensors | None:
    """Give the KV cache's tensors of a graph (None: it has none). A past input is one that reaches a graph output
    through a Concat (the present: past + the step's keys or values) or is an attention op's past input, or one
    named as exporters name them (past_key_values.N.key, past.N.value, cache_*); a present output is the output
    such a Concat or attention op writes, or one named present.N.key, present_*, cache_*. Only floating-point
    tensors of rank 3 or more count (cache_position, past_sequence_length are no cache)."""
    outputs = {t for t in graph.outputs if t >= 0}
    past: list[int] = []
    present: list[int] = []
    taken: set[int] = set()
    heads_axes: dict[int, int] = {}
    shared = False
    writers: set[str] = set()  # the op types that write the presents found by the wiring
    for i in graph.inputs:
        t = graph.tensors[i]
        if t.kind != INPUT or not _float(t):
            continue
        paired = False
        for c in _forward(graph, i, lambda c: graph.ops[c].op_type in ("Concat", *_ATTENTION)):
            op = graph.ops[c]
            made = op.outputs[:1] if op.op_type == "Concat" else op.outputs[1:]
            for out in made:
                end = _to_output(graph, out, outputs) if out >= 0 else -1
                if end < 0:
                    continue
                axis = _heads_axis(t, graph.tensors[end])
                if axis is not None:  # (an attention op's key and value pasts both pair with its presents)
                    heads_axes.setdefault(i, axis)
                if end in taken:
                    continue
                paired = True
                writers.add(op.op_type)
                present.append(end)
                taken.add(end)
                if axis is not None:
                    heads_axes[end] = axis
                shared = shared or op.op_type == "GroupQueryAttention" or _repeated(graph, end)
        if paired or _PAST_NAME.search(t.name):
            past.append(i)
    for o in graph.outputs:
        written = graph.tensors[o] if o >= 0 else None
        if written is not None and o not in taken and written.kind == OUTPUT and _float(written) and \
                _PRESENT_NAME.search(written.name):
            present.append(o)
    if not past and not present:
        return None
    in_place = bool(writers) and writers <= _IN_PLACE_ATTENTION and len(present) == len(taken)
    return CacheTensors(tuple(past), tuple(present), heads_axes, shared, in_place)


# a decoder's total length, a dim of its own beside the lengths it adds up (the model builder's decoders: attention
# mask [batch_size, total_sequence_length], presents [.., total_sequence_length, ..]) -> those lengths
TOTAL_LENGTHS: dict[str, tuple[str, str]] = {"total_sequence_length": ("past_sequence_length", "sequence_length")}


def is_past_cache_name(name: str) -> bool:
    """Say whether an input's name is a KV cache's past as exporters name them (past_key_values.0.key, ...)."""
    return bool(_PAST_NAME.search(name))


def _heads_axis(past: Tensor, present: Tensor) -> int | None:
    """Give the heads axis of a rank-4 cache from its past and present shapes (the sequence axis is where they
    differ; the heads axis is the other of axes 1 and 2), or None."""
    a, b = past.shape, present.shape
    if a is None or b is None or len(a) != 4 or len(b) != 4:
        return None
    differ = [k for k in range(4) if a[k] != b[k]]
    if len(differ) != 1 or differ[0] not in (1, 2):
        return None
    return 3 - differ[0]


def _repeated(graph: ModelGraph, present: int) -> bool:
    """Say whether the attention repeats the present cache (Expand, Tile) before it computes with it: grouped-query
    attention written in plain ops."""
    # (transformers' repeat_kv as the dynamo exporter writes it: Unsqueeze -> Slice -> Expand -> Reshape)
    return bool(_forward(graph, present, lambda c: graph.ops[c].op_type in _REPEATS, _REPEAT_PASSES)) and \
        not _forward(graph, present, lambda c: graph.ops[c].op_type in _COMPUTES, _REPEAT_PASSES)


def kv_cache_of(graph: ModelGraph) -> KVCache | None:
    """Give the KV cache of a sized graph as onnxruntime holds it in one step (see the module's docstring), or
    None where the graph has none."""
    found = cache_tensors(graph)
    if found is None:
        return None
    tensors = graph.tensors
    past = [tensors[t] for t in found.past]
    present = [tensors[t] for t in found.present]
    types = {t.dtype for t in (*past, *present)}
    unsized = sum(1 for t in (*past, *present) if t.nbytes is None)
    return KVCache(past_bytes=sum(t.nbytes or 0 for t in past), present_bytes=sum(t.nbytes or 0 for t in present),
                   past_tensors=len(past), present_tensors=len(present),
                   dtype=dtype_name(types.pop()) if len(types) == 1 else "mixed", unsized_tensors=unsized)


# --- what-ifs: the cache tensors re-sized --------------------------------------------------------------------------

SCALE_BYTES = 2  # int8: one float16 scale per row of the last axis (per token and head)
FP8_SCALE_BYTES = 4  # fp8: one float32 scale per cache tensor


def int8_bytes(t: Tensor) -> int | None:
    """Give a cache tensor's bytes in int8 with per-token, per-head float16 scales (one per row of its last axis,
    head_dim elements: symmetric per-token quantization, as KIVI's and onnxruntime-genai's int8 caches keep them)."""
    elements = _elements(t)
    if elements is None or t.shape is None or not isinstance(t.shape[-1], int) or t.shape[-1] <= 0:
        return None
    return elements + elements // t.shape[-1] * SCALE_BYTES


def fp8_bytes(t: Tensor) -> int | None:
    """Give a cache tensor's bytes in fp8 (e4m3) with one float32 scale for the whole tensor (vLLM's fp8 cache)."""
    elements = _elements(t)
    return None if elements is None else elements + FP8_SCALE_BYTES


def _elements(t: Tensor) -> int | None:
    bits = element_bits(t.dtype)
    return None if t.nbytes is None or not bits else t.nbytes * 8 // bits


def resized_cache(graph: ModelGraph, found: CacheTensors, size: Callable[[Tensor], int | None],
                  tensors: Sequence[int] | None = None) -> ModelGraph | None:
    """Give the graph with each cache tensor (or each of `tensors`) at the bytes `size` gives it, every other
    tensor as it is (None where a cache tensor cannot be re-sized)."""
    chosen = set((*found.past, *found.present) if tensors is None else tensors)
    sizes: list[int | None] = []
    for t in graph.tensors:
        if t.index in chosen:
            nbytes = size(t)
            if nbytes is None:
                return None
            sizes.append(nbytes)
        else:
            sizes.append(t.nbytes)
    return graph.with_sizes([t.shape for t in graph.tensors], sizes)


def shared_buffer_size(found: CacheTensors, graph: ModelGraph, length: int) -> Callable[[Tensor], int | None] | None:
    """Give the size of each cache tensor where past and present are one buffer of `length` positions, updated in
    place (onnxruntime-genai's past_present_share_buffer, max_length `length`): each past input at `length`
    positions, each present output 0 bytes (written into its past's buffer); None where the attention cannot
    update the cache in place (found.in_place), a past's sequence axis is not known or the step's context (a
    present's length) does not fit in `length` positions."""
    if not found.in_place:
        return None
    for t in found.present:
        axis, shape = found.heads_axes.get(t), graph.tensors[t].shape
        context = shape[3 - axis] if axis is not None and shape is not None and len(shape) == 4 else None
        if not isinstance(context, int) or context > length:
            return None
    sizes: dict[int, int] = {t: 0 for t in found.present}
    for t in found.past:
        tensor, axis = graph.tensors[t], found.heads_axes.get(t)
        bits = element_bits(tensor.dtype)
        positions = [d for d in tensor.shape or () if isinstance(d, int)]
        if axis is None or not bits or tensor.shape is None or len(positions) != 4 or len(tensor.shape) != 4:
            return None
        positions[3 - axis] = length  # (the sequence axis: the other of axes 1 and 2)
        elements = 1
        for d in positions:
            elements *= d
        sizes[t] = elements * bits // 8
    return lambda t: sizes.get(t.index, t.nbytes)


def fewer_heads(found: CacheTensors, graph: ModelGraph, factor: int) -> Callable[[Tensor], int | None] | None:
    """Give the size of each cache tensor with its heads axis divided by `factor`, or None where the cache's head
    count is unknown (kv_heads) or not a multiple of `factor`."""
    heads = kv_heads(found, graph)
    if heads is None or heads % factor:
        return None
    kept = heads // factor

    def size(t: Tensor) -> int | None:
        return None if t.nbytes is None else t.nbytes // heads * kept

    return size


def kv_heads(found: CacheTensors, graph: ModelGraph) -> int | None:
    """Give the cache's head count (its heads axis), where every cache tensor has one and says the same; else
    None."""
    counts: set[int] = set()
    for t in (*found.past, *found.present):
        axis, shape = found.heads_axes.get(t), graph.tensors[t].shape
        heads = shape[axis] if axis is not None and shape is not None else None
        if not isinstance(heads, int) or heads <= 0:
            return None
        counts.add(heads)
    return counts.pop() if len(counts) == 1 else None


GENAI_CONFIG = "genai_config.json"


def genai_config(model_path: Path | None) -> dict[str, object] | None:
    """Give the genai_config.json beside the model (onnxruntime-genai's model builder writes it), or None where there
    is none or it is not a JSON object (a FIFO or a device is never read)."""
    if model_path is None:
        return None
    text = read_small_text(Path(model_path).parent / GENAI_CONFIG)
    try:
        config = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        return None
    return config if isinstance(config, dict) else None


def genai_dims(model_path: Path | None, free: Sequence[InputDim]) -> tuple[dict[str, int], tuple[Warning, ...]]:
    """Give the dims the genai_config.json beside the model states and the note that says so: the head size
    (model.decoder.head_size) of the dims found only on the last axis of the past cache inputs (the model builder's
    kv_cache_dim of past_key_values.N.key [batch, kv heads, past, head size]); none where there is no such file."""
    places: dict[str, set[bool]] = {}
    for d in free:
        places.setdefault(d.name, set()).add(is_past_cache_name(d.input) and d.axis == 3)
    heads = sorted(name for name, found in places.items() if found == {True})
    if not heads:  # (the file is read only where a dim could take its value: every sizing asks)
        return {}, ()
    config = genai_config(model_path)
    model = config.get("model") if config is not None else None
    decoder = model.get("decoder") if isinstance(model, dict) else None
    head_size = decoder.get("head_size") if isinstance(decoder, dict) else None
    if not isinstance(head_size, int) or isinstance(head_size, bool) or head_size <= 0:
        return {}, ()
    named = ", ".join(f"{name}={head_size}" for name in heads)
    return dict.fromkeys(heads, head_size), (Warning("genai-config-dim", f"{named}: the head size of the KV cache "
                                                     f"inputs, from {GENAI_CONFIG} beside the model "
                                                     "(model.decoder.head_size); --dim overrides it"),)
