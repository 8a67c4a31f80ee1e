"""Model transforms for what-ifs: a what-if is the same analysis run on a changed model, so its figure is what
`onnxmem report` says of that model."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Container, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, numpy_helper

from onnxmem.ir.dtypes import tensor_bytes
from onnxmem.ir.load import LoadedModel
from onnxmem.ir.tensor_types import Dim, TensorType, decode_type
from onnxmem.targets.ort.cpu.kernels import CPU_FLOAT16_KERNELS
from onnxmem.targets.ort.planner import declared_dim_names, runtime_view

if TYPE_CHECKING:
    from onnxmem.passes.pipeline import Sizing

# The onnxruntime execution providers a report can assume. What differs between them in a report: the Casts the CPU
# provider inserts around operators without a float16 kernel (cpu_float16_casts); the nodes the CUDA provider leaves
# on the CPU, the Memcpy copies it inserts and its kernels' in-place rules (cuda_placement, rules.cuda: from
# onnxruntime's source, not measured).
PROVIDERS = ("cuda", "cpu")
DEFAULT_PROVIDER = "cuda"

# The name onnxruntime's InsertCastTransformer gives the Casts it adds (AddCastNode: "InsertedPrecisionFreeCast_"
# and the cast tensor's name); the transform names its Casts so. Onnxruntime adds them after the model's nodes,
# so their node indices come after every other's: its execution order ranks them so (schedule.ort_order).
INSERTED_CAST_PREFIX = "InsertedPrecisionFreeCast_"
# Inputs the operator's schema types as float32 whatever the data's type (a Resize's roi and scales): kept so.
FLOAT_ONLY_INPUTS: dict[str, tuple[int, ...]] = {"Resize": (1, 2), "Upsample": (1,)}
# Attributes that name an output's element type.
DTYPE_ATTRIBUTES: dict[str, str] = {"Cast": "to", "RandomNormal": "dtype", "RandomUniform": "dtype",
                                    "RandomNormalLike": "dtype", "RandomUniformLike": "dtype", "EyeLike": "dtype",
                                    "Multinomial": "dtype", "Bernoulli": "dtype"}
# Initializers up to this many elements keep their values (converted): shape inference may read them. Larger
# ones keep their type and dims only (no analysis reads a weight's values).
_CONVERT_VALUES_UP_TO = 4096
# Initializers up to this many elements are read by the provider transform's shape inference (axes, shapes).
_INFERENCE_VALUES_UP_TO = 64


def half_precision_sizing(sized: Sizing) -> Sizing | None:
    """Give the Sizing of the half_precision model without analysing it again: the same shapes (an element type
    changes no shape), every float32 tensor but the float32-only operands as float16, its bytes halved. None where
    the graph holds subgraphs, whose tensors are sized apart (analyse half_precision(model) instead).

    For the inference passes (a training step re-sized at a micro-batch would read the float32 model)."""
    graph = sized.graph
    if any(op.subgraphs for op in graph.ops):
        return None
    kept = _float_only_names(sized.loaded.proto.graph)
    dtypes: list[int] = []
    nbytes: list[int | None] = []
    for t in graph.tensors:
        if t.dtype == TensorProto.FLOAT and t.name not in kept:
            dtypes.append(int(TensorProto.FLOAT16))
            dims = [d for d in t.shape or () if isinstance(d, int)]
            count = math.prod(dims) if t.shape is not None and len(dims) == len(t.shape) else None
            nbytes.append(None if t.nbytes is None or count is None else tensor_bytes(TensorProto.FLOAT16, count))
        else:
            dtypes.append(t.dtype)
            nbytes.append(t.nbytes)
    halved = graph.with_sizes([t.shape for t in graph.tensors], nbytes, dtypes)
    return dataclasses.replace(sized, graph=halved)


def half_precision(loaded: LoadedModel) -> LoadedModel:
    """Give the model with every float32 tensor stored as float16: inputs, outputs, declared values, weights,
    constants and the element types that Cast and generators name (float32-only operands are kept)."""
    model = ModelProto()
    model.CopyFrom(_shell(loaded.proto))
    _half_graph(loaded.proto.graph, model.graph)
    return dataclasses.replace(loaded, proto=model, data=None)  # (the bytes read are the unchanged model)


def _shell(model: ModelProto) -> ModelProto:
    shell = ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(shell, field, getattr(model, field))
    shell.opset_import.extend(model.opset_import)
    shell.functions.extend(model.functions)
    shell.metadata_props.extend(model.metadata_props)
    return shell


def _float_only_names(graph: GraphProto) -> set[str]:
    """Give the names of the tensors the graph's nodes read as float32-only operands (FLOAT_ONLY_INPUTS)."""
    return {node.input[i] for node in graph.node for i in FLOAT_ONLY_INPUTS.get(node.op_type, ())
            if node.domain in ("", "ai.onnx") and i < len(node.input) and node.input[i]}


