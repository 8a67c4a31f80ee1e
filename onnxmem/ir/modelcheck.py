"""The model's own structure, checked once as it is loaded: text that is not UTF-8, duplicate initializers,
element types, dims, initializer data against its dims, external-data locations, the attributes that hold
control-flow bodies, opsets and local functions.

An invalid model is a ModelFileError naming the tensor or node and what is wrong (PROBLEMS); a model that stands
but that the installed onnx does not fully know gets a named warning (WARNINGS). Every check reads the parsed
model, never its bytes, and applies to every graph at every depth (the bodies of If, Loop, Scan and of any node
holding a graph, nested, and local functions): one walk over the nodes gives the graphs, the Constant nodes and
the op types (a 100k-node graph: about 0.1 s).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import onnx
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

from onnxmem.errors import ModelFileError, listing, quoted
from onnxmem.ir.dtypes import dtype_name, element_bits, tensor_bytes
from onnxmem.targets.ort.tables import CONTROL_FLOW
from onnxmem.views.report import Warning

# What makes a model invalid, by code: each a one-line message (the CLI prints it after "onnxmem: error: <file>:").
PROBLEMS: dict[str, str] = {
    "not-a-model": "not a valid ONNX model (no IR version, opset or graph); the file may be truncated or not ONNX "
                   "at all",
    "not-utf8": "{place} is not valid UTF-8 ({value}): protobuf strings must be UTF-8",
    "bad-opset": "opset_import: {problem}",
    "duplicate-initializer": "initializer {name} is given twice{scope}",
    "bad-data-type": "{what} {name} has data_type {dtype}, which is no ONNX element type",
    "negative-dim": "{what} {name} has a negative dim: dims {dims}",
    "too-many-elements": "{what} {name} has dims {dims}: {count} elements, more than 64-bit sizes can count",
    "data-size": "{what} {name} ({dtype}, dims {dims}) holds {actual} bytes of data where its dims need "
                 "{expected}",
    "data-count": "{what} {name} ({dtype}, dims {dims}) holds {actual} values in {field} where its dims need "
                  "{expected}",
    "no-data": "{what} {name} ({dtype}, dims {dims}) holds no data and is not stored externally",
    "external-location": "{what} {name}: external-data location {location} {problem}",
    "bad-elem-type": "{what} {name} has elem_type {dtype}, which is no ONNX element type",
    "long-int-vector": "{what} {name} is declared as a vector of {length} integers: more than {limit}, the longest "
                       "onnxmem gives ONNX's shape inference (it expands such a vector value by value, without "
                       "bound)",
    "graph-attribute": "node {node} ({op_type}): attribute {attribute} {problem}",
    "body-arity": "node {node} ({op_type}): its {attribute} graph has {actual} {part} where the node needs "
                  "{expected}",
    "recursive-function": "local function {name} calls itself ({path}): a model must not recurse",
    "too-many-values": "{what}: {count:,} {part}, more than the {limit:,} onnxmem analyses (no model needs as many; "
                       "the work grows with each)",
    "sparse-initializer": "sparse initializer {name} ({dtype}, dims {dims}){scope}: sparse initializers are not "
                          "supported (onnxruntime makes them dense at session creation); store it as a dense "
                          "initializer",
    "external-entry": "{what} {name}: external-data {key} {value} {problem}",
}

# What the installed onnx does not know but leaves the estimate standing, by code (the warning's stable code).
WARNINGS: dict[str, str] = {
    "newer-opset": "the model imports opset {version} of domain {domain}; the installed onnx {onnx} knows up to "
                   "{known}, and infers its operators by those rules (pip install -U onnx)",
    "newer-ir-version": "the model's IR version {version} is newer than the installed onnx {onnx} knows ({known}) "
                        "(pip install -U onnx)",
    "subgraph-weights": "{count} weights ({nbytes:,} bytes) live in graphs that nodes hold (control-flow bodies) "
                        "and are counted in weights_bytes and the peak (onnxruntime holds them from session "
                        "creation, as the main graph's): {places}",
}

# The most inputs, or outputs, one graph may declare (a stateful decoder has two per layer; 10^6 took over a minute).
MAX_GRAPH_VALUES = 2**18
# The longest integer vector declared on a graph input that is given to ONNX's shape inference: its data
# propagation holds such a vector as a shape of that many dims (2^40 takes minutes and terabytes).
LONGEST_INT_VECTOR = 1 << 20
# Initializers up to this size have their data measured exactly (reading a larger raw_data copies it).
_EXACT_DATA_BYTES = 64 * 1024 * 1024
_PATH_MAX, _NAME_MAX = 4096, 255
_STANDARD = ("", "ai.onnx")
_STANDARD_SET = frozenset(_STANDARD)
_INT_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32, TensorProto.UINT64, TensorProto.UINT32,
                        TensorProto.INT16, TensorProto.UINT16, TensorProto.INT8, TensorProto.UINT8})
_DATA_TYPES = frozenset(v for v in TensorProto.DataType.values() if v != TensorProto.UNDEFINED)
_ELEM_TYPES = frozenset(TensorProto.DataType.values())  # UNDEFINED: the type is unknown, which stays honest
# The graph attributes each control-flow operator needs, and the body arity it implies (see _check_bodies).
_BODIES: dict[str, tuple[str, ...]] = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",),
                                       "SequenceMap": ("body",)}
# Where a typed field holds a tensor's values: (field, elements per stored value) by data type; 0 for packed types
# whose values share one int32 (see _stored_values).
_TYPED_FIELDS: dict[int, str] = {
    TensorProto.FLOAT: "float_data", TensorProto.COMPLEX64: "float_data", TensorProto.DOUBLE: "double_data",
    TensorProto.COMPLEX128: "double_data", TensorProto.INT64: "int64_data", TensorProto.UINT64: "uint64_data",
    TensorProto.UINT32: "uint64_data", TensorProto.STRING: "string_data",
}


@dataclass(frozen=True)
class Checked:
    """What the check found that loading goes on with: warnings, the external-data locations of the initializers
    (location -> the number of tensors stored there), and what the walk saw of the nodes at every depth: their op
    types, and whether a node holds a graph."""

    warnings: tuple[Warning, ...]
    external: dict[str, int]
    op_types: frozenset[str] = frozenset()
    holds_graphs: bool = False


def check_model(model: ModelProto, where: str, data: bytes | None = None) -> Checked:
    """Give what the model's structure tells (see Checked), or raise ModelFileError where the model is invalid.

    `where` names the model in messages; `data`, its serialized bytes where the caller has them (their strings
    are then checked for UTF-8 in one parse).
    """
    _check_is_model(model, where)
    _check_utf8(model, where, data)
    warnings = _check_opsets(model, where)
    walk = _walk(model)
    external: dict[str, int] = {}
    for graph in walk.graphs:
        _check_counts(graph, where, graph is not model.graph)
        _check_initializers(graph, where, external, graph is not model.graph)
        _check_values(graph, where)
    for nodes in walk.with_constants:
        _check_constants(nodes, where, {})
    for nodes in walk.with_bodies:
        _check_bodies(nodes, where)
    _check_functions(model, where)
    warnings.extend(_subgraph_weights(walk))
    return Checked(tuple(warnings), external, frozenset(walk.op_types), walk.holds_graphs)


def external_locations(model: ModelProto) -> list[str]:
    """Give the external-data locations of the model's initializers and Constant values, at every depth."""
    walk = _walk(model)
    tensors = [*(t for graph in walk.graphs for t in graph.initializer),
               *(a.t for nodes in walk.with_constants for node in nodes for a in node.attribute
                 if a.type == AttributeProto.TENSOR)]
    return list(dict.fromkeys(entry.value for t in tensors if t.data_location == TensorProto.EXTERNAL
                              for entry in t.external_data if entry.key == "location"))


