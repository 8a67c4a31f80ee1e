"""Data-dependent shapes: the operators whose output size depends on the input's values (NonZero's count, the boxes
NonMaxSuppression keeps, a TopK whose k is computed from the data). Their outputs are sized at a count the user
binds by its dim name (--dim nonzero=N, nms_boxes=N, topk_k=N; one name per operator kind), else at the most the
operator can give (every element non-zero, every box kept up to max_output_boxes_per_class, k the whole axis): an
upper bound of the run, named in a `data-dependent-shape` warning with the count used. One entry per operator in
DATA_DEPENDENT."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx
from onnx import TensorProto

from onnxmem.ir.dtypes import tensor_bytes
from onnxmem.ir.tensor_types import TensorType
from onnxmem.views.report import Warning

if TYPE_CHECKING:
    from onnxmem.ir.graph import ModelGraph

Shape = tuple[int, ...]
# (the node's input shapes, sized; its constant integer inputs by slot, where known; its attributes) ->
# (the most elements its data-dependent dim can take, what that most is, in words), or None where it cannot tell
Bound = Callable[[Sequence[Shape | None], Mapping[int, list[int]], Mapping[str, object]], tuple[int, str] | None]


@dataclass(frozen=True)
class DataDependent:
    """How one operator's outputs depend on the data: the dim name a user binds, its bound, and the outputs'
    shapes and element types at a count."""

    dim: str
    bound: Bound
    shapes: Callable[[Sequence[Shape | None], Mapping[str, object], int], list[Shape]]
    dtypes: Callable[[Sequence[int]], list[int]]  # from the input element types


def _nonzero_bound(shapes: Sequence[Shape | None], constants: Mapping[int, list[int]],
                   attrs: Mapping[str, object]) -> tuple[int, str] | None:
    shape = shapes[0] if shapes else None
    return None if shape is None else (math.prod(shape), "every element of its input non-zero")


def _nms_bound(shapes: Sequence[Shape | None], constants: Mapping[int, list[int]],
               attrs: Mapping[str, object]) -> tuple[int, str] | None:
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None or len(shapes[0]) != 3 or len(shapes[1]) != 3:
        return None
    batches, classes, boxes = shapes[1]
    if len(shapes) < 3 or shapes[2] is None:  # (an absent input; a computed one is a sized scalar)
        per_class, why = 0, "no max_output_boxes_per_class: none kept"
    elif 2 in constants:
        per_class = min(boxes, max(constants[2][0], 0))
        why = f"every box kept up to max_output_boxes_per_class, {per_class} per class"
    else:
        per_class, why = boxes, "every box kept (max_output_boxes_per_class is computed)"
    return batches * classes * per_class, f"{why}, for {batches} batches x {classes} classes"


def _topk_bound(shapes: Sequence[Shape | None], constants: Mapping[int, list[int]],
                attrs: Mapping[str, object]) -> tuple[int, str] | None:
    shape = shapes[0] if shapes else None
    if shape is None or not shape:
        return None
    axis = int(attrs.get("axis", -1))  # type: ignore[call-overload]
    return shape[axis], f"k the whole axis {axis}"


def _topk_shapes(shapes: Sequence[Shape | None], attrs: Mapping[str, object], count: int) -> list[Shape]:
    shape = list(shapes[0] or ())
    shape[int(attrs.get("axis", -1))] = count  # type: ignore[call-overload]
    return [tuple(shape), tuple(shape)]


DATA_DEPENDENT: dict[str, DataDependent] = {
    "NonZero": DataDependent("nonzero", _nonzero_bound, lambda s, a, n: [(len(s[0] or ()), n)],
                             lambda d: [TensorProto.INT64]),
    "NonMaxSuppression": DataDependent("nms_boxes", _nms_bound, lambda s, a, n: [(n, 3)],
                                       lambda d: [TensorProto.INT64]),
    "TopK": DataDependent("topk_k", _topk_bound, _topk_shapes, lambda d: [d[0], TensorProto.INT64]),
}
DATA_DEPENDENT_DIMS = frozenset(entry.dim for entry in DATA_DEPENDENT.values())


def data_dependent_nodes(model: onnx.ModelProto, wiring: ModelGraph | None = None) -> list[int]:
    """Give the indices of the main graph's nodes whose output size may depend on the data: every NonZero and
    NonMaxSuppression, and each TopK whose k is no constant (a k computed from sizes is a shape value: sizing
    finds it, and the TopK is bounded only where it does not). `wiring`: the model's graph, where the caller has
    built it (its ops are read faster than the model's nodes)."""
    nodes = model.graph.node
    if wiring is not None:
        found = [op.index for op in wiring.ops if op.op_type in DATA_DEPENDENT and op.domain in ("", "ai.onnx")]
    else:
        found = [i for i, node in enumerate(nodes) if node.op_type in DATA_DEPENDENT and node.domain in ("", "ai.onnx")]
    if not any(nodes[i].op_type == "TopK" for i in found):
        return found
    constants = _constant_names(model)
    return [i for i in found if nodes[i].op_type != "TopK" or (len(nodes[i].input) > 1
                                                                and nodes[i].input[1] not in constants)]


def _constant_names(model: onnx.ModelProto) -> set[str]:
    return {t.name for t in model.graph.initializer} | {n.output[0] for n in model.graph.node
                                                         if n.op_type == "Constant" and n.output}


def _constant_ints(model: onnx.ModelProto, names: Sequence[str]) -> dict[int, list[int]]:
    """Give the small integer constants (initializers, Constant nodes' values) among `names`, by slot."""
    wanted = {name: slot for slot, name in enumerate(names) if name}
    tensors = {t.name: t for t in model.graph.initializer if t.name in wanted}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] in wanted and node.attribute and \
                node.attribute[0].name == "value":
            tensors[node.output[0]] = node.attribute[0].t
    return {wanted[name]: [int(v) for v in onnx.numpy_helper.to_array(tensor).reshape(-1)]
            for name, tensor in tensors.items()
            if tensor.data_type in (TensorProto.INT64, TensorProto.INT32)
            and tensor.data_location != TensorProto.EXTERNAL and math.prod(tensor.dims) <= 16}


