"""The simulation of one training step: every buffer of the step (weights, inputs, activations and what is kept
for backward, gradients, optimizer states, temporaries, the device's autograd heap and library buffers) from one
event to another, and the live bytes at each event (a difference array, as in passes/liveness.py)."""

from __future__ import annotations

from dataclasses import dataclass

from onnxmem.ir.graph import INPUT, OUTPUT, WEIGHT
from onnxmem.passes.liveness import live_bytes
from onnxmem.targets.torch.base import DeviceModel
from onnxmem.training.model import StepModel
from onnxmem.training.optimizers import optimizer_buffers
from onnxmem.training.options import PHASES, TrainingOptions
from onnxmem.training.rules import AUTOCAST_LOW_PRECISION, OptimizerRule
from onnxmem.training.schedule import Buffer, Buffers, Events, Schedule, aliases, schedule
from onnxmem.views.report import PhaseRow, TrainingLiveRow, TrainingStep


@dataclass
class Run:
    events: Events
    buffers: list[Buffer]
    live: list[int]
    peak: int
    peak_event: int
    saved_at_backward_start: int

    @property
    def peak_phase(self) -> str:
        return self.events.phase[self.peak_event]

    @property
    def peak_label(self) -> str:
        return self.events.label[self.peak_event]

    @property
    def live_rows(self) -> tuple[TrainingLiveRow, ...]:
        at = self.peak_event
        live = [b for b in self.buffers if b.start <= at <= b.end and b.nbytes]
        by_category: dict[str, list[Buffer]] = {}
        for b in live:
            by_category.setdefault(b.category, []).append(b)
        rows = []
        for category, items in sorted(by_category.items(), key=lambda kv: -sum(b.nbytes for b in kv[1])):
            items.sort(key=lambda b: -b.nbytes)
            largest = ", ".join(f"{b.name}" for b in items[:3])
            rows.append(TrainingLiveRow(category, sum(b.nbytes for b in items), len(items), largest))
        return tuple(rows)

    def as_step(self, which: str) -> TrainingStep:
        rows = []
        for phase in PHASES:
            indices = [e for e, p in enumerate(self.events.phase) if p == phase]
            if not indices:
                continue
            peak_at = max(indices, key=self.live.__getitem__)
            rows.append(PhaseRow(phase, self.live[peak_at], self.live[indices[-1]], self.events.label[peak_at]))
        return TrainingStep(which, self.peak, self.peak_phase, self.peak_label, tuple(rows))


def simulate(model: StepModel, options: TrainingOptions, rule: OptimizerRule, first_step: bool,
              segments: list[tuple[int, int]] | None = None, recomputed: frozenset[int] = frozenset()) -> Run:
    """Give the live bytes at every event of one training step.

    `segments`: checkpointed ranges [start, end) of node positions (they keep only their inputs and are
    recomputed in backward); `recomputed`: storage roots recomputed in backward instead of kept. With
    checkpoint="layers" the segments are PyTorch's non-reentrant checkpoints (use_reentrant=False): the forward
    builds the autograd graph as it would without them; else (the K-segment what-if) each segment's graph is built
    by its recompute.
    """
    step = schedule(model, options, segments or [])
    buffers = Buffers()
    for v in model.values:  # the baseline: weights and the input batch, for the whole step
        if v.kind == WEIGHT:
            buffers.add(v.name, "weights", v.nbytes, step.data, step.end)
        elif v.kind == INPUT:
            buffers.add(v.name, "input batch", v.nbytes, step.data, step.end)
    _forward_buffers(model, step, buffers, recomputed)
    _recompute_buffers(model, step, buffers, options.checkpoints_layers)
    _kept_extras(model, step, buffers, options.checkpoints_layers)
    _backward_buffers(model, options, step, buffers)
    optimizer_buffers(model, options, rule, step, buffers, first_step)
    device = options.device_model
    _autograd_graph_buffers(model, device, step, buffers, options.checkpoints_layers)
    # the device libraries' buffers are made once per process (oneDNN's primitives and MKL's blocks on CPU): with
    # gradient accumulation the micro-step simulated (a later one, see _backward_buffers) starts with those the
    # first micro-step made
    made_before = not first_step or options.accumulates
    _library_buffers(model, device, step, buffers, not made_before)
    live = live_bytes(((b.nbytes, b.start, b.end) for b in buffers), len(step.events.phase))
    peak_event = max(range(len(live)), key=live.__getitem__)
    saved = sum(b.nbytes for b in buffers if b.category == "saved activations" and b.start <= step.seed <= b.end)
    return Run(step.events, buffers, live, live[peak_event], peak_event, saved)


def _forward_buffers(model: StepModel, step: Schedule, buffers: Buffers, recomputed: frozenset[int]) -> None:
    """Add the forward incarnation of every activation storage, alive until its last reader, or until the backward
    of the last node that keeps it; a checkpointed segment keeps only its inputs, until its backward is done."""
    nodes, values, roots, fwd, bwd = model.nodes, model.values, model.root, step.fwd, step.bwd
    saving_end: dict[int, int] = {}
    for r, savers in model.saved_by.items():
        for s in savers:
            if step.segment_of[s] < 0 and r not in recomputed:
                saving_end[r] = max(saving_end.get(r, -1), bwd[s])
    for start, end in step.segments:
        done = max((bwd[m] for m in range(start, end)), default=-1)
        for m in range(start, end):
            for t in nodes[m].inputs:
                if t < 0:
                    continue
                producer = values[roots[t]].producer
                if producer is not None and producer < start and values[roots[t]].kind not in (WEIGHT, INPUT):
                    saving_end[roots[t]] = max(saving_end.get(roots[t], -1), done)
    held_to_end = {roots[t] for t, v in enumerate(values) if v.kind == OUTPUT} | {roots[model.loss_value]} \
        if model.loss_value >= 0 else set()
    if model.model_output >= 0:
        held_to_end.add(roots[model.model_output])
    for t, v in enumerate(values):
        if roots[t] != t or v.producer is None or v.kind in (WEIGHT, INPUT):
            continue
        last = fwd[v.producer]
        for alias in aliases(model, t):
            for c in values[alias].consumers:
                last = max(last, fwd[c])
        if t in held_to_end:
            last = step.end
        if t in model.held_by_call:
            last = max(last, fwd[model.held_by_call[t]])
        if t in saving_end:
            last = max(last, saving_end[t])
        category = "saved activations" if t in saving_end else "activations"
        buffers.add(v.name, category, v.nbytes, fwd[v.producer], last)
        # recomputed in backward (the what-if): alive again from its first use to its last use in backward
        if t in recomputed and t in model.saved_by:
            uses = [bwd[s] for s in model.saved_by[t] if bwd[s] >= 0]
            if uses:
                buffers.add(v.name, "recomputed activations", v.nbytes, min(uses), max(uses))


def _autograd_graph_buffers(model: StepModel, device: DeviceModel, step: Schedule, buffers: Buffers,
                            forward_graph: bool = False) -> None:
    """Add PyTorch's autograd graph where the device counts it (DeviceModel.autograd_node_bytes per differentiable op,
    or per autograd node it makes, and per trainable parameter; on CPU: its heap): from the op's forward (its
    recompute inside a checkpointed segment, until its backward, unless `forward_graph`: non-reentrant checkpoints
    build it in forward) or the parameter's first use, to the step's end."""
    each = device.autograd_node_bytes
    if not each:
        return
    for n, node in enumerate(model.nodes):
        if not model.differentiable[n]:
            continue
        nbytes = each * model.autograd_nodes.get(n, 1)
        if step.segment_of[n] >= 0 and not forward_graph:
            buffers.add(f"{node.name} (autograd node)", "autograd graph", nbytes, step.rec[n], step.bwd[n])
        else:
            buffers.add(f"{node.name} (autograd node)", "autograd graph", nbytes, step.fwd[n], step.end)
    for t in model.params:
        users = [step.fwd[c] for c in model.values[t].consumers]
        buffers.add(f"{model.values[t].name} (gradient accumulator)", "autograd graph", each,
                    min(users, default=step.data), step.end)


def _library_buffers(model: StepModel, device: DeviceModel, step: Schedule, buffers: Buffers, first_step: bool) \
        -> None:
    """Add the buffers the device's libraries keep (DeviceModel.library_buffers: oneDNN's primitives and MKL's GEMM
    buffers on CPU), each from the event that makes it to the step's end (to the process's end: in a later step,
    from its start)."""

    def event(n: int, backward: bool) -> int:
        return step.bwd[n] if backward else step.rec[n] if step.fwd[n] < 0 else step.fwd[n]

    for made in device.library_buffers(model.library, event):
        buffers.add(made.name, made.category, made.nbytes, made.event if first_step else step.data, step.end)


