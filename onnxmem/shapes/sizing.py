"""Sizing: every tensor gets a dtype and, where it can be known, a static shape at the bound dims (the planner
types evaluated where they name every dim; inference only for the rest)."""

from __future__ import annotations

import math
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx
from onnx import AttributeProto, ModelProto, TensorProto, ValueInfoProto

from onnxmem.errors import DimError
from onnxmem.ir.dtypes import tensor_bytes
from onnxmem.ir.tensor_types import UNKNOWN_TYPE, Dim, TensorType, TypeDecoder
from onnxmem.shapes.bounds import DATA_DEPENDENT_DIMS, bounded_types, data_dependent_nodes
from onnxmem.shapes.dims import InputDim, _evaluate_dim, bind_dims, input_dims
from onnxmem.shapes.infer import (
    _REST_ROUNDS,
    _bounded_inference,
    _has_unknown_outputs,
    _infer,
    _rule_rounds,
    _shape_only_copy,
    _substitute,
    _without_initializers,
    has_rule,
)
from onnxmem.shapes.values import (
    _INT_TYPES,
    SHAPE_VALUE_OPS,
    _constant_value,
    _is_shape_constant,
    _is_small,
    _shape_values,
)
from onnxmem.targets.ort.tables import CONTROL_FLOW, DIM_FROM_INPUTS
from onnxmem.views.report import Warning

if TYPE_CHECKING:
    from onnxmem.ir.graph import ModelGraph


@dataclass(frozen=True)
class SizedModel:
    """The model with the type of every tensor that inference could find, once its dims are bound."""

    proto: ModelProto  # the user's model, untouched
    types: dict[str, TensorType]  # tensor name -> inferred type, over the graph and its subgraphs
    dims: dict[str, int]
    warnings: tuple[Warning, ...]


def bind_and_infer(model: ModelProto, dims: Mapping[str, int], default_dim: int | None = None,
                   symbolic: Mapping[str, TensorType] | None = None, graph: ModelGraph | None = None,
                   free: list[InputDim] | None = None) -> SizedModel:
    """Give the type of every tensor with the user's dims bound.

    Where `symbolic` (infer_symbolic's types) names every dim of every tensor, the bound types are those names
    evaluated, and inference does not run again; otherwise inference runs on a copy with the dims bound, on the
    nodes the names leave unknown only where it can. `graph`, the model's graph (sized or not), saves reading
    its wiring from the model again; `free`, the model's input_dims where the caller has them.
    """
    free = input_dims(model) if free is None else free
    data_dependent = data_dependent_nodes(model, graph)
    if data_dependent:  # the counts a user binds by name (bounds.DATA_DEPENDENT) are no input dims
        counts = {name: value for name, value in dims.items() if name in DATA_DEPENDENT_DIMS}
        _check_counts(counts)
        dims = {name: value for name, value in dims.items() if name not in counts}
        sized = _bind_inputs(model, dims, default_dim, symbolic, graph, free)
        return _bound_data_dependent(sized, free, data_dependent, counts)
    return _bind_inputs(model, dims, default_dim, symbolic, graph, free)


def _bind_inputs(model: ModelProto, dims: Mapping[str, int], default_dim: int | None,
                 symbolic: Mapping[str, TensorType] | None, graph: ModelGraph | None,
                 free: list[InputDim]) -> SizedModel:
    """Give bind_and_infer's types with the input dims bound, before any data-dependent count is."""
    bound, bound_warnings = bind_dims(free, dims, default_dim)
    warnings = list(bound_warnings)
    if symbolic is not None:
        types, unknown = evaluate_known(symbolic, bound)
        if unknown and graph is not None:
            unknown = _size_from_inputs(model, graph, symbolic, types, unknown, bound)
            sequences = unknown & _sequences(graph)
            if sequences:  # (a sequence has no tensor type: no inference sizes it, the whole graph's neither)
                types.update((name, UNKNOWN_TYPE) for name in sequences)
                unknown -= sequences
        if not unknown:
            return SizedModel(model, types, bound, tuple(warnings))
        rest = _infer_rest(model, types, unknown, bound, graph)
        if rest is not None:
            return SizedModel(model, {**types, **rest}, bound, tuple(warnings))
    return SizedModel(model, _infer(model, free, bound, warnings), bound, tuple(warnings))


# The operators that make a sequence (no tensor type), and those that pass one on (onnxruntime's Memcpy copies).
SEQUENCE_OPS = frozenset({"SplitToSequence", "SequenceConstruct", "SequenceInsert", "SequenceErase",
                          "SequenceEmpty"})
