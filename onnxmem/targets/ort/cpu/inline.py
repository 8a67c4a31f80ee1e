"""The function bodies onnxruntime's CPU provider inlines (its graph partitioner's InlineNodes: an ONNX operator
it has no kernel for runs as its schema's function body), and ONNX's inference of one node that the float16
transform (float16.py) and the inlining share."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, numpy_helper

from onnxmem.ir.tensor_types import Dim, TensorType, decode_type

# The name the transform gives a node onnxruntime made from a function body (onnxruntime leaves it unnamed):
# '<prefix><its index among such nodes>_<function op>_<body op>'. Onnxruntime indexes such nodes after the
# model's nodes, in the order it inlined them: its execution order ranks them so (schedule.ort_order), before
# the Casts it inserts later.
INLINED_NODE_PREFIX = "InlinedFunctionNode_"
# The prefix Graph::InlineFunction gives a body's tensors and Constants (then '<OpType>', and '_token_<n>' from
# Graph::GenerateNodeName where the name is taken).
INLINED_TENSOR_PREFIX = "_inlfunc_"


def inlined_node_rank(name: str) -> int | None:
    """Give the index among inlined nodes a node's name carries (INLINED_NODE_PREFIX), None for other names."""
    if not name.startswith(INLINED_NODE_PREFIX):
        return None
    head = name[len(INLINED_NODE_PREFIX):].split("_", 1)[0]
    return int(head) if head.isdigit() else None


def inlined_function_ops(model: ModelProto) -> list[str]:
    """Give the function operators whose bodies the model's nodes come from (INLINED_NODE_PREFIX), sorted."""
    return sorted({n.name[len(INLINED_NODE_PREFIX):].split("_")[1] for n in model.graph.node
                   if inlined_node_rank(n.name) is not None and n.name.count("_") >= 2})


@dataclasses.dataclass(frozen=True)
class _Inlined:
    nodes: list[onnx.NodeProto]  # the graph's nodes, each body in place of its node (a topological order)
    rank: list[int]  # per node: onnxruntime's node index, up to order (the model's nodes, then the inlined ones)
    initializers: list[TensorProto]  # the bodies' Constants


def inline_functions(graph: GraphProto, versions: Mapping[str, int], known: dict[str, TensorType],
                      no_kernel: Callable[[onnx.NodeProto], bool],
                      constants: dict[str, TensorProto], memo: NodeMemo | None = None) -> _Inlined | None:
    """Replace every ONNX node the CPU provider has no kernel for (`no_kernel`) and whose operator has a function
    body by that body, round after round (a body's own function ops, as CastLike in Gelu's, in the next round),
    as onnxruntime's partitioner does. `known` gains the types of the bodies' tensors, `constants` (the values
    inference may read) the bodies' Constants. None where no node is replaced."""
    nodes = list(graph.node)
    rank = list(range(len(nodes)))
    initializers: list[TensorProto] = []
    taken = {n.name for n in nodes if n.name}
    counter = [0]

    def unique(base: str) -> str:  # Graph::GenerateNodeName
        name = base
        while name in taken:
            name = f"{base}_token_{counter[0]}"
            counter[0] += 1
        taken.add(name)
        return name

    next_rank = len(nodes)
    changed = False
    while True:
        calls = sorted((i for i, node in enumerate(nodes) if node.domain in ("", "ai.onnx") and no_kernel(node)),
                       key=rank.__getitem__)
        bodies = {i: body for i in calls if (body := _function_body(nodes[i], versions, known)) is not None}
        if not bodies:
            break
        changed = True
        new_nodes: list[onnx.NodeProto] = []
        new_rank: list[int] = []
        placed: dict[int, tuple[list[onnx.NodeProto], list[int]]] = {}
        for i in calls:  # in index order: the ranks of the bodies' nodes follow it
            if i not in bodies:
                continue
            call = nodes[i]
            body_nodes, body_constants = _specialize(call, bodies[i], unique(INLINED_TENSOR_PREFIX + call.op_type),
                                                     versions.get("", 1))
            initializers.extend(body_constants)
            for tensor in body_constants:
                known[tensor.name] = (tensor.data_type, tuple(tensor.dims), None)
            constants.update((tensor.name, tensor) for tensor in body_constants)
            _type_body(body_nodes, versions, known, constants, memo)
            ranks = []
            for body_node in body_nodes:
                seq = next_rank - len(graph.node)
                body_node.name = f"{INLINED_NODE_PREFIX}{seq}_{call.op_type}_{body_node.op_type}"
                ranks.append(next_rank)
                next_rank += 1
            placed[i] = (body_nodes, ranks)
        for i, node in enumerate(nodes):
            if i in placed:
                new_nodes.extend(placed[i][0])
                new_rank.extend(placed[i][1])
            else:
                new_nodes.append(node)
                new_rank.append(rank[i])
        nodes, rank = new_nodes, new_rank
    return _Inlined(nodes, rank, initializers) if changed else None