def _half_graph(source: GraphProto, target: GraphProto) -> None:
    kept = _float_only_names(source)
    target.name = source.name
    for values, into in ((source.input, target.input), (source.output, target.output),
                         (source.value_info, target.value_info)):
        for value in values:
            copy = into.add()
            copy.CopyFrom(value)
            if copy.name not in kept:
                _half_type(copy.type)
    for tensor in source.initializer:
        target.initializer.append(tensor if tensor.name in kept else _half_tensor(tensor))
    for node in source.node:
        copy = target.node.add()
        copy.CopyFrom(node)
        if node.op_type == "Constant" and any(name in kept for name in node.output):
            continue  # a float32-only operand made by a Constant node stays float32
        for attr, original in zip(copy.attribute, node.attribute, strict=True):
            _half_attribute(node.op_type, attr, original)


def _half_attribute(op_type: str, attr: AttributeProto, original: AttributeProto) -> None:
    if attr.type == AttributeProto.GRAPH:
        attr.g.Clear()
        _half_graph(original.g, attr.g)
    elif attr.type == AttributeProto.GRAPHS:
        for sub, orig in zip(attr.graphs, original.graphs, strict=True):
            sub.Clear()
            _half_graph(orig, sub)
    elif attr.type == AttributeProto.TENSOR:  # Constant's value, ConstantOfShape's value
        attr.t.CopyFrom(_half_tensor(original.t))
    elif attr.type == AttributeProto.INT and DTYPE_ATTRIBUTES.get(op_type) == attr.name and attr.i == TensorProto.FLOAT:
        attr.i = TensorProto.FLOAT16
    elif op_type == "Constant" and attr.name in ("value_float", "value_floats"):
        values = [attr.f] if attr.name == "value_float" else list(attr.floats)
        shape = [] if attr.name == "value_float" else [len(values)]
        attr.Clear()
        attr.CopyFrom(onnx.helper.make_attribute("value", numpy_helper.from_array(
            numpy.array(values, dtype=numpy.float16).reshape(shape))))


def _half_type(type_proto: onnx.TypeProto) -> None:
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        inner = getattr(type_proto, kind)
        if inner.elem_type == TensorProto.FLOAT:
            inner.elem_type = TensorProto.FLOAT16
    elif kind == "sequence_type":
        _half_type(type_proto.sequence_type.elem_type)
    elif kind == "optional_type":
        _half_type(type_proto.optional_type.elem_type)


def _half_tensor(tensor: TensorProto) -> TensorProto:
    if tensor.data_type != TensorProto.FLOAT:
        return tensor
    count = 1
    for d in tensor.dims:
        count *= d
    if tensor.data_location != TensorProto.EXTERNAL and count <= _CONVERT_VALUES_UP_TO:
        half = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(numpy.float16), tensor.name)
        return half
    header = TensorProto()
    header.name = tensor.name
    header.dims.extend(tensor.dims)
    header.data_type = TensorProto.FLOAT16
    if tensor.data_location == TensorProto.EXTERNAL:
        header.data_location = TensorProto.EXTERNAL
        header.external_data.extend(tensor.external_data)
    return header