_PASSING_ON = frozenset({"Identity", "MemcpyFromHost", "MemcpyToHost"})


def _sequences(graph: ModelGraph) -> set[str]:
    """Give the names of the tensors of a graph that are sequences, by the operators that make them."""
    tensors, found = graph.tensors, set[str]()
    for op in graph.ops:  # (in node order: a copy comes after what it copies)
        if op.op_type in SEQUENCE_OPS or op.op_type in _PASSING_ON and op.inputs and op.inputs[0] >= 0 and \
                tensors[op.inputs[0]].name in found:
            found.update(tensors[j].name for j in op.outputs if j >= 0)
    return found


def _check_counts(counts: Mapping[str, int]) -> None:
    for name, value in counts.items():  # (0 is a count a run can give: no box kept)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**62:
            raise DimError(f"dim {name}={value}: must be a non-negative integer (the count the data gives)")


def _bound_data_dependent(sized: SizedModel, free: list[InputDim], nodes: list[int],
                          counts: Mapping[str, int]) -> SizedModel:
    """Give `sized` with the outputs of the data-dependent nodes sized at the user's counts or their bounds
    (bounds.bounded_types), and what follows from them inferred: in rounds, as a bound may size the input of the
    next data-dependent node (NMS boxes gathered, then a TopK of them)."""
    model = sized.proto
    types, warnings = dict(sized.types), list(sized.warnings)
    declared: dict[str, TensorType] = {}
    done: set[int] = set()
    for _ in range(len(nodes)):
        more, said = bounded_types(model, nodes, types, counts, done)
        if not more:
            break
        declared.update(more)
        warnings.extend(said)
        light = _shape_only_copy(model)
        kept = [v for v in light.graph.value_info if v.name not in declared]
        del light.graph.value_info[:]
        light.graph.value_info.extend(kept)
        light.graph.value_info.extend(onnx.helper.make_tensor_value_info(name, dtype, list(shape or ()))
                                      for name, (dtype, shape, _) in declared.items())
        inferred = _infer(light, free, sized.dims, warnings)
        # (sizing may know more than the whole graph's inference: keep what an earlier round sized)
        types.update((name, t) for name, t in inferred.items() if t[2] is not None or name not in types)
        types.update(declared)
    return SizedModel(model, types, sized.dims, tuple(warnings))


def evaluate_known(symbolic: Mapping[str, TensorType], bound: Mapping[str, int]) -> \
        tuple[dict[str, TensorType], set[str]]:
    """Give the types whose every dim evaluates at `bound`, and the names of the others."""
    values: dict[str, int | None] = dict(bound)
    types: dict[str, TensorType] = {}
    unknown: set[str] = set()
    evaluated: dict[TensorType, TensorType | None] = {}  # layers repeat their types: evaluate each one once
    seen = evaluated.get
    for name, symbolic_type in symbolic.items():
        result = seen(symbolic_type, UNKNOWN_TYPE)  # (UNKNOWN_TYPE: not evaluated yet; a result never equals it)
        if result is UNKNOWN_TYPE:
            result = evaluated[symbolic_type] = _evaluate_type(symbolic_type, values, bound)
        if result is None:
            unknown.add(name)
        else:
            types[name] = result
    return types, unknown