def _function_body(node: onnx.NodeProto, versions: Mapping[str, int],
                   known: Mapping[str, TensorType]) -> onnx.FunctionProto | None:
    """Give the ONNX function body of the node's operator at the model's opset (the newest body not newer than
    it; for a context-dependent body, built for the node's input types, as Node::TryGetFunctionProto asks for
    it); None where the operator has none, or a body holds a subgraph (not modelled: left to the Casts)."""
    opset = versions.get("", 1)
    schema: Any  # (onnx's stubs lack the function-body methods)
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return None
    body = onnx.FunctionProto()
    if schema.has_context_dependent_function:
        usable = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        if not usable:
            return None
        input_types = []
        for name in node.input:
            dtype, shape, _ = known.get(name, (0, None, None)) if name else (0, None, None)
            input_types.append(onnx.helper.make_tensor_type_proto(dtype, shape).SerializeToString() if dtype
                               else onnx.TypeProto().SerializeToString())
        try:
            built = schema.get_context_dependent_function_with_opset_version(max(usable), node.SerializeToString(),
                                                                             input_types)
        except Exception:  # noqa: BLE001 (the builder rejects what it cannot type: no body, the Casts then)
            return None
        body.ParseFromString(built)
    elif schema.has_function:
        usable = [v for v in schema.function_opset_versions if v <= opset]
        if not usable:
            return None
        body.ParseFromString(schema.get_function_with_opset_version(max(usable)))
        if not _body_valid_at(body, max(usable), opset):
            return None
    else:
        return None
    if not body.node or any(holds_graph(n) for n in body.node):
        return None
    return body


def _body_valid_at(body: onnx.FunctionProto, written_for: int, opset: int) -> bool:
    """Say whether a static function body written for one opset serves the model's: every ONNX operator it calls
    is the same version at both (ONNX's OpSchema::GetFunction with validation, as onnxruntime asks for a body;
    measured on onnxruntime 1.32: Relu's opset-18 body, Max of a CastLike'd Constant, is inlined in an opset-18
    model and not at opset 20, where Constant and CastLike are newer; a context-dependent body is built unchecked)."""
    if written_for == opset:
        return True
    for node in body.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            if onnx.defs.get_schema(node.op_type, opset, "").since_version != \
                    onnx.defs.get_schema(node.op_type, written_for, "").since_version:
                return False
        except onnx.defs.SchemaError:
            return False
    return True


def _specialize(call: onnx.NodeProto, body: onnx.FunctionProto, prefix: str, opset: int) \
        -> tuple[list[onnx.NodeProto], list[TensorProto]]:
    """Give the body's nodes wired to the call's inputs and outputs, its other tensors renamed '<prefix>_<name>',
    attribute references resolved from the call's attributes (or the body's defaults), and its Constant nodes as
    initializers (function_utils::Specialize, then Graph::InlineFunction)."""
    rename = dict(zip(body.input, call.input, strict=False))
    rename.update(dict(zip(body.input[len(call.input):], [""] * len(body.input), strict=False)))
    rename.update(zip(body.output, call.output, strict=False))
    given = {a.name: a for a in call.attribute}
    defaults = {a.name: a for a in body.attribute_proto}
    try:  # the schema's defaults (a schema's body leaves them there: LeakyRelu's alpha)
        schema = onnx.defs.get_schema(call.op_type, opset, "")
        for name, attribute in schema.attributes.items():
            if name not in defaults and attribute.default_value.type != AttributeProto.UNDEFINED:
                defaults[name] = attribute.default_value
    except onnx.defs.SchemaError:
        pass

    def renamed(name: str) -> str:
        if not name:
            return ""
        return rename.setdefault(name, f"{prefix}_{name}")

    nodes: list[onnx.NodeProto] = []
    constants: list[TensorProto] = []
    for source in body.node:
        node = onnx.NodeProto()
        node.op_type, node.domain = source.op_type, source.domain
        node.input.extend(renamed(n) for n in source.input)
        node.output.extend(renamed(n) for n in source.output)
        for attr in source.attribute:
            if attr.ref_attr_name:
                value = given.get(attr.ref_attr_name) or defaults.get(attr.ref_attr_name)
                if value is None:
                    continue
                resolved = node.attribute.add()
                resolved.CopyFrom(value)
                resolved.name = attr.name
            else:
                node.attribute.add().CopyFrom(attr)
        tensor = _constant_value(node) if node.op_type == "Constant" and node.domain in ("", "ai.onnx") else None
        if tensor is not None:
            tensor.name = node.output[0]
            constants.append(tensor)
        else:
            nodes.append(node)
    return nodes, constants


