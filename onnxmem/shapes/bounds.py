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
from onnxmem.ir.tensor_types import UNKNOWN_TYPE, TensorType, TypeDecoder
from onnxmem.shapes.infer import _collect_types
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
    finds it, and the TopK is bounded only where it does not); and each If one of whose branches holds such a node
    (torchvision's batched_nms runs NMS in the else branch of `if boxes.numel() == 0`: see _if_bound). `wiring`:
    the model's graph, where the caller has built it (its ops are read faster than the model's nodes)."""
    nodes = model.graph.node
    kinds = (*DATA_DEPENDENT, "If")
    if wiring is not None:
        found = [op.index for op in wiring.ops if op.op_type in kinds and op.domain in ("", "ai.onnx")]
    else:
        found = [i for i, node in enumerate(nodes) if node.op_type in kinds and node.domain in ("", "ai.onnx")]
    found = [i for i in found if nodes[i].op_type != "If" or _branches_depend_on_data(model, nodes[i])]
    if not any(nodes[i].op_type == "TopK" for i in found):
        return found
    constants = _constant_names(model.graph)
    return [i for i in found if nodes[i].op_type != "TopK" or (len(nodes[i].input) > 1
                                                                and nodes[i].input[1] not in constants)]


def _branches_depend_on_data(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """Say whether a branch of an If holds a data-dependent node (data_dependent_nodes' kinds, its own nodes)."""
    return any(_data_dependent_in(model, body) for body in _branches(node))


def _branches(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [a.g for a in node.attribute if a.name in ("then_branch", "else_branch") and a.type == a.GRAPH]


def _data_dependent_in(model: onnx.ModelProto, body: onnx.GraphProto) -> list[int]:
    """Give the indices of a branch's data-dependent nodes (a TopK's k a constant of the branch or the model's
    main graph is none)."""
    found = [i for i, n in enumerate(body.node) if n.op_type in DATA_DEPENDENT and n.domain in ("", "ai.onnx")]
    if not any(body.node[i].op_type == "TopK" for i in found):
        return found
    constants = _constant_names(body) | _constant_names(model.graph)
    return [i for i in found if body.node[i].op_type != "TopK" or (len(body.node[i].input) > 1
                                                                    and body.node[i].input[1] not in constants)]


def _constant_names(graph: onnx.GraphProto) -> set[str]:
    return {t.name for t in graph.initializer} | {n.output[0] for n in graph.node
                                                  if n.op_type == "Constant" and n.output}


def _constant_ints(model: onnx.ModelProto, names: Sequence[str],
                   body: onnx.GraphProto | None = None) -> dict[int, list[int]]:
    """Give the small integer constants (initializers, Constant nodes' values) among `names`, by slot: the main
    graph's, and the branch's where the node is in `body`."""
    wanted = {name: slot for slot, name in enumerate(names) if name}
    graphs = [model.graph] if body is None else [model.graph, body]
    tensors = {t.name: t for graph in graphs for t in graph.initializer if t.name in wanted}
    for node in (n for graph in graphs for n in graph.node):
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
        found = _if_bound(model, node, types, given) if node.op_type == "If" else \
            _node_bound(model, node, types, given, f"{node.op_type} node '{node.name or index}'")
        if found is None:
            continue  # its input is not sized yet (it may follow from another bound, next round)
        done.add(index)
        declared.update(found[0])
        warnings.extend(found[1])
    return declared, warnings


def _node_bound(model: onnx.ModelProto, node: onnx.NodeProto, types: Mapping[str, TensorType],
                given: Mapping[str, int], what: str, body: onnx.GraphProto | None = None) -> \
        tuple[dict[str, TensorType], list[Warning]] | None:
    """Give the sized types of one data-dependent node's outputs at the given count or its bound, with the warning
    that names it (`what`: the node, in words; `body`: the branch it is in), or None where its inputs are not
    sized."""
    inputs = [types.get(name) if name else None for name in node.input]
    if not inputs or inputs[0] is None or inputs[0][2] is None:
        return None
    shapes = [t[1] if t is not None and t[2] is not None else None for t in inputs]
    entry = DATA_DEPENDENT[node.op_type]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    bound = entry.bound(shapes, _constant_ints(model, node.input, body), attrs)  # type: ignore[arg-type]
    if bound is None:
        return None
    most, why = bound
    count = given.get(entry.dim, most)
    dtypes = entry.dtypes([t[0] if t is not None else TensorProto.UNDEFINED for t in inputs])
    declared: dict[str, TensorType] = {}
    for name, shape, dtype in zip(node.output, entry.shapes(shapes, attrs, count), dtypes, strict=False):  # type: ignore[arg-type]
        if name:
            declared[name] = (dtype, shape, tensor_bytes(dtype, math.prod(shape)))
    if entry.dim in given:
        how = f"at {entry.dim}={count} as given (the most it can give here: {most}, {why})"
    else:
        how = (f"at the most it can give, {entry.dim}={most} ({why}); bind --dim {entry.dim}=N (dims="
               f"{{'{entry.dim}': N}} in Python) to size the count a run gives")
    return declared, [Warning("data-dependent-shape", f"the outputs of {what} depend on the data: sized {how}")]


def _if_bound(model: onnx.ModelProto, node: onnx.NodeProto, types: Mapping[str, TensorType],
              given: Mapping[str, int]) -> tuple[dict[str, TensorType], list[Warning]] | None:
    """Give the sized types of an If's outputs, where a branch holds a data-dependent node: each branch inferred
    on its own (the outer values it reads at their sizes, the small constants at their values) with its
    data-dependent nodes at their counts, and each output at the larger branch's size, dim by dim (onnxruntime
    runs one branch; which one depends on the data); the branches' own tensors so sized too. None where an
    outer value a branch reads is not sized yet, or the branches' outputs differ in rank or stay unsized."""
    declared: dict[str, TensorType] = {}
    warnings: list[Warning] = []
    outputs: list[list[TensorType]] = []
    for branch in _branches(node):
        found = _branch_types(model, node, branch, types, given)
        if found is None:
            return None
        sized, said = found
        declared.update(sized)
        warnings.extend(said)
        outputs.append([sized.get(out.name, types.get(out.name, UNKNOWN_TYPE)) for out in branch.output])
    if len(outputs) != 2:
        return None
    for name, then_type, else_type in zip(node.output, *outputs, strict=False):
        dtype = then_type[0] if then_type[0] != TensorProto.UNDEFINED else else_type[0]
        if then_type[1] is None or else_type[1] is None or then_type[2] is None or else_type[2] is None \
                or len(then_type[1]) != len(else_type[1]):
            return None
        shape = tuple(max(int(a), int(b)) for a, b in zip(then_type[1], else_type[1], strict=True))
        if name:
            declared[name] = (dtype, shape, tensor_bytes(dtype, math.prod(shape)))
    return declared, warnings


def _branch_types(model: onnx.ModelProto, node: onnx.NodeProto, branch: onnx.GraphProto,
                  types: Mapping[str, TensorType], given: Mapping[str, int]) -> \
        tuple[dict[str, TensorType], list[Warning]] | None:
    """Give the sized types of a branch's tensors, its data-dependent nodes at their counts (in rounds: one
    bounded count may size the next node's input), with their warnings; None where an outer value it reads is
    not sized."""
    made = {out for n in branch.node for out in n.output} | {t.name for t in branch.initializer}
    outer = list(dict.fromkeys(name for n in branch.node for name in n.input if name and name not in made))
    constants = {t.name: t for t in model.graph.initializer if t.name in outer}
    constants.update((n.output[0], n.attribute[0].t) for n in model.graph.node
                     if n.op_type == "Constant" and n.output and n.output[0] in outer and n.attribute
                     and n.attribute[0].name == "value")
    inputs = []
    for name in outer:
        if name in constants:
            continue
        dtype, shape, size = types.get(name, UNKNOWN_TYPE)
        if shape is None or size is None:
            return None
        inputs.append(onnx.helper.make_tensor_value_info(name, dtype, list(shape)))
    small = [t for t in constants.values() if t.data_location != TensorProto.EXTERNAL and math.prod(t.dims) <= 64]
    initializers = []
    for name, tensor in constants.items():
        if any(t is tensor for t in small):
            copy = TensorProto()
            copy.CopyFrom(tensor)
            copy.name = name
            initializers.append(copy)
        else:  # (a large outer weight: its type is enough)
            inputs.append(onnx.helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims)))
    outputs = [onnx.helper.make_tensor_value_info(out.name, out.type.tensor_type.elem_type, None)
               for out in branch.output]
    declared: dict[str, TensorType] = {}
    warnings: list[Warning] = []
    pending = _data_dependent_in(model, branch)
    before = len(pending)
    for _ in range(len(pending) + 1):
        graph = onnx.helper.make_graph(list(branch.node), "branch", inputs, outputs,
                                       [*initializers, *branch.initializer], value_info=[
                                           onnx.helper.make_tensor_value_info(name, dtype, list(shape or ()))
                                           for name, (dtype, shape, _) in declared.items()])
        light = onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
        try:
            inferred = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
        except Exception:  # noqa: BLE001 - onnx raises several types; the branch stays unsized
            return None
        found = _collect_types(inferred.graph, TypeDecoder())
        found.update(declared)
        if not pending:
            break  # (the counts of the round before are inferred through)
        for i in list(pending):
            inner = branch.node[i]
            what = f"{inner.op_type} node '{inner.name or i}' in a branch of If node '{node.name}'"
            bounded = _node_bound(model, inner, found, given, what, branch)
            if bounded is not None:
                pending.remove(i)
                declared.update(bounded[0])
                warnings.extend(bounded[1])
        if len(pending) == before:
            return None  # (an input no count sizes)
        before = len(pending)
    if pending:
        return None
    sized = {name: t for name, t in found.items() if name not in outer and t[1] is not None and t[2] is not None}
    return sized, warnings