def _size_from_inputs(model: ModelProto, wiring: ModelGraph, symbolic: Mapping[str, TensorType],
                      types: dict[str, TensorType], unknown: set[str], bound: Mapping[str, int]) -> set[str]:
    """Size, into `types`, the unknown tensors whose unnamed dims follow from their inputs' sizes by a rule
    (rules.inference.DIM_FROM_INPUTS), and the tensors that carry those dims on; give the names still unknown.

    In node order, each dim so learned sizes every later tensor that carries its name (ONNX gives one unknown
    dim one name). A name that would take two sizes leaves everything to inference, as if no rule had run.
    """
    tensors, index, nodes = wiring.tensors, wiring.tensor_index, model.graph.node
    producer: dict[str, int] = {}
    for name in unknown:
        position = index.get(name)
        made_by = tensors[position].producer if position is not None else None
        if made_by is None:
            return unknown  # an input or initializer: nothing to size it from
        producer[name] = made_by
    values: dict[str, int | None] = dict(bound)
    sized: dict[str, TensorType] = {}
    initializers: dict[str, TensorProto] = {}  # read at the first Reshape
    by_rule: dict[tuple[str, int, tuple[tuple[Dim, ...], ...], int], list[int | None]] = {}

    def constant_ints(j: int) -> list[int] | None:  # a Reshape's target: an initializer or a Constant's value
        if not initializers:
            initializers.update((t.name, t) for t in model.graph.initializer)
        made_by = tensors[j].producer
        tensor = initializers.get(tensors[j].name) if made_by is None else _constant_value(nodes[made_by])
        if tensor is None and made_by is not None:
            return computed_ints(j)
        if tensor is None or tensor.data_type not in _INT_TYPES or not _is_shape_constant(tensor):
            return None
        return [int(v) for v in onnx.numpy_helper.to_array(tensor).reshape(-1)]

    def computed_ints(j: int) -> list[int] | None:
        """A shape value computed from the sizes known so far (values.SHAPE_VALUE_OPS: Shape, Gather, Concat, ...),
        as the bound inference's data propagation and its rounds of shape values find it."""
        chosen: set[int] = set()
        stack = [j]
        while stack:
            made_by = tensors[stack.pop()].producer
            if made_by is None or made_by in chosen:
                continue
            op = wiring.ops[made_by]
            if op.domain not in ("", "ai.onnx") or op.op_type not in SHAPE_VALUE_OPS or \
                    len(chosen) >= _COMPUTED_VALUE_NODES:
                return None
            chosen.add(made_by)
            if op.op_type not in ("Shape", "Size"):  # (their input's size is read, not its value)
                stack.extend(k for k in op.inputs if k >= 0)
        # (a view, not a copy of every type: a graph may hold thousands of such Reshapes)
        found = _shape_values([nodes[i] for i in sorted(chosen)], initializers, ChainMap(sized, types))
        tensor = found.get(tensors[j].name)
        if tensor is None or tensor.data_type not in _INT_TYPES or len(tensor.dims) > 1:
            return None
        return [int(v) for v in onnx.numpy_helper.to_array(tensor).reshape(-1)]

    def float_values(j: int) -> list[float] | None:  # a Resize's scales: an initializer or a Constant's value
        if not initializers:
            initializers.update((t.name, t) for t in model.graph.initializer)
        made_by = tensors[j].producer
        tensor = initializers.get(tensors[j].name) if made_by is None else _constant_value(nodes[made_by])
        if tensor is None or tensor.data_type != TensorProto.FLOAT or not _is_shape_constant(tensor):
            return None
        return [float(v) for v in onnx.numpy_helper.to_array(tensor).reshape(-1)]

    def opset() -> int:
        return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)

    def learned(shape: tuple[Dim, ...], sizes: Sequence[int | None]) -> bool:
        """Record the size each symbolic dim of `shape` takes; False where one disagrees with a size learned
        before (None: the rule gives none for that axis)."""
        for d, size in zip(shape, sizes, strict=True):
            if isinstance(d, str) and size is not None:
                if values.get(d) not in (None, size):
                    return False
                values[d] = size
        return True

    for name in sorted(unknown, key=producer.__getitem__):
        found = _evaluate_type(symbolic[name], values, bound)
        op = wiring.ops[producer[name]]
        rule = (DIM_FROM_INPUTS.get(op.op_type) or DIM_FROM_VALUE.get(op.op_type)) \
            if op.domain in ("", "ai.onnx") else None
        shape = symbolic[name][1]
        if found is None and rule == "value" and shape is not None:  # the shape is an input's value
            if not initializers:
                initializers.update((t.name, t) for t in model.graph.initializer)
            value = computed_ints(op.inputs[0]) if op.inputs and op.inputs[0] >= 0 else None
            if value is not None and len(value) == len(shape) and all(length >= 0 for length in value):
                if not learned(shape, value):
                    return unknown  # the value disagrees with a size learned before: infer instead
                found = _evaluate_type(symbolic[name], values, bound)
        elif found is None and rule in ("slice", "resize") and shape is not None:
            first = tensors[op.inputs[0]].name if op.inputs and op.inputs[0] >= 0 else ""
            source = (types.get(first) or sized.get(first) or UNKNOWN_TYPE)[1]
            ints = tuple(d for d in source if isinstance(d, int)) if source is not None else ()
            if source is not None and len(ints) == len(source) == len(shape):
                node = nodes[op.index]
                if rule == "slice":
                    sizes = _sliced(ints, [constant_ints(j) if j >= 0 else None for j in op.inputs[1:5]])
                else:
                    sizes = _resized(ints, node, [constant_ints(j) if j >= 0 else None for j in op.inputs[3:4]],
                                     [float_values(j) if j >= 0 else None for j in op.inputs[2:3]], opset())
                if not learned(shape, sizes):
                    return unknown  # the rule disagrees with a size learned before: infer instead
                found = _evaluate_type(symbolic[name], values, bound)
        elif found is None and rule is not None and shape is not None:
            inputs = [(types.get(n) or sized.get(n) or UNKNOWN_TYPE)[1] for n in
                      (tensors[j].name for j in op.inputs if j >= 0)]
            if all(s is not None for s in inputs):
                attrs = {a.name: a.i for a in nodes[op.index].attribute if a.type == AttributeProto.INT} \
                    if rule != "broadcast" else {}  # (reading a node's attributes costs microseconds)
                if rule == "reshape":
                    target = constant_ints(op.inputs[1]) if len(op.inputs) > 1 and op.inputs[1] >= 0 else None
                    sizes = _reshaped(inputs[0], target, attrs.get("allowzero", 0), len(shape))  # type: ignore[arg-type]
                else:  # layers repeat their shapes: each case is worked out once
                    case = (rule, len(shape), tuple(inputs), attrs.get("axis", 0))
                    sizes = by_rule.get(case) or by_rule.setdefault(case, _dims_by_rule(*case))  # type: ignore[arg-type]
                if not learned(shape, sizes):
                    return unknown  # the rule disagrees with a size learned before: infer instead
                found = _evaluate_type(symbolic[name], values, bound)
        if found is not None:
            sized[name] = found
    types.update(sized)
    return unknown - sized.keys()


