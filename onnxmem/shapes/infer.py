"""Running ONNX's shape inference on a light copy of the model (Constant nodes folded, fused operators as their
standard forms, dims named or bound), and collecting the types it finds; onnxruntime's symbolic inference as the
last resort for contrib operators."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping

import numpy
import onnx
from google.protobuf.message import Message
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, ValueInfoProto

from onnxmem.errors import quoted
from onnxmem.ir.dtypes import dtype_name
from onnxmem.ir.graph import body_graphs
from onnxmem.ir.load import initializer_type
from onnxmem.ir.tensor_types import Dim, TensorType, TypeDecoder, decode_type
from onnxmem.shapes.dims import InputDim
from onnxmem.shapes.rules import SHAPE_RULES, rule_key
from onnxmem.shapes.values import _constant_value, _is_shape_constant, _is_small_constant, _shape_values
from onnxmem.targets.ort.tables import ALL_ATTRIBUTES, CONTROL_FLOW, SHAPE_AS
from onnxmem.views.report import Warning

# Each round sizes one more layer of shape values that a size found in the round before gates (a fused operator's
# output; a Reshape to [batch, -1, ...] of a tensor sized by a computed shape: ShuffleNetV2's 16 channel shuffles
# are a chain of 16). The rounds stop as soon as one learns nothing new; this bounds a graph that keeps learning.
_REST_ROUNDS = 64


def declared_types(model: ModelProto) -> dict[str, TensorType]:
    """Give the types the model itself declares (inputs, outputs, value_info, initializers), inferring nothing."""
    return _collect_types(model.graph, TypeDecoder())


def _fold_constant_nodes(graph: GraphProto) -> None:
    """Turn the graph's Constant nodes into initializers, in place (the copy given to inference only); a value too
    large to be a shape value whose data the model holds (not a header: ir.embedded keeps numbers written one by one
    whole) into a typed graph input, as _slim_graph does to such an initializer: its data is not copied."""
    values = [(i, _constant_value(n) if _is_small_constant(n) else _constant_input(n))
              for i, n in enumerate(graph.node) if n.op_type == "Constant"]
    folded = {i: tensor for i, tensor in values if isinstance(tensor, TensorProto)}
    typed = {i: value for i, value in values if isinstance(value, ValueInfoProto)}
    if not folded and not typed:
        return
    kept = [n for i, n in enumerate(graph.node) if i not in folded and i not in typed]
    graph.initializer.extend(folded.values())
    graph.input.extend(typed.values())
    del graph.node[:]
    graph.node.extend(kept)
    # an initializer's own type is exact; a declaration of the same name (exporters declare Constant outputs,
    # often with no shape) would override it in inference
    names = {tensor.name for tensor in folded.values()} | {value.name for value in typed.values()}
    if any(v.name in names for v in graph.value_info):
        declared = [v for v in graph.value_info if v.name not in names]
        del graph.value_info[:]
        graph.value_info.extend(declared)


def _constant_input(node: onnx.NodeProto) -> TensorProto | ValueInfoProto | None:
    """Give a large Constant's value as what inference reads of it: the value itself where it is a header (its
    data in a file), else a graph input of its type (its data, held in the model, is not copied)."""
    attr = node.attribute[0] if len(node.attribute) == 1 else None
    if attr is None or node.domain not in ("", "ai.onnx") or not node.output:
        return _constant_value(node)
    if attr.name == "value" and attr.t.data_location != TensorProto.EXTERNAL:
        return onnx.helper.make_tensor_value_info(node.output[0], attr.t.data_type, list(attr.t.dims))
    if attr.name in ("value_ints", "value_floats"):
        dtype = TensorProto.INT64 if attr.name == "value_ints" else TensorProto.FLOAT
        return onnx.helper.make_tensor_value_info(node.output[0], dtype, [len(attr.ints) + len(attr.floats)])
    return _constant_value(node)


def _prepared(model: ModelProto, free: list[InputDim], bound: Mapping[str, int]) -> ModelProto:
    """Give the copy of the model that inference reads: Constant nodes as initializers, fused operators as their
    standard forms, every free input dim named, and the `bound` ones substituted; at IR version 4 at least."""
    light = _shape_only_copy(model)
    light.ir_version = inference_ir_version(model.ir_version)
    _fold_constant_nodes(light.graph)
    _standardize_fused_ops(light.graph)
    _name_unnamed_dims(light.graph, free)
    _substitute(light.graph, bound)
    return light


def _inferred(light: ModelProto | bytes, data_prop: bool, known: ModelProto | None = None) -> ModelProto:
    """Give ONNX's inference of `light`, with data propagation where asked; `known`, an inference of the same
    graph (with or without data propagation, an earlier round's) where the caller has one: the model ONNX gives
    is then made without the values of long vectors that no shape reads (_propagated)."""
    if data_prop and isinstance(light, ModelProto):
        return _propagated(light, known)
    return onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=data_prop)


# ONNX's data propagation (onnx 1.23: DataPropagationContextImpl::getInputData) gives a rank-1 tensor of known
# length N that it has no value for, read by an operator that propagates values (DATA_PROPAGATING_OPS), a value of
# N unknown numbers, and keeps every value it makes until the inference ends: the routing of an MoE block
# (tokens x top-k indices through Cast, Mul, Concat, ...) held 1.6 GB of them in one inference of a Mixtral-8x7B
# export at batch 7 (benchmarks/hf_config.py). A value changes a type only where an operator's inference reads an
# input as a shape (getShapeInput: SHAPE_READ_INPUTS, every opset of ONNX's domain), through operators that
# propagate values; _propagated leaves out the operators on long vectors whose values reach none.
DATA_PROPAGATING_OPS = frozenset({"Add", "Cast", "Concat", "Gather", "Mul", "Shape", "Size", "Slice", "Squeeze",
                                  "Sub", "Unsqueeze"})
SHAPE_READ_INPUTS = {"Reshape": 1, "Expand": 1, "ConstantOfShape": 0, "Resize": 3, "AffineGrid": 1}
LONG_UNREAD_VALUE = 1024  # the shortest vector whose value _propagated does not let ONNX make
LONG_UNREAD_NUMBERS = 1 << 22  # the fewest numbers (of about 70 bytes each in ONNX) worth a second inference


@functools.cache
def _propagation_as_known() -> bool:
    """Say whether the installed ONNX propagates values through DATA_PROPAGATING_OPS and no other operator (a
    later version that propagates more may read values where _propagated does not look: it then leaves none out)."""
    return frozenset(s.name for s in onnx.defs.get_all_schemas_with_history()
                     if s.domain == "" and s.has_data_propagation_function) == DATA_PROPAGATING_OPS


@functools.cache
def _enters_no_function(op_type: str, version: int) -> bool:
    """Say whether ONNX's inference of the operator at that opset enters no function body (whose nodes data
    propagation would enter too): it has an inference function of its own, or no schema (ONNX infers nothing for
    it: onnxruntime's Memcpy copies)."""
    try:
        schema = onnx.defs.get_schema(op_type, version, "")
    except onnx.defs.SchemaError:
        return True
    return bool(schema.has_type_and_shape_inference_function)


def _static(type_proto: onnx.TypeProto | None) -> bool:
    return type_proto is not None and type_proto.HasField("tensor_type") and \
        type_proto.tensor_type.HasField("shape") and \
        all(d.HasField("dim_value") for d in type_proto.tensor_type.shape.dim)


def _unread_long_values(light: ModelProto, known: ModelProto) -> list[int]:
    """Give the nodes (indices, in order) whose values ONNX's data propagation would make from a vector of more
    than LONG_UNREAD_VALUE numbers and no shape reads: operators that propagate values, none of whose values reach
    a shape input (SHAPE_READ_INPUTS) through such operators, of one output that `known` (an inference of the
    graph) sizes in full; none where they would hold fewer than LONG_UNREAD_NUMBERS numbers, or in a graph of
    operators beyond ONNX's own inference (another domain, a subgraph, a function)."""
    types = {v.name: v.type for v in (*known.graph.value_info, *known.graph.output, *known.graph.input)}
    longest = {name: t.tensor_type.shape.dim[0].dim_value for name, t in types.items()
               if len(t.tensor_type.shape.dim) == 1 and t.tensor_type.shape.dim[0].dim_value > LONG_UNREAD_VALUE}
    graph = light.graph
    version = next((o.version for o in light.opset_import if o.domain in ("", "ai.onnx")), None)
    if not longest or version is None or light.functions or not _propagation_as_known():
        return []
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type in CONTROL_FLOW or \
                not _enters_no_function(node.op_type, version):
            return []
        for out in node.output:
            if out in producer:
                return []
            producer[out] = i
    reaching: set[int] = set()  # the nodes whose values may reach a shape input
    stack = [n.input[k] for n in graph.node if (k := SHAPE_READ_INPUTS.get(n.op_type, -1)) >= 0 and k < len(n.input)]
    while stack:
        i = producer.get(stack.pop(), -1)
        if i < 0 or i in reaching or graph.node[i].op_type not in DATA_PROPAGATING_OPS:
            continue
        reaching.add(i)
        if graph.node[i].op_type not in ("Shape", "Size"):  # (they read their input's type, not its value)
            stack.extend(graph.node[i].input)
    taken = {v.name for v in (*graph.input, *graph.output)} | {t.name for t in graph.initializer}
    unread, numbers = [], 0
    for i, node in enumerate(graph.node):
        if node.op_type not in DATA_PROPAGATING_OPS or node.op_type in ("Shape", "Size") or i in reaching or \
                len(node.output) != 1 or node.output[0] in taken or not _static(types.get(node.output[0])):
            continue
        length = max((longest.get(name, 0) for name in node.input), default=0)
        if length:
            unread.append(i)
            numbers += length
    return unread if numbers >= LONG_UNREAD_NUMBERS else []


def _holds_long_size(values: Iterable[TensorProto]) -> bool:
    """Say whether an integer value holds a number above LONG_UNREAD_VALUE (a size that may make a vector that
    long known)."""
    return any(t.data_type in (TensorProto.INT64, TensorProto.INT32) and
               bool((abs(onnx.numpy_helper.to_array(t)) > LONG_UNREAD_VALUE).any()) for t in values)


def _propagated(light: ModelProto, known: ModelProto | None) -> ModelProto:
    """Give onnx.shape_inference.infer_shapes(light, data_prop=True), the same model, making no value of a long
    vector that no shape reads (_unread_long_values): those nodes are left out of the inference and their outputs
    entered as inputs of the type they have without data propagation; the types ONNX gives their outputs from the
    inputs this inference found are checked to be those, with no dim ONNX names (so every 'unk__N' it names falls
    as in the whole inference), and the nodes and their types put back where ONNX writes them. Where the check
    fails, the whole graph is inferred with data propagation."""
    def whole() -> ModelProto:
        return onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)

    unread = [] if known is None else _unread_long_values(light, known)
    if not unread:
        return whole()
    assert known is not None
    graph, left_out = light.graph, set(unread)
    entered = {v.name: v.type for v in (*known.graph.value_info, *known.graph.output)}
    made = [graph.node[i].output[0] for i in unread]
    part = _copy(light)
    del part.graph.node[:]
    part.graph.node.extend(n for i, n in enumerate(graph.node) if i not in left_out)
    part.graph.input.extend(ValueInfoProto(name=name, type=entered[name]) for name in made)
    inferred = onnx.shape_inference.infer_shapes(part, check_type=False, strict_mode=False, data_prop=True)
    found = {v.name: v.type for v in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input)}
    if not _infer_alone_as(light, unread, found, entered):
        return whole()
    # back as ONNX writes them: declared values in place, the ones it adds in the order of the nodes
    declared = len(graph.value_info)
    del inferred.graph.input[len(graph.input):]
    kept = set(made)
    for value in inferred.graph.value_info[:declared]:
        if value.name in kept:  # (left as declared: the whole inference merges what the node gives into it)
            value.type.CopyFrom(entered[value.name])
    added = {v.name: v for v in inferred.graph.value_info[declared:]}
    named = {v.name for v in graph.value_info}
    order: list[ValueInfoProto] = []
    for i, node in enumerate(graph.node):
        for out in node.output:
            if i in left_out:
                if out not in named:
                    order.append(ValueInfoProto(name=out, type=entered[out]))
            elif out in added:
                order.append(added.pop(out))
    if added:
        return whole()  # (a value no node makes: not the graph this was written for)
    del inferred.graph.value_info[declared:]
    inferred.graph.value_info.extend(order)
    del inferred.graph.node[:]
    inferred.graph.node.extend(graph.node)
    return inferred