def _recompute_buffers(model: StepModel, step: Schedule, buffers: Buffers, non_reentrant: bool = False) -> None:
    """Add the recompute incarnations of the activations inside checkpointed segments (`non_reentrant`:
    checkpoint="layers")."""
    nodes, values, roots, rec, bwd = model.nodes, model.values, model.root, step.rec, step.bwd
    for start, end in step.segments:
        recomputed = [m for m in range(start, end) if rec[m] >= 0]  # (a non-reentrant checkpoint stops early)
        stop = max((rec[m] for m in recomputed), default=-1)
        for m in recomputed:
            if non_reentrant and m == recomputed[-1] and m not in model.extras and \
                    not any(t >= 0 and m in model.saved_by.get(roots[t], ()) for t in nodes[m].outputs):
                # the recompute stops when the last saved tensor is packed: where that is an input, before the
                # op runs
                continue
            for t in nodes[m].outputs:
                if t < 0 or roots[t] != t or values[t].kind in (WEIGHT, INPUT):
                    continue
                last = rec[m]
                for alias in aliases(model, t):
                    for c in values[alias].consumers:
                        if start <= c < end:
                            last = max(last, rec[c])
                for saver in model.saved_by.get(t, []):
                    if start <= saver < end:
                        last = max(last, bwd[saver])
                held = model.held_by_call.get(t)
                if non_reentrant and held is not None and start <= held < end:
                    # the recompute runs the block's Python again: its frames hold what they held in forward, to
                    # the recompute's end where it stops early
                    last = max(last, rec[held] if rec[held] >= 0 else stop)
                buffers.add(values[t].name, "saved activations", values[t].nbytes, rec[m], last)


def _kept_extras(model: StepModel, step: Schedule, buffers: Buffers, non_reentrant: bool = False) -> None:
    """Add the masks, indices and statistics nodes keep, forward temporaries, and autocast's low-precision
    copies (`non_reentrant`: checkpoint="layers")."""
    nodes, values, fwd, rec, bwd = model.nodes, model.values, step.fwd, step.rec, step.bwd
    for n, nbytes in model.extras.items():
        name = f"{nodes[n].name} (mask/indices/statistics)"
        if step.segment_of[n] >= 0:
            buffers.add(name, "activations", nbytes, fwd[n], fwd[n])
            buffers.add(name, "saved activations", nbytes, rec[n], bwd[n])
        else:
            buffers.add(name, "saved activations", nbytes, fwd[n], bwd[n])
    for n, nbytes in model.forward_temporaries.items():
        name = f"{nodes[n].name} (forward temporaries)"
        buffers.add(name, "temporaries", nbytes, fwd[n], fwd[n])
        if step.segment_of[n] >= 0 and rec[n] >= 0:
            buffers.add(name, "temporaries", nbytes, rec[n], rec[n])
    for (n, t), nbytes in model.cast_copies.items():
        start = rec[n] if step.segment_of[n] >= 0 else fwd[n]
        buffers.add(f"{values[t].name} (low-precision copy)", "saved activations", nbytes, start, bwd[n])
    for t, nbytes in model.weight_copies.items():
        users = [n for n in _copy_readers(model, t) if model.differentiable[n]]
        if users and non_reentrant and all(step.segment_of[n] >= 0 for n in users):
            # in a non-reentrant checkpoint, autocast's cache holds the forward's copy until the autocast region
            # ends; the recompute (its own autocast region) makes the copy again, which the op keeps until its
            # backward
            name = f"{values[t].name} (low-precision copy)"
            buffers.add(name, "low-precision weight copies", nbytes, min(fwd[n] for n in users),
                        step.end_of_forward)
            buffers.add(name, "low-precision weight copies", nbytes, min(rec[n] for n in users),
                        max(bwd[n] for n in users))
            continue
        first_use = min((fwd[n] for n in users), default=step.end_of_forward)
        last_use = max([bwd[n] for n in users] + [step.end_of_forward])
        buffers.add(f"{values[t].name} (low-precision copy)", "low-precision weight copies", nbytes, first_use,
                    last_use)


def _copy_readers(model: StepModel, t: int) -> list[int]:
    """Give the nodes that read weight `t`'s autocast copy: its consumers that autocast runs in 16 bits, directly or
    through a view of the whole weight (a 3-D Linear's transpose)."""
    readers: list[int] = []
    stack = [t]
    while stack:
        for n in model.values[stack.pop()].consumers:
            views = [o for o in model.nodes[n].outputs if o >= 0 and model.root[o] == t]
            if views:
                stack.extend(views)
            else:
                readers.append(n)
    low = [n for n in readers if model.nodes[n].op_type in AUTOCAST_LOW_PRECISION]
    return low or readers  # a tied embedding's Gather reads the fp32 weight, not the copy