def all_initializers(graph: GraphProto) -> Iterator[TensorProto]:
    """Give the initializers of a graph and of every graph its control-flow nodes hold."""
    for sub in _subgraphs_of(graph):
        yield from sub.initializer


def _fail(where: str, code: str, **fields: object) -> ModelFileError:
    return ModelFileError(f"{where}: invalid model: {PROBLEMS[code].format(**fields)}")


def _warning(code: str, **fields: object) -> Warning:
    return Warning(code, WARNINGS[code].format(**fields))


def _check_is_model(model: ModelProto, where: str) -> None:
    # Protobuf parses many non-ONNX byte strings without complaint (an empty file is a valid empty message),
    # so a model must at least declare an IR version, an opset and a graph with something in it.
    graph = model.graph
    if model.ir_version <= 0 or not model.opset_import or not (graph.node or graph.output):
        raise ModelFileError(f"{where}: {PROBLEMS['not-a-model']}")


# --- strings ------------------------------------------------------------------------------------------------

def _verifying_model_class() -> type[Message]:
    """Give a ModelProto class that rejects strings that are not UTF-8 as it parses (ONNX's schema is proto2,
    whose parser hands such a string back as bytes): onnx's own schema, as edition 2023 with UTF-8 verified."""
    source = descriptor_pb2.FileDescriptorProto()
    onnx.ModelProto.DESCRIPTOR.file.CopyToProto(source)
    source.syntax, source.edition = "editions", descriptor_pb2.EDITION_2023
    features = source.options.features
    features.utf8_validation = descriptor_pb2.FeatureSet.VERIFY
    features.enum_type = descriptor_pb2.FeatureSet.CLOSED
    features.repeated_field_encoding = descriptor_pb2.FeatureSet.EXPANDED
    features.field_presence = descriptor_pb2.FeatureSet.EXPLICIT

    def proto2_fields(message: descriptor_pb2.DescriptorProto) -> None:
        for field in message.field:
            if field.label == field.LABEL_REQUIRED:
                field.label = field.LABEL_OPTIONAL
                field.options.features.field_presence = descriptor_pb2.FeatureSet.LEGACY_REQUIRED
            if field.name == "doc_string":  # free text that nothing reads: not worth refusing a model over
                field.options.features.utf8_validation = descriptor_pb2.FeatureSet.NONE
        for nested in message.nested_type:
            proto2_fields(nested)

    for message in source.message_type:
        proto2_fields(message)
        if message.name in _NUMBERS_ONLY:
            # numbers hold no string: left out of this schema, they are kept as the unknown fields' bytes (their
            # size in the file) instead of parsed a second time (an int64_data of 2^23 zeros: 8 MB on disk,
            # 128 MB parsed)
            kept = [f for f in message.field if f.name not in _NUMBERS_ONLY[message.name]]
            del message.field[:]
            message.field.extend(kept)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(source)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{source.package}.ModelProto"))


