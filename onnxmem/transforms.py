"""Model transforms for what-ifs: a what-if is the same analysis run on a changed model, so its figure is what
`onnxmem report` says of that model."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, numpy_helper

from .dtypes import tensor_bytes
from .load import LoadedModel
from .rules.kernels import CPU_FLOAT16_KERNELS
from .tensor_types import TensorType

if TYPE_CHECKING:
    from .analyze import Sizing

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
    kernel (rules.kernels.CPU_FLOAT16_KERNELS): that operator runs in float32, its float16 inputs cast to float32
    (one Cast per tensor), its outputs cast back to float16 where a float16 reader or a graph output needs them
    (core/optimizer/insert_cast_transformer.cc: InsertCastTransformer, then RemoveDuplicateCastTransformer, whose
    net effect this is; an operator with a float16 kernel between two converted ones is converted too, as its
    ForceSingleNodeCPUFloat16ToFloat32 does). None where no operator needs a Cast. `types`: the model's tensor
    types (planner.infer_symbolic). The main graph only: a subgraph's nodes are left as they are."""
    model = loaded.proto
    graph = model.graph
    nodes = list(graph.node)
    versions = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}

    def fp16(name: str) -> bool:
        return bool(name) and types.get(name, (0, None, None))[0] == TensorProto.FLOAT16

    has_fp16_input = [any(fp16(name) for name in node.input) for node in nodes]
    unassigned = [has_fp16_input[i] and not _cpu_float16_kernel(node, versions) for i, node in enumerate(nodes)]
    if not any(unassigned):
        return None
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            if name:
                readers.setdefault(name, []).append(i)
    outputs = {v.name for v in graph.output}
    def needs_cast(i: int) -> bool:  # NodeNeedsInputCastToFp32: unassigned, with a float16 input
        return unassigned[i] and has_fp16_input[i]

    if len(nodes) > 1:  # ForceSingleNodeCPUFloat16ToFloat32, in node order as onnxruntime walks its nodes
        for i, node in enumerate(nodes):
            # IsIsolatedFp16NodeOnCpu: a node with a float16 kernel, an input made by a node, no subgraph and no
            # graph output, whose float16 inputs made by nodes all come from nodes that need a Cast and whose
            # float16 outputs (one at least) all go to such nodes (float16 initializers and graph inputs are no
            # edges: they get a Cast of their own)
            if unassigned[i] or _holds_graph(node) or any(out in outputs for out in node.output) \
                    or not any(name in producer for name in node.input) \
                    or not any(fp16(name) for name in node.input):
                continue
            if any(fp16(name) and name in producer and not needs_cast(producer[name]) for name in node.input):
                continue
            fp16_outputs = [out for out in node.output if fp16(out)]
            if fp16_outputs and all(needs_cast(r) for out in fp16_outputs for r in readers.get(out, [])):
                unassigned[i] = True
    as_fp32: dict[str, str] = {}  # a float16 tensor -> its float32 twin (a converted node's output, or a Cast's)
    out_nodes: list[onnx.NodeProto] = []
    for i, node in enumerate(nodes):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        if not unassigned[i]:
            out_nodes.append(copy)
            continue
        for j, name in enumerate(node.input):
            if not fp16(name):
                continue
            if name not in as_fp32:
                as_fp32[name] = f"{INSERTED_CAST_PREFIX}{name}"
                out_nodes.append(onnx.helper.make_node("Cast", [name], [as_fp32[name]], name=as_fp32[name],
                                                       to=TensorProto.FLOAT))
            copy.input[j] = as_fp32[name]
        for attr in copy.attribute:
            if attr.name == "dtype" and attr.type == AttributeProto.INT and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.FLOAT
        back = []
        for j, name in enumerate(node.output):
            if not fp16(name):
                continue
            twin = as_fp32[name] = f"{INSERTED_CAST_PREFIX}{name}"
            copy.output[j] = twin
            if name in outputs or any(not unassigned[r] for r in readers.get(name, [])):
                back.append(onnx.helper.make_node("Cast", [twin], [name], name=twin,
                                                  to=TensorProto.FLOAT16))
        out_nodes.append(copy)
        out_nodes.extend(back)
    changed = ModelProto()
    changed.CopyFrom(_shell(model))
    changed.graph.CopyFrom(_without_nodes(graph))
    changed.graph.node.extend(out_nodes)
    return dataclasses.replace(loaded, proto=changed, data=None, nodes=None)


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
