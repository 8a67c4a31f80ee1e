"""Liveness: an execution order and buffer rules -> live activation bytes at every step, and the peak."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .dtypes import element_bits
from .graph import ACTIVATION, OUTPUT, ModelGraph, Tensor
from .rules import InferenceRules
from .rules.inference import BODY_OUTPUTS_SEPARATE, BODY_STATE_BYTES

_OWNS_BUFFER = (ACTIVATION, OUTPUT)


@dataclass(frozen=True)
class Timeline:
    """Live activation bytes at each step of an order, and which buffer each tensor lives in.

    Step s runs op order[s]. live_bytes[s] counts every activation buffer allocated at or before s and
    last read at or after s: the op's inputs and outputs are both live while it runs. Graph inputs and
    weights are not activations and are not counted here.
    """

    order: tuple[int, ...]
    live_bytes: tuple[int, ...]
    new_bytes: tuple[int, ...]  # bytes allocated at each step (live before the op = live - new)
    subgraph_bytes: tuple[int, ...]  # transient bytes of an If/Loop/Scan body at each step
    buffer_of: tuple[int, ...]  # per tensor: the tensor whose buffer it uses (itself, or -1: not an activation)
    first_step: tuple[int, ...]  # per buffer-owning tensor: step it is allocated (-1: not a buffer)
    last_step: tuple[int, ...]  # per buffer-owning tensor: last step it is live
    unsized: tuple[int, ...]  # activation tensors whose size is unknown: counted as 0 bytes
    peak_bytes: int
    peak_step: int

    def live_at(self, step: int) -> list[int]:
        """Give the buffer-owning tensors live at a step."""
        return [t for t, first in enumerate(self.first_step) if 0 <= first <= step <= self.last_step[t]]


def alias_roots(graph: ModelGraph, rules: InferenceRules) -> list[int]:
    """Give, per tensor, the tensor whose buffer it is a view of (itself when it is no view).

    A view (ALIASES) shares its input's buffer, whatever that is: an activation, a graph input or a weight.
    A graph output is never a view: onnxruntime gives every output a buffer of its own.
    """
    tensors = graph.tensors
    root = list(range(len(tensors)))
    for op in graph.ops:
        source = rules.alias_input(op.op_type, op.domain)
        if source is None or source >= len(op.inputs) or op.inputs[source] < 0 or not op.outputs:
            continue
        out = op.outputs[0]
        if out >= 0 and tensors[out].kind != OUTPUT:
            root[out] = root[op.inputs[source]]
    for t in range(len(root)):  # an out-of-order file may leave chains: compress them
        while root[root[t]] != root[t]:
            root[t] = root[root[t]]
    return root


def liveness(graph: ModelGraph, order: Sequence[int], rules: InferenceRules,
             count_graph_outputs: bool = True) -> Timeline:
    """Give the timeline of live activation bytes when the graph runs in `order` under `rules`."""
    tensors = graph.tensors
    steps = len(order)
    end = steps - 1
    position = [0] * len(graph.ops)
    for step, op_index in enumerate(order):
        position[op_index] = step

    # Buffer owners: views live in their input's buffer; in-place outputs join it below (union-find).
    owner = alias_roots(graph, rules)

    def find(t: int) -> int:
        while owner[t] != t:
            owner[t] = owner[owner[t]]
            t = owner[t]
        return t

    first = [-1] * len(tensors)
    last = [-1] * len(tensors)
    for t in tensors:
        if t.producer is None:
            continue
        last_use = max((position[c] for c in t.consumers), default=position[t.producer])
        if t.kind == OUTPUT and count_graph_outputs:
            last_use = end
        root = find(t.index)
        if root == t.index:
            first[root] = position[t.producer]
        last[root] = max(last[root], last_use)

    # In place: the op's output takes its first input's buffer when that buffer dies at this very step.
    for step, op_index in enumerate(order):
        op = graph.ops[op_index]
        if not op.inputs or not op.outputs or op.inputs[0] < 0 or op.outputs[0] < 0:
            continue
        if not rules.may_run_in_place(op.op_type, op.domain):
            continue
        source, out = find(op.inputs[0]), find(op.outputs[0])
        if source == out or tensors[source].kind != ACTIVATION or tensors[out].kind != ACTIVATION:
            continue
        if last[source] != step or not _same_size(tensors[op.inputs[0]], tensors[op.outputs[0]]):
            continue
        owner[out] = source
        last[source] = max(last[source], last[out])
        first[out] = last[out] = -1

    buffer_of = [-1] * len(tensors)
    delta = [0] * (steps + 1)
    new_bytes = [0] * steps
    unsized = []
    for t in tensors:
        root = find(t.index)
        if tensors[root].kind not in _OWNS_BUFFER or tensors[root].producer is None:
            continue
        if tensors[root].kind == OUTPUT and not count_graph_outputs:
            continue
        buffer_of[t.index] = root
        if root != t.index:
            continue
        size = t.nbytes
        if size is None:
            unsized.append(t.index)
            continue
        delta[first[root]] += size
        delta[last[root] + 1] -= size
        new_bytes[first[root]] += size

    subgraph_bytes = [0] * steps
    for step, op_index in enumerate(order):
        op = graph.ops[op_index]
        if op.subgraphs:
            separate = op.op_type in BODY_OUTPUTS_SEPARATE
            subgraph_bytes[step] = max(subgraph_peak(sub, rules, separate) for sub in op.subgraphs) + \
                BODY_STATE_BYTES.get(op.op_type, 0)

    live = []
    running = 0
    for step in range(steps):
        running += delta[step]
        live.append(running + subgraph_bytes[step])
    peak_step = max(range(steps), key=live.__getitem__) if steps else -1
    return Timeline(
        order=tuple(order), live_bytes=tuple(live), new_bytes=tuple(new_bytes),
        subgraph_bytes=tuple(subgraph_bytes), buffer_of=tuple(buffer_of),
        first_step=tuple(f if buffer_of[i] == i else -1 for i, f in enumerate(first)),
        last_step=tuple(last), unsized=tuple(unsized),
        peak_bytes=live[peak_step] if steps else 0, peak_step=peak_step,
    )


def _same_size(a: Tensor, b: Tensor) -> bool:
    # onnxruntime's SameSize: the same element size and the same static shape, not merely the same bytes.
    if a.shape is None or b.shape is None or a.nbytes is None or b.nbytes is None or a.shape != b.shape:
        return False
    return element_bits(a.dtype) == element_bits(b.dtype)


def subgraph_peak(sub: ModelGraph, rules: InferenceRules, count_outputs: bool = False) -> int:
    """Give the most bytes a subgraph holds at once: its intermediates, and its outputs when they are buffers of
    their own (a Loop's body) rather than its node's outputs (an If's branch)."""
    from .schedule import model_order

    if not sub.ops:
        return 0
    return liveness(sub, model_order(sub), rules, count_graph_outputs=count_outputs).peak_bytes