_VERIFYING: list[type[Message]] = []  # made at first use (a few milliseconds)
# The fields of numbers the UTF-8 check's parse skips (see _verifying_model_class), by message.
_NUMBERS_ONLY = {"TensorProto": frozenset({"float_data", "int32_data", "int64_data", "double_data", "uint64_data"}),
                 "AttributeProto": frozenset({"floats", "ints"})}


def _check_utf8(model: ModelProto, where: str, data: bytes | None) -> None:
    """Raise where a string of the model is not UTF-8: one C parse of its bytes, and a walk to name the string
    only when that parse fails."""
    if data is None:
        if model.ByteSize() > _EXACT_DATA_BYTES:
            _find_bytes(model, where)  # a walk over the strings: no second copy of embedded weights
            return
        data = model.SerializeToString()
    if not _VERIFYING:
        _VERIFYING.append(_verifying_model_class())
    try:
        _VERIFYING[0].FromString(data)
    except DecodeError:
        _find_bytes(model, where)


def _find_bytes(model: ModelProto, where: str) -> None:
    """Raise naming the first string of the model that protobuf gave back as bytes (not UTF-8)."""
    for place, value in _strings(model):
        if isinstance(value, bytes):
            raise _fail(where, "not-utf8", place=place, value=quoted(value))


def _strings(model: ModelProto) -> Iterator[tuple[str, str | bytes]]:
    for opset in model.opset_import:
        yield "an opset_import domain", opset.domain
    for entry in model.metadata_props:
        yield "a metadata_props entry", entry.key
        yield "a metadata_props entry", entry.value
    for text in (model.producer_name, model.producer_version, model.domain):
        yield "the model's producer or domain", text
    for function in model.functions:
        for text in (function.name, function.domain, *function.input, *function.output, *function.attribute):
            yield f"local function {quoted(function.name)}", text
        yield from _node_strings(function.node)
    for graph in _subgraphs_of(model.graph):
        yield from _graph_strings(graph)


