"""Dim binding and shape inference: every tensor gets a dtype and, where it can be known, a static shape."""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, ValueInfoProto

from .dtypes import tensor_bytes
from .errors import DimError
from .load import initializer_type
from .report import Warning
from .rules.inference import CONTROL_FLOW, DIM_FROM_INPUTS, PLANNER_MERGES_DIMS, SHAPE_AS

if TYPE_CHECKING:
    from .graph import ModelGraph
    from .load import LoadedModel

# Initializers up to this many elements stay in the copy given to shape inference: the shape, axes and index
# constants that data propagation needs, and Resize's scales. Everything else travels as a typed input.
_KEEP_INT_VALUES_UP_TO = 4096
_INT_TYPES = (TensorProto.INT64, TensorProto.INT32)
_DIM_NAME = re.compile(r"^[^=\s]+$")

Dim = int | str | None  # a size, a symbolic name, or unknown
TensorType = tuple[int, tuple[Dim, ...] | None, int | None]  # dtype, shape (None: rank unknown), bytes
UNKNOWN_TYPE: TensorType = (0, None, None)


class InputDim(NamedTuple):
    """One dimension of a graph input that has no fixed size."""

    name: str  # the dim's symbolic name, or '<input>_dim<axis>' for an unnamed one
    input: str
    axis: int


@dataclass(frozen=True)
class SizedModel:
    """The model with the type of every tensor that inference could find, once its dims are bound."""

    proto: ModelProto  # the user's model, untouched
    types: dict[str, TensorType]  # tensor name -> inferred type, over the graph and its subgraphs
    dims: dict[str, int]
    warnings: tuple[Warning, ...]


def parse_dims(items: list[str] | tuple[str, ...]) -> dict[str, int]:
    """Give the dims named by 'NAME=VALUE' strings (as typed after --dim)."""
    dims: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not _DIM_NAME.match(name):
            raise DimError(f"--dim '{item}': expected NAME=VALUE, e.g. --dim batch=8")
        try:
            number = int(value, 0)
        except ValueError:
            raise DimError(f"--dim '{item}': '{value}' is not an integer") from None
        dims[name] = number
    return dims


def input_dims(model: ModelProto) -> list[InputDim]:
    """Give every dim of the graph's inputs that has no fixed size, in input order."""
    initializers = {t.name for t in model.graph.initializer}
    decode = TypeDecoder()  # the inputs of a KV cache repeat one type thousands of times: decode it once
    found: list[InputDim] = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = decode(value.type)[1]
        for axis, dim in enumerate(shape or ()):
            if isinstance(dim, int) and dim > 0:
                continue
            found.append(InputDim(dim if isinstance(dim, str) else f"{value.name}_dim{axis}", value.name, axis))
    return found


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
    bound, bound_warnings = bind_dims(free, dims, default_dim)
    warnings = list(bound_warnings)
    if symbolic is not None:
        types, unknown = evaluate_known(symbolic, bound)
        if unknown and graph is not None:
            unknown = _size_from_inputs(model, graph, symbolic, types, unknown, bound)
        if not unknown:
            return SizedModel(model, types, bound, tuple(warnings))
        rest = _infer_rest(model, types, unknown, bound, graph)
        if rest is not None:
            return SizedModel(model, {**types, **rest}, bound, tuple(warnings))
    return SizedModel(model, _infer(model, free, bound, warnings), bound, tuple(warnings))


def evaluate_known(symbolic: Mapping[str, TensorType], bound: Mapping[str, int]) -> \
        tuple[dict[str, TensorType], set[str]]:
    """Give the types whose every dim evaluates at `bound`, and the names of the others."""
    values: dict[str, int | None] = dict(bound)
    types: dict[str, TensorType] = {}
    unknown: set[str] = set()
    evaluated: dict[TensorType, TensorType | None] = {}  # layers repeat their types: evaluate each one once
    for name, symbolic_type in symbolic.items():
        if symbolic_type in evaluated:
            result = evaluated[symbolic_type]
        else:
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
        if tensor is None or tensor.data_type not in _INT_TYPES or not _is_shape_constant(tensor):
            return None
        return [int(v) for v in onnx.numpy_helper.to_array(tensor).reshape(-1)]

    for name in sorted(unknown, key=producer.__getitem__):
        found = _evaluate_type(symbolic[name], values, bound)
        op = wiring.ops[producer[name]]
        rule = DIM_FROM_INPUTS.get(op.op_type) if op.domain in ("", "ai.onnx") else None
        shape = symbolic[name][1]
        if found is None and rule is not None and shape is not None:
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
                for d, size in zip(shape, sizes, strict=True):
                    if isinstance(d, str) and size is not None:
                        if values.get(d) not in (None, size):
                            return unknown  # the rule disagrees with a size learned before: infer instead
                        values[d] = size
                found = _evaluate_type(symbolic[name], values, bound)
        if found is not None:
            sized[name] = found
    types.update(sized)
    return unknown - sized.keys()


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


