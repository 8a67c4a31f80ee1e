"""Data-dependent shapes: the operators whose output size depends on the input's values (NonZero's count, the boxes
NonMaxSuppression keeps, a TopK whose k is computed from the data). Their outputs are sized at a count the user
binds by its dim name (--dim nonzero=N, nms_boxes=N, topk_k=N; one name per operator kind), else at the most the
operator can give (every element non-zero, every box kept up to max_output_boxes_per_class, k the whole axis): an
upper bound of the run, named in a `data-dependent-shape` warning with the count used. One entry per operator in
DATA_DEPENDENT."""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping, Sequence
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
    axis: Callable[[Sequence[Shape | None], Mapping[str, object]], int]  # the outputs' axis the count sizes


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


def _topk_axis(shapes: Sequence[Shape | None], attrs: Mapping[str, object]) -> int:
    axis = int(attrs.get("axis", -1))  # type: ignore[call-overload]
    return axis + len(shapes[0] or ()) if axis < 0 else axis


DATA_DEPENDENT: dict[str, DataDependent] = {
    "NonZero": DataDependent("nonzero", _nonzero_bound, lambda s, a, n: [(len(s[0] or ()), n)],
                             lambda d: [TensorProto.INT64], lambda s, a: 1),
    "NonMaxSuppression": DataDependent("nms_boxes", _nms_bound, lambda s, a, n: [(n, 3)],
                                       lambda d: [TensorProto.INT64], lambda s, a: 0),
    "TopK": DataDependent("topk_k", _topk_bound, _topk_shapes, lambda d: [d[0], TensorProto.INT64], _topk_axis),
}
DATA_DEPENDENT_DIMS = frozenset(entry.dim for entry in DATA_DEPENDENT.values())


def data_dependent_nodes(model: onnx.ModelProto, wiring: ModelGraph | None = None) -> list[int]:
    """Give the indices of the main graph's nodes whose output size may depend on the data: every NonZero and
    NonMaxSuppression, and each TopK whose k is no constant (a k computed from sizes is a shape value: sizing
    finds it, and the TopK is bounded only where it does not); and each If one of whose branches holds such a node
    (torchvision's batched_nms runs NMS in the else branch of `if boxes.numel() == 0`: see _if_bound), and each
    Loop whose body does (_loop_bound). `wiring`: the model's graph, where the caller has built it (its ops are
    read faster than the model's nodes)."""
    nodes = model.graph.node
    kinds = (*DATA_DEPENDENT, *_BODIES)
    if wiring is not None:
        found = [op.index for op in wiring.ops if op.op_type in kinds and op.domain in ("", "ai.onnx")]
    else:
        found = [i for i, node in enumerate(nodes) if node.op_type in kinds and node.domain in ("", "ai.onnx")]
    found = [i for i in found if nodes[i].op_type not in _BODIES or _branches_depend_on_data(model, nodes[i])]
    if not any(nodes[i].op_type == "TopK" for i in found):
        return found
    constants = _constant_names(model.graph)
    return [i for i in found if nodes[i].op_type != "TopK" or (len(nodes[i].input) > 1
                                                                and nodes[i].input[1] not in constants)]


_BODIES = {"If": ("then_branch", "else_branch"), "Loop": ("body",)}  # the graphs bounded, by the node holding them