def has_float16(model: ModelProto) -> bool:
    """Say whether the model holds a float16 tensor anywhere it says so cheaply (its inputs, outputs, declared
    values, initializers, or a Cast to float16)."""
    graph = model.graph
    if any(t.data_type == TensorProto.FLOAT16 for t in graph.initializer):
        return True
    for values in (graph.input, graph.output, graph.value_info):
        if any(v.type.tensor_type.elem_type == TensorProto.FLOAT16 for v in values):
            return True
    return any(node.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.FLOAT16 for a in node.attribute)
               for node in graph.node)


def cpu_float16_casts(loaded: LoadedModel, types: Mapping[str, TensorType]) -> LoadedModel | None:
    """Give the model as onnxruntime's CPU provider runs it where float16 data meets an operator without a float16
    kernel (rules.kernels.CPU_FLOAT16_KERNELS).

    An ONNX operator with a function body (Softmax, Gelu, ...: the schema's body at the model's opset, built for
    the node's types where the body depends on them) is first replaced by that body, as the graph partitioner's
    InlineNodes does (core/framework/graph_partitioner.cc; Graph::InlineFunction: the body's Constants become
    initializers, its tensors are renamed '_inlfunc_<OpType>[_token_<n>]_<name>', its nodes are indexed after
    every node of the model, a body's own function ops again after those): see _inline_functions.
    Then every operator without a float16 kernel runs in float32, its float16 inputs cast to float32 (one Cast per
    tensor), its outputs cast back to float16 where a float16 reader or a graph output needs them
    (core/optimizer/insert_cast_transformer.cc: InsertCastTransformer, whose net effect after its
    RemoveDuplicateCastTransformer this is; an operator with a float16 kernel between two converted ones is
    converted too, as its ForceSingleNodeCPUFloat16ToFloat32 does), then the duplicate remover's work on the
    model's own Casts (_without_duplicate_casts). A converted node's float32 output is declared with the shape
    onnxruntime first infers for it (_first_output_shapes), which its planner compares. None where no operator
    needs a Cast. `types`: the model's tensor types (planner.infer_symbolic). The main graph only: a subgraph's
    nodes are left as they are (the caller says so)."""
    model = loaded.proto
    graph = model.graph
    versions = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    known = dict(types)

    def fp16(name: str) -> bool:
        return bool(name) and known.get(name, (0, None, None))[0] == TensorProto.FLOAT16

    kernels: dict[tuple[str, str], bool] = {}  # (op type, domain) -> _cpu_float16_kernel: asked once per kind

    def has_kernel(node: onnx.NodeProto) -> bool:
        kind = (node.op_type, node.domain)
        found = kernels.get(kind)
        if found is None:
            found = kernels[kind] = _cpu_float16_kernel(node, versions)
        return found

    def no_kernel(node: onnx.NodeProto) -> bool:
        return any(fp16(name) for name in node.input) and not has_kernel(node)

    # values shape inference reads, as onnxruntime's reads its constant initializers (small ones: axes, shapes)
    constants = {t.name: t for t in graph.initializer if t.data_location != TensorProto.EXTERNAL
                 and math.prod(t.dims) <= _INFERENCE_VALUES_UP_TO}
    memo: NodeMemo = {}  # (see _infer_node)
    inlined = _inline_functions(graph, versions, known, no_kernel, constants, memo)
    nodes = list(graph.node) if inlined is None else inlined.nodes
    has_fp16_input = [any(fp16(name) for name in node.input) for node in nodes]
    unassigned = [has_fp16_input[i] and not has_kernel(node) for i, node in enumerate(nodes)]
    if not any(unassigned) and inlined is None:
        return None
    # the node making each tensor, but Constant nodes: onnxruntime makes them initializers first (no edges)
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out and not
                (node.op_type == "Constant" and node.domain in ("", "ai.onnx"))}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            if name:
                readers.setdefault(name, []).append(i)
    outputs = {v.name for v in graph.output}
    def needs_cast(i: int) -> bool:  # NodeNeedsInputCastToFp32: unassigned, with a float16 input
        return unassigned[i] and has_fp16_input[i]

    if len(nodes) > 1:  # ForceSingleNodeCPUFloat16ToFloat32, in node order as onnxruntime walks its nodes
        walk = range(len(nodes)) if inlined is None else sorted(range(len(nodes)), key=inlined.rank.__getitem__)
        for i in walk:
            node = nodes[i]
            # IsIsolatedFp16NodeOnCpu: a node with a float16 kernel, an input made by a node, no subgraph and no
            # graph output, whose float16 inputs made by nodes all come from nodes that need a Cast and whose
            # float16 outputs (one at least) all go to such nodes (float16 initializers and graph inputs are no
            # edges: they get a Cast of their own; of a variadic input, only the first tensor is looked at)
            if unassigned[i] or _holds_graph(node) or any(out in outputs for out in node.output) \
                    or not any(name in producer for name in node.input) \
                    or not any(fp16(name) for name in node.input):
                continue
            if any(fp16(node.input[k]) and node.input[k] in producer and not needs_cast(producer[node.input[k]])
                   for k in _typed_inputs(node, versions)):
                continue
            fp16_outputs = [out for out in node.output if fp16(out)]
            if fp16_outputs and all(needs_cast(r) for out in fp16_outputs for r in readers.get(out, [])):
                unassigned[i] = True
    as_fp32: dict[str, str] = {}  # a float16 tensor -> its float32 twin (a converted node's output, or a Cast's)
    out_nodes: list[onnx.NodeProto] = []
    # A converted node's float32 output keeps the shape onnxruntime first inferred for it, while the node read the
    # Casts of its float16 inputs (their shapes: the float16 tensors', declared or inferred); when the duplicate
    # remover rewires it to the converted producer's output, inference runs again and the merge keeps the names
    # found first (_first_output_shapes). Measured: an inlined Softmax's ReduceSum takes its ReduceMax's freed
    # buffer, its Div the Sub's, where the float16 input's declared shape names every dim, and not where
    # inference from the converted producers leaves a dim empty.
    declared = declared_dim_names(model)
    twins: list[onnx.ValueInfoProto] = []
    float_types: dict[tuple[Dim, ...], onnx.TypeProto] = {}  # (see _float_value)
    out_rank: list[int] = []  # per node: onnxruntime's node index, up to order (the inserted Casts after all)
    inserted_rank = len(nodes) if inlined is None else max(inlined.rank, default=0) + 1

    def add(node: onnx.NodeProto, rank: int | None = None) -> None:
        nonlocal inserted_rank
        out_nodes.append(node)
        if rank is None:
            rank, inserted_rank = inserted_rank, inserted_rank + 1
        out_rank.append(rank)

    for i, node in enumerate(nodes):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        rank = i if inlined is None else inlined.rank[i]
        if not unassigned[i]:
            add(copy, rank)
            continue
        for j, name in enumerate(node.input):
            if not fp16(name):
                continue
            if name not in as_fp32:
                as_fp32[name] = f"{INSERTED_CAST_PREFIX}{name}"
                add(onnx.helper.make_node("Cast", [name], [as_fp32[name]], name=as_fp32[name], to=TensorProto.FLOAT))
            copy.input[j] = as_fp32[name]
        for attr in copy.attribute:
            if attr.name == "dtype" and attr.type == AttributeProto.INT and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.FLOAT
        back = []
        first_shapes: dict[str, tuple[Dim, ...]] | None = None
        for j, name in enumerate(node.output):
            if not fp16(name):
                continue
            twin = as_fp32[name] = f"{INSERTED_CAST_PREFIX}{name}"
            copy.output[j] = twin
            if first_shapes is None:
                first_shapes = _first_output_shapes(node, versions, known, declared, constants, memo)
            shape = first_shapes.get(name)
            if shape is not None and any(d is not None for d in shape):
                twins.append(_float_value(twin, shape, float_types))
            # a Cast back where a float16 reader or a graph output needs it, or where nothing reads the output
            # (InsertCastTransformer casts every float16 output back; the duplicate remover drops only the Casts
            # a converted reader makes redundant: an LSTM's unread Y_h keeps its Cast)
            if name in outputs or not readers.get(name) or any(not unassigned[r] for r in readers[name]):
                back.append(onnx.helper.make_node("Cast", [twin], [name], name=twin,
                                                  to=TensorProto.FLOAT16))
        add(copy, rank)
        for cast in back:
            add(cast)
    as_float = set(as_fp32.values())

    def dtype(name: str) -> int:
        return TensorProto.FLOAT if name in as_float else known.get(name, (0, None, None))[0]

    out_nodes = _without_duplicate_casts(out_nodes, out_rank, dtype, outputs)
    changed = ModelProto()
    changed.CopyFrom(_shell(model))
    changed.graph.CopyFrom(_without_nodes(graph))
    if inlined is not None:
        changed.graph.initializer.extend(inlined.initializers)
    changed.graph.value_info.extend(twins)
    changed.graph.node.extend(out_nodes)
    return dataclasses.replace(loaded, proto=changed, data=None, nodes=None)


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


