"""Tensor types as the passes hold them: (dtype, shape, bytes), with dims that are sizes, names or unknown."""

from __future__ import annotations

import onnx

from onnxmem.ir.dtypes import tensor_bytes

Dim = int | str | None  # a size, a symbolic name, or unknown


TensorType = tuple[int, tuple[Dim, ...] | None, int | None]  # dtype, shape (None: rank unknown), bytes


UNKNOWN_TYPE: TensorType = (0, None, None)


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
