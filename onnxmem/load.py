"""ONNX file -> onnx.ModelProto, never reading weight data."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from .errors import ModelFileError
from .report import Warning
from .rules.inference import CONTROL_FLOW


@dataclass(frozen=True)
class LoadedModel:
    """A parsed model, where it came from, and what loading found wrong but survivable."""

    proto: onnx.ModelProto
    path: Path | None
    warnings: tuple[Warning, ...]
    # (domain, op type) of every node of the main graph, where loading read them (a file); None otherwise
    op_kinds: frozenset[tuple[str, str]] | None = None
    stamp: tuple[int, int] | None = None  # the file's size and modification time when it was read


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
    stamp = file_stamp(path)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except DecodeError as exc:
        raise ModelFileError(
            f"{path}: not a valid ONNX model (the protobuf could not be parsed: {_one_line(exc)}); "
            "the file may be truncated or not ONNX at all"
        ) from None
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelFileError(f"{path}: could not be read as ONNX: {_one_line(exc)}") from None
    _check_is_model(proto, str(path))
    kinds: set[tuple[str, str]] = set()
    warnings = _missing_external_data(proto, path.parent, kinds)
    return LoadedModel(proto, path, tuple(warnings), frozenset(kinds), stamp)


def file_stamp(path: Path) -> tuple[int, int] | None:
    """Give a file's size and modification time (nanoseconds), or None where it cannot be read."""
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_size, status.st_mtime_ns


def _check_is_model(proto: onnx.ModelProto, where: str) -> None:
    # Protobuf parses many non-ONNX byte strings without complaint (an empty file is a valid empty message),
    # so a model must at least declare an IR version, an opset and a graph with something in it.
    graph = proto.graph
    if proto.ir_version <= 0 or not proto.opset_import or not (graph.node or graph.output):
        raise ModelFileError(
            f"{where}: not a valid ONNX model (no IR version, opset or graph); "
            "the file may be truncated or not ONNX at all"
        )


def _missing_external_data(proto: onnx.ModelProto, base: Path, kinds: set[tuple[str, str]]) -> list[Warning]:
    """Give a warning per external data file that is missing; put the main graph's node kinds into `kinds`
    (the walk reads them anyway)."""
    missing: dict[str, int] = {}
    present: dict[str, bool] = {}  # one stat per file, not per tensor (a large model has thousands in one file)
    for tensor in _all_initializers(proto.graph, kinds):
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


def _all_initializers(graph: onnx.GraphProto, kinds: set[tuple[str, str]] | None = None) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        domain, op_type = node.domain, node.op_type
        if kinds is not None:
            kinds.add((domain, op_type))
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