def _dims_by_rule(rule: str, rank: int, inputs: list[tuple[Dim, ...]], axis: int) -> list[int | None]:
    """Give each output dim's size by the rule from the input shapes (None where it does not follow)."""
    sizes: list[int | None] = []
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
        from .graph import build_graph  # imported here: the graph module reads this one's types

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


_REST_ROUNDS = 3


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
    entered: set[str] = set()
    type_protos: dict[TensorType, onnx.TypeProto] = {}  # layers repeat their types: make each one once
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
            type_proto = type_protos.get(sized)
            if type_proto is None:
                type_proto = type_protos[sized] = onnx.helper.make_tensor_type_proto(sized[0], list(sized[1]))
            inputs.append(ValueInfoProto(name=name, type=type_proto))
    graph.input.extend(inputs)
    try:
        inferred = onnx.shape_inference.infer_shapes(sub, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - the whole graph's inference will say what is wrong
        return None
    found: dict[str, TensorType] = {}
    decode = TypeDecoder()
    for value in inferred.graph.value_info:  # what the part made (its inputs were given sized)
        found[value.name] = decode(value.type)
    return found


def infer_symbolic(model: ModelProto, loaded: LoadedModel | None = None, free: list[InputDim] | None = None,
                   wiring: ModelGraph | None = None) -> dict[str, TensorType]:
    """Give every tensor's type with the input dims left symbolic, as a runtime's planner sees the model before
    any input arrives (onnxruntime decides buffer reuse on these shapes: equal names are equal sizes).

    `loaded`: the model as loaded from its file, whose NodeKinds tell which passes can be skipped; `free`: the
    model's input_dims where the caller has them; `wiring`: the model's graph, where the caller has built it (its
    ops find the nodes the planner rounds read faster than the model's nodes do).
    """
    free = input_dims(model) if free is None else free
    nodes = loaded.nodes if loaded is not None else None
    subgraphs = nodes is None or nodes.graphs  # whether a node may hold a graph (see _collect_types)
    merges = nodes is None or nodes.merges  # whether a node may merge dims (see _planner_rounds)
    # The model as it was read serves inference where preparation would change nothing in it (no Constant node
    # to fold, no fused operator to rewrite, every free dim named): no copy, no serialization.
    as_read = loaded.data if loaded is not None and nodes is not None and not nodes.prepared and \
        all(d.name != f"{d.input}_dim{d.axis}" for d in free) else None
    prepared: list[ModelProto] = []

    def light() -> ModelProto:  # the model inference reads, where a round adds to it: made at first use
        if not prepared:
            prepared.append(_prepared(model, free, {}))
        return prepared[0]

    try:
        inferred = _inferred(as_read if as_read is not None else light(), data_prop=False)
    except Exception:  # noqa: BLE001 - onnx raises several types; the bound inference reports the failure
        return _collect_types(light().graph, TypeDecoder())
    candidates: list[onnx.NodeProto] | None = []
    if merges:  # the model's own nodes serve where preparation changed none of them (no fused op was rewritten)
        candidates = _candidate_nodes(model, wiring) if wiring is not None and nodes is not None and \
            not nodes.prepared else None
    return _planner_rounds(light, inferred, [], subgraphs=subgraphs, candidates=candidates)


def declared_types(model: ModelProto) -> dict[str, TensorType]:
    """Give the types the model itself declares (inputs, outputs, value_info, initializers), inferring nothing."""
    return _collect_types(model.graph, TypeDecoder())


def runtime_view(shape: tuple[Dim, ...] | None) -> tuple[Dim, ...] | None:
    """Give a shape as onnxruntime's planner holds it: ONNX names every dim it cannot infer 'unk__N', where
    onnxruntime leaves the dim empty, and an empty dim equals nothing (measured: Softmax after a dynamic Reshape
    is not done in place)."""
    if shape is None:
        return None
    return tuple(None if isinstance(d, str) and d.startswith("unk__") else d for d in shape)


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


def _fold_constant_nodes(graph: GraphProto) -> None:
    """Turn the graph's Constant nodes into initializers, in place (the copy given to inference only)."""
    values = [(i, _constant_value(n)) for i, n in enumerate(graph.node) if n.op_type == "Constant"]
    folded = {i: tensor for i, tensor in values if tensor is not None}
    if not folded:
        return
    kept = [n for i, n in enumerate(graph.node) if i not in folded]
    graph.initializer.extend(folded.values())
    del graph.node[:]
    graph.node.extend(kept)
    # an initializer's own type is exact; a declaration of the same name (exporters declare Constant outputs,
    # often with no shape) would override it in inference
    names = {tensor.name for tensor in folded.values()}
    if any(v.name in names for v in graph.value_info):
        declared = [v for v in graph.value_info if v.name not in names]
        del graph.value_info[:]
        graph.value_info.extend(declared)


def _prepared(model: ModelProto, free: list[InputDim], bound: Mapping[str, int]) -> ModelProto:
    """Give the copy of the model that inference reads: Constant nodes as initializers, fused operators as their
    standard forms, every free input dim named, and the `bound` ones substituted."""
    light = _shape_only_copy(model)
    _fold_constant_nodes(light.graph)
    _standardize_fused_ops(light.graph)
    _name_unnamed_dims(light.graph, free)
    _substitute(light.graph, bound)
    return light


def _inferred(light: ModelProto | bytes, data_prop: bool) -> ModelProto:
    return onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=data_prop)


def _infer(model: ModelProto, free: list[InputDim], bound: Mapping[str, int],
           warnings: list[Warning], data_prop: bool = True) -> dict[str, TensorType]:
    light = _prepared(model, free, bound)
    try:
        inferred = _inferred(light, data_prop)
    except Exception as exc:  # onnx raises several types here; any of them means "no inference"
        warnings.append(Warning("shape-inference-failed", f"ONNX shape inference failed: {_one_line(exc)}"))
        return _collect_types(light.graph, TypeDecoder())
    if _has_custom_domains(inferred) and _has_unknown_outputs(inferred.graph):
        inferred = _ort_symbolic_inference(inferred, warnings)
        return _collect_types(inferred.graph, TypeDecoder())
    types = _collect_types(inferred.graph, TypeDecoder())
    if data_prop and _has_unknown_outputs(inferred.graph):
        # shape values ONNX's data propagation does not carry (see _shape_values), computed and given back
        for _ in range(_REST_ROUNDS):
            initializers = {t.name: t for t in light.graph.initializer}
            folded = _shape_values(list(light.graph.node), initializers, types)
            fresh = [t for name, t in folded.items() if name not in initializers]
            if not fresh:
                break
            light.graph.initializer.extend(fresh)
            try:
                inferred = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False,
                                                             data_prop=True)
            except Exception:  # noqa: BLE001 - keep what the first inference found
                break
            types = _collect_types(inferred.graph, TypeDecoder())
            if not _has_unknown_outputs(inferred.graph):
                break
    return types


_PLANNER_ROUNDS = 8


