"""Bytes per element for every ONNX element type; sub-byte types are packed."""

from __future__ import annotations

from onnx import TensorProto

# Bits per element. 4-bit types pack two per byte and 2-bit types four per byte, as ONNX stores them.
_BITS: dict[int, int] = {
    TensorProto.FLOAT: 32,
    TensorProto.UINT8: 8,
    TensorProto.INT8: 8,
    TensorProto.UINT16: 16,
    TensorProto.INT16: 16,
    TensorProto.INT32: 32,
    TensorProto.INT64: 64,
    TensorProto.BOOL: 8,
    TensorProto.FLOAT16: 16,
    TensorProto.DOUBLE: 64,
    TensorProto.UINT32: 32,
    TensorProto.UINT64: 64,
    TensorProto.COMPLEX64: 64,
    TensorProto.COMPLEX128: 128,
    TensorProto.BFLOAT16: 16,
}
for _name, _bits in (
    ("FLOAT8E4M3FN", 8), ("FLOAT8E4M3FNUZ", 8), ("FLOAT8E5M2", 8), ("FLOAT8E5M2FNUZ", 8),
    ("FLOAT8E8M0", 8), ("UINT4", 4), ("INT4", 4), ("FLOAT4E2M1", 4), ("UINT2", 2), ("INT2", 2),
    ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6),
):
    if hasattr(TensorProto, _name):  # newer types exist only in newer onnx releases
        _BITS[getattr(TensorProto, _name)] = _bits


def dtype_name(dtype: int) -> str:
    """Give the ONNX name of an element type ('FLOAT', 'INT4', ...), or 'UNDEFINED'."""
    try:
        return str(TensorProto.DataType.Name(dtype))
    except ValueError:
        return f"TYPE{dtype}"


def element_bits(dtype: int) -> int | None:
    """Give the bits one element of this type takes, or None where it has no fixed size (STRING)."""
    return _BITS.get(dtype)


def tensor_bytes(dtype: int, numel: int) -> int | None:
    """Give the exact bytes of `numel` elements of `dtype` (packed types rounded up to a whole byte)."""
    bits = _BITS.get(dtype)
    if bits is None:
        return None
    return (numel * bits + 7) // 8