def _backward_buffers(model: StepModel, options: TrainingOptions, step: Schedule, buffers: Buffers) -> None:
    """Add backward's buffers: the loss gradient, activation gradients (handed through views, summed in place where
    the engine may), parameter gradients (to the end of the step), backward temporaries; with gradient accumulation, the
    gradients kept across micro-steps."""
    nodes, values = model.nodes, model.values
    grad_buffer: dict[int, int] = {}  # value -> index in `buffers` of its gradient
    holders: dict[int, int] = {}  # index in `buffers` -> how many values' gradient it is (grad_buffer's inverse)

    def hold(t: int, index: int) -> None:
        previous = grad_buffer.get(t)
        if previous is not None:
            holders[previous] -= 1
        grad_buffer[t] = index
        holders[index] = holders.get(index, 0) + 1
    trainable = set(model.params)
    if model.loss_value >= 0 and model.needs_grad[model.loss_value]:
        buffers.append(Buffer("loss gradient", "activation gradients", 4, step.seed, step.seed))
        hold(model.loss_value, len(buffers) - 1)
    grad_of_output_size = grad_bytes_per_value(model, options)
    param_first_grad: dict[int, int] = {}
    param_grad_views: dict[int, int] = {}  # parameter -> the gradient buffer it took over
    for e, n in sorted((e, n) for n, e in enumerate(step.bwd) if e >= 0):
        node = nodes[n]
        for t in node.outputs:
            if t >= 0 and t in grad_buffer:
                b = buffers[grad_buffer[t]]
                b.end = max(b.end, e)
        out_grad = grad_buffer.get(node.outputs[0]) if node.outputs and node.outputs[0] >= 0 else None
        for t in model.passthrough.get(n, []):
            if out_grad is None:
                continue
            if t in trainable:  # a view's gradient handed to the parameter: it becomes the parameter's
                if t in param_first_grad or t in param_grad_views:
                    buffers.add(f"{values[t].name} (accumulated)", "temporaries", buffers[out_grad].nbytes, e, e)
                else:
                    param_grad_views[t] = out_grad
                continue
            if t in grad_buffer:  # accumulated out of place into a new buffer
                old = buffers[grad_buffer[t]]
                old.end = max(old.end, e)
                buffers.append(Buffer(f"grad {values[t].name}", "activation gradients", old.nbytes, e, e))
                hold(t, len(buffers) - 1)
                continue
            hold(t, out_grad)
        for t in model.new_grads.get(n, []):
            size = grad_of_output_size[t]
            if t in trainable:
                if t in param_first_grad or t in param_grad_views:
                    buffers.add(f"{values[t].name} (accumulated)", "temporaries", size, e, e)
                else:
                    param_first_grad[t] = e
                continue
            if t in grad_buffer:
                # The engine sums in place (InputBuffer::accumulate): into the old gradient where it holds the only
                # reference to it, dropping the new one; else into the new one, which it alone holds (just made)
                old_index = grad_buffer[t]
                old = buffers[old_index]
                old.end = max(old.end, e)
                if holders.get(old_index, 0) <= 1:  # (t is its only holder)
                    buffers.add(f"grad {values[t].name} (incoming)", "temporaries", size, e, e)
                    continue
            buffers.append(Buffer(f"grad {values[t].name}", "activation gradients", size, e, e))
            hold(t, len(buffers) - 1)
        if n in model.backward_temporaries:
            buffers.add(f"{node.name} (backward temporaries)", "temporaries", model.backward_temporaries[n], e, e)
        if options.precision.startswith("amp-") and node.op_type in AUTOCAST_LOW_PRECISION:
            for t in node.inputs:
                if t in trainable:  # the low-precision weight gradient, cast to the fp32 one
                    buffers.add(f"{values[t].name} (low-precision gradient)", "temporaries",
                                (values[t].numel or 0) * 2, e, e)
    # Gradients of graph inputs are never needed; a gradient nobody consumes dies where it was made.
    for param, e in param_first_grad.items():
        buffers.add(f"grad {values[param].name}", "parameter gradients", grad_of_output_size[param], e, step.end)
    for param, taken in param_grad_views.items():
        buffers[taken].category, buffers[taken].end = "parameter gradients", step.end
        param_first_grad.setdefault(param, buffers[taken].start)
    # Gradient accumulation: from the second micro-step on, gradients exist through forward, and each new
    # parameter gradient is a temporary added into the kept one.
    if options.accumulates:
        for param, e in param_first_grad.items():
            buffers.add(f"grad {values[param].name} (accumulating)", "parameter gradients",
                        grad_of_output_size[param], step.data, e - 1)
            buffers.add(f"grad {values[param].name} (micro-step)", "temporaries", grad_of_output_size[param], e, e)


def grad_bytes_per_value(model: StepModel, options: TrainingOptions) -> list[int]:
    """Give the bytes of each value's gradient: its own size (parameters: at the master precision)."""
    return [v.nbytes for v in model.values]
