"""The shape-value rules: the small integer tensors (shapes, sizes, indices) that nodes compute from constants and
from the sizes of known tensors, where ONNX's data propagation stops. One entry per operator in SHAPE_VALUE_OPS."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy
import onnx
from onnx import TensorProto

from onnxmem.ir.tensor_types import UNKNOWN_TYPE, Dim, TensorType


def _shape_values(nodes: list[onnx.NodeProto], initializers: Mapping[str, TensorProto],
                  known: Mapping[str, TensorType], *, given: bool = True,
                  decoded: dict[str, numpy.ndarray | None] | None = None) -> dict[str, TensorProto]:
    """Give the values of the small integer tensors these nodes compute from constants and from the sizes of
    tensors whose shapes are `known` (Shape of a known tensor, then Gather, Concat, Mul, ...), as initializers;
    with given=False, only those that are not `initializers` already. `decoded`: the initializers' arrays read by
    an earlier call on the same initializers (kept there for the next).

    ONNX's data propagation carries such values to Reshape and Expand but not to Slice's bounds, and not through
    Reshape or Identity (the dynamo exporter writes a symbolic size as Reshape(size, [-1]) and slices an RNN's
    weights by it); computing them here sizes what they shape.
    """
    values: dict[str, numpy.ndarray] = {}
    if decoded is None:
        decoded = {}  # initializers read (a layer's constants are read by every layer)

    def value(name: str) -> numpy.ndarray | None:
        if name in values:
            return values[name]
        if name in decoded:
            return decoded[name]
        tensor = initializers.get(name)
        if tensor is None:
            return None  # (not cached: a later call may have it)
        if tensor.data_type not in _VALUE_TYPES or not _is_shape_constant(tensor):
            array = None  # sized from its header before any data is decoded
        else:
            array = onnx.numpy_helper.to_array(tensor)
            array.flags.writeable = False  # (shared by every reader: no rule writes into its arguments)
        decoded[name] = array
        return array

    for node in nodes:
        if node.op_type == "Split" and node.domain in ("", "ai.onnx") and node.input and node.input[0] in values:
            _split(node, values, [value(name) if name else None for name in node.input])
            continue
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1 or node.op_type not in SHAPE_VALUE_OPS:
            continue
        if node.op_type == "Constant":
            constant = _constant_value(node) if _is_small_constant(node) else None
            if constant is not None and constant.data_type in _VALUE_TYPES:
                values[node.output[0]] = onnx.numpy_helper.to_array(constant)
            continue  # (a larger one is no shape value: unknown here, as a large initializer is; never decoded)
        if node.op_type in ("Shape", "Size"):
            computed = values.get(node.input[0])  # a shape value's own shape, else the tensor's known one
            shape = computed.shape if computed is not None else known.get(node.input[0], UNKNOWN_TYPE)[1]
            if shape is None or not all(isinstance(d, int) for d in shape):
                continue
            if node.op_type == "Size":
                values[node.output[0]] = numpy.array(math.prod(shape), dtype=numpy.int64)
                continue
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            start, end = attrs.get("start", 0), attrs.get("end", len(shape))
            values[node.output[0]] = numpy.array(shape[start:end] if end else shape[start:0], dtype=numpy.int64)
            continue
        arguments = [value(name) if name else None for name in node.input]
        compute = SHAPE_VALUE_OPS[node.op_type]
        if not arguments or arguments[0] is None or compute is None:
            continue
        if node.op_type not in FLOAT_VALUE_OPS and any(x is not None and x.dtype.kind == "f" for x in arguments):
            continue  # (a float value reaches a shape only through these: a float Range or Expand is no shape)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        try:
            with numpy.errstate(all="ignore"):
                result = compute(arguments, attrs)
        except Exception:  # noqa: BLE001 - an unexpected form: leave the node to inference
            continue
        if result is not None and result.size <= _KEEP_INT_VALUES_UP_TO and (
                result.dtype.kind in "iub" or (result.dtype.kind == "f" and bool(numpy.isfinite(result).all()))):
            values[node.output[0]] = result
    # (a float value is a step of the arithmetic, never a shape: only the integers are given back)
    return {name: onnx.numpy_helper.from_array(array, name) for name, array in values.items()
            if array.dtype.kind in "iub" and (given or name not in initializers)}


Values = list["numpy.ndarray | None"]


def _axes(a: Values, k: Mapping[str, Any]) -> tuple[int, ...] | None:
    if len(a) > 1 and a[1] is not None:
        return tuple(int(x) for x in a[1].reshape(-1))
    return tuple(int(x) for x in k["axes"]) if "axes" in k else None


def _unsqueeze(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    axes = _axes(a, k)
    return None if axes is None or a[0] is None else numpy.expand_dims(a[0], axes)


def _squeeze(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    axes = _axes(a, k)
    return None if a[0] is None else numpy.squeeze(a[0], axis=axes)


def _reshape(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    if a[0] is None or a[1] is None or 0 in a[1]:
        return None  # a 0 copies the input's dim (allowzero 0): left to inference
    return a[0].reshape([int(d) for d in a[1]])


def _concat(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    if any(x is None for x in a):
        return None
    return numpy.concatenate([x.reshape(-1) if x.ndim == 0 else x for x in a if x is not None], int(k.get("axis", 0)))


def _gather(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    return None if a[0] is None or a[1] is None else numpy.take(a[0], a[1], axis=int(k.get("axis", 0)))


def _slice(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    """Slice (opset 10+: starts, ends, axes, steps as inputs) of a value of any rank; Python's slicing clamps a
    start or end past a dim as ONNX does (an end of -2^63 + 1 with a step of -1 runs to the first element: the
    TorchScript exporter reverses a pad list so)."""
    if len(a) < 3 or a[0] is None or a[1] is None or a[2] is None or a[1].shape != a[2].shape or a[1].ndim != 1:
        return None
    data = a[0]
    count = a[1].shape[0]
    axes = [int(x) for x in a[3]] if len(a) > 3 and a[3] is not None else list(range(count))
    steps = [int(x) for x in a[4]] if len(a) > 4 and a[4] is not None else [1] * count
    if len(axes) != count or len(steps) != count or 0 in steps:
        return None
    index: list[slice] = [slice(None)] * data.ndim
    for axis, start, end, step in zip(axes, a[1], a[2], steps, strict=True):
        if not -data.ndim <= axis < data.ndim:
            return None
        index[axis] = slice(int(start), int(end), step)
    return data[tuple(index)]


def _transpose(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    if a[0] is None:
        return None
    perm = k.get("perm")
    return numpy.transpose(a[0], [int(p) for p in perm] if perm else None)


def _arithmetic(function: Callable[[numpy.ndarray, numpy.ndarray], numpy.ndarray]) -> \
        Callable[[Values, Mapping[str, Any]], numpy.ndarray | None]:
    def apply(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
        return None if len(a) < 2 or a[0] is None or a[1] is None else function(a[0], a[1])
    return apply


def _divide(x: numpy.ndarray, y: numpy.ndarray) -> numpy.ndarray:
    if numpy.result_type(x, y).kind == "f":
        return numpy.divide(x, y)  # in the values' own float type, as onnxruntime divides
    return numpy.trunc(x / y).astype(numpy.result_type(x, y))  # ONNX integer division truncates


def _expand(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    if a[0] is None or len(a) < 2 or a[1] is None:
        return None
    shape = numpy.broadcast_shapes(a[0].shape, tuple(int(d) for d in a[1]))
    if math.prod(shape) > _KEEP_INT_VALUES_UP_TO:
        return None  # a shape value is small; this one is not (and is not built)
    return numpy.broadcast_to(a[0], shape).copy()


def _cast(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    """Cast as onnxruntime casts: an integer to float rounded to the nearest, a float to an integer truncated
    toward zero (C++'s static_cast; a float past int64's range is no shape value)."""
    if a[0] is None:
        return None
    to = k.get("to")
    if to == TensorProto.BOOL:
        return a[0].astype(numpy.bool_)
    if to in _FLOAT_TYPES:
        return a[0].astype(_FLOAT_TYPES[to])
    if to not in _INT_TYPES:
        return None
    if a[0].dtype.kind == "f" and not bool((numpy.abs(a[0]) < 2.0 ** 62).all()):
        return None
    return numpy.trunc(a[0]).astype(numpy.int64) if a[0].dtype.kind == "f" else a[0].astype(numpy.int64)


def _reduce(function: Callable[..., numpy.ndarray]) -> Callable[[Values, Mapping[str, Any]], numpy.ndarray | None]:
    """ReduceMax, ReduceMin, ...: over the axes of the attribute (opset < 18) or of the second input, all of them
    where none is given (noop_with_empty_axes 0); keepdims as given (1 by default)."""
    def apply(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
        data = a[0]
        if data is None or data.size == 0:
            return None
        axes = _axes(a, k)
        if not axes:
            if k.get("noop_with_empty_axes", 0):
                return data
            axes = None
        keep = bool(k.get("keepdims", 1))
        return numpy.asarray(function(data, axis=axes, keepdims=keep)).astype(data.dtype)
    return apply


def _split(node: onnx.NodeProto, values: dict[str, numpy.ndarray], a: Values) -> None:
    """Put the parts of a Split of a shape value into `values` (onnxruntime's transpose optimizer writes Shape ->
    Gather -> Split -> Squeeze for the dims a Reshape reads): by its split input or attribute, else in equal parts."""
    attrs = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    data = a[0]
    if data is None or data.ndim != 1:
        return
    parts = len(node.output)
    sizes = [int(d) for d in a[1]] if len(a) > 1 and a[1] is not None else list(attrs.get("split") or [])
    if not sizes:
        if not parts or data.shape[0] % parts:
            return
        sizes = [data.shape[0] // parts] * parts
    if len(sizes) != parts or sum(sizes) != data.shape[0] or int(attrs.get("axis", 0)) not in (0, -1):
        return
    start = 0
    for name, size in zip(node.output, sizes, strict=True):
        if name:
            values[name] = data[start:start + size]
        start += size


def _where(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    if len(a) < 3 or a[0] is None or a[1] is None or a[2] is None:
        return None
    shape = numpy.broadcast_shapes(a[0].shape, a[1].shape, a[2].shape)
    return None if math.prod(shape) > _KEEP_INT_VALUES_UP_TO else numpy.where(a[0], a[1], a[2])


def _constant_of_shape(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    if a[0] is None or a[0].ndim != 1 or any(int(d) < 0 for d in a[0]) or \
            math.prod(int(d) for d in a[0]) > _KEEP_INT_VALUES_UP_TO:
        return None  # a shape value is small; a larger one is never built
    value = k.get("value")
    fill = onnx.numpy_helper.to_array(value).reshape(-1) if value is not None else numpy.zeros(1, numpy.float32)
    if fill.size != 1 or fill.dtype.kind not in "iub":
        return None  # (a float fill makes no shape value)
    return numpy.full([int(d) for d in a[0]], fill[0], dtype=fill.dtype)


def _range(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    if len(a) < 3 or any(x is None or x.size != 1 for x in a[:3]):
        return None
    start, limit, delta = (int(x.reshape(-1)[0]) for x in a[:3] if x is not None)
    if delta == 0 or max(0, -(-(limit - start) // delta)) > _KEEP_INT_VALUES_UP_TO:
        return None
    return numpy.arange(start, limit, delta, dtype=numpy.int64)


def _one_hot(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    """OneHot of known indices: the values' on value where an index is, their off value elsewhere (repeat_interleave
    by a count, exported by TorchScript as the repeats of a Tile: OneHot([1], 3, [1, k]) is [1, k, 1])."""
    if len(a) < 3 or a[1] is None or a[2] is None or a[1].size != 1 or a[2].size != 2:
        return None
    indices, depth = a[0], int(a[1].reshape(-1)[0])
    if indices is None or depth <= 0 or indices.size * depth > _KEEP_INT_VALUES_UP_TO:
        return None
    off, on = a[2].reshape(-1)
    hot = numpy.arange(depth) == numpy.where(indices < 0, indices + depth, indices)[..., None]
    axis = int(k.get("axis", -1))
    return numpy.moveaxis(numpy.where(hot, on, off).astype(a[2].dtype), -1, axis)


def _tile(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    if len(a) < 2 or a[0] is None or a[1] is None or a[1].size != a[0].ndim or \
            a[0].size * math.prod(max(int(r), 0) for r in a[1].reshape(-1)) > _KEEP_INT_VALUES_UP_TO:
        return None
    return numpy.tile(a[0], tuple(int(r) for r in a[1].reshape(-1)))


def _unary(function: Callable[[numpy.ndarray], numpy.ndarray | None]) -> Callable[[Values, Mapping[str, Any]],
                                                                         numpy.ndarray | None]:
    def apply(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
        return None if a[0] is None else function(a[0])
    return apply


# How each operator computes a small integer value from its inputs' values (None where unknown) and its
# attributes: the shape arithmetic exporters write. None leaves the node to inference. Constant and Shape are
# computed in _shape_values (from the node's value, from its input's known shape).
SHAPE_VALUE_OPS: dict[str, Callable[[Values, Mapping[str, Any]], numpy.ndarray | None] | None] = {
    "Constant": None,
    "Shape": None,
    "Identity": lambda a, k: a[0],
    "MemcpyFromHost": lambda a, k: a[0],  # the copies between host and device memory (cuda_placement)
    "MemcpyToHost": lambda a, k: a[0],
    "Cast": _cast,
    "Reshape": _reshape,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Gather": _gather,
    "Slice": _slice,
    "Transpose": _transpose,
    "Add": _arithmetic(numpy.add),
    "Sub": _arithmetic(numpy.subtract),
    "Mul": _arithmetic(numpy.multiply),
    "Div": _arithmetic(_divide),
    "Mod": _arithmetic(numpy.fmod),
    "Max": _arithmetic(numpy.maximum),
    "Min": _arithmetic(numpy.minimum),
    "Neg": _unary(numpy.negative),
    "Abs": _unary(numpy.abs),
    "Not": _unary(numpy.logical_not),
    "Equal": _arithmetic(numpy.equal),
    "Less": _arithmetic(numpy.less),
    "LessOrEqual": _arithmetic(numpy.less_equal),
    "Greater": _arithmetic(numpy.greater),
    "GreaterOrEqual": _arithmetic(numpy.greater_equal),
    "And": _arithmetic(numpy.logical_and),
    "Or": _arithmetic(numpy.logical_or),
    "Where": _where,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "Size": _unary(lambda x: numpy.array(x.size, dtype=numpy.int64)),  # of a shape value (of a tensor: above)
    "Expand": _expand,
    "OneHot": _one_hot,
    "Tile": _tile,
    "Floor": _unary(numpy.floor),
    "Ceil": _unary(numpy.ceil),
    "Round": _unary(numpy.round),  # half to even, as ONNX's Round
    "Reciprocal": _unary(lambda x: numpy.reciprocal(x) if x.dtype.kind == "f" else None),  # (float types only)
    "ReduceMax": _reduce(numpy.max),
    "ReduceMin": _reduce(numpy.min),
}

# The operators that compute on float values too: torchvision's transform pads an image to a multiple of 32 as
# ceil(float(size) / 32.0) * 32, cast back to an integer (float arithmetic on sizes, as onnxruntime runs it in
# float32). Any other operator given a float value leaves it to inference.
FLOAT_VALUE_OPS = frozenset({"Identity", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Concat", "Gather", "Slice",
                             "Transpose", "Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Abs", "Equal", "Less",
                             "LessOrEqual", "Greater", "GreaterOrEqual", "Floor", "Ceil", "Round", "Reciprocal",
                             "ReduceMax", "ReduceMin"})


# Initializers up to this many elements stay in the copy given to shape inference: the shape, axes and index
# constants that data propagation needs, and Resize's scales. Everything else travels as a typed input.
_KEEP_INT_VALUES_UP_TO = 4096


_INT_TYPES = (TensorProto.INT64, TensorProto.INT32)
_FLOAT_TYPES = {TensorProto.FLOAT: numpy.float32, TensorProto.DOUBLE: numpy.float64}
_VALUE_TYPES = (*_INT_TYPES, *_FLOAT_TYPES)


def _constant_value(node: onnx.NodeProto) -> TensorProto | None:
    """Give a Constant node's value as an initializer named after its output, or None (a string, a sparse
    value, another domain). onnxruntime turns Constant nodes into initializers before it infers shapes, so
    their values reach inference (a Resize's scales, a Slice's bounds, a Reshape's target)."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1 \
            or not node.output:
        return None
    attr = node.attribute[0]
    name = node.output[0]
    if attr.name == "value":
        tensor = TensorProto()
        tensor.CopyFrom(attr.t)
        tensor.name = name
        return tensor
    if attr.name == "value_int":
        return onnx.helper.make_tensor(name, TensorProto.INT64, [], [attr.i])
    if attr.name == "value_ints":
        return onnx.helper.make_tensor(name, TensorProto.INT64, [len(attr.ints)], list(attr.ints))
    if attr.name == "value_float":
        return onnx.helper.make_tensor(name, TensorProto.FLOAT, [], [attr.f])
    if attr.name == "value_floats":
        return onnx.helper.make_tensor(name, TensorProto.FLOAT, [len(attr.floats)], list(attr.floats))
    return None


def _is_small_constant(node: onnx.NodeProto) -> bool:
    """Say whether a Constant node's value has few enough elements to be a shape value, from its header (a value
    tensor's dims, a list's length) before any of its data is read or copied."""
    for attr in node.attribute:
        if attr.name == "value":
            return _is_shape_constant(attr.t)
        if attr.name in ("value_ints", "value_floats"):
            return len(attr.ints) + len(attr.floats) <= _KEEP_INT_VALUES_UP_TO
    return True  # a single number, or a value that is no tensor of numbers (_constant_value gives None)


def _is_shape_constant(tensor: TensorProto) -> bool:
    # integer shape values (Reshape, Expand, ...) and small float ones (Resize's scales) that inference reads
    return tensor.data_location != TensorProto.EXTERNAL and _is_small(tensor.dims)


def _is_small(dims: Iterable[Dim]) -> bool:
    """Say whether a tensor of these (known) dims has few enough elements to be a shape value."""
    count = 1
    for d in dims:
        count *= int(d)  # type: ignore[arg-type]
    return count <= _KEEP_INT_VALUES_UP_TO