def _graph_strings(graph: GraphProto) -> Iterator[tuple[str, str | bytes]]:
    yield "a graph name", graph.name
    for tensor in graph.initializer:
        yield "an initializer name", tensor.name
        for entry in tensor.external_data:
            yield f"initializer {quoted(tensor.name)}: external data", entry.key
            yield f"initializer {quoted(tensor.name)}: external-data {quoted(entry.key)}", entry.value
    for sparse in graph.sparse_initializer:
        yield "a sparse initializer name", sparse.values.name
    for value in (*graph.input, *graph.output, *graph.value_info):
        yield "a value name", value.name
        for dim in value.type.tensor_type.shape.dim:
            yield f"value {quoted(value.name)}: a dim name", dim.dim_param
    yield from _node_strings(graph.node)


def _node_strings(nodes: Iterable[onnx.NodeProto]) -> Iterator[tuple[str, str | bytes]]:
    for position, node in enumerate(nodes):
        where = f"node #{position} ({quoted(node.name)})"
        yield f"node #{position}: its name", node.name
        yield f"{where}: its op_type", node.op_type
        yield f"{where}: its domain", node.domain
        for text in (*node.input, *node.output):
            yield f"{where}: an input or output name", text
        for attribute in node.attribute:
            yield f"{where}: an attribute name", attribute.name
            yield f"{where}: attribute {quoted(attribute.name)}", attribute.ref_attr_name
        for entry in node.metadata_props:
            yield f"{where}: metadata_props", entry.key
            yield f"{where}: metadata_props", entry.value


# --- opsets and functions -----------------------------------------------------------------------------------

def _check_opsets(model: ModelProto, where: str) -> list[Warning]:
    known = onnx.defs.C.schema_version_map()  # domain -> (first, last) opset version the installed onnx knows
    warnings: list[Warning] = []
    seen: set[str] = set()
    for opset in model.opset_import:
        domain = "" if opset.domain == "ai.onnx" else opset.domain
        if domain in seen:
            raise _fail(where, "bad-opset", problem=f"domain {quoted(opset.domain)} is imported twice")
        seen.add(domain)
        if opset.version <= 0:
            raise _fail(where, "bad-opset",
                        problem=f"domain {quoted(opset.domain)} has version {opset.version} (versions start at 1)")
        last = known.get(domain, (0, 0))[1]
        if last and opset.version > last:
            warnings.append(_warning("newer-opset", version=opset.version, domain=quoted(opset.domain or "ai.onnx"),
                                     onnx=onnx.__version__, known=last))
    if model.ir_version > onnx.IR_VERSION:
        warnings.append(_warning("newer-ir-version", version=model.ir_version, onnx=onnx.__version__,
                                 known=onnx.IR_VERSION))
    return warnings


def _check_functions(model: ModelProto, where: str) -> None:
    """Raise where a local function calls itself, directly or through others (inference would not end)."""
    if not model.functions:
        return
    calls: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for function in model.functions:  # (a call inside a body the function holds is a call all the same)
        calls[(function.domain, function.name)] = {(n.domain, n.op_type) for n in _every_node(function.node)}
    for key in calls:
        calls[key] &= calls.keys()
    done: set[tuple[str, str]] = set()
    for start in calls:  # an iterative depth-first search: a long chain of functions must not exhaust the stack
        path: list[tuple[str, str]] = []
        on_path: set[tuple[str, str]] = set()
        stack: list[tuple[tuple[str, str], Iterator[tuple[str, str]]]] = []
        if start not in done:
            path.append(start)
            on_path.add(start)
            stack.append((start, iter(sorted(calls[start]))))
        while stack:
            current, callees = stack[-1]
            callee = next(callees, None)
            if callee is None:
                stack.pop()
                path.pop()
                on_path.discard(current)
                done.add(current)
                continue
            if callee in on_path:
                cycle = [*path[path.index(callee):], callee]
                raise _fail(where, "recursive-function", name=quoted(_function_name(callee)),
                            path=" -> ".join(_function_name(c) for c in cycle[:10])
                            + (f" ... ({len(cycle) - 10} more)" if len(cycle) > 10 else ""))
            if callee not in done:
                path.append(callee)
                on_path.add(callee)
                stack.append((callee, iter(sorted(calls[callee]))))


