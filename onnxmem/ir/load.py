"""ONNX file -> onnx.ModelProto, never reading weight data."""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import onnx
from google.protobuf.message import DecodeError

from onnxmem.errors import ModelFileError, quoted
from onnxmem.ir.dtypes import element_bits, tensor_bytes
from onnxmem.ir.embedded import headers_only
from onnxmem.ir.modelcheck import all_initializers, check_model, external_locations
from onnxmem.shapes.rules import ONNX_DOMAIN_RULE_OPS
from onnxmem.targets.ort.tables import CONTROL_FLOW, PLANNER_MERGES_DIMS, SHAPE_AS
from onnxmem.views.report import Warning

if TYPE_CHECKING:
    from onnxmem.ir.graph import NodeFacts


@dataclass(frozen=True)
class LoadedModel:
    """A parsed model, where it came from, and what loading found wrong but survivable."""

    proto: onnx.ModelProto
    path: Path | None
    warnings: tuple[Warning, ...]
    nodes: NodeKinds | None = None  # what the file's bytes tell of its nodes; None where it was not read so
    # the serialized model as it was read (protobuf, up to SERIALIZED_BYTES_KEPT): shape inference reads it as it
    # is where the model needs no preparation, instead of a copy serialized again (see shapes.infer_symbolic)
    data: bytes | None = dataclasses.field(default=None, repr=False)
    # what the runtime's transforms that made this model say of its nodes (where they came from, where they run)
    facts: NodeFacts | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class NodeKinds:
    """What the model's nodes are, anywhere in it (every graph at every depth, local functions), as the check of
    the parsed model walked them (modelcheck.check_model):

    `prepared`: a Constant node or a fused operator (see shapes._prepared); `graphs`: a node holding a graph (a
    control-flow operator, or an operator of a domain the model declares beyond ONNX's own); `merges`: a node
    whose output dims onnxruntime merges from its inputs (rules.inference.PLANNER_MERGES_DIMS), or of such a
    domain; `metadata`: node metadata naming layers or PyTorch ops (see graph._layer_and_origin), told by a search
    of the file's bytes (True means "may"; it names layers and checks nothing).
    """

    prepared: bool
    graphs: bool
    merges: bool
    metadata: bool

    @classmethod
    def of(cls, op_types: frozenset[str], holds_graphs: bool, data: bytes, domains: Iterable[str]) -> NodeKinds:
        """Give the kinds of a model whose nodes have `op_types`, hold a graph where `holds_graphs`, whose
        opset_import declares `domains`, serialized as `data`."""
        return cls(prepared=bool(op_types & _PREPARED), graphs=holds_graphs or bool(op_types & CONTROL_FLOW),
                   merges=bool(op_types & _PLANNER_ROUND_OPS),
                   metadata=any(part in data for part in _LAYER_METADATA)).declaring(domains)

    def declaring(self, domains: Iterable[str]) -> NodeKinds:
        """Give these kinds for a model whose opset_import declares `domains` (an operator of a domain beyond
        ONNX's own may hold a graph and may merge dims)."""
        other = any(domain not in ("", "ai.onnx") for domain in domains)
        return dataclasses.replace(self, graphs=self.graphs or other, merges=self.merges or other)


_PREPARED = frozenset({"Constant", *(key.split("::")[1] for key in SHAPE_AS)})
# the planner rounds' operators of ONNX's domain: those that merge dims, and those with a shape rule of ours
_PLANNER_ROUND_OPS = frozenset(PLANNER_MERGES_DIMS) | ONNX_DOMAIN_RULE_OPS
_LAYER_METADATA = (b"pkg.torch.onnx", b"namespace")


# A model file up to this size is kept as read (a larger one holds embedded weights inference does not need).
SERIALIZED_BYTES_KEPT = 64 * 1024 * 1024