# More rules of _size_from_inputs, beside DIM_FROM_INPUTS's: value, the output's shape is the value of the first
# input, computed from the sizes known; matmul, the batch dims broadcast and the two matrices' outer dims.
# slice, a Slice of constant or computed starts, ends, axes and steps; resize, a Resize (opset 11 on) to constant
# scales or to constant or computed sizes, on every axis.
DIM_FROM_VALUE: dict[str, str] = {"ConstantOfShape": "value", "MatMul": "matmul", "Slice": "slice", "Resize": "resize"}
_COMPUTED_VALUE_NODES = 256  # the most nodes a computed shape value is read through (a shape's arithmetic is short)


def _reshaped(shape: tuple[Dim, ...], target: list[int] | None, allowzero: int, rank: int) -> list[int | None]:
    """Give the dims of a Reshape of `shape` to the constant `target` (0 copies the input's dim unless allowzero,
    -1 takes what remains), None each where they do not follow."""
    sizes = [d for d in shape if isinstance(d, int)]
    if target is None or len(target) != rank or len(sizes) != len(shape):
        return [None] * rank
    dims: list[int | None] = [
        (sizes[k] if k < len(sizes) else None) if t == 0 and not allowzero else t for k, t in enumerate(target)]
    total = math.prod(sizes)
    rest = math.prod(d for d in dims if d is not None and d != -1)
    if dims.count(-1) == 1:
        dims[dims.index(-1)] = total // rest if rest and total % rest == 0 else None
    return [d if d is None or d >= 0 else None for d in dims]