def _inline_functions(graph: GraphProto, versions: Mapping[str, int], known: dict[str, TensorType],
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
    if not body.node or any(_holds_graph(n) for n in body.node):
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
# millisecond, and the nodes converted or inlined on a float16 model repeat layer after layer: _infer_node keeps
# each answer, by what decides it (the operator and its opset, its attributes, its inputs' types and constant
# values; not the tensors' names), in a memo of the caller's (one per transform run).
NodeMemo = dict[tuple[object, ...], tuple[tuple[int, onnx.TypeProto], ...] | None]


def _infer_node(node: onnx.NodeProto, versions: Mapping[str, int], known: Mapping[str, TensorType],
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
        for name, type_proto in (_infer_node(node, versions, known, constants, memo=memo) or {}).items():
            known[name] = decode_type(type_proto)


def with_inserted_cast_shapes(ran: ModelProto, types: Mapping[str, TensorType]) -> ModelProto:
    """Give onnxruntime's saved graph (`ran`: optimized_model_filepath, Casts inserted) with the float32 output of
    each converted node declared as onnxruntime first inferred it (see cpu_float16_casts: from the float16 tensors
    its inputs were cast from, a removed one's shape first inferred the same way), for the planner's shapes; the
    graph as given where it holds no converted node. `types`: the graph's types (infer_symbolic, declared)."""
    graph = ran.graph
    if not any(out.startswith(INSERTED_CAST_PREFIX) for node in graph.node if node.op_type != "Cast"
               for out in node.output):
        return ran
    versions = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in ran.opset_import}
    declared = declared_dim_names(ran)
    constants = {t.name: t for t in graph.initializer if t.data_location != TensorProto.EXTERNAL
                 and math.prod(t.dims) <= _INFERENCE_VALUES_UP_TO}
    known: dict[str, TensorType] = dict(types)

    def half(name: str) -> str:  # the float16 tensor a float32 twin stands for
        return name[len(INSERTED_CAST_PREFIX):] if name.startswith(INSERTED_CAST_PREFIX) else name

    twins = []
    memo: NodeMemo = {}  # (see _infer_node)
    float_types: dict[tuple[Dim, ...], onnx.TypeProto] = {}  # (see _float_value)
    for node in _topological(graph):
        if node.op_type == "Cast" or not any(out.startswith(INSERTED_CAST_PREFIX) for out in node.output):
            continue
        view = onnx.NodeProto()
        view.CopyFrom(node)
        for j, name in enumerate(node.input):
            if name.startswith(INSERTED_CAST_PREFIX) and half(name) in known:
                view.input[j] = half(name)
        for j, name in enumerate(node.output):
            view.output[j] = half(name)
        shapes = _first_output_shapes(view, versions, known, declared, constants, memo)
        for name in node.output:
            shape = shapes.get(half(name))
            if shape is None or not name.startswith(INSERTED_CAST_PREFIX):
                continue
            if half(name) not in known:  # removed with its Casts: its shape is the one first inferred
                known[half(name)] = (TensorProto.FLOAT16, shape, None)
            if any(d is not None for d in shape):
                twins.append(_float_value(name, shape, float_types))
    changed = ModelProto()
    changed.CopyFrom(ran)
    changed.graph.value_info.extend(twins)
    return changed


def _float_value(name: str, shape: tuple[Dim, ...], types: dict[tuple[Dim, ...], onnx.TypeProto]) -> \
        onnx.ValueInfoProto:
    """Give onnx.helper.make_tensor_value_info(name, FLOAT, shape), each distinct shape's type made once (`types`)."""
    value = onnx.ValueInfoProto(name=name)
    made = types.get(shape)
    if made is None:
        made = types[shape] = onnx.helper.make_tensor_type_proto(TensorProto.FLOAT, shape)
    value.type.CopyFrom(made)
    return value


def _topological(graph: GraphProto) -> list[onnx.NodeProto]:
    """Give the graph's nodes in a topological order (the file's, where it is one)."""
    made = {name for name in (*(i.name for i in graph.input), *(t.name for t in graph.initializer))}
    made.add("")
    pending = list(graph.node)
    order: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for node in pending:
            if all(name in made for name in node.input):
                order.append(node)
                made.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):  # inputs from nowhere (a subgraph's outer names): keep the file's order
            order.extend(rest)
            break
        pending = rest
    return order


def _first_output_shapes(node: onnx.NodeProto, versions: Mapping[str, int], known: Mapping[str, TensorType],
                         declared: Container[str], constants: Mapping[str, TensorProto],
                         memo: NodeMemo | None = None) -> dict[str, tuple[Dim, ...]]:
    """Give the output shapes ONNX's inference gives the node on its inputs' shapes as onnxruntime holds them
    (planner.runtime_view: an undeclared 'unk__N' is an empty dim), by output name; {} where it cannot (no first
    shape: inference's later one stands)."""
    inferred = _infer_node(node, versions, known, constants, lambda shape: runtime_view(shape, declared), memo)
    shapes = {}
    for name, type_proto in (inferred or {}).items():
        shape = decode_type(type_proto)[1]
        if shape is not None:
            shapes[name] = shape
    return shapes


# The type groups RemoveDuplicateCastTransformer compares (GetTypeGroup): a Cast to a lower group loses precision.
_CAST_TYPE_GROUP: dict[int, int] = {
    TensorProto.BOOL: 0,
    **{t: 1 for t in (TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
                      TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64)},
    **{t: 2 for t in (TensorProto.BFLOAT16, TensorProto.DOUBLE, TensorProto.FLOAT, TensorProto.FLOAT16)},
}


def _without_duplicate_casts(nodes: list[onnx.NodeProto], rank: Sequence[int], dtype: Callable[[str], int],
                             outputs: Container[str]) -> list[onnx.NodeProto]:
    """Give the nodes after onnxruntime's RemoveDuplicateCastTransformer (insert_cast_transformer.cc), which runs
    after the Casts go in: walking the Casts in node index order (`rank`), a Cast's reader that is a Cast back to
    its input's type (not making a graph output) goes, its readers reading the first Cast's input; the first Cast
    goes too where Casts were all its readers and it makes no graph output (the Casts kept then read its input).
    A Cast to a lower type group followed by one to a higher group is left alone (a real loss of precision). The
    net effect on the inserted Casts is already in cpu_float16_casts; this drops the pairs a model's own Cast
    makes with them (keep_io_types' input Casts, a body's CastLike of a constant, a Cast to a float32 output)."""
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in (*node.input, *_subgraph_reads(node)):  # a subgraph's read is an edge of its node
            if name:
                readers.setdefault(name, []).append(i)
    gone: set[int] = set()
    source: dict[str, str] = {}  # a tensor no longer made -> the one its readers read instead

    def read(name: str) -> str:
        while name in source:
            name = source[name]
        return name

    for i in sorted(range(len(nodes)), key=rank.__getitem__):
        node = nodes[i]
        if i in gone or node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        first_in, first_out = read(node.input[0]), node.output[0]
        src, dst = _CAST_TYPE_GROUP.get(dtype(first_in)), _CAST_TYPE_GROUP.get(dtype(first_out))
        if src is None or dst is None:
            continue
        children = [r for r in readers.get(first_out, []) if r not in gone]
        casts = [r for r in children if nodes[r].op_type == "Cast" and nodes[r].domain in ("", "ai.onnx")]
        if any(_CAST_TYPE_GROUP.get(dtype(nodes[r].output[0])) is None or
               (src > dst and _CAST_TYPE_GROUP[dtype(nodes[r].output[0])] > dst) for r in casts):
            continue
        removed = [r for r in casts if nodes[r].output[0] not in outputs and
                   dtype(nodes[r].output[0]) == dtype(first_in)]
        for r in removed:
            gone.add(r)
            source[nodes[r].output[0]] = first_in
        if children and len(casts) == len(children) and first_out not in outputs:
            gone.add(i)
            source[first_out] = first_in
    if not gone:
        return nodes
    kept = []
    for i, node in enumerate(nodes):
        if i in gone:
            continue
        for j, name in enumerate(node.input):
            node.input[j] = read(name)
        _rename_subgraph_reads(node, read)
        kept.append(node)
    return kept


def _rename_subgraph_reads(node: onnx.NodeProto, read: Callable[[str], str]) -> None:
    """Rename the outer tensors the node's subgraphs read, as `read` maps them."""
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs) \
            if attr.type == AttributeProto.GRAPHS else []
        for graph in graphs:
            for inner in graph.node:
                for j, name in enumerate(inner.input):
                    inner.input[j] = read(name)
                _rename_subgraph_reads(inner, read)


def _cpu_float16_kernel(node: onnx.NodeProto, versions: Mapping[str, int]) -> bool:
    """Say whether onnxruntime's CPU provider has a float16 kernel for this node's operator at its opset."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    spans = CPU_FLOAT16_KERNELS.get(f"{domain}::{node.op_type}")
    if not spans:
        return False
    opset = versions.get(domain, 1)
    try:
        since = onnx.defs.get_schema(node.op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        since = opset
    return any(first <= since <= last for first, last in spans)


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Give the names the node's subgraphs read (every input of their nodes, at any depth; their own tensors too,
    which name nothing of the outer graph in a valid model unless they shadow it)."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs) \
            if attr.type == AttributeProto.GRAPHS else []
        for graph in graphs:
            for inner in graph.node:
                names.update(inner.input)
                names.update(_subgraph_reads(inner))
    return names


def _typed_inputs(node: onnx.NodeProto, versions: Mapping[str, int]) -> list[int]:
    """Give the positions of the inputs IsIsolatedFp16NodeOnCpu looks at: per formal input of the node's schema
    whose type is a constraint (T, T1, ...), its first present tensor (a variadic input's first only: measured,
    Relu's opset-18 body Max(X, CastLike(0, X)) between converted nodes runs in float32 though its second input
    comes from a Cast it does not look at); every input where the schema is unknown."""
    try:
        schema = onnx.defs.get_schema(node.op_type, versions.get(node.domain or "", 1), node.domain)
    except onnx.defs.SchemaError:
        return list(range(len(node.input)))
    constrained = {c.type_param_str for c in schema.type_constraints}
    positions = []
    start = 0
    formals = schema.inputs
    for formal in formals:  # a variadic formal input is the last: it takes the rest
        variadic = formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic
        count = max(len(node.input) - start, 0) if variadic else (1 if start < len(node.input) else 0)
        if formal.type_str in constrained:
            first = next((k for k in range(start, start + count) if node.input[k]), None)
            if first is not None:
                positions.append(first)
        start += count
    return positions


def _holds_graph(node: onnx.NodeProto) -> bool:
    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)


def _without_nodes(graph: GraphProto) -> GraphProto:
    """Give a copy of the graph without its nodes (its initializers, inputs, outputs and declared values kept)."""
    copy = GraphProto()
    copy.name = graph.name
    copy.initializer.extend(graph.initializer)
    copy.sparse_initializer.extend(graph.sparse_initializer)
    copy.input.extend(graph.input)
    copy.output.extend(graph.output)
    copy.value_info.extend(graph.value_info)
    return copy