def load_model(source: str | os.PathLike[str] | onnx.ModelProto) -> LoadedModel:
    """Give the parsed model; weight data stored outside the file is never read.

    The model's structure is checked as it is loaded (modelcheck.check_model): an invalid model is a
    ModelFileError naming the tensor or node and what is wrong.
    """
    if isinstance(source, onnx.ModelProto):
        checked = check_model(source, "the given ModelProto")
        return LoadedModel(source, None, checked.warnings)
    path = Path(source)
    if not path.exists():
        raise ModelFileError(f"{quoted(str(path))[1:-1]}: no such file")
    if path.is_dir():
        raise ModelFileError(f"{quoted(str(path))[1:-1]}: is a directory, not an ONNX file")
    where = quoted(str(path))[1:-1]
    fmt = onnx.serialization.registry.get_format_from_file_extension(path.suffix) or "protobuf"
    data, regular = _read_bounded(path, where, fmt == "protobuf")
    if fmt == "protobuf" and regular:
        data = headers_only(data, path.name) or data  # large embedded tensors as headers (see ir.embedded)
    try:
        with warnings.catch_warnings():  # onnx warns that its text format is experimental, on several lines
            warnings.simplefilter("ignore")
            proto = onnx.serialization.registry.get(fmt).deserialize_proto(data, onnx.ModelProto())
    except DecodeError as exc:
        raise ModelFileError(
            f"{where}: not a valid ONNX model (the protobuf could not be parsed: {_one_line(exc)}); "
            "the file may be truncated or not ONNX at all"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the text and JSON parsers raise their own ParseError classes
        raise ModelFileError(f"{where}: could not be read as ONNX ({fmt}): {_one_line(exc)}") from None
    checked = check_model(proto, where, data if fmt == "protobuf" else None)
    nodes = NodeKinds.of(checked.op_types, checked.holds_graphs, data, [o.domain for o in proto.opset_import]) \
        if fmt == "protobuf" else None
    found = (*checked.warnings, *_missing_external_data(checked.external, path.parent))
    kept = data if nodes is not None and len(data) <= SERIALIZED_BYTES_KEPT else None
    return LoadedModel(proto, path, found, nodes, kept)


# The most bytes a model file may hold: protobuf parses no message of 2 GiB or more. A pipe is read up to this and
# no further.
MAX_MODEL_BYTES = 2**31 - 1
_CHUNK_BYTES = 1 << 24
# The longest a pipe may keep the reader waiting for its next bytes (one given as the model with no writer would
# otherwise block for ever).
PIPE_WAIT_S = 10.0
_SPECIAL_FILES = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                  (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _read_bounded(path: Path, where: str, protobuf: bool) -> tuple[bytes, bool]:
    """Give the file's bytes and whether it is a regular file, reading at most MAX_MODEL_BYTES: a file's size is
    checked before it is opened, a device, a socket or a directory is refused unopened, a pipe is read without ever
    waiting more than PIPE_WAIT_S for bytes; a stream that is not a protobuf message (the first fields that cannot
    be ONNX's) is refused as soon as that shows."""
    try:
        _refuse_special(os.stat(path), where)  # (a stat opens nothing: nothing to block on)
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with open(descriptor, "rb", buffering=0) as file:
            status = os.fstat(descriptor)  # the file opened, which may not be the one stat saw
            _refuse_special(status, where)
            pipe = not stat.S_ISREG(status.st_mode)
            chunks: list[bytes] = []
            total = 0
            fields = _FieldWalk(where) if protobuf else None
            first = _CHUNK_BYTES if pipe else status.st_size + 1
            while True:
                if pipe:
                    _wait_for_bytes(descriptor, where)
                chunk = file.read(min(first if not chunks else _CHUNK_BYTES, MAX_MODEL_BYTES + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                if fields is not None:
                    fields.feed(chunk)
                if total > MAX_MODEL_BYTES:
                    raise ModelFileError(f"{where}: 2 GiB read (more than one protobuf message can hold) without "
                                         "its end: not an ONNX model")
    except OSError as exc:
        raise ModelFileError(f"{where}: could not be read: {_one_line(exc)}") from None
    return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), not pipe


def _refuse_special(status: os.stat_result, where: str) -> None:
    """Raise where the file is no model file to read: a device, a socket, a directory, or a file too large."""
    for test, kind in _SPECIAL_FILES:
        if test(status.st_mode):
            raise ModelFileError(f"{where}: not a valid ONNX model file: it is {kind}, not a regular file")
    if stat.S_ISREG(status.st_mode) and status.st_size > MAX_MODEL_BYTES:
        raise ModelFileError(f"{where}: {status.st_size:,} bytes, 2 GiB or more, which one protobuf message cannot "
                             "hold: not an ONNX model file (its weights may be meant as external data)")


def read_small_text(path: Path, limit: int = 1 << 20) -> str | None:
    """Give the UTF-8 text of a small regular file beside the model (a runtime's own config), or None where there is
    none, it is no regular file (a FIFO or a device is opened without blocking and not read) or it holds more than
    `limit` bytes or no UTF-8."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return None
    with open(descriptor, "rb", buffering=0) as file:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_size > limit:
            return None
        try:
            data = file.read(limit + 1)
        except OSError:
            return None
    if len(data) > limit:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _wait_for_bytes(descriptor: int, where: str) -> None:
    """Return when the pipe has bytes to read or its writer has closed it; raise after PIPE_WAIT_S without."""
    import select

    if not hasattr(select, "poll"):  # (Windows: no named pipes to open by path)
        return
    poller = select.poll()
    poller.register(descriptor, select.POLLIN | select.POLLHUP)
    if not poller.poll(int(PIPE_WAIT_S * 1000)):
        raise ModelFileError(f"{where}: a pipe that gave no bytes for {PIPE_WAIT_S:g} s (no writer?): give the "
                             "model as a file")


class _FieldWalk:
    """Follows the top-level fields of a protobuf message as its bytes arrive, and refuses a stream whose next
    field cannot be a field at all (a field number 0, a wire type protobuf does not use, a length past 2 GiB):
    what lets a read of /dev/zero or /dev/urandom stop at once instead of at the 2 GiB cap."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.buffer = b""
        self.skip = 0  # bytes of the current field still to come

    def feed(self, chunk: bytes) -> None:
        if self.skip >= len(chunk):
            self.skip -= len(chunk)
            return
        data = self.buffer + chunk[self.skip:]
        self.skip = 0
        position = 0
        while position < len(data):
            tag, after = _varint(data, position)
            if tag is None:
                break  # the tag continues in the next chunk
            number, wire = tag >> 3, tag & 7
            if number == 0 or wire not in (0, 1, 2, 5):
                raise ModelFileError(f"{self.where}: not a valid ONNX model (byte {position} does not start a "
                                     "protobuf field); the file may be truncated or not ONNX at all")
            if wire == 0:
                value, end = _varint(data, after)
                if value is None:
                    break
            elif wire == 2:
                length, start = _varint(data, after)
                if length is None:
                    break
                if length > MAX_MODEL_BYTES:
                    raise ModelFileError(f"{self.where}: not a valid ONNX model (a field of {length:,} bytes at "
                                         f"byte {position}, more than a protobuf message can hold)")
                end = start + length
            else:
                end = after + (8 if wire == 1 else 4)
            if end > len(data):
                self.skip = end - len(data)
                data, position = b"", 0
                break
            position = end
        self.buffer = data[position:]


def _varint(data: bytes, position: int) -> tuple[int | None, int]:
    """Give the varint at `position` and the position after it, or (None, position) where it is cut off."""
    value = shift = 0
    for index in range(position, min(position + 10, len(data))):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
    if len(data) - position >= 10:
        return 1 << 70, position + 10  # longer than any varint: no length protobuf accepts
    return None, position


def input_files(source: str | os.PathLike[str]) -> list[tuple[Path, str]]:
    """Give the files a model given by path is read from, each with what it is: the model and, where it is a
    regular file that parses, its external data files (nothing is read from a pipe, which one read empties)."""
    path = Path(source)
    found = [(path, "the model")]
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return found
        data = _read_bounded(path, str(path), True)[0]
        proto = onnx.ModelProto.FromString(headers_only(data, path.name) or data)
    except (OSError, ModelFileError, DecodeError):
        return found
    return found + [(path.parent / location, f"the model's external data file {quoted(location)}")
                    for location in external_locations(proto) if location != path.name]


def _missing_external_data(external: dict[str, int], base: Path) -> list[Warning]:
    """Give a warning per external data file that is missing or not a regular file (`external`: location ->
    the number of tensors stored there, as modelcheck found them)."""
    found = []
    for location, count in external.items():
        try:
            target = base / location
            present = target.is_file()
            problem = "is missing" if not present and not target.exists() else "is not a regular file"
        except (OSError, ValueError) as exc:
            present, problem = False, f"cannot be looked up ({_one_line(exc)})"
        if not present:
            found.append(Warning(
                "missing-external-data",
                f"external data file {quoted(location)} {problem} ({count} tensors): sizes come from the model's "
                "headers, so the estimate stands, but the model cannot be run"))
    return found


def external_data_problems(model: onnx.ModelProto, base: Path) -> list[str]:
    """Give what would stop the model's external data from being read (as onnx and onnxruntime read it): a file
    missing, not a regular file (a pipe would block the reader), outside the model's folder (through a symlink),
    or shorter than an offset and length ask; [] where every tensor can be read."""
    problems: list[str] = []
    folder = base.resolve()
    sizes: dict[str, int | str] = {}
    for tensor in all_initializers(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        location = entries.get("location", "")
        if location not in sizes:
            sizes[location] = _external_file_size(folder, location)
        size = sizes[location]
        name = quoted(tensor.name)
        if isinstance(size, str):
            problems.append(f"initializer {name}: external data file {quoted(location)} {size}")
            continue
        offset_text, length = entries.get("offset", "0") or "0", entries.get("length")
        if not all(text.isascii() and text.isdigit() for text in (offset_text, length or "0")):
            problems.append(f"initializer {name}: external-data offset {quoted(offset_text)} or length "
                            f"{quoted(length or '')} is not a non-negative integer")
            continue
        offset = int(offset_text)
        bits = element_bits(tensor.data_type)
        needed = (math.prod(tensor.dims) * bits + 7) // 8 if bits is not None else None
        if length and needed is not None and int(length) != needed:
            problems.append(f"initializer {name}: external-data length {length} where its dims need {needed} bytes")
            continue
        end = offset + (int(length) if length else needed or 0)
        if offset > size or end > size:
            problems.append(f"initializer {name}: external data at offset {offset}"
                            f"{f' (length {length})' if length else ''} lies past the end of {quoted(location)} "
                            f"({size} bytes)")
    return problems


def _external_file_size(folder: Path, location: str) -> int | str:
    """Give the size of an external data file, or what is wrong with it."""
    try:
        target = (folder / location).resolve()
        if not target.is_relative_to(folder):
            return "lies outside the model's folder (through a symbolic link)"
        if not target.exists():
            return "is missing"
        status = target.stat()
    except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        return f"cannot be looked up ({_one_line(exc)})"
    if not stat.S_ISREG(status.st_mode):
        return "is not a regular file"
    return status.st_size


def initializer_type(tensor: onnx.TensorProto) -> tuple[int, tuple[int, ...], int | None]:
    """Give an initializer's (dtype, dims, bytes), as shape inference types it (see shapes.TensorType)."""
    dims = tuple(tensor.dims[:])  # (tuple() of the protobuf field itself takes twice as long: 16k weights)
    return tensor.data_type, dims, tensor_bytes(tensor.data_type, math.prod(dims))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


def model_shell(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give a model with the given one's header (versions, producer, opsets, functions, metadata) and no graph."""
    shell = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(shell, field, getattr(model, field))
    shell.opset_import.extend(model.opset_import)
    shell.functions.extend(model.functions)
    shell.metadata_props.extend(model.metadata_props)
    return shell


def has_float16(model: onnx.ModelProto) -> bool:
    """Say whether the model holds a float16 tensor anywhere it says so cheaply (its inputs, outputs, declared
    values, initializers, or a Cast to float16)."""
    graph = model.graph
    if any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer):
        return True
    for values in (graph.input, graph.output, graph.value_info):
        if any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for v in values):
            return True
    half = onnx.TensorProto.FLOAT16
    return any(node.op_type == "Cast" and any(a.name == "to" and a.i == half for a in node.attribute)
               for node in graph.node)
