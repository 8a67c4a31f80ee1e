"""The events of one training step and the buffers that live between them (data, forward, loss, backward with the
recomputes of checkpointed segments, optimizer)."""

from __future__ import annotations

from dataclasses import dataclass

from onnxmem.training.model import StepModel
from onnxmem.training.options import TrainingOptions


@dataclass
class Buffer:
    """A buffer of the step, live from event `start` to event `end` (both included)."""

    name: str
    category: str
    nbytes: int
    start: int
    end: int


class Events:
    """The events of one step in order: each one's phase and label."""

    def __init__(self) -> None:
        self.phase: list[str] = []
        self.label: list[str] = []

    def add(self, phase: str, label: str) -> int:
        self.phase.append(phase)
        self.label.append(label)
        return len(self.phase) - 1


# ---------------------------------------------------------------------------------------------------------------
# The simulation: events, buffers, and the live bytes at each event.


@dataclass
class Schedule:
    """The events of one step in order (data, forward, loss, backward with the recomputes of checkpointed segments,
    optimizer), and where each node's forward, recompute and backward fall among them (-1: none)."""

    events: Events
    data: int
    fwd: list[int]  # per node
    bwd: list[int]
    rec: list[int]
    seed: int  # the loss gradient
    opt_events: list[int]  # per parameter (a for-loop update), or one for all
    end: int  # the last event
    segments: list[tuple[int, int]]
    segment_of: list[int]  # per node: its checkpointed segment, -1 for none

    @property
    def end_of_forward(self) -> int:
        return self.fwd[-1] if self.fwd else self.data


class Buffers(list[Buffer]):
    def add(self, name: str, category: str, nbytes: int, start: int, end: int) -> None:
        """Add a buffer live from event `start` to `end` (an empty one is left out)."""
        if nbytes > 0:
            self.append(Buffer(name, category, nbytes, start, max(start, end)))


def schedule(model: StepModel, options: TrainingOptions, segments: list[tuple[int, int]]) -> Schedule:
    """Give the events of one step: data, each node's forward, the loss, the backward of the differentiable nodes in
    reverse (a checkpointed segment recomputed first; with checkpoint="layers", as PyTorch's non-reentrant
    checkpoint: from the backward of its last node that keeps something, and up to that node only), the optimizer
    update (per parameter in a for-loop)."""
    nodes = model.nodes
    ev = Events()
    data = ev.add("data", "data")
    fwd = [ev.add("loss" if node.graph_op is None else "forward", f"{node.op_type} {node.name}") for node in nodes]
    segment_of = [-1] * len(nodes)
    for s, (start, end) in enumerate(segments):
        for n in range(start, end):
            segment_of[n] = s
    bwd = [-1] * len(nodes)
    rec = [-1] * len(nodes)
    non_reentrant = options.checkpoints_layers
    keeps = keeping_nodes(model) if non_reentrant and segments else set()
    seed = ev.add("backward", "loss gradient")
    n = len(nodes) - 1
    while n >= 0:
        s = segment_of[n]
        if s < 0:
            if model.differentiable[n]:
                bwd[n] = ev.add("backward", f"backward of {nodes[n].op_type} {nodes[n].name}")
            n -= 1
            continue
        start, end = segments[s]
        # non-reentrant (checkpoint="layers"): the recompute runs at the first unpack of a saved tensor, in the
        # backward of the block's last op that keeps one, and stops after that op (early stop)
        stop = max((m + 1 for m in range(start, end) if m in keeps), default=start) if non_reentrant else end
        for m in range(end - 1, stop - 1, -1):
            if model.differentiable[m]:
                bwd[m] = ev.add("backward", f"backward of {nodes[m].op_type} {nodes[m].name}")
        for m in range(start, stop):
            rec[m] = ev.add("backward", f"recompute {nodes[m].op_type} {nodes[m].name}")
        for m in range(stop - 1, start - 1, -1):
            if model.differentiable[m]:
                bwd[m] = ev.add("backward", f"backward of {nodes[m].op_type} {nodes[m].name}")
        n = start - 1
    if options.update_impl == "for-loop":
        opt_events = [ev.add("optimizer", f"update {model.values[p].name}") for p in model.params] or \
            [ev.add("optimizer", "update")]
    else:
        opt_events = [ev.add("optimizer", "update (all parameters)")]
    return Schedule(ev, data, fwd, bwd, rec, seed, opt_events, len(ev.phase) - 1, segments, segment_of)


def keeping_nodes(model: StepModel) -> set[int]:
    """Give the nodes that keep something for backward: a tensor, a mask or statistics, an autocast copy."""
    kept = {n for savers in model.saved_by.values() for n in savers} | set(model.extras)
    kept |= {n for n, _ in model.cast_copies}
    kept |= {n for t in model.weight_copies for n in model.values[t].consumers if model.differentiable[n]}
    return kept


def aliases(model: StepModel, root: int) -> list[int]:
    """Give the values that live in storage `root` (views of it, and itself)."""
    return model.members.get(root, [root])