def _infer_alone_as(light: ModelProto, nodes: list[int], found: Mapping[str, onnx.TypeProto],
                    entered: Mapping[str, onnx.TypeProto]) -> bool:
    """Say whether ONNX's inference gives the outputs of `nodes`, their inputs of the `found` types, the `entered`
    types: with the model's declarations of them (as the whole inference merges them) and without (what its
    inference alone gives: sized in full, so it names no dim)."""
    graph = light.graph
    made = {graph.node[i].output[0] for i in nodes}
    alone = ModelProto()
    alone.CopyFrom(_without_initializers(light))
    alone.ir_version = light.ir_version
    alone.graph.node.extend(graph.node[i] for i in nodes)
    initializers = {t.name: t for t in graph.initializer}
    inputs = {v.name: v for v in graph.input}
    constants = {n.output[0]: n for n in graph.node if n.op_type == "Constant" and len(n.output) == 1}
    for name in dict.fromkeys(name for i in nodes for name in graph.node[i].input):
        if not name or name in made:
            continue
        if name in constants:  # (its value is read as an initializer's)
            alone.graph.node.insert(0, constants[name])
        elif name in initializers:
            alone.graph.initializer.append(initializers[name])
            if name in inputs:
                alone.graph.input.append(inputs[name])
        elif name in found:
            alone.graph.input.append(ValueInfoProto(name=name, type=found[name]))
        else:
            return False
    bare = onnx.shape_inference.infer_shapes(alone, check_type=False, strict_mode=False, data_prop=False)
    alone.graph.value_info.extend(v for v in graph.value_info if v.name in made)
    merged = onnx.shape_inference.infer_shapes(alone, check_type=False, strict_mode=False, data_prop=False)
    bare_types = {v.name: v.type for v in bare.graph.value_info}
    merged_types = {v.name: v.type for v in merged.graph.value_info}
    return all(bare_types.get(name) == entered[name] == merged_types.get(name) for name in made)