def _constant_value(node: onnx.NodeProto) -> TensorProto | None:
    """Give a Constant node's value as a tensor (None for a sparse value or a missing one)."""
    for attr in node.attribute:
        if attr.name == "value":
            tensor = TensorProto()
            tensor.CopyFrom(attr.t)
            return tensor
        if attr.name in ("value_float", "value_floats", "value_int", "value_ints"):
            value = onnx.helper.get_attribute_value(attr)
            dtype = numpy.float32 if attr.name.startswith("value_float") else numpy.int64
            return numpy_helper.from_array(numpy.array(value, dtype=dtype))
    return None


# ONNX's inference of one node from Python (onnx.shape_inference.infer_node_outputs) costs about a tenth of a
# millisecond, and the nodes converted or inlined on a float16 model repeat layer after layer: infer_node keeps
# each answer, by what decides it (the operator and its opset, its attributes, its inputs' types and constant
# values; not the tensors' names), in a memo of the caller's (one per transform run).
NodeMemo = dict[tuple[object, ...], tuple[tuple[int, onnx.TypeProto], ...] | None]


def infer_node(node: onnx.NodeProto, versions: Mapping[str, int], known: Mapping[str, TensorType],
                constants: Mapping[str, TensorProto],
                view: Callable[[tuple[Dim, ...] | None], tuple[Dim, ...] | None] = lambda shape: shape,
                memo: NodeMemo | None = None) -> dict[str, onnx.TypeProto] | None:
    """Give ONNX's inference of one node's output types, on its inputs' `known` types (each shape as `view` gives
    it) and the values of its `constants` inputs; None where ONNX cannot type it here. `memo`: answers kept
    across calls (see NodeMemo)."""
    key: tuple[object, ...] | None = None
    if memo is not None and len(set(node.output)) == len(node.output):
        key = (node.op_type, node.domain, versions.get("", 1), len(node.output),
               b"".join(a.SerializeToString() for a in node.attribute),
               *(name if not name else
                 ((known[name][0], view(known[name][1])) if name in known and known[name][0] else None,
                  _constant_content(constants[name]) if name in constants else None)
                 for name in node.input))
        if key in memo:
            kept = memo[key]
            return None if kept is None else {node.output[k]: type_proto for k, type_proto in kept}
    try:
        schema = onnx.defs.get_schema(node.op_type, versions.get("", 1), node.domain)
        inputs = {}
        for name in node.input:
            if name and name in known and known[name][0]:
                dtype, shape, _ = known[name]
                inputs[name] = onnx.helper.make_tensor_type_proto(dtype, view(shape))
        data = {name: constants[name] for name in node.input if name in constants}
        found: dict[str, onnx.TypeProto] | None = dict(
            onnx.shape_inference.infer_node_outputs(schema, node, inputs, data))
    except Exception:  # noqa: BLE001 - onnx raises several types here; any of them means "not typed"
        found = None
    if key is not None and memo is not None and (found is None or found.keys() <= set(node.output)):
        memo[key] = None if found is None else tuple(
            (k, found[name]) for k, name in enumerate(node.output) if name in found)
    return found


def _constant_content(tensor: TensorProto) -> bytes:
    """Give a constant's type, dims and values as bytes, without its name."""
    nameless = TensorProto()
    nameless.CopyFrom(tensor)
    nameless.ClearField("name")
    return nameless.SerializeToString()


def _type_body(nodes: Sequence[onnx.NodeProto], versions: Mapping[str, int], known: dict[str, TensorType],
               constants: Mapping[str, TensorProto], memo: NodeMemo | None = None) -> None:
    """Add the element types (and shapes, where ONNX infers them) of the body's outputs to `known`, node by node
    (a node ONNX cannot type here: its outputs stay unknown to the transform)."""
    for node in nodes:
        for name, type_proto in (infer_node(node, versions, known, constants, memo=memo) or {}).items():
            known[name] = decode_type(type_proto)


def holds_graph(node: onnx.NodeProto) -> bool:
    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)