def _branches_depend_on_data(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """Say whether a branch of an If or a Loop's body holds a data-dependent node (data_dependent_nodes' kinds,
    its own nodes)."""
    return any(_data_dependent_in(model, body) for body in _branches(node))


def _branches(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    names = _BODIES.get(node.op_type, ())
    return [a.g for a in node.attribute if a.name in names and a.type == a.GRAPH]


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


def _constant_tensors(model: onnx.ModelProto, body: onnx.GraphProto | None = None,
                      wanted: Container[str] | None = None) -> dict[str, TensorProto]:
    """Give the constants (initializers, Constant nodes' values) by name, of those `wanted` (None: all): the main
    graph's, and the branch's where `body` is given."""
    graphs = [model.graph] if body is None else [model.graph, body]
    tensors = {t.name: t for graph in graphs for t in graph.initializer if wanted is None or t.name in wanted}
    for node in (n for graph in graphs for n in graph.node):
        if node.op_type == "Constant" and node.output and (wanted is None or node.output[0] in wanted) and \
                node.attribute and node.attribute[0].name == "value":
            tensors[node.output[0]] = node.attribute[0].t
    return tensors


def _constant_ints(model: onnx.ModelProto, names: Sequence[str], body: onnx.GraphProto | None = None,
                   known: Mapping[str, TensorProto] | None = None) -> dict[int, list[int]]:
    """Give the small integer constants (initializers, Constant nodes' values) among `names`, by slot: the main
    graph's, and the branch's where the node is in `body` (`known`: _constant_tensors' answer, where built)."""
    wanted = {name: slot for slot, name in enumerate(names) if name}
    tensors = _constant_tensors(model, body, wanted) if known is None else \
        {name: known[name] for name in wanted if name in known}
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
    wiring: _Wiring | None = None  # (built at the first node bounded)
    for index in nodes:
        node = model.graph.node[index]
        outputs = [name for name in node.output if name]
        if index in done or not outputs:
            continue
        if all(name in types and types[name][2] is not None for name in outputs):
            done.add(index)  # sized without a bound (a TopK's k that sizing computed)
            continue
        if node.op_type == "If":
            found = _if_bound(model, node, types, given)
        elif node.op_type == "Loop":
            found = _loop_bound(model, node, types, given)
        else:
            wiring = _wiring(model) if wiring is None else wiring
            found = _node_bound(model, node, types, given, f"{node.op_type} node '{node.name or index}'", wiring)
        if found is None:
            continue  # its input is not sized yet (it may follow from another bound, next round)
        done.add(index)
        declared.update(found[0])
        warnings.extend(found[1])
    return declared, warnings


def _node_bound(model: onnx.ModelProto, node: onnx.NodeProto, types: Mapping[str, TensorType],
                given: Mapping[str, int], what: str, wiring: _Wiring,
                body: onnx.GraphProto | None = None) -> tuple[dict[str, TensorType], list[Warning]] | None:
    """Give the sized types of one data-dependent node's outputs at the count the graph states downstream
    (_stated_count: a TorchScript trace bakes the count it saw into a Split's sizes), else the given count or its
    bound, with the warning that names it (`what`: the node, in words; `wiring`: its graph's readers and constants;
    `body`: the branch it is in), or None where its inputs are not sized."""
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
    hot = _one_hot_bound(node, wiring, types) if node.op_type == "NonZero" else None
    most, why = hot if hot is not None and hot[0] < most else (most, why)
    axis = entry.axis(shapes, attrs)  # type: ignore[arg-type]
    start = [list(shape) for shape in entry.shapes(shapes, attrs, 0)]  # type: ignore[arg-type]
    stated = _stated_count(model, [(name, [*shape[:axis], None, *shape[axis + 1:]], axis)
                                   for name, shape in zip(node.output, start, strict=False) if name], wiring)
    stated = stated if stated is not None and stated[0] <= most else None  # (more than it gives: no run fits)
    count = stated[0] if stated is not None else given.get(entry.dim, most)
    dtypes = entry.dtypes([t[0] if t is not None else TensorProto.UNDEFINED for t in inputs])
    declared: dict[str, TensorType] = {}
    for name, shape, dtype in zip(node.output, entry.shapes(shapes, attrs, count), dtypes, strict=False):  # type: ignore[arg-type]
        if name:
            declared[name] = (dtype, shape, tensor_bytes(dtype, math.prod(shape)))
    if stated is not None:
        how = (f"at {entry.dim}={count}, the count {stated[1]}, the only one a run can give (the most it can give "
               f"otherwise: {most}, {why})")
    elif entry.dim in given:
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
        found = _branch_types(model, node, branch, types, given, f"a branch of If node '{node.name}'")
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
                  types: Mapping[str, TensorType], given: Mapping[str, int], where: str,
                  formal: Sequence[onnx.ValueInfoProto] = ()) -> tuple[dict[str, TensorType], list[Warning]] | None:
    """Give the sized types of a branch's tensors, its data-dependent nodes at their counts (in rounds: one
    bounded count may size the next node's input), with their warnings (`where`: the branch, in words); None
    where an outer value it reads is not sized. `formal`: the graph's own inputs, typed (a Loop body's)."""
    made = {out for n in branch.node for out in n.output} | {t.name for t in branch.initializer} | \
        {value.name for value in formal}
    outer = list(dict.fromkeys(name for n in branch.node for name in n.input if name and name not in made))
    constants = _constant_tensors(model, wanted=set(outer))  # (the main graph's, which the branch reads)
    inputs = list(formal)
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
    wiring = _wiring(model, branch)
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
            what = f"{inner.op_type} node '{inner.name or i}' in {where}"
            bounded = _node_bound(model, inner, found, given, what, wiring, branch)
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


def _loop_bound(model: onnx.ModelProto, node: onnx.NodeProto, types: Mapping[str, TensorType],
                given: Mapping[str, int]) -> tuple[dict[str, TensorType], list[Warning]] | None:
    """Give the sized types of a Loop's outputs and its body's tensors, where the body holds a data-dependent node:
    the body inferred on its own as a branch of an If is (_branch_types), its iteration number and condition
    scalars, its loop-carried inputs at the sizes of the Loop's initial values, its data-dependent nodes at their
    counts (the most any iteration gives); each loop-carried output at the body's size, each scan output that
    size stacked over the trip count where it is a constant (else left unsized). None where an input is not sized
    yet or a loop-carried value changes size in the body (its first iteration's sizes would not hold)."""
    body = _branches(node)[0]
    carried = len(body.input) - 2
    if carried < 0 or len(node.input) < 2 + carried:
        return None
    formal = [onnx.helper.make_tensor_value_info(body.input[0].name, TensorProto.INT64, []),
              onnx.helper.make_tensor_value_info(body.input[1].name, TensorProto.BOOL, [])]
    for value, name in zip(body.input[2:], node.input[2:], strict=False):
        dtype, shape, size = types.get(name, UNKNOWN_TYPE)
        if shape is None or size is None:
            return None
        formal.append(onnx.helper.make_tensor_value_info(value.name, dtype, list(shape)))
    found = _branch_types(model, node, body, types, given, f"the body of Loop node '{node.name}'", formal)
    if found is None:
        return None
    sized, warnings = found
    declared = dict(sized)
    declared.update((value.name, types[name]) for value, name in zip(body.input[2:], node.input[2:], strict=False))
    results = [(sized[out.name][0], _sized_shape(sized, out.name)) if out.name in sized else None
               for out in body.output[1:]]
    if [None if result is None else result[1] for result in results[:carried]] != \
            [_sized_shape(types, name) for name in node.input[2:2 + carried]]:
        return None
    trips = _constant_ints(model, node.input[:1]).get(0) if node.input and node.input[0] else None
    for position, (name, result) in enumerate(zip(node.output, results, strict=False)):
        if not name or result is None or result[1] is None:
            continue
        dtype, shape = result[0], result[1]
        if position >= carried:  # (a scan output: every iteration's, stacked)
            if trips is None or len(trips) != 1 or trips[0] < 0:
                continue
            shape = (trips[0], *shape)
        declared[name] = (dtype, shape, tensor_bytes(dtype, math.prod(shape)))
    return declared, warnings


@dataclass(frozen=True)
class _Wiring:
    """A graph's readers of each tensor (its own nodes, not its subgraphs') and the constants its nodes read."""

    readers: dict[str, list[onnx.NodeProto]]
    producers: dict[str, onnx.NodeProto]
    constants: dict[str, TensorProto]


def _wiring(model: onnx.ModelProto, body: onnx.GraphProto | None = None) -> _Wiring:
    """Give the wiring of the main graph, or of the branch `body`."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    producers: dict[str, onnx.NodeProto] = {}
    for node in (model.graph if body is None else body).node:
        for name in dict.fromkeys(node.input):
            if name:
                readers.setdefault(name, []).append(node)
        producers.update((name, node) for name in node.output if name)
    return _Wiring(readers, producers, _constant_tensors(model, body))


_ONE_HOT_STEPS = 8  # the most nodes _one_hot_bound walks up from a NonZero


def _one_hot_bound(node: onnx.NodeProto, wiring: _Wiring, types: Mapping[str, TensorType]) -> tuple[int, str] | None:
    """Give the most elements a NonZero can find in a one-hot tensor, with why: its input a OneHot's output
    (through Cast, Identity, Transpose, and Gathers of one index, as an MoE's eager experts read their routing
    mask: transformers' `one_hot(top_k_index, experts).permute(2, 1, 0)[expert]`), which holds at most one hot
    element per index; where the class axis is gathered to one class and the indices are a TopK's, whose indices
    are distinct along its axis, at most one per line along that axis too. None where it is no such input."""
    found = _one_hot_source(node.input[0], wiring, types)
    if found is None:
        return None
    one_hot, pinned, indices = found
    rank = len(indices) + 1
    classes = int(next((onnx.helper.get_attribute_value(a) for a in one_hot.attribute if a.name == "axis"), -1))
    classes += rank if classes < 0 else 0
    positions = [i for i in range(rank) if i != classes]  # (each index axis's axis in the OneHot's output)
    most = math.prod(length for i, length in zip(positions, indices, strict=True) if i not in pinned)
    why = f"one hot element per index of OneHot node '{one_hot.name}'"
    picked = wiring.producers.get(one_hot.input[0])
    while picked is not None and picked.op_type in ("Cast", "Identity") and picked.domain in ("", "ai.onnx"):
        picked = wiring.producers.get(picked.input[0])
    if classes in pinned and picked is not None and picked.op_type == "TopK" and picked.domain in ("", "ai.onnx"):
        along = int(next((onnx.helper.get_attribute_value(a) for a in picked.attribute if a.name == "axis"), -1))
        along += len(indices) if along < 0 else 0
        if 0 <= along < len(indices) and positions[along] not in pinned and indices[along] > 0:
            most //= indices[along]
            why += (f"; one class of it, whose indices (from TopK node '{picked.name}') are distinct along axis "
                    f"{along}: at most one in {indices[along]} hot")
    return most, why


def _one_hot_source(name: str, wiring: _Wiring, types: Mapping[str, TensorType]) -> \
        tuple[onnx.NodeProto, set[int], tuple[int, ...]] | None:
    """Give the OneHot node whose output `name` is read from (_one_hot_bound), the axes of that output gathered to
    one index, and the shape of its indices; None where it is none."""
    pinned: set[int] = set()  # (the axes of `name` gathered to one index)
    for _ in range(_ONE_HOT_STEPS):
        made_by = wiring.producers.get(name)
        if made_by is None or made_by.domain not in ("", "ai.onnx") or not made_by.input:
            return None
        source = _sized_shape(types, made_by.input[0])
        if source is None:
            return None
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in made_by.attribute if a.type != a.GRAPH}
        if made_by.op_type == "OneHot":
            return made_by, pinned, source
        if made_by.op_type == "Transpose":
            perm = [int(p) for p in attrs.get("perm", range(len(source) - 1, -1, -1))]
            pinned = {perm[p] for p in pinned}
        elif made_by.op_type == "Gather" and len(made_by.input) > 1:
            index = _sized_shape(types, made_by.input[1])
            axis = int(attrs.get("axis", 0))
            axis += len(source) if axis < 0 else 0
            if index is None or index not in ((), (1,)):
                return None
            pinned = {p if p < axis or index else p + 1 for p in pinned} | {axis}
        elif made_by.op_type not in ("Cast", "Identity"):
            return None
        name = made_by.input[0]
    return None


def _sized_shape(types: Mapping[str, TensorType], name: str) -> tuple[int, ...] | None:
    dtype, shape, size = types.get(name, UNKNOWN_TYPE)
    return None if shape is None or size is None else tuple(int(d) for d in shape)  # type: ignore[arg-type]


_STATED_STEPS = 64  # the most readers _stated_count walks through from one node's outputs
Carried = tuple[str, list[int | None], int]  # a tensor, its shape (None: the count, or a dim not followed), the axis


def _stated_count(model: onnx.ModelProto, outputs: Sequence[Carried], wiring: _Wiring) -> tuple[int, str] | None:
    """Give the count a data-dependent node's outputs must have for the graph to run, where a reader downstream
    states it (the axis followed through Identity, Cast, Transpose, Squeeze, Unsqueeze and Splits along other
    axes): a Split along it into constant sizes (their sum), a Squeeze of it (1), a Reshape of it to a constant
    shape (that shape's elements over the others'); with the reader, in words. None where none does, or two
    disagree (no run fits both)."""
    stated: dict[int, str] = {}
    stack, seen, steps = list(outputs), set(), 0
    while stack and steps < _STATED_STEPS:
        name, shape, axis = stack.pop()
        for node in wiring.readers.get(name, ()):
            if node.input[0] != name or node.domain not in ("", "ai.onnx") or id(node) in seen:
                continue
            seen.add(id(node))
            steps += 1
            carried, found = _carry(model, node, shape, axis, wiring)
            stack.extend(carried)
            if found is not None:
                stated.setdefault(found[0], found[1])
    return next(iter(stated.items())) if len(stated) == 1 else None


def _carry(model: onnx.ModelProto, node: onnx.NodeProto, shape: list[int | None], axis: int,
           wiring: _Wiring) -> tuple[list[Carried], tuple[int, str] | None]:
    """Give the outputs of `node` that carry the counted axis of its first input (`shape`, `axis`) on, and the count
    it states, with why (_stated_count)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.type != a.GRAPH}
    op, out = node.op_type, node.output[0] if node.output else ""
    where = f"{op} node '{node.name}'"
    if op in ("Identity", "Cast") and out:
        return [(out, shape, axis)], None
    if op == "Transpose" and out:
        perm = [int(p) for p in attrs.get("perm", range(len(shape) - 1, -1, -1))]
        if sorted(perm) != list(range(len(shape))):
            return [], None
        return [(out, [shape[p] for p in perm], perm.index(axis))], None
    if op not in ("Squeeze", "Unsqueeze", "Split", "Reshape"):
        return [], None
    constants = _constant_ints(model, node.input, known=wiring.constants)
    if op in ("Squeeze", "Unsqueeze"):
        given = constants.get(1, attrs.get("axes"))  # (an input from opset 13, an attribute before)
        if given is None or not out:
            return [], None
        rank = len(shape) + (len(given) if op == "Unsqueeze" else 0)
        axes = {int(a) + rank if int(a) < 0 else int(a) for a in given}
        if op == "Squeeze":
            if axis in axes:
                return [], (1, f"{where} states (it removes that axis)")
            kept = [i for i in range(len(shape)) if i not in axes]
            return [(out, [shape[i] for i in kept], kept.index(axis))], None
        placed = iter(shape)
        grown = [1 if i in axes else next(placed) for i in range(rank)]
        return [(out, grown, [i for i in range(rank) if i not in axes][axis])], None
    if op == "Split":
        split_axis = int(attrs.get("axis", 0))
        split_axis += len(shape) if split_axis < 0 else 0
        sizes = constants.get(1, attrs.get("split"))  # (an input from opset 13, an attribute before)
        if split_axis == axis:
            return [], None if not sizes else (sum(int(s) for s in sizes),
                                               f"{where} states (its parts along that axis sum to it)")
        parts = [int(s) for s in sizes] if sizes else [None] * len(node.output)
        return [(name, [*shape[:split_axis], part, *shape[split_axis + 1:]], axis)
                for name, part in zip(node.output, parts, strict=False) if name], None
    target = constants.get(1)  # Reshape
    if target is None or -1 in target:
        return [], None
    allow_zero = bool(attrs.get("allowzero", 0))
    if not allow_zero and any(d == 0 and (i == axis or i >= len(shape) or shape[i] is None)
                              for i, d in enumerate(target)):
        return [], None
    total = math.prod(shape[i] if d == 0 and not allow_zero else d for i, d in enumerate(target))  # type: ignore[misc]
    others = [d for i, d in enumerate(shape) if i != axis]
    if any(d is None for d in others) or math.prod(others) <= 0 or total % math.prod(others):  # type: ignore[arg-type]
        return [], None
    return [], (total // math.prod(others), f"{where} states (it reshapes that axis to {target})")  # type: ignore[arg-type]