def _every_node(nodes: Sequence[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Give the nodes and those of every graph they hold, at any depth (iteratively: nesting depth is the file's)."""
    stack = [nodes]
    while stack:
        for node in stack.pop():
            yield node
            if node.op_type not in CONTROL_FLOW and node.domain in _STANDARD:
                continue
            for attribute in node.attribute:
                stack.extend(graph.node for graph in _attribute_graphs(attribute))


def _function_name(key: tuple[str, str]) -> str:
    return f"{key[0]}::{key[1]}" if key[0] else key[1]


# --- graphs -------------------------------------------------------------------------------------------------

@dataclass
class _Walk:
    """What one walk over every node of a model finds (see _walk)."""

    graphs: list[GraphProto]  # the main graph and every graph a node holds, at any depth
    holders: list[str]  # per graph after the main one: the node and attribute that hold it
    op_types: set[str]
    with_constants: list[Sequence[onnx.NodeProto]]  # the node lists (of graphs, of functions) with a Constant node
    with_bodies: list[Sequence[onnx.NodeProto]]  # those with a control-flow node of ONNX's domain
    holds_graphs: bool  # whether a node holds a graph


def _walk(model: ModelProto) -> _Walk:
    """Give every graph of the model and what its nodes are, reading each node list once (iteratively: nesting
    depth is the file's). A node holds graphs where it is a control-flow operator or of a domain beyond ONNX's
    own (as graph.build_graph reads them); its graph attributes are read there only."""
    walk = _Walk([], [], set(), [], [], False)
    graphs: list[tuple[GraphProto, str]] = [(model.graph, "")]
    functions: list[Sequence[onnx.NodeProto]] = [f.node for f in model.functions]
    while graphs or functions:
        if graphs:
            graph, holder = graphs.pop()
            walk.graphs.append(graph)
            if holder:
                walk.holders.append(holder)
            nodes: Sequence[onnx.NodeProto] = graph.node
        else:
            nodes = functions.pop()
        kinds = {(node.op_type, node.domain) for node in nodes}  # (one pass: reading a node costs most)
        op_types = {op_type for op_type, _ in kinds}
        walk.op_types |= op_types
        if "Constant" in op_types:
            walk.with_constants.append(nodes)
        if op_types & _BODIES.keys():
            walk.with_bodies.append(nodes)
        if not op_types & CONTROL_FLOW and {domain for _, domain in kinds} <= _STANDARD_SET:
            continue  # a standard operator holds no graph (reading every node's attributes is costly)
        for node in nodes:
            if node.op_type not in CONTROL_FLOW and node.domain in _STANDARD:
                continue
            for attribute in node.attribute:
                held = _attribute_graphs(attribute)
                walk.holds_graphs = walk.holds_graphs or bool(held)
                holder = f"{node.op_type} node {quoted(node.name)}, {quoted(attribute.name)}"
                graphs.extend((graph, holder) for graph in held)
    return walk


def _subgraph_weights(walk: _Walk) -> list[Warning]:
    """Give the warning naming the initializers and Constant values that live in graphs held by nodes, with the
    graph each lives in (checked beforehand: their dims are sound)."""
    places: list[str] = []
    count = total = 0
    for graph, holder in zip(walk.graphs[1:], walk.holders, strict=True):
        tensors = graph_weights(graph)
        if not tensors:
            continue
        nbytes = sum(tensor_bytes(t.data_type, math.prod(t.dims)) or 0 for t in tensors)
        count, total = count + len(tensors), total + nbytes
        places.append(f"graph {quoted(graph.name)} of {holder}: {len(tensors)} ({nbytes:,} bytes)")
    if not places:
        return []
    return [_warning("subgraph-weights", count=count, nbytes=total, places=listing(places, 5, "; "))]


def graph_weights(graph: GraphProto) -> list[TensorProto]:
    """Give the weights of the graph itself (not of the graphs its nodes hold): its initializers and the tensors of
    its Constant nodes."""
    return [*graph.initializer, *(a.t for node in graph.node if node.op_type == "Constant"
                                  and node.domain in _STANDARD for a in node.attribute
                                  if a.type == AttributeProto.TENSOR)]


def weight_bytes_by_dtype(graph: GraphProto) -> dict[int, int]:
    """Give the bytes of the graph's own weights (graph_weights), by element type (checked beforehand: their dims
    are sound)."""
    by_dtype: dict[int, int] = {}
    for t in graph_weights(graph):
        by_dtype[t.data_type] = by_dtype.get(t.data_type, 0) + (tensor_bytes(t.data_type, math.prod(t.dims)) or 0)
    return by_dtype


def _subgraphs_of(graph: GraphProto) -> Iterator[GraphProto]:
    """Give the graph and every graph its nodes hold, depth first (iteratively: nesting depth is the file's)."""
    stack = [graph]
    while stack:
        current = stack.pop()
        yield current
        for node in current.node:
            if node.op_type not in CONTROL_FLOW and node.domain in _STANDARD:
                continue  # a standard operator holds no graph (reading every node's attributes is costly)
            for attribute in node.attribute:
                stack.extend(_attribute_graphs(attribute))


def _attribute_graphs(attribute: AttributeProto) -> list[GraphProto]:
    if attribute.type == AttributeProto.GRAPH:
        return [attribute.g]
    if attribute.type == AttributeProto.GRAPHS:
        return list(attribute.graphs)
    return []


def _check_initializers(graph: GraphProto, where: str, external: dict[str, int], nested: bool) -> None:
    _check_tensors(graph.initializer, where, external, nested, graph.name, "initializer")
    for sparse in graph.sparse_initializer:
        scope = f" (in graph {quoted(graph.name)})" if nested else ""
        raise _fail(where, "sparse-initializer", name=quoted(sparse.values.name), dims=list(sparse.dims),
                    dtype=dtype_name(sparse.values.data_type), scope=scope)


def _check_counts(graph: GraphProto, where: str, nested: bool) -> None:
    """Raise where a graph declares more inputs or outputs than MAX_GRAPH_VALUES."""
    for values, part in ((graph.input, "inputs"), (graph.output, "outputs")):
        if len(values) > MAX_GRAPH_VALUES:
            what = f"graph {quoted(graph.name)}" if nested else "the main graph"
            raise _fail(where, "too-many-values", what=what, count=len(values), part=part, limit=MAX_GRAPH_VALUES)


def _check_constants(nodes: Iterable[onnx.NodeProto], where: str, external: dict[str, int]) -> None:
    """Raise where the value of a Constant node is invalid as an initializer would be (inference folds it into one)."""
    for node in nodes:
        if node.op_type == "Constant" and node.domain in _STANDARD:
            values = [a.t for a in node.attribute if a.type == AttributeProto.TENSOR]
            label = quoted(node.output[0] if node.output else node.name)
            _check_tensors(values, where, external, False, "", "the value of Constant", label)


def _check_tensors(initializers: Iterable[TensorProto], where: str, external: dict[str, int], nested: bool,
                   graph_name: str, what: str, label: str = "") -> None:
    """Raise where an initializer is given twice, has no ONNX element type, a negative dim, more elements than
    64-bit sizes count, data that its dims do not fit, or an unusable external-data location; count the external
    locations into `external`."""
    initializers = list(initializers)
    if not label and len({t.name for t in initializers}) != len(initializers):
        seen: set[str] = set()
        for tensor in initializers:
            if tensor.name in seen:
                scope = f" (in graph {quoted(graph_name)})" if nested else ""
                raise _fail(where, "duplicate-initializer", name=_shown(tensor, label), scope=scope)
            seen.add(tensor.name)
    data_types, prod, largest = _DATA_TYPES, math.prod, 1 << 62
    for tensor in initializers:  # 16k initializers on a large model: every step here counts
        if tensor.data_type not in data_types:
            raise _fail(where, "bad-data-type", what=what, name=_shown(tensor, label), dtype=tensor.data_type)
        dims = tensor.dims[:]  # (a list made at once: prod and min over the protobuf field take twice as long)
        count = prod(dims)
        if dims and min(dims) < 0:
            raise _fail(where, "negative-dim", what=what, name=_shown(tensor, label), dims=list(dims))
        if count >= largest:
            raise _fail(where, "too-many-elements", what=what, name=_shown(tensor, label),
                        dims=list(dims), count=count)
        if tensor.data_location == TensorProto.EXTERNAL:
            entries = tensor.external_data
            first = entries[0] if entries else None
            location = first.value if first is not None and first.key == "location" else \
                next((e.value for e in entries if e.key == "location"), "")
            known = external.get(location)
            if known is None:
                problem = _location_problem(location)
                if problem:
                    raise _fail(where, "external-location", what=what, name=_shown(tensor, label),
                                location=quoted(location), problem=problem)
                known = 0
            external[location] = known + 1
            if len(entries) > 1:
                _check_entries(tensor, where, count, what, label)
        else:
            _check_data(tensor, where, count, what, label)


def _check_entries(tensor: TensorProto, where: str, count: int, what: str, label: str) -> None:
    """Raise where an external-data offset or length is not a non-negative decimal integer, or a length is not
    the bytes the tensor's dims need (onnx and onnxruntime refuse both when they read the data)."""
    for entry in tensor.external_data:
        key, value = entry.key, entry.value
        if key != "offset" and key != "length":
            continue
        if not (value.isascii() and value.isdigit()):
            raise _fail(where, "external-entry", what=what, name=_shown(tensor, label), key=key,
                        value=quoted(value), problem="is not a non-negative integer")
        needed = tensor_bytes(tensor.data_type, count)
        if key == "length" and needed is not None and int(value) != needed:
            raise _fail(where, "external-entry", what=what, name=_shown(tensor, label), key=key, value=value,
                        problem=f"is not the {needed:,} bytes its dims need ({dtype_name(tensor.data_type)}, dims "
                                f"{list(tensor.dims)})")


def _shown(tensor: TensorProto, label: str) -> str:
    return label or quoted(tensor.name)


def _location_problem(location: str) -> str:
    """Give what makes an external-data location unusable (onnx and onnxruntime refuse the same), or ''."""
    if not location:
        return "is empty"
    if len(location) > _PATH_MAX or any(len(part) > _NAME_MAX for part in location.split("/")):
        return f"is too long for a file name ({len(location)} characters)"
    if "\0" in location:
        return "holds a NUL character"
    if os.path.isabs(location) or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        return "is absolute: external data must lie in the model's folder"
    if ".." in location.replace("\\", "/").split("/"):
        return "leaves the model's folder ('..')"
    return ""


def _check_data(tensor: TensorProto, where: str, count: int, what: str, label: str = "") -> None:
    """Raise where an initializer stored in the file holds more or less data than its dims need."""
    dtype = tensor.data_type
    bits = element_bits(dtype)
    if tensor.HasField("raw_data"):
        if bits is None:
            return  # a string tensor's raw_data has no fixed size
        expected = (count * bits + 7) // 8
        size = tensor.ByteSize()
        if expected > size:  # the whole tensor is smaller than its data would be: no read of the data needed
            raise _fail(where, "data-size", what=what, name=_shown(tensor, label), dtype=dtype_name(dtype),
                        dims=list(tensor.dims), actual=f"at most {size}", expected=expected)
        if size <= _EXACT_DATA_BYTES and len(tensor.raw_data) != expected:
            raise _fail(where, "data-size", what=what, name=_shown(tensor, label), dtype=dtype_name(dtype),
                        dims=list(tensor.dims), actual=len(tensor.raw_data), expected=expected)
        return
    field, stored, expected = _stored_values(tensor, count)
    if stored == expected:
        return
    if stored == 0 and count > 0:
        raise _fail(where, "no-data", what=what, name=_shown(tensor, label), dtype=dtype_name(dtype),
                    dims=list(tensor.dims))
    raise _fail(where, "data-count", what=what, name=_shown(tensor, label), dtype=dtype_name(dtype),
                dims=list(tensor.dims), actual=stored, field=field, expected=expected)


def _stored_values(tensor: TensorProto, count: int) -> tuple[str, int, int]:
    """Give the field that holds a tensor's values, how many it holds, and how many its dims need."""
    dtype = tensor.data_type
    field = _TYPED_FIELDS.get(dtype, "int32_data")
    stored = len(getattr(tensor, field))
    if dtype in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        return field, stored, 2 * count
    bits = element_bits(dtype)
    if field == "int32_data" and bits is not None and bits < 8:
        per_value = 8 // bits  # 4-bit and 2-bit types: packed into bytes, one byte per int32 value
        return field, stored, -(-count // per_value)
    return field, stored, count


def _check_values(graph: GraphProto, where: str) -> None:
    """Raise where a graph input or output has an element type ONNX does not define, more elements than 64-bit
    sizes count, or (inputs) is an integer vector too long to give to ONNX's shape inference."""
    problems: dict[tuple[bytes, str], tuple[str, dict[str, object]] | None] = {}  # a KV cache repeats one type
    for values, what in ((graph.input, "input"), (graph.output, "output")):
        for value in values:
            key = (value.type.SerializeToString(), what)
            if key not in problems:
                problems[key] = _type_problem(value.type, what)
            found = problems[key]
            if found is not None:
                code, fields = found
                raise _fail(where, code, what=f"graph {what}", name=quoted(value.name), **fields)


def _type_problem(type_proto: onnx.TypeProto, what: str) -> tuple[str, dict[str, object]] | None:
    if not type_proto.HasField("tensor_type"):
        return None
    tensor_type = type_proto.tensor_type
    if tensor_type.elem_type not in _ELEM_TYPES:
        return "bad-elem-type", {"dtype": tensor_type.elem_type}
    dims = [d.dim_value for d in tensor_type.shape.dim if d.HasField("dim_value")]
    count = math.prod(d for d in dims if d > 0)
    if count >= 1 << 62:  # (said in a short line: thousands of dims, a count str() may refuse to write)
        shown = str(dims) if len(dims) <= 8 else f"[{', '.join(map(str, dims[:4]))}, ... ({len(dims):,} dims)]"
        return "too-many-elements", {"dims": shown, "count": f"2^{count.bit_length() - 1} or more"}
    if what == "input" and tensor_type.elem_type in _INT_TYPES and len(tensor_type.shape.dim) == 1 \
            and count > LONGEST_INT_VECTOR:
        return "long-int-vector", {"length": count, "limit": LONGEST_INT_VECTOR}
    return None


def _check_bodies(nodes: Iterable[onnx.NodeProto], where: str) -> None:
    """Raise where a control-flow node lacks a body graph, holds it in an attribute of another type, or holds a
    body whose inputs and outputs do not match the node's."""
    for position, node in enumerate(nodes):
        required = _BODIES.get(node.op_type) if node.domain in _STANDARD else None
        if required is None:
            continue
        name = quoted(node.name or f"{node.op_type}_{position}")
        attributes = {a.name: a for a in node.attribute}
        for attribute_name in required:
            attribute = attributes.get(attribute_name)
            if attribute is None:
                raise _fail(where, "graph-attribute", node=name, op_type=node.op_type,
                            attribute=quoted(attribute_name), problem="is missing")
            if attribute.type != AttributeProto.GRAPH:
                kind = AttributeProto.AttributeType.Name(attribute.type) \
                    if attribute.type in AttributeProto.AttributeType.values() else str(attribute.type)
                raise _fail(where, "graph-attribute", node=name, op_type=node.op_type,
                            attribute=quoted(attribute_name), problem=f"must be a graph (GRAPH), not {kind}")
            body = attribute.g
            outputs = len(node.output)
            if node.op_type == "If" and len(body.output) != outputs:
                raise _fail(where, "body-arity", node=name, op_type=node.op_type, attribute=quoted(attribute_name),
                            actual=len(body.output), part="outputs", expected=outputs)
            if node.op_type == "Loop":
                carried = max(len(node.input) - 2, 0)
                if len(body.input) != 2 + carried:
                    raise _fail(where, "body-arity", node=name, op_type="Loop", attribute="'body'",
                                actual=len(body.input), part="inputs", expected=2 + carried)
                if len(body.output) != 1 + outputs:
                    raise _fail(where, "body-arity", node=name, op_type="Loop", attribute="'body'",
                                actual=len(body.output), part="outputs", expected=1 + outputs)