def _declared_message() -> type[Message]:
    """Give a protobuf message class that reads a serialized ModelProto's graph inputs, outputs and value_info,
    each as its name and its TypeProto's bytes, and skips the rest (its nodes above all) unparsed."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name="onnxmem_declared.proto", package="onnxmem_declared",
                                              syntax="proto2")
    value = file.message_type.add(name="Value")  # ValueInfoProto: name = 1, type = 2 (its bytes, not parsed)
    value.field.add(name="name", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=1)
    value.field.add(name="type", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES, label=1)
    graph = file.message_type.add(name="Graph")  # GraphProto: input = 11, output = 12, value_info = 13
    for name, number in (("input", 11), ("output", 12), ("value_info", 13)):
        graph.field.add(name=name, number=number, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                        label=3, type_name=".onnxmem_declared.Value")
    model = file.message_type.add(name="Model")  # ModelProto: graph = 7
    model.field.add(name="graph", number=7, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE, label=1,
                    type_name=".onnxmem_declared.Graph")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("onnxmem_declared.Model"))


_DECLARED: list[type[Message]] = []  # the class above, made at first use


def inferred_declared_types(data: bytes, decode: TypeDecoder) -> dict[str, TensorType]:
    """Give the types ONNX's inference (no data propagation) finds for the values the serialized model's main graph
    declares (inputs, outputs, value_info; not its initializers, nor a subgraph's), reading none of its nodes:
    the same as _collect_types(_inferred(data).graph, initializers=False, subgraphs=False), without parsing the
    100k nodes of a large graph back into Python. Raises what ONNX's inference raises."""
    from onnx.onnx_cpp2py_export import shape_inference

    if not _DECLARED:
        _DECLARED.append(_declared_message())
    graph = _DECLARED[0].FromString(shape_inference.infer_shapes(data, False, False, False)).graph
    types: dict[str, TensorType] = {}
    decoded = decode.decoded
    for values in (graph.input, graph.output, graph.value_info):
        for value in values:
            key = value.type  # a TypeProto's bytes: the key TypeDecoder makes
            found = decoded.get(key)
            if found is None:
                found = decoded[key] = decode_type(onnx.TypeProto.FromString(key))
            types[value.name] = found
    return types


# The longest vector ONNX's data propagation may build (a shape value is a few numbers; a Range of a bound sequence
# length, or of a constant 2^40, is not one, and propagating it takes memory without bound). ONNX 1.23 expands a
# rank-1 tensor of any element type, not only an integer one: Add, Mul, Cast or Concat of a float vector input of 2^25
# values built 4.6-7.3 GB (benchmarks/hostile_corpus.py, data propagation).
LONGEST_PROPAGATED_VECTOR = 1 << 20


def _bounded_inference(light: ModelProto, data_prop: bool, warnings: list[Warning]) -> tuple[ModelProto, bool]:
    """Give ONNX's inference of `light`, with data propagation where asked and bounded: inferred first without it,
    and where a vector (a rank-1 tensor of any element type: a value, an initializer, a folded Constant, in any
    graph at any depth) of more than LONGEST_PROPAGATED_VECTOR values shows, without it (a named warning); and
    whether data propagation ran (or was not needed: the first inference sized every output of a graph of standard
    operators, its subgraphs' too, which is what it would find: _sized_everywhere)."""
    if not data_prop:
        return _inferred(light, False), False
    plain = _inferred(light, False)
    long = _long_vector(plain.graph)
    if long is not None:
        name, length, dtype = long
        kind = "integer" if dtype in (TensorProto.INT64, TensorProto.INT32) else dtype_name(dtype)
        warnings.append(Warning(
            "long-shape-value", f"{kind} tensor {quoted(name)} holds {length:,} values: shape values "
            "are not propagated through the graph (sizes that depend on computed shapes may stay unknown)"))
        return plain, False
    if _sized_everywhere(plain.graph) or _reads_no_shape_value(light):
        return plain, True  # every output sized, or no size read from a value: propagating them finds the same
    return _inferred(light, True, plain), True


def _reads_no_shape_value(light: ModelProto) -> bool:
    """Say whether no node of the model, in any graph at any depth, reads a shape from an input that is not a
    constant of its graph (SHAPE_READ_INPUTS: the one place ONNX's inference reads a propagated value), and no node
    enters a function body (whose nodes data propagation would enter too): ONNX's inference with data propagation
    then gives the model it gives without (an If whose branches' outputs differ, a Slice in a branch of the outer
    graph's constants). False for an ONNX that propagates values through other operators (_propagation_as_known)."""
    version = next((o.version for o in light.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is None or light.functions or not _propagation_as_known():
        return False
    stack = [light.graph]
    while stack:
        current = stack.pop()
        constants = {t.name for t in current.initializer}
        for node in current.node:
            if node.domain not in ("", "ai.onnx"):
                continue  # (ONNX has no inference for another domain's operator: it reads nothing)
            slot = SHAPE_READ_INPUTS.get(node.op_type, -1)
            if 0 <= slot < len(node.input) and node.input[slot] and node.input[slot] not in constants:
                return False
            if node.op_type in CONTROL_FLOW:
                stack.extend(body_graphs(node))
            elif not _enters_no_function(node.op_type, version):
                return False
    return True


def _long_vector(graph: GraphProto) -> tuple[str, int, int] | None:
    """Give the first vector of more than LONGEST_PROPAGATED_VECTOR values the graph declares or holds (its
    values, then its initializers, then its subgraphs' at every depth) as (name, length, element type), or None.
    Its dims only are read, never its data."""
    stack = [graph]
    while stack:
        current = stack.pop()
        for value in _value_infos(current):
            tensor = value.type.tensor_type
            if len(tensor.shape.dim) == 1 and tensor.shape.dim[0].dim_value > LONGEST_PROPAGATED_VECTOR:
                return value.name, tensor.shape.dim[0].dim_value, tensor.elem_type
        for initializer in current.initializer:
            if len(initializer.dims) == 1 and initializer.dims[0] > LONGEST_PROPAGATED_VECTOR:
                return initializer.name, initializer.dims[0], initializer.data_type
        for node in current.node:
            if node.op_type in CONTROL_FLOW:
                stack.extend(body_graphs(node))
    return None


def _sized_everywhere(graph: GraphProto) -> bool:
    """Say whether every output of every node of the graph, its subgraphs' at every depth included, has a static
    shape, and every node is a standard operator (whose inference data propagation could only make more exact)."""
    stack = [graph]
    while stack:
        current = stack.pop()
        if _has_unknown_outputs(current):
            return False
        for node in current.node:
            if node.domain not in ("", "ai.onnx"):
                return False
            if node.op_type in CONTROL_FLOW:
                stack.extend(body_graphs(node))
    return True


def _infer(model: ModelProto, free: list[InputDim], bound: Mapping[str, int],
           warnings: list[Warning], data_prop: bool = True) -> dict[str, TensorType]:
    light = _prepared(model, free, bound)
    try:
        inferred, data_prop = _bounded_inference(light, data_prop, warnings)
    except Exception as exc:  # onnx raises several types here; any of them means "no inference"
        warnings.append(Warning("shape-inference-failed", f"ONNX shape inference failed: {_one_line(exc)}"))
        return _collect_types(light.graph, TypeDecoder())
    ruled = any(has_rule(n) for n in light.graph.node)
    if _has_unknown_outputs(inferred.graph) and ruled:
        inferred = _rule_rounds(light, inferred, data_prop)
    if _has_custom_domains_without_rule(inferred) and _has_unknown_outputs(inferred.graph):
        inferred = _ort_symbolic_inference(inferred, warnings)  # the last resort (see rules.shapes)
        return _collect_types(inferred.graph, TypeDecoder())
    types = _collect_types(inferred.graph, TypeDecoder())
    if data_prop and _has_unknown_outputs(inferred.graph):
        # shape values ONNX's data propagation does not carry (see _shape_values), computed and given back; the
        # shape rules again after each round, as a fused operator may read what a shape value sized
        decoded: dict[str, numpy.ndarray | None] = {}  # (the initializers' arrays, read once over the rounds)
        for _ in range(_REST_ROUNDS):
            initializers = {t.name: t for t in light.graph.initializer}
            fresh = list(_shape_values(list(light.graph.node), initializers, types, given=False,
                                       decoded=decoded).values())
            if not fresh:
                break  # (the rules ran on what the last round learned, below)
            light.graph.initializer.extend(fresh)
            try:  # (a fresh size may make long vectors known: an MoE's routing of tokens x top-k by a TopK's k)
                known = _inferred(light, False) if _holds_long_size(fresh) else inferred
            except Exception:  # noqa: BLE001 - it only chooses what data propagation may leave out
                known = inferred
            try:
                inferred = _inferred(light, True, known)
            except Exception:  # noqa: BLE001 - keep what the first inference found
                break
            if ruled and _has_unknown_outputs(inferred.graph):
                inferred = _rule_rounds(light, inferred, data_prop)
            types = _collect_types(inferred.graph, TypeDecoder())
            if not _has_unknown_outputs(inferred.graph):
                break
    return types


def rule_value_infos(nodes: Iterable[onnx.NodeProto], types: dict[str, TensorType],
                     skip: set[str] | None = None) -> list[ValueInfoProto]:
    """Give the output types the shape rules (rules.shapes.SHAPE_RULES) tell for nodes whose outputs are not known,
    in node order; `types` takes each (so a chain of fused operators is typed in one pass). An input dim ONNX named
    'unk__N' is unknown to a rule. `skip`: outputs not to give again."""
    learned: list[ValueInfoProto] = []
    decode = TypeDecoder()
    for node in nodes:
        rule = SHAPE_RULES.get(rule_key(node.op_type, node.domain))
        if rule is None or all(not out or _all_numbers(types.get(out)) for out in node.output):
            continue
        inputs: list[tuple[int, tuple[Dim, ...]] | None] = []
        for name in node.input:
            found = types.get(name) if name else None
            if found is None or found[1] is None or not found[0]:
                inputs.append(None)
            else:
                inputs.append((found[0], tuple(None if isinstance(d, str) and d.startswith("unk__") else d
                                               for d in found[1])))
        try:
            outputs = rule(inputs, {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute})
        except (ArithmeticError, TypeError, ValueError, IndexError):  # attributes a rule cannot read: no type
            continue
        for name, out in zip(node.output, outputs, strict=False):
            if not name or out is None or (skip is not None and name in skip):
                continue
            before = types.get(name)
            if _is_known(before):
                # a declared name the rule computes a number for (a TorchScript export names the dims it was not
                # told are dynamic 'Conv<output>_dim_2'): the number, as ONNX's inference merges a dim; else kept
                out = _merged(before, out)  # type: ignore[arg-type]
                if out is None:
                    continue
            value = onnx.helper.make_tensor_value_info(name, out[0], list(out[1]))
            found = decode(value.type)
            if types.get(name) == found:
                continue  # (learned before: a rule gives an output again only when its inputs say more)
            learned.append(value)
            types[name] = found
    return learned


def has_rule(node: onnx.NodeProto) -> bool:
    """Say whether a node's operator has a shape rule (rules.shapes.SHAPE_RULES)."""
    return rule_key(node.op_type, node.domain) in SHAPE_RULES


def _all_numbers(t: TensorType | None) -> bool:
    return t is not None and t[1] is not None and all(isinstance(d, int) for d in t[1])


def _merged(declared: TensorType, ruled: tuple[int, tuple[Dim, ...]]) -> tuple[int, tuple[Dim, ...]] | None:
    """Give the declared type with each named dim the rule gives a number for taking that number (ONNX's
    mergeInDimensionInfo), or None where the rule adds nothing to it (or disagrees on its rank)."""
    shape = declared[1]
    assert shape is not None
    if len(shape) != len(ruled[1]) or not any(isinstance(d, str) and isinstance(r, int)
                                               for d, r in zip(shape, ruled[1], strict=True)):
        return None
    return declared[0], tuple(r if isinstance(d, str) and isinstance(r, int) else d
                              for d, r in zip(shape, ruled[1], strict=True))


def _is_known(t: TensorType | None) -> bool:
    return t is not None and t[1] is not None and all(
        isinstance(d, int) or (isinstance(d, str) and not d.startswith("unk__")) for d in t[1])


_RULE_ROUNDS = 128  # each round types the rule operators the last inference reached: one per standard barrier


def _rule_rounds(light: ModelProto, inferred: ModelProto, data_prop: bool) -> ModelProto:
    """Give ONNX's inference of `light` with the outputs the shape rules tell added to it, round by round (each
    round types every rule operator whose inputs are known, then ONNX's inference carries them on), until a round
    learns nothing."""
    nodes = [n for n in light.graph.node if has_rule(n)]
    for _ in range(_RULE_ROUNDS):
        types = _collect_types(inferred.graph, TypeDecoder())
        learned = rule_value_infos(nodes, types)
        if not learned:
            break
        # an output learned again (its inputs say more now) replaces what was learned of it before
        names = {v.name for v in learned}
        if any(v.name in names for v in light.graph.value_info):
            kept = [v for v in light.graph.value_info if v.name not in names]
            del light.graph.value_info[:]
            light.graph.value_info.extend(kept)
        light.graph.value_info.extend(learned)
        try:
            inferred = _inferred(light, data_prop, inferred)
        except Exception:  # noqa: BLE001 - keep what the rounds before found
            break
    return inferred


def _copy(model: ModelProto) -> ModelProto:
    copy = ModelProto()
    copy.CopyFrom(model)
    return copy


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
            continue  # a standard operator holds no graph (reading every node's attributes is costly)
        for sub in body_graphs(node):
            _collect_types(sub, decode, types)
    return types


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


_STANDARD_DOMAIN_SHAPE_AS = frozenset(key[2:] for key in SHAPE_AS if key.startswith("::"))


def _standardize_fused_ops(graph: GraphProto) -> None:
    # The copy given to inference only: the graph the passes read keeps every node as it is.
    for node in graph.node:
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type not in _STANDARD_DOMAIN_SHAPE_AS:
            continue  # the fused operators are all in onnxruntime's domains (and its Memcpy copies in ONNX's)
        rule = SHAPE_AS.get(f"{'' if standard else node.domain}::{node.op_type}")
        if rule is None:
            continue
        op_type, inputs, dropped = rule
        if op_type == "MatMul" and any(a.name.startswith("trans") and a.i for a in node.attribute):
            continue  # a transposing FusedMatMul is not a MatMul's shape: left for onnxruntime's inference
        kept = [] if ALL_ATTRIBUTES in dropped else [a for a in node.attribute if a.name not in dropped]
        del node.attribute[:]
        node.attribute.extend(kept)
        del node.input[inputs:]
        node.op_type, node.domain = op_type, ""


# Below IR version 4 an initializer is a graph input's default value, and ONNX's inference ignores one the graph
# does not list as an input, where onnxruntime (and its optimizers, which add such initializers to IR 3 models at
# basic and extended) treats every initializer as a known tensor: inference reads such a model as IR version 4.
MIN_INFERENCE_IR_VERSION = 4


def inference_ir_version(version: int) -> int:
    """Give the IR version inference reads a model of `version` as (see MIN_INFERENCE_IR_VERSION)."""
    return max(version, MIN_INFERENCE_IR_VERSION)


def _without_initializers(model: ModelProto) -> ModelProto:
    shell = ModelProto()
    shell.ir_version = inference_ir_version(model.ir_version)
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


def _has_custom_domains_without_rule(model: ModelProto) -> bool:
    """Say whether a node of a domain beyond ONNX's has an output unknown and no shape rule."""
    known = {v.name for v in _value_infos(model.graph) if _is_static(v)}
    return any(node.domain not in ("", "ai.onnx") and not has_rule(node) and
               any(out and out not in known for out in node.output) for node in model.graph.node)


def _ort_symbolic_inference(model: ModelProto, warnings: list[Warning]) -> ModelProto:
    # onnxruntime's symbolic shape inference knows the com.microsoft contrib ops that ONNX's does not.
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError as exc:  # onnxruntime, or the sympy its symbolic inference needs
        warnings.append(Warning(
            "contrib-shapes",
            "the model has non-standard operators that ONNX shape inference does not know, and onnxruntime's "
            f"symbolic shape inference cannot run ({_one_line(exc)}): pip install \".[cpu]\" in a clone of onnxmem "
            "(its extra onnxmem[cpu])",
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
