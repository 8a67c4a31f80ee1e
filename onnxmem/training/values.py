"""The step's data: its forward nodes and values, and the lookups every part of the step model (and each device's
model, onnxmem/targets/torch/) reads them with.

A StepNode is a forward op of the step (a graph op, an ATen op fused back from its nodes, or an op of the loss
onnxmem appends); a StepValue is a tensor of the step at the training precision. Both are indexed as the graph's
ops and tensors are, with the loss's values appended.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from onnxmem.training.rules import ATEN_SAVED_FOR_BACKWARD, SAVED_FOR_BACKWARD, Saves

_ATEN_TARGET = re.compile(r"^torch\.ops\.aten\.([A-Za-z0-9_]+)\.")

# (T steps, D directions, B batch, I input features, H hidden) of a recurrent op
RecurrentDims = tuple[int, int, int, int, int]


@dataclass
class StepNode:
    """A forward op of the step: a graph op or one of the loss's appended ops."""

    op_type: str
    domain: str
    name: str
    layer: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    graph_op: int | None  # index into graph.ops, or None for a loss op
    restored: bool = False  # an op the export folded away, simulated after the node it was folded into
    aten: str = ""  # the ATen op a graph op was exported from ('clone'; aten_op of its origin), "" where not known


@dataclass
class StepValue:
    """A tensor of the step (a graph tensor or a loss intermediate) at the training precision."""

    name: str
    shape: tuple[int | str | None, ...] | None
    numel: int | None
    nbytes: int  # at the training precision; 0 when unknown
    is_float: bool
    kind: str  # weight | input | activation | output | loss
    is_sequence: bool = False  # a tensor sequence (no dtype of its own): it carries gradients like its tensors
    producer: int | None = None  # node index
    consumers: list[int] = field(default_factory=list)
    quantized: bool = False  # a frozen weight stored at TrainingOptions.base_precision (bitsandbytes' layout)


def saves_rule(op_type: str, domain: str) -> Saves | None:
    """Give what an op keeps for backward (SAVED_FOR_BACKWARD, ATEN_SAVED_FOR_BACKWARD for 'aten::<op>'), or None
    for an op missing from the tables."""
    if op_type.startswith("aten::"):
        return ATEN_SAVED_FOR_BACKWARD.get(op_type[len("aten::"):])
    key = op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"
    return SAVED_FOR_BACKWARD.get(key)


def rule_key(node: StepNode) -> str:
    """Give the node's key in the rule tables: its op type, 'domain::op type' outside ONNX's domain."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def aten_op(origin: str) -> str:
    """Give the ATen op's name ('silu') from an Op.origin ('torch.ops.aten.silu.default %silu x'), or ""."""
    found = _ATEN_TARGET.match(origin)
    return found.group(1) if found else ""


def numel_of(shape: tuple[object, ...] | None) -> int | None:
    """Give the elements of a shape, or None where a dim is not a number."""
    if shape is None:
        return None
    count = 1
    for d in shape:
        if not isinstance(d, int):
            return None
        count *= d
    return count


def module_classes(layer: str) -> list[str]:
    """Give the module classes of a dynamo export's scope, outermost first (': pkg.M/drop: torch...Dropout/...')."""
    if ":" not in layer:
        return []
    return [part.split(":", 1)[1].strip() for part in layer.split("/")[:-1] if ":" in part]


def is_tensor(value: StepValue) -> bool:
    """Say whether a value is an activation-like tensor: float and more than one element (not a shape, an index
    or a scalar constant)."""
    return value.is_float and (value.numel is None or value.numel > 1)


def known_shape(value: StepValue) -> tuple[int, ...] | None:
    """Give a value's shape where every dim is a positive number, else None."""
    shape = value.shape
    if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)  # type: ignore[arg-type]


def node_recurrent_dims(node: StepNode, values: list[StepValue]) -> RecurrentDims | None:
    """Give (T steps, D directions, B batch, I features, H hidden) of a recurrent node (_recurrent_dims), from the
    ONNX node's shapes: W [D, gates x H, I], R [D, gates x H, H], X of T x B x I elements, Y_h or initial_h of
    D x B x H (any layout)."""

    def shape(i: int, sources: tuple[int, ...]) -> tuple[int | str | None, ...] | None:
        t = sources[i] if i < len(sources) else -1
        return values[t].shape if t >= 0 else None

    x = values[node.inputs[0]] if node.inputs and node.inputs[0] >= 0 else None
    return recurrent_dims(shape(1, node.inputs), shape(2, node.inputs), x,
                           shape(1, node.outputs) or shape(5, node.inputs), shape(0, node.outputs))



def recurrent_dims(w: tuple[int | str | None, ...] | None, r: tuple[int | str | None, ...] | None,
                    x: StepValue | None, states: tuple[int | str | None, ...] | None,
                    y: tuple[int | str | None, ...] | None) -> RecurrentDims | None:
    """Give (T steps, D directions, B batch, I features, H hidden) of a recurrent node: from its weights
    W [D, gates x H, I] and R [D, gates x H, H] and its states [D, B, H] where those are known, else from its
    output Y [T, D, B, H] (layout 0, the one exporters write) and input X [T, B, I] (weights the exporter
    reorders at run time have no static shape)."""
    if x is None:
        return None
    if x.numel is not None and w is not None and r is not None and states is not None and len(w) == 3 and len(r) == 3:
        directions, features, hidden = w[0], w[2], r[2]
        state_numel = numel_of(states)
        if all(isinstance(d, int) and d > 0 for d in (directions, features, hidden)) and state_numel:
            assert isinstance(directions, int) and isinstance(features, int) and isinstance(hidden, int)
            batch = state_numel // (directions * hidden)
            return x.numel // max(batch * features, 1), directions, batch, features, hidden
    if y is not None and len(y) == 4 and all(isinstance(d, int) and d > 0 for d in y):
        steps, directions, batch, hidden = (int(d) for d in y)  # type: ignore[arg-type]
        features = x.shape[2] if x.shape is not None and len(x.shape) == 3 else None
        return steps, directions, batch, features if isinstance(features, int) else 0, hidden
    return None

