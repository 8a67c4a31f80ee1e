"""A serialized model whose large embedded tensors become headers: their data is left where it lies in the file.

Parsing a model's bytes copies every embedded weight into the parsed message, and every later copy of that message
(the checks' UTF-8 parse, the light copy shape inference reads, its serialization) copies them again: a 200 MB
Constant cost 4.6 GB and 24 s to analyse. Nothing onnxmem computes reads the values of a large tensor (shape
values and the constants a pass decodes are at most 4096 elements: shapes.values, passes.half_precision), so the
bytes are rewritten before they are parsed: each tensor holding more than ELIDED_BYTES of data that fits its dims
is written as stored externally, in the model's own file, at the offset and length its data has there. That is
true of the file (onnx and onnxruntime read the same values back from there), and the parsed model holds headers
only: memory is the file's bytes once, and the rewrite reads each byte of the weights not at all (it skips them by
their length prefix).

The walk goes down only into messages longer than ELIDED_BYTES (a shorter one cannot hold such a tensor), and
gives up (None: the bytes are parsed as they are) past WALKED_FIELDS fields or MAX_DEPTH nested messages.
"""

from __future__ import annotations

from onnx import (
    AttributeProto,
    FunctionProto,
    GraphProto,
    ModelProto,
    NodeProto,
    SparseTensorProto,
    TensorProto,
    TrainingInfoProto,
)

from onnxmem.ir.dtypes import element_bits
from onnxmem.ir.modelcheck import _location_problem

# Tensors with more data than this are rewritten as headers: more than any value a pass decodes (4096 elements of
# at most 16 bytes).
ELIDED_BYTES = 64 * 1024
# The most fields the walk reads, and the deepest nesting it follows, before it gives up (the bytes are then
# parsed as they are, as before this module).
WALKED_FIELDS = 4_000_000
MAX_DEPTH = 90
# The most fields of one tensor (its dims unpacked, one field each, are a handful on any real model), or of one
# attribute, read.
_TENSOR_FIELDS = 4096


def _numbers(message: type, kinds: dict[str, str]) -> dict[int, str]:
    fields = message.DESCRIPTOR.fields_by_name  # type: ignore[attr-defined]
    return {fields[name].number: kind for name, kind in kinds.items()}


def _singular(message: type, kinds: dict[str, str]) -> frozenset[int]:
    fields = message.DESCRIPTOR.fields_by_name  # type: ignore[attr-defined]
    return frozenset(fields[name].number for name in kinds if not fields[name].is_repeated)


_FIELDS: dict[str, tuple[type, dict[str, str]]] = {
    "model": (ModelProto, {"graph": "graph", "functions": "function", "training_info": "training"}),
    "training": (TrainingInfoProto, {"initialization": "graph", "algorithm": "graph"}),
    "function": (FunctionProto, {"node": "node"}),
    "graph": (GraphProto, {"node": "node", "initializer": "tensor", "sparse_initializer": "sparse"}),
    "node": (NodeProto, {"attribute": "attribute"}),
    "attribute": (AttributeProto, {"t": "tensor", "g": "graph", "tensors": "tensor", "graphs": "graph",
                                   "sparse_tensor": "sparse", "sparse_tensors": "sparse"}),
    "sparse": (SparseTensorProto, {"values": "tensor", "indices": "tensor"}),
}
# The message fields that may hold a tensor, by message kind: field number -> the kind of message it holds.
_CHILDREN = {kind: _numbers(*fields) for kind, fields in _FIELDS.items()}
# The singular ones: protobuf merges two occurrences of one, so neither is rewritten.
_SINGULAR = {kind: _singular(*fields) for kind, fields in _FIELDS.items()}
_TENSOR = {f.name: f.number for f in TensorProto.DESCRIPTOR.fields}
_DIMS, _DATA_TYPE, _RAW = _TENSOR["dims"], _TENSOR["data_type"], _TENSOR["raw_data"]
# Typed data fields whose packed bytes are the values' own little-endian bytes (as raw_data would hold them).
_PACKED_AS_RAW = {_TENSOR["float_data"]: (TensorProto.FLOAT, TensorProto.COMPLEX64),
                  _TENSOR["double_data"]: (TensorProto.DOUBLE, TensorProto.COMPLEX128)}
# Fields whose presence leaves a tensor as it is: other data, a segment, data already external.
_KEPT_AS_IS = frozenset({_TENSOR[name] for name in (
    "segment", "int32_data", "string_data", "int64_data", "uint64_data", "external_data", "data_location")})
_EXTERNAL_DATA, _DATA_LOCATION = _TENSOR["external_data"], _TENSOR["data_location"]


class _GiveUp(Exception):
    """The walk read too many fields or nested too deep: the bytes are parsed as they are."""


def headers_only(data: bytes, file_name: str) -> bytes | None:
    """Give the serialized model `data` (the bytes of the file `file_name`, in its folder) with each tensor whose
    data is over ELIDED_BYTES and fits its dims written as external data in that file (see the module's
    docstring), or None where no tensor is or the walk gave up."""
    if len(data) <= ELIDED_BYTES or _location_problem(file_name) or not file_name.isprintable():
        return None  # (a name the checks would refuse as a location: 'c:model.onnx', or not UTF-8)
    try:
        location = file_name.encode()
    except UnicodeEncodeError:
        return None
    walk = _Rewrite(data, location)
    try:
        pieces = walk.message("model", 0, len(data), 0)
    except _GiveUp:
        return None
    if pieces is None:
        return None
    return b"".join(pieces)