def _sliced(shape: tuple[int, ...], operands: list[list[int] | None]) -> list[int | None]:
    """Give the dims of a Slice (opset 10 on) of `shape` by `operands`, its starts, ends, axes and steps (None: not
    constant; missing: axes 0.., steps 1), as ONNX's inference computes them (processSliceInputs: negative starts
    and ends count from the end, then clamp to the dim); None each where they do not follow."""
    rank = len(shape)
    if len(operands) < 2 or operands[0] is None or operands[1] is None or any(o is None for o in operands[2:]):
        return [None] * rank
    starts, ends = operands[0], operands[1]
    axes = operands[2] if len(operands) > 2 else list(range(len(starts)))
    steps = operands[3] if len(operands) > 3 else [1] * len(starts)
    assert axes is not None and steps is not None
    axes = [a + rank if a < 0 else a for a in axes]
    if not len(starts) == len(ends) == len(axes) == len(steps) or len(set(axes)) != len(axes) or \
            any(not 0 <= a < rank for a in axes) or 0 in steps:
        return [None] * rank
    dims: list[int | None] = list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        size = shape[axis]
        start += size if start < 0 else 0
        end += size if end < 0 else 0
        if step < 0:
            start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
        else:
            start, end = min(max(start, 0), size), min(max(end, 0), size)
        dims[axis] = max(-((start - end) // step), 0)
    return dims


def _resized(shape: tuple[int, ...], node: onnx.NodeProto, sizes: list[list[int] | None],
             scales: list[list[float] | None], opset: int) -> list[int | None]:
    """Give the dims of a Resize (opset 11 on, every axis: no `axes`, the default aspect ratio policy) of `shape`:
    its constant or computed `sizes` where given, else each dim times its constant scale in float, floored, as
    ONNX's inference computes them (resizeShapeInferenceHelper); None each where they do not follow."""
    rank = len(shape)
    if opset < 11 or any(a.name in ("axes", "keep_aspect_ratio_policy") for a in node.attribute):
        return [None] * rank
    if sizes and sizes[0] is not None and len(sizes[0]) > 0:
        return list(sizes[0]) if len(sizes[0]) == rank and all(d >= 0 for d in sizes[0]) else [None] * rank
    if len(node.input) > 3 and node.input[3]:
        return [None] * rank  # (sizes not constant)
    if not scales or scales[0] is None or len(scales[0]) != rank:
        return [None] * rank
    import numpy as np

    return [int(np.floor(np.float32(d) * np.float32(s))) for d, s in zip(shape, scales[0], strict=True)]


def _dims_by_rule(rule: str, rank: int, inputs: list[tuple[Dim, ...]], axis: int) -> list[int | None]:
    """Give each output dim's size by the rule from the input shapes (None where it does not follow)."""
    sizes: list[int | None] = []
    if rule == "matmul":
        if len(inputs) != 2 or min(len(inputs[0]), len(inputs[1])) < 2 or rank < 2:
            return [None] * rank
        a, b = inputs
        batch = _dims_by_rule("broadcast", rank - 2, [a[:-2], b[:-2]], 0)
        return [*batch, a[-2] if isinstance(a[-2], int) else None, b[-1] if isinstance(b[-1], int) else None]
    for position in range(rank):
        if rule == "concat":
            column = [shape[position] if len(shape) == rank else None for shape in inputs]
        else:  # broadcast: the shapes aligned on their last dims
            column = [shape[position - rank + len(shape)] for shape in inputs if position - rank + len(shape) >= 0]
        known = [d for d in column if isinstance(d, int)]
        if len(known) != len(column):
            sizes.append(None)
        elif rule == "concat" and position == axis % rank:
            sizes.append(sum(known))
        elif rule == "concat":
            sizes.append(known[0])
        else:
            widest = max(known, default=1)
            sizes.append(widest if all(d in (1, widest) for d in known) else None)
    return sizes


def _evaluate_type(symbolic_type: TensorType, values: dict[str, int | None],
                   bound: Mapping[str, int]) -> TensorType | None:
    dtype, shape, _ = symbolic_type
    if shape is None:
        return None
    sizes = []
    for d in shape:
        if isinstance(d, str):
            if d not in values:
                values[d] = _evaluate_dim(d, bound) if not d.startswith("unk__") else None
            d = values[d]
        if d is None:
            return None
        sizes.append(d)
    count = 1
    for size in sizes:
        count *= size
    return dtype, tuple(sizes), tensor_bytes(dtype, count)


def _infer_rest(model: ModelProto, known: Mapping[str, TensorType], unknown: set[str],
                bound: Mapping[str, int], wiring: ModelGraph | None) -> dict[str, TensorType] | None:
    """Give the types of the `unknown` tensors by inferring, with data propagation, only the nodes that make them
    and the small integer tensors (shape values) they read; the tensors already `known` enter as inputs of that
    part. None where the part cannot stand alone (control flow, custom operators, an input of unknown type) or
    leaves a tensor unknown: the caller infers the whole graph then, so the result is always the whole graph's.
    """
    if wiring is None:
        from onnxmem.ir.graph import build_graph  # imported here: the graph module reads this one's types

        wiring = build_graph(model)
    ops, tensors, index = wiring.ops, wiring.tensors, wiring.tensor_index
    if any(op.domain not in ("", "ai.onnx") or op.op_type in CONTROL_FLOW for op in ops):
        return None
    wanted = [tensors[index[name]].producer for name in unknown if name in index]
    if len(wanted) != len(unknown) or None in wanted:
        return None  # an unknown input or initializer: nothing to infer it from

    def value_source(name: str) -> bool:  # a shape value: an integer tensor of a few elements, or a Constant
        if name not in known:
            return True  # its producer is in the part anyway
        dtype, shape, _ = known[name]
        return dtype in _INT_TYPES and shape is not None and _is_small(shape)

    chosen: set[int] = set()
    stack: list[int] = wanted  # type: ignore[assignment]  # checked above: no None
    while stack:
        i = stack.pop()
        if i in chosen:
            continue
        chosen.add(i)
        for j in ops[i].inputs:
            producer = tensors[j].producer if j >= 0 else None
            if producer is not None and producer not in chosen and (
                    value_source(tensors[j].name) or ops[producer].op_type == "Constant"):
                stack.append(producer)
    initializers = {t.name: t for t in model.graph.initializer}
    part = sorted(chosen)
    nodes = [model.graph.node[i] for i in part]
    # Shape values computed here reach where ONNX's data propagation does not; those that depend on a size the
    # part infers are computed after it, and the part inferred again with them (a few rounds at most).
    sizes: dict[str, TensorType] = dict(known)
    folded: dict[str, TensorProto] = {}
    for _ in range(_REST_ROUNDS):
        found = _infer_part(model, wiring, part, folded, initializers, known, unknown, bound)
        if found is None:
            return None
        rest = {name: found[name] for name in unknown if name in found and found[name][2] is not None}
        if len(rest) == len(unknown):
            return rest
        sizes.update((name, t) for name, t in found.items() if t[2] is not None)
        more = _shape_values(nodes, initializers, sizes)
        if more.keys() <= folded.keys():
            return None
        folded = more
    return None


def _infer_part(model: ModelProto, wiring: ModelGraph, part: list[int], folded: Mapping[str, TensorProto],
                initializers: Mapping[str, TensorProto], known: Mapping[str, TensorType], unknown: set[str],
                bound: Mapping[str, int]) -> dict[str, TensorType] | None:
    """Give the types inference finds on the nodes `part` (op indices) alone, the `folded` shape values as
    constants and the `known` tensors they read as inputs; None where an input is of unknown type or inference
    fails."""
    ops, tensors = wiring.ops, wiring.tensors
    sub = _without_initializers(model)
    graph = sub.graph
    graph.initializer.extend(folded.values())
    made: set[str] = set()
    nodes = []
    for i in part:
        outputs = [tensors[j].name for j in ops[i].outputs if j >= 0]
        made.update(outputs)
        if not outputs or not all(out in folded for out in outputs):
            nodes.append(model.graph.node[i])
    graph.node.extend(nodes)
    declared = [v for v in model.graph.value_info if v.name in made and v.name in unknown]
    if declared:
        graph.value_info.extend(declared)
        _substitute(graph, bound)  # the inputs below are sized already
    type_protos: dict[TensorType, onnx.TypeProto] = {}  # layers repeat their types: make each one once

    def type_proto(sized: TensorType) -> onnx.TypeProto:
        made_once = type_protos.get(sized)
        if made_once is None:
            made_once = type_protos[sized] = onnx.helper.make_tensor_type_proto(sized[0], list(sized[1] or ()))
        return made_once

    # what the part makes that is known already (a shape value's producers, taken in for its value) keeps its
    # known sizes: inferred again from the part alone, a Range of a size the part does not hold would lose them
    for name in sorted(made - unknown):
        sized = known.get(name)
        if sized is not None and sized[1] is not None and sized[2] is not None:
            graph.value_info.append(ValueInfoProto(name=name, type=type_proto(sized)))
    entered: set[str] = set()
    inputs = []
    for i in part:
        for j in ops[i].inputs:
            name = tensors[j].name if j >= 0 else ""
            if not name or name in made or name in entered or name in folded:
                continue
            entered.add(name)
            tensor = initializers.get(name)
            if tensor is not None and (tensor.data_location == TensorProto.EXTERNAL or _is_shape_constant(tensor)):
                graph.initializer.append(tensor)
                continue
            sized = known.get(name, UNKNOWN_TYPE)
            if sized[1] is None:
                return None
            inputs.append(ValueInfoProto(name=name, type=type_proto(sized)))
    graph.input.extend(inputs)
    try:
        inferred, _ = _bounded_inference(sub, True, [])  # (the whole graph's inference warns of a long vector)
        if any(has_rule(n) for n in sub.graph.node) and _has_unknown_outputs(inferred.graph):
            inferred = _rule_rounds(sub, inferred, True)  # (onnxruntime's Memcpy copies: as the whole graph's)
    except Exception:  # noqa: BLE001 - the whole graph's inference will say what is wrong
        return None
    found: dict[str, TensorType] = {}
    decode = TypeDecoder()
    for value in inferred.graph.value_info:  # what the part made (its inputs were given sized)
        found[value.name] = decode(value.type)
    return found