def _shape_values(nodes: list[onnx.NodeProto], initializers: Mapping[str, TensorProto],
                  known: Mapping[str, TensorType]) -> dict[str, TensorProto]:
    """Give the values of the small integer tensors these nodes compute from constants and from the sizes of
    tensors whose shapes are `known` (Shape of a known tensor, then Gather, Concat, Mul, ...), as initializers.

    ONNX's data propagation carries such values to Reshape and Expand but not to Slice's bounds, and not through
    Reshape or Identity (the dynamo exporter writes a symbolic size as Reshape(size, [-1]) and slices an RNN's
    weights by it); computing them here sizes what they shape.
    """
    values: dict[str, numpy.ndarray] = {}

    def value(name: str) -> numpy.ndarray | None:
        if name in values:
            return values[name]
        tensor = initializers.get(name)
        if tensor is None or tensor.data_type not in _INT_TYPES or not _is_shape_constant(tensor):
            return None  # sized from its header before any data is decoded
        return onnx.numpy_helper.to_array(tensor)

    for node in nodes:
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1 or node.op_type not in SHAPE_VALUE_OPS:
            continue
        constant = _constant_value(node)
        if constant is not None:
            if constant.data_type in _INT_TYPES:
                values[node.output[0]] = onnx.numpy_helper.to_array(constant)
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Shape":
            shape = known.get(node.input[0], UNKNOWN_TYPE)[1]
            if shape is None or not all(isinstance(d, int) for d in shape):
                continue
            start, end = attrs.get("start", 0), attrs.get("end", len(shape))
            values[node.output[0]] = numpy.array(shape[start:end] if end else shape[start:0], dtype=numpy.int64)
            continue
        arguments = [value(name) if name else None for name in node.input]
        compute = SHAPE_VALUE_OPS[node.op_type]
        if not arguments or arguments[0] is None or compute is None:
            continue
        try:
            result = compute(arguments, attrs)
        except Exception:  # noqa: BLE001 - an unexpected form: leave the node to inference
            continue
        if result is not None and result.size <= _KEEP_INT_VALUES_UP_TO and result.dtype.kind in "iu":
            values[node.output[0]] = result
    return {name: onnx.numpy_helper.from_array(array, name) for name, array in values.items()}


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
    if len(a) < 3 or a[0] is None or a[1] is None or a[2] is None or a[0].ndim != 1 or len(a[1]) != 1:
        return None
    if len(a) > 3 and a[3] is not None and int(a[3][0]) not in (0, -1):
        return None
    step = int(a[4][0]) if len(a) > 4 and a[4] is not None else 1
    return a[0][int(a[1][0]):int(a[2][0]):step]


def _arithmetic(function: Callable[[numpy.ndarray, numpy.ndarray], numpy.ndarray]) -> \
        Callable[[Values, Mapping[str, Any]], numpy.ndarray | None]:
    def apply(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
        return None if len(a) < 2 or a[0] is None or a[1] is None else function(a[0], a[1])
    return apply


def _divide(x: numpy.ndarray, y: numpy.ndarray) -> numpy.ndarray:
    return numpy.trunc(x / y).astype(numpy.result_type(x, y))  # ONNX integer division truncates


def _expand(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    if a[0] is None or len(a) < 2 or a[1] is None:
        return None
    shape = numpy.broadcast_shapes(a[0].shape, tuple(int(d) for d in a[1]))
    if math.prod(shape) > _KEEP_INT_VALUES_UP_TO:
        return None  # a shape value is small; this one is not (and is not built)
    return numpy.broadcast_to(a[0], shape).copy()


def _cast(a: Values, k: Mapping[str, Any]) -> numpy.ndarray | None:
    return None if a[0] is None or k.get("to") not in _INT_TYPES else a[0].astype(numpy.int64)


# How each operator computes a small integer value from its inputs' values (None where unknown) and its
# attributes: the shape arithmetic exporters write. None leaves the node to inference. Constant and Shape are
# computed in _shape_values (from the node's value, from its input's known shape).
SHAPE_VALUE_OPS: dict[str, Callable[[Values, Mapping[str, Any]], numpy.ndarray | None] | None] = {
    "Constant": None,
    "Shape": None,
    "Identity": lambda a, k: a[0],
    "Cast": _cast,
    "Reshape": _reshape,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Gather": _gather,
    "Slice": _slice,
    "Add": _arithmetic(numpy.add),
    "Sub": _arithmetic(numpy.subtract),
    "Mul": _arithmetic(numpy.multiply),
    "Div": _arithmetic(_divide),
    "Expand": _expand,
}


def _planner_rounds(light: Callable[[], ModelProto], inferred: ModelProto | None, warnings: list[Warning],
                    subgraphs: bool = True, candidates: Sequence[onnx.NodeProto] | None = None,
                    weights: Mapping[str, TensorType] | None = None,
                    collected: dict[str, TensorType] | None = None) -> dict[str, TensorType]:
    """Give the types onnxruntime's planner knows: ONNX's inference (no value propagation), and what onnxruntime
    knows besides, fed back into it until nothing more is learned.

    Contrib operators: onnxruntime infers their outputs from their schemas, from their inputs' shapes, and
    propagates no shape values (measured: after a Reshape whose target is computed, it knows no shape). Its
    Python symbolic inference knows the contrib operators but also propagates shape values symbolically, so it
    knows more than the planner: its type for a contrib operator's output is taken only where every input of
    that operator is known. Concat merges each dim from all its inputs, where ONNX's 'unk__N' names would win
    (rules.inference.PLANNER_MERGES_DIMS).

    `candidates`: the nodes the rounds look at (see _candidate_nodes), where the caller has them (None: they are
    read from `inferred`); `weights`: the types of the graph's initializers, where the caller has them;
    `collected`: the types collected from `inferred` but its initializers', where they were collected before
    (`inferred` is then not read: None, where the model has no contrib operator).
    """
    # the nodes the rounds look at: contrib operators and those that merge dims (the others, read once)
    nodes = _candidate_nodes(inferred) if candidates is None and inferred is not None else candidates or []
    contrib: dict[str, ValueInfoProto] = {}
    if inferred is not None and any(n.domain not in ("", "ai.onnx") for n in nodes) and \
            _has_unknown_outputs(inferred.graph):
        found = _ort_symbolic_inference(_copy(inferred), warnings)
        if found is not inferred:
            contrib = {v.name: v for v in found.graph.value_info}
            contrib.update((v.name, v) for v in found.graph.output)

    def collect(inferred: ModelProto) -> dict[str, TensorType]:
        types = _collect_types(inferred.graph, TypeDecoder(), subgraphs=subgraphs, initializers=weights is None)
        types.update(weights or {})  # (where _collect_types puts them: last)
        return types

    learned_before: set[str] = set()
    if collected is not None:
        types = collected
        types.update(weights or {})
    else:
        assert inferred is not None
        types = collect(inferred)
    for _ in range(_PLANNER_ROUNDS):
        learned: list[ValueInfoProto] = []
        for node in nodes:
            if node.domain not in ("", "ai.onnx"):
                if contrib and not all(out in types and _known(types[out]) for out in node.output if out) \
                        and all(_known(types.get(i, UNKNOWN_TYPE)) for i in node.input if i):
                    learned.extend(contrib[out] for out in node.output if out in contrib
                                   and out not in learned_before and not (out in types and _known(types[out])))
            elif node.op_type in PLANNER_MERGES_DIMS and node.output and node.output[0] not in learned_before:
                merged = _merged_dims(node, types)
                if merged is not None:
                    learned.append(merged)
        if not learned:
            return types
        learned_before.update(v.name for v in learned)
        light().graph.value_info.extend(learned)
        try:
            inferred = _inferred(light(), data_prop=False)
        except Exception:  # noqa: BLE001 - keep what the rounds before found
            return types
        types = collect(inferred)
    return types


def _is_candidate(op_type: str, domain: str) -> bool:
    """Say whether the planner rounds look at a node of this kind (see _planner_rounds)."""
    return op_type in PLANNER_MERGES_DIMS or domain not in ("", "ai.onnx")


def _candidate_nodes(model: ModelProto, wiring: ModelGraph | None = None) -> list[onnx.NodeProto]:
    """Give the nodes of the model's graph the planner rounds look at: found from its graph where the caller has it
    (faster than reading every node's op type from the model)."""
    nodes = model.graph.node
    if wiring is None:
        return [n for n in nodes if _is_candidate(n.op_type, n.domain)]
    return [nodes[op.index] for op in wiring.ops if _is_candidate(op.op_type, op.domain)]


def _merged_dims(node: onnx.NodeProto, types: Mapping[str, TensorType]) -> ValueInfoProto | None:
    """Give the output type of a Concat with each dim merged as onnxruntime does (the first input dim with a
    value or a name; 'unk__N' is no name), where that names a dim ONNX's inference left 'unk__N'; else None."""
    dtype, current, _ = types.get(node.output[0], UNKNOWN_TYPE)
    if current is None:
        return None
    unknown = [j for j, d in enumerate(current) if d is None or (isinstance(d, str) and d.startswith("unk__"))]
    if not unknown:
        return None  # no dim to learn (the usual case: reading the node's inputs costs more)
    axis = next((a.i for a in node.attribute if a.name == "axis"), PLANNER_MERGES_DIMS[node.op_type])
    axis %= max(len(current), 1)
    if unknown == [axis]:
        return None  # the concatenated dim is never merged (a KV cache's past + new: the usual unknown one)
    shapes = [types.get(name, UNKNOWN_TYPE)[1] for name in node.input if name]
    dims: list[int | str | None] = [None if isinstance(d, str) and d.startswith("unk__") else d for d in current]
    changed = False
    for j in unknown:
        if j == axis:
            continue
        for shape in shapes:
            d = shape[j] if shape is not None and len(shape) == len(current) else None
            if isinstance(d, int) or (isinstance(d, str) and not d.startswith("unk__")):
                dims[j] = d
                changed = True
                break
    return onnx.helper.make_tensor_value_info(node.output[0], dtype, dims) if changed else None


def _known(t: TensorType) -> bool:
    shape = t[1]
    return shape is not None and all(isinstance(d, int) or (isinstance(d, str) and not d.startswith("unk__"))
                                     for d in shape)


def _copy(model: ModelProto) -> ModelProto:
    copy = ModelProto()
    copy.CopyFrom(model)
    return copy


def bind_dims(free: list[InputDim], dims: Mapping[str, int],
              default_dim: int | None = None) -> tuple[dict[str, int], tuple[Warning, ...]]:
    """Give the value of every free input dim: given, computed from an expression of given ones, or defaulted."""
    names = {d.name for d in free}
    _check_dim_values(dims, default_dim)
    unknown = sorted(set(dims) - names)
    if unknown:
        known = ", ".join(sorted(names)) or "none (every input dim is fixed)"
        raise DimError(f"unknown dim {', '.join(unknown)}: the model's symbolic dims are {known}")
    bound = dict(dims)
    _bind_expressions(free, bound)
    where: dict[str, list[InputDim]] = {}  # each unbound name, where it occurs
    for d in free:
        if d.name not in bound:
            where.setdefault(d.name, []).append(d)
    # a dim named by an expression of other unbound dims ('past + seq') is bound with them: not asked for
    asked = [n for n in where if not (_dim_names(n) - {n}) & where.keys()]
    if asked and default_dim is None:
        listed = ", ".join(f"{n} (input '{where[n][0].input}' axis {where[n][0].axis}"
                           f"{f', and {len(where[n]) - 1} more inputs' if len(where[n]) > 1 else ''})"
                           for n in sorted(asked))
        example = " ".join(f"--dim {n}=N" for n in sorted(asked))
        raise DimError(f"unbound dims: {listed}; bind them with {example} (or --default-dim N)")
    if not where:
        return bound, ()
    for name in asked:
        bound[name] = int(default_dim)  # type: ignore[arg-type]
    _bind_expressions(free, bound)
    for name in where:  # an expression that does not evaluate (a size of 0 or less) takes the default too
        bound.setdefault(name, int(default_dim))  # type: ignore[arg-type]
    defaulted = ", ".join(sorted(asked))
    return bound, (Warning("default-dim", f"dims {defaulted} were not given and took --default-dim {default_dim}"),)


def _bind_expressions(free: list[InputDim], bound: dict[str, int]) -> None:
    """Bind the dims named by an expression of bound dims, as exporters write them ('past + seq')."""
    for d in free:
        if d.name not in bound:
            value = _evaluate_dim(d.name, bound)
            if value is not None:
                bound[d.name] = value


def _dim_names(expression: str) -> set[str]:
    """Give the names a dim's name is written with: itself for a plain name, the operands of 'past + seq'."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return {expression}
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} or {expression}


def _collect_types(graph: GraphProto, decode: TypeDecoder, into: dict[str, TensorType] | None = None,
                   subgraphs: bool = True, initializers: bool = True) -> dict[str, TensorType]:
    """Give the type of every value the graph declares and of its initializers, its subgraphs' included
    (`subgraphs` False: the caller knows the graph has none, and its nodes are not read; `initializers` False:
    the caller has the graph's own, see LoadedModel.weights)."""
    types = {} if into is None else into
    decoded = decode.decoded
    for values in (graph.input, graph.output, graph.value_info):
        for value in values:  # the loop of TypeDecoder.__call__, inlined: 100k values on a large graph
            type_proto = value.type
            key = type_proto.SerializeToString()
            found = decoded.get(key)
            if found is None:
                found = decoded[key] = decode_type(type_proto)
            types[value.name] = found
    for tensor in graph.initializer if initializers else ():
        types[tensor.name] = initializer_type(tensor)
    for node in graph.node if subgraphs else ():
        if node.op_type not in CONTROL_FLOW and node.domain in ("", "ai.onnx"):
            continue  # a standard operator holds no graph (reading every node's attributes costs 0.1 s per 100k)
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                _collect_types(attr.g, decode, types)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _collect_types(sub, decode, types)
    return types


class TypeDecoder:
    """Gives (dtype, shape, bytes) of a TypeProto, decoding each distinct serialized type once.

    Reading a TypeProto field by field costs microseconds in Python; layers repeat their types, so
    decoding each distinct one once halves the cost on a large graph.
    """

    def __init__(self) -> None:
        self.decoded: dict[bytes, TensorType] = {}  # serialized TypeProto -> its type

    def __call__(self, type_proto: onnx.TypeProto) -> TensorType:
        key = type_proto.SerializeToString()
        sized = self.decoded.get(key)
        if sized is None:
            sized = self.decoded[key] = decode_type(type_proto)
        return sized


def decode_type(type_proto: onnx.TypeProto) -> TensorType:
    """Give the element type, shape and exact bytes of a tensor type (None where unknown)."""
    if not type_proto.HasField("tensor_type"):
        return UNKNOWN_TYPE
    tensor_type = type_proto.tensor_type
    dtype = tensor_type.elem_type
    if not tensor_type.HasField("shape"):
        return dtype, None, None
    shape = tuple(
        d.dim_value if d.WhichOneof("value") == "dim_value" and d.dim_value >= 0 else (d.dim_param or None)
        for d in tensor_type.shape.dim
    )
    count = 1
    for size in shape:
        if not isinstance(size, int):
            return dtype, shape, None
        count *= size
    return dtype, shape, tensor_bytes(dtype, count)


def _evaluate_dim(expression: str, bound: Mapping[str, int]) -> int | None:
    """Give the value of a dim written as + - * // of bound dims and integers, or None."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return None
    operators = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}

    def value(node: ast.AST) -> int | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in operators:
            left, right = value(node.left), value(node.right)
            if left is None or right is None or (right == 0 and isinstance(node.op, ast.FloorDiv)):
                return None
            return int(operators[type(node.op)](left, right))
        return None

    if isinstance(tree.body, ast.Name):
        return None  # a plain name is a dim of its own, for the user to bind
    result = value(tree.body)
    return result if result is not None and result > 0 else None


def _check_dim_values(dims: Mapping[str, int], default_dim: int | None) -> None:
    for name, value in [*dims.items(), *([("--default-dim", default_dim)] if default_dim is not None else [])]:
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise DimError(f"dim {name}={value}: must be a positive integer")
        if value >= 2**62:
            raise DimError(f"dim {name}={value}: too large (sizes would overflow 64-bit integers)")


_EMBEDDED_BYTES_TO_COPY = 64 * 1024 * 1024


def _shape_only_copy(model: ModelProto) -> ModelProto:
    # Shape inference needs every initializer's type and the values of small integer ones; copying the
    # weights themselves would double the memory of a model with embedded data for nothing. A model whose
    # weights are external (or small) is copied whole: one C++ copy beats a Python walk over its nodes.
    if model.ByteSize() <= _EMBEDDED_BYTES_TO_COPY:
        whole = ModelProto()
        whole.CopyFrom(model)
        return whole
    copy = ModelProto()
    copy.CopyFrom(_without_initializers(model))
    _slim_graph(model.graph, copy.graph)
    return copy


def _standardize_fused_ops(graph: GraphProto) -> None:
    # The copy given to inference only: the graph the passes read keeps every node as it is.
    for node in graph.node:
        if node.domain in ("", "ai.onnx"):
            continue  # the fused operators are all in onnxruntime's domains
        rule = SHAPE_AS.get(f"{node.domain}::{node.op_type}")
        if rule is None:
            continue
        op_type, inputs, dropped = rule
        if op_type == "MatMul" and any(a.name.startswith("trans") and a.i for a in node.attribute):
            continue  # a transposing FusedMatMul is not a MatMul's shape: left for onnxruntime's inference
        kept = [a for a in node.attribute if a.name not in dropped]
        del node.attribute[:]
        node.attribute.extend(kept)
        del node.input[inputs:]
        node.op_type, node.domain = op_type, ""


def _without_initializers(model: ModelProto) -> ModelProto:
    shell = ModelProto()
    shell.ir_version = model.ir_version
    shell.opset_import.extend(model.opset_import)
    shell.functions.extend(model.functions)
    shell.graph.name = model.graph.name
    return shell


def _slim_graph(source: GraphProto, target: GraphProto) -> None:
    target.input.extend(source.input)
    target.output.extend(source.output)
    target.value_info.extend(source.value_info)
    declared = {v.name for v in source.input}
    for tensor in source.initializer:
        if tensor.data_location == TensorProto.EXTERNAL or _is_shape_constant(tensor):
            target.initializer.append(tensor)  # a header only, or a small constant inference may need
            continue
        if tensor.name not in declared:
            target.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    for node in source.node:
        copy = target.node.add()
        copy.CopyFrom(node)
        for attr, original in zip(copy.attribute, node.attribute, strict=True):
            if attr.type == AttributeProto.GRAPH:
                attr.g.ClearField("initializer")
                del attr.g.input[:], attr.g.output[:], attr.g.value_info[:], attr.g.node[:]
                _slim_graph(original.g, attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub, orig in zip(attr.graphs, original.graphs, strict=True):
                    sub.ClearField("initializer")
                    del sub.input[:], sub.output[:], sub.value_info[:], sub.node[:]
                    _slim_graph(orig, sub)


def _is_shape_constant(tensor: TensorProto) -> bool:
    # integer shape values (Reshape, Expand, ...) and small float ones (Resize's scales) that inference reads
    return tensor.data_location != TensorProto.EXTERNAL and _is_small(tensor.dims)


def _is_small(dims: Iterable[Dim]) -> bool:
    """Say whether a tensor of these (known) dims has few enough elements to be a shape value."""
    count = 1
    for d in dims:
        count *= int(d)  # type: ignore[arg-type]
    return count <= _KEEP_INT_VALUES_UP_TO


def _name_unnamed_dims(graph: GraphProto, free: list[InputDim]) -> None:
    by_input = {v.name: v for v in graph.input}
    for d in free:
        dim = by_input[d.input].type.tensor_type.shape.dim[d.axis]
        if not (dim.HasField("dim_param") and dim.dim_param):
            dim.dim_param = d.name


def _substitute(graph: GraphProto, bound: Mapping[str, int]) -> None:
    if not bound:
        return
    for value in _value_infos(graph):
        if not value.type.HasField("tensor_type"):
            continue
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in bound:
                dim.dim_value = bound[dim.dim_param]


def _value_infos(graph: GraphProto) -> Iterator[ValueInfoProto]:
    yield from graph.input
    yield from graph.output
    yield from graph.value_info


def _has_unknown_outputs(graph: GraphProto) -> bool:
    known = {v.name for v in _value_infos(graph) if _is_static(v)}
    return any(out and out not in known for node in graph.node for out in node.output)


def _is_static(value: ValueInfoProto) -> bool:
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
        return False
    return all(d.HasField("dim_value") for d in value.type.tensor_type.shape.dim)


def _has_custom_domains(model: ModelProto) -> bool:
    return any(node.domain not in ("", "ai.onnx") for node in model.graph.node)


def _ort_symbolic_inference(model: ModelProto, warnings: list[Warning]) -> ModelProto:
    # onnxruntime's symbolic shape inference knows the com.microsoft contrib ops that ONNX's does not.
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError as exc:  # onnxruntime, or the sympy its symbolic inference needs
        warnings.append(Warning(
            "contrib-shapes",
            "the model has non-standard operators that ONNX shape inference does not know, and onnxruntime's "
            f"symbolic shape inference cannot run ({_one_line(exc)}): pip install \"onnxmem[cpu]\"",
        ))
        return model
    # Its public infer_shapes() saves the model into the current directory whenever any shape stays
    # unknown, and then throws the partial result away; running its steps ourselves keeps what it found
    # and writes nothing.
    try:
        inference = SymbolicShapeInference(2**31 - 1, True, False, 0)
        inference._preprocess(model)
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
        result: ModelProto = inference.out_mp_
    except Exception as exc:  # its failures are many and untyped; fall back to what ONNX found
        warnings.append(Warning("contrib-shapes", f"onnxruntime symbolic shape inference failed: {_one_line(exc)}"))
        return model
    return result


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__