class _Rewrite:
    def __init__(self, raw: bytes, location: bytes) -> None:
        self.raw = raw
        self.data = memoryview(raw)
        self.location = location
        self.fields = 0

    def message(self, kind: str, start: int, end: int, depth: int) -> list[bytes | memoryview] | None:
        """Give the pieces of the message data[start:end] rewritten, or None where nothing in it changes."""
        if depth > MAX_DEPTH:
            raise _GiveUp
        raw = self.raw  # (indexing bytes is faster than indexing a memoryview: this loop reads every field)
        children = _CHILDREN[kind]
        singular = _SINGULAR[kind]
        found: list[tuple[int, int, int, str]] = []  # (tag start, payload start, payload end, kind) to look into
        seen: dict[int, int] = {}
        position = start
        budget = WALKED_FIELDS - self.fields
        # an attribute holds one value: one with more fields is a list of numbers written one field each (proto2's
        # repeated ints and floats are not packed; 2^23 of them took the walk 8 s), whose tensors stay as they are
        own_limit = _TENSOR_FIELDS if kind == "attribute" else budget
        fields = 0
        while position < end:
            fields += 1
            if fields > budget:
                raise _GiveUp
            if fields > own_limit:
                return None
            tag = raw[position]
            if tag < 0x80:
                after = position + 1
            else:
                tag, after = _varint(raw, position, end)
            wire = tag & 7
            if wire == 2:
                length = raw[after] if after < end else 0x80
                if length < 0x80:
                    payload = after + 1
                else:
                    length, payload = _varint(raw, after, end)
                field_end = payload + length
                if field_end > end:
                    return None  # the parse refuses it, naming the problem
                number = tag >> 3
                if number in singular:
                    seen[number] = seen.get(number, 0) + 1
                if length > ELIDED_BYTES and number in children:
                    found.append((position, payload, field_end, children[number]))
                position = field_end
            elif wire == 0:
                position = _varint(raw, after, end)[1]
            elif wire == 5 or wire == 1:
                position = after + (8 if wire == 1 else 4)
            else:
                return None  # groups and invalid wire types: left to the parse
        self.fields += fields
        if position != end:
            return None
        pieces: list[bytes | memoryview] = []
        copied = start  # bytes of this message up to here are in pieces (or to be copied as they are)
        data = self.data
        for tag_start, payload, field_end, child in found:
            number = _varint(raw, tag_start, payload)[0] >> 3
            if seen.get(number, 0) > 1:
                continue
            inner = self.tensor(payload, field_end) if child == "tensor" else \
                self.message(child, payload, field_end, depth + 1)
            if inner is None:
                continue
            tag_end = _varint(raw, tag_start, payload)[1]
            pieces.append(data[copied:tag_end])
            pieces.append(varint(sum(len(p) for p in inner)))
            pieces.extend(inner)
            copied = field_end
        if not pieces:
            return None
        pieces.append(data[copied:end])
        return pieces

    def tensor(self, start: int, end: int) -> list[bytes | memoryview] | None:
        """Give the pieces of the TensorProto data[start:end] as a header whose data lies in the file, or None
        where it stays as it is (its data small, not fitting its dims, or not the values' own bytes)."""
        data, raw = self.data, self.raw
        dims: list[int] = []
        dtype: int | None = None
        held: tuple[int, int, int, int] | None = None  # (field start, payload start, end, field number)
        position, fields = start, 0
        while position < end:
            fields += 1
            if fields > _TENSOR_FIELDS:
                return None
            field_start = position
            tag, after = _varint(raw, position, end)
            number, wire = tag >> 3, tag & 7
            if number in _KEPT_AS_IS:
                return None
            if wire == 2:
                length, payload = _varint(raw, after, end)
                position = payload + length
                if position > end:
                    return None
                if number == _DIMS:
                    inner = payload
                    while inner < position:
                        value, inner = _varint(raw, inner, position)
                        dims.append(value)
                elif number == _RAW or number in _PACKED_AS_RAW:
                    if held is not None:
                        return None  # two data fields: protobuf's merge rules decide, not this walk
                    held = (field_start, payload, position, number)
            elif wire == 0:
                value, position = _varint(raw, after, end)
                if number == _DIMS:
                    dims.append(value)
                elif number == _DATA_TYPE:
                    if dtype is not None:
                        return None
                    dtype = value
            elif wire in (1, 5):
                if number in _PACKED_AS_RAW:
                    return None  # values written one field each: not the values' own bytes in one piece
                position = after + (8 if wire == 1 else 4)
            else:
                return None
        if held is None or dtype is None or position != end:
            return None
        field_start, payload, field_end, number = held
        if number != _RAW and dtype not in _PACKED_AS_RAW[number]:
            return None
        bits = element_bits(dtype)
        if bits is None or any(d >= 1 << 63 for d in dims):
            return None  # a negative dim (a varint of 2^64 - n), or no fixed size: the checks name it
        count = 1
        for d in dims:
            count *= d
        size = field_end - payload
        if size <= ELIDED_BYTES or (count * bits + 7) // 8 != size:
            return None
        return [data[start:field_start], data[field_end:end], self._external(payload, size)]

    def _external(self, offset: int, length: int) -> bytes:
        entries = b"".join(length_delimited(_EXTERNAL_DATA, length_delimited(1, key) + length_delimited(2, value))
                           for key, value in ((b"location", self.location), (b"offset", str(offset).encode()),
                                              (b"length", str(length).encode())))
        return entries + varint(_DATA_LOCATION << 3) + varint(TensorProto.EXTERNAL)


def _varint(data: bytes | memoryview, position: int, end: int) -> tuple[int, int]:
    """Give the varint at `position` and the position after it; give up where it runs past `end`."""
    value = shift = 0
    for index in range(position, min(position + 10, end)):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
    raise _GiveUp


def varint(value: int) -> bytes:
    """Give protobuf's varint of a non-negative integer."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    """Give a protobuf length-delimited field (wire type 2): its key, its length, the payload."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload
