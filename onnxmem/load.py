"""ONNX file -> onnx.ModelProto, never reading weight data."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from .dtypes import tensor_bytes
from .errors import ModelFileError
from .report import Warning
from .rules.inference import CONTROL_FLOW, PLANNER_MERGES_DIMS, SHAPE_AS
from .rules.shapes import ONNX_DOMAIN_RULE_OPS


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


@dataclass(frozen=True)
class NodeKinds:
    """What a serialized model tells of its nodes, anywhere in it, by searching its bytes (a node's op type is
    field 4 of NodeProto: the tag byte 0x22, its length, the name), so False is sure and True means "may":

    `prepared`: a Constant node or a fused operator (see shapes._prepared); `graphs`: a node holding a graph (a
    control-flow operator, or an operator of a domain the model declares beyond ONNX's own); `merges`: a node
    whose output dims onnxruntime merges from its inputs (rules.inference.PLANNER_MERGES_DIMS), or of such a
    domain; `metadata`: node metadata naming layers or PyTorch ops (see graph._layer_and_origin).

    A search of the bytes costs milliseconds where reading every node of a 100k-node graph costs 0.1 s.
    """

    prepared: bool
    graphs: bool
    merges: bool
    metadata: bool

    @classmethod
    def of(cls, data: bytes, domains: Iterable[str]) -> NodeKinds:
        """Give the kinds of the model serialized as `data`, whose opset_import declares `domains`."""
        found = {match.group(1)[1:].decode() for match in _OP_TYPES.finditer(data)}
        return cls(prepared=bool(found & _PREPARED), graphs=bool(found & CONTROL_FLOW),
                   merges=bool(found & _PLANNER_ROUND_OPS),
                   metadata=any(part in data for part in _LAYER_METADATA)).declaring(domains)

    def declaring(self, domains: Iterable[str]) -> NodeKinds:
        """Give these kinds for a model whose opset_import declares `domains` (an operator of a domain beyond
        ONNX's own may hold a graph and may merge dims)."""
        other = any(domain not in ("", "ai.onnx") for domain in domains)
        return dataclasses.replace(self, graphs=self.graphs or other, merges=self.merges or other)


_PREPARED = frozenset({"Constant", *(key.split("::")[1] for key in SHAPE_AS)})
# the planner rounds' operators of ONNX's domain: those that merge dims, and those with a shape rule of ours
_PLANNER_ROUND_OPS = frozenset(PLANNER_MERGES_DIMS) | ONNX_DOMAIN_RULE_OPS
# Every op type above, CONTROL_FLOW and PLANNER_MERGES_DIMS as it is serialized: one pass finds them all (25 ms on
# 18 MB, where a search per op type takes 10 ms each)
_OP_TYPES = re.compile(b'"(' + b"|".join(re.escape(bytes([len(n)]) + n.encode())
                                         for n in sorted(_PREPARED | CONTROL_FLOW | _PLANNER_ROUND_OPS)) + b")")
_LAYER_METADATA = (b"pkg.torch.onnx", b"namespace")


# A model file up to this size is kept as read (a larger one holds embedded weights inference does not need).
SERIALIZED_BYTES_KEPT = 64 * 1024 * 1024


def load_model(source: str | os.PathLike[str] | onnx.ModelProto) -> LoadedModel:
    """Give the parsed model; weight data stored outside the file is never read."""
    if isinstance(source, onnx.ModelProto):
        _check_is_model(source, "the given ModelProto")
        return LoadedModel(source, None, ())
    path = Path(source)
    if not path.exists():
        raise ModelFileError(f"{path}: no such file")
    if path.is_dir():
        raise ModelFileError(f"{path}: is a directory, not an ONNX file")
    fmt = onnx.serialization.registry.get_format_from_file_extension(path.suffix) or "protobuf"
    try:
        data = path.read_bytes()
        proto = onnx.serialization.registry.get(fmt).deserialize_proto(data, onnx.ModelProto())
    except DecodeError as exc:
        raise ModelFileError(
            f"{path}: not a valid ONNX model (the protobuf could not be parsed: {_one_line(exc)}); "
            "the file may be truncated or not ONNX at all"
        ) from None
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelFileError(f"{path}: could not be read as ONNX: {_one_line(exc)}") from None
    _check_is_model(proto, str(path))
    nodes = NodeKinds.of(data, [o.domain for o in proto.opset_import]) if fmt == "protobuf" else None
    warnings = _missing_external_data(proto, path.parent, nodes is None or nodes.graphs)
    kept = data if nodes is not None and len(data) <= SERIALIZED_BYTES_KEPT else None
    return LoadedModel(proto, path, tuple(warnings), nodes, kept)


def _check_is_model(proto: onnx.ModelProto, where: str) -> None:
    # Protobuf parses many non-ONNX byte strings without complaint (an empty file is a valid empty message),
    # so a model must at least declare an IR version, an opset and a graph with something in it.
    graph = proto.graph
    if proto.ir_version <= 0 or not proto.opset_import or not (graph.node or graph.output):
        raise ModelFileError(
            f"{where}: not a valid ONNX model (no IR version, opset or graph); "
            "the file may be truncated or not ONNX at all"
        )


def _missing_external_data(proto: onnx.ModelProto, base: Path, subgraphs: bool) -> list[Warning]:
    """Give a warning per external data file that is missing (`subgraphs` False: no node holds a graph, so only
    the main graph's initializers are read)."""
    missing: dict[str, int] = {}
    present: dict[str, bool] = {}  # one stat per file, not per tensor (a large model has thousands in one file)
    for tensor in _all_initializers(proto.graph) if subgraphs else proto.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if location and location not in present:
            present[location] = (base / location).is_file()
        if location and not present[location]:
            missing[location] = missing.get(location, 0) + 1
    return [
        Warning(
            "missing-external-data",
            f"external data file '{location}' is missing ({count} tensors): sizes come from the model's "
            "headers, so the estimate stands, but the model cannot be run",
        )
        for location, count in missing.items()
    ]


def initializer_type(tensor: onnx.TensorProto) -> tuple[int, tuple[int, ...], int | None]:
    """Give an initializer's (dtype, dims, bytes), as shape inference types it (see shapes.TensorType)."""
    dims = tuple(tensor.dims)
    return tensor.data_type, dims, tensor_bytes(tensor.data_type, math.prod(dims))


def _all_initializers(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        domain, op_type = node.domain, node.op_type
        if op_type not in CONTROL_FLOW and domain in ("", "ai.onnx"):
            continue  # a standard operator holds no graph (reading every node's attributes costs 0.1 s per 100k)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_initializers(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _all_initializers(sub)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__
