"""The float16 what-if's model: every float32 tensor stored as float16. A what-if is the same analysis run on a
changed model, so its figure is what `onnxmem report` says of that model."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, numpy_helper

from onnxmem.ir.dtypes import tensor_bytes
from onnxmem.ir.load import LoadedModel, model_shell

if TYPE_CHECKING:
    from onnxmem.passes.pipeline import Sizing

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
    model.CopyFrom(model_shell(loaded.proto))
    _half_graph(loaded.proto.graph, model.graph)
    return dataclasses.replace(loaded, proto=model, data=None)  # (the bytes read are the unchanged model)


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