def bounded_types(model: onnx.ModelProto, nodes: Sequence[int], types: Mapping[str, TensorType],
                  given: Mapping[str, int], done: set[int]) -> tuple[dict[str, TensorType], list[Warning]]:
    """Give the sized types of the outputs of the data-dependent `nodes` not `done` (added to it) whose inputs
    `types` sizes and whose outputs it does not, at the count the user gave (`given`, by dim name) or the bound;
    with a warning per node naming the count used."""
    declared: dict[str, TensorType] = {}
    warnings: list[Warning] = []
    for index in nodes:
        node = model.graph.node[index]
        outputs = [name for name in node.output if name]
        if index in done or not outputs:
            continue
        if all(name in types and types[name][2] is not None for name in outputs):
            done.add(index)  # sized without a bound (a TopK's k that sizing computed)
            continue
        inputs = [types.get(name) if name else None for name in node.input]
        if not inputs or inputs[0] is None or inputs[0][2] is None:
            continue  # its input is not sized yet (it may follow from another bound, next round)
        shapes = [t[1] if t is not None and t[2] is not None else None for t in inputs]
        entry = DATA_DEPENDENT[node.op_type]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        bound = entry.bound(shapes, _constant_ints(model, node.input), attrs)  # type: ignore[arg-type]
        if bound is None:
            continue
        done.add(index)
        most, why = bound
        count = given.get(entry.dim, most)
        dtypes = entry.dtypes([t[0] if t is not None else TensorProto.UNDEFINED for t in inputs])
        for name, shape, dtype in zip(node.output, entry.shapes(shapes, attrs, count), dtypes, strict=False):  # type: ignore[arg-type]
            if name:
                declared[name] = (dtype, shape, tensor_bytes(dtype, math.prod(shape)))
        if entry.dim in given:
            how = f"at {entry.dim}={count} as given (the most it can give here: {most}, {why})"
        else:
            how = (f"at the most it can give, {entry.dim}={most} ({why}); bind --dim {entry.dim}=N (dims="
                   f"{{'{entry.dim}': N}} in Python) to size the count a run gives")
        warnings.append(Warning("data-dependent-shape", f"the outputs of {node.op_type} node '{node.name or index}' "
                                                        f"depend on the data: sized {how}"))
    return declared, warnings
