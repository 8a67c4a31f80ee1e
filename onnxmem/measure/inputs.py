"""Input feeds for running a model for real: bound shapes, the right dtypes, values that keep indexing ops valid."""

from __future__ import annotations

import math
import os
from collections import deque

import numpy
import onnx
from onnx import TensorProto

from onnxmem.errors import DimError, OnnxMemError, RuntimeMeasurementError, quoted
from onnxmem.ir.dtypes import element_bits

# Ops through which an integer input keeps its meaning (token ids stay token ids).
_PASS_THROUGH = {"Cast", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Transpose",
                 "Slice", "Concat", "Tile"}
_SEED = 0


def _initializer_dims(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """Dims of every constant tensor: initializers and Constant nodes' `value`."""
    dims = {t.name: list(t.dims) for t in graph.initializer}
    for s in graph.sparse_initializer:
        dims[s.values.name or s.indices.name] = list(s.dims)
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output:
            for a in n.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    dims[n.output[0]] = list(a.t.dims)
    return dims


def _index_bound(graph: onnx.GraphProto, name: str, const_dims: dict[str, list[int]]) -> int | None:
    """Smallest table size indexed by `name` (or a pass-through derivative of it), if the graph shows one.

    Returns None when the input does not index anything, 0 when it indexes a table of unknown size.
    """
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            if i:
                consumers.setdefault(i, []).append(n)
    bound: int | None = None

    def tighten(size: int) -> None:
        nonlocal bound
        bound = size if bound is None or bound == 0 else (min(bound, size) if size > 0 else bound)

    seen, queue = {name}, deque([name])
    while queue:
        value = queue.popleft()
        for n in consumers.get(value, []):
            positions = [k for k, i in enumerate(n.input) if i == value]
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            table: str | None = None
            axis = 0
            if n.op_type in ("Gather", "GatherElements") and 1 in positions:
                table, axis = n.input[0], int(attrs.get("axis", 0))
            elif n.op_type == "GatherND" and 1 in positions:
                table = n.input[0]
            elif n.op_type == "EmbedLayerNormalization":  # com.microsoft: ids 0 -> word table 2, segments 1 -> 4
                if 0 in positions and len(n.input) > 2:
                    table = n.input[2]
                elif 1 in positions and len(n.input) > 4:
                    table = n.input[4]
            elif n.op_type == "OneHot" and 0 in positions:
                tighten(0)
                continue
            if table is not None:
                dims = const_dims.get(table)
                if dims is not None and dims:
                    tighten(int(dims[axis if axis >= 0 else axis + len(dims)]))
                else:
                    tighten(0)
                continue
            if n.op_type in _PASS_THROUGH and 0 in positions:
                for out in n.output[:1]:
                    if out and out not in seen:
                        seen.add(out)
                        queue.append(out)
    return bound


def _shape(value: onnx.ValueInfoProto, dims: dict[str, int]) -> tuple[int, ...]:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        raise DimError(f"input '{value.name}' has no shape (unknown rank); cannot build an input for it")
    shape = []
    for k, d in enumerate(tensor_type.shape.dim):
        if d.HasField("dim_value"):
            if d.dim_value < 0:
                raise DimError(f"input '{value.name}' has a negative dimension {d.dim_value} at axis {k}")
            shape.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            if d.dim_param not in dims:
                raise DimError(f"dimension '{d.dim_param}' of input '{value.name}' is unbound: give it a value")
            size = dims[d.dim_param]
            if isinstance(size, bool) or not isinstance(size, (int, numpy.integer)) or size < 0:
                raise DimError(f"dimension '{d.dim_param}' must be a non-negative integer, not {size!r}")
            shape.append(int(size))
        else:
            raise DimError(f"input '{value.name}' has an unnamed dimension of unknown size at axis {k}")
    return tuple(shape)


def _check_fits(name: str, shape: tuple[int, ...], elem: int) -> None:
    """Raise where an input of this shape could not be built in this machine's memory (it is never attempted)."""
    bits = element_bits(elem) or 64  # strings: at least a pointer each
    needed = (math.prod(shape) * bits + 7) // 8
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: no bound known
        return
    if needed > memory:
        raise RuntimeMeasurementError(
            f"input {quoted(name)} of shape {list(shape)} needs {needed:,} bytes, more than this machine's "
            f"{memory:,} bytes of memory: it cannot be fed to onnxruntime (bind smaller dims with --dim)")


def make_feeds(model: onnx.ModelProto, dims: dict[str, int]) -> dict[str, numpy.ndarray]:
    """One array per graph input that is not an initializer, of the shape the bound dims give.

    Values: floats small random normals (seeded); integers that index a table (Gather, GatherElements, GatherND,
    EmbedLayerNormalization, directly or through Cast/Reshape/Unsqueeze/...) random in [0, smallest table size),
    or 0 when the table's size is unknown; other integers 1 (masks, counts); booleans True; strings "a".
    Any unbound symbolic dim raises DimError naming it.
    """
    graph = model.graph
    initializers = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    const_dims = _initializer_dims(graph)
    rng = numpy.random.default_rng(_SEED)
    feeds: dict[str, numpy.ndarray] = {}
    for value in graph.input:
        if value.name in initializers:
            continue
        if value.type.WhichOneof("value") != "tensor_type":
            raise OnnxMemError(f"input '{value.name}' is not a tensor; only tensor inputs can be fed")
        elem = value.type.tensor_type.elem_type
        shape = _shape(value, dims)
        _check_fits(value.name, shape, elem)
        if elem == TensorProto.STRING:
            feeds[value.name] = numpy.full(shape, "a", dtype=object)
            continue
        try:
            dtype = numpy.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
        except (KeyError, TypeError, ValueError) as exc:
            raise OnnxMemError(f"input '{value.name}' has an element type numpy cannot feed ({elem})") from exc
        if dtype.kind == "b":
            array = numpy.ones(shape, dtype=bool)
        elif dtype.kind == "f":
            array = (rng.standard_normal(shape) * 0.1).astype(dtype)
        elif dtype.kind == "c":
            array = (rng.standard_normal(shape) * 0.1).astype(dtype)
        elif dtype.kind in "iu":
            bound = _index_bound(graph, value.name, const_dims)
            if bound is None:
                array = numpy.ones(shape, dtype=dtype)
            elif bound <= 0:
                array = numpy.zeros(shape, dtype=dtype)
            else:
                array = rng.integers(0, bound, size=shape).astype(dtype)
        else:
            raise OnnxMemError(f"input '{value.name}' has an element type numpy cannot feed ({dtype})")
        feeds[value.name] = numpy.asarray(array).reshape(shape)
    return feeds
