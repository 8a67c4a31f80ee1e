"""Results as plain frozen dataclasses; to_dict() gives the versioned JSON form. Sizes are int bytes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

SCHEMA = "onnxmem.report/1"


@dataclass(frozen=True)
class Warning:  # noqa: A001 - the name is what it is; the builtin is never needed next to it
    """Something the user should know: the estimate stands but is incomplete, assumed or approximate."""

    code: str  # a stable name: unknown-shape, unknown-operator, missing-external-data, default-dim, ...
    message: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


@dataclass(frozen=True)
class LiveTensor:
    """A tensor live at the peak."""

    name: str
    shape: tuple[int | str | None, ...] | None
    dtype: str
    bytes: int | None
    producer: str  # node name
    op_type: str
    layer: str


@dataclass(frozen=True)
class OpTypeRow:
    """Totals for one operator type."""

    op_type: str
    nodes: int
    weight_bytes: int
    output_bytes: int  # bytes of the activation buffers its nodes allocate (aliases and in-place excluded)


@dataclass(frozen=True)
class LayerRow:
    """Totals for one layer (the node name's scope, e.g. /encoder/layers.0/attn)."""

    layer: str
    nodes: int
    weight_bytes: int
    output_bytes: int
    peak_live_bytes: int  # the most activation bytes live while one of its nodes runs


@dataclass(frozen=True)
class InferenceReport:
    """Inference memory: weights, inputs, and the peak of activations by liveness."""

    weights_bytes: int
    weights_by_dtype: dict[str, int]
    input_bytes: int
    output_bytes: int
    peak_activation_bytes: int  # most bytes of computed tensors (intermediates and outputs) live at once
    peak_bytes: int  # weights + inputs + peak activations
    peak_node: str
    peak_op_type: str
    peak_step: int
    sum_activation_bytes: int  # every activation buffer added up: what a hand formula would count
    live_at_peak: tuple[LiveTensor, ...]  # largest first
    by_op_type: tuple[OpTypeRow, ...]
    by_layer: tuple[LayerRow, ...]
    unsized_tensors: int  # activations of unknown size, not counted: the peak is then a lower bound


@dataclass(frozen=True)
class Report:
    """Everything `onnxmem report` says about one model at one binding of its dims."""

    model: str
    dims: dict[str, int]
    order: str
    nodes: int
    tensors: int
    opsets: dict[str, int]
    inference: InferenceReport
    warnings: tuple[Warning, ...]
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """Give the report as JSON-ready builtins (the documented schema)."""
        return _plain(self)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
