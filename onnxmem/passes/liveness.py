"""Liveness: an execution order and buffer rules -> live activation bytes at every step, and the peak."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from onnxmem.ir.dtypes import element_bits
from onnxmem.ir.graph import ACTIVATION, OUTER, OUTPUT, ModelGraph
from onnxmem.ir.tensor_types import Dim
from onnxmem.passes.schedule import model_order
from onnxmem.targets.ort.rules import InferenceRules
from onnxmem.targets.ort.tables import BODY_OUTPUTS_SEPARATE, BODY_STATE_BYTES, EXPANDED_INTERMEDIATES

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
    # transient bytes at each step: an If/Loop/Scan body, an expanded function, a kernel's scratch (liveness's
    # `scratch`)
    subgraph_bytes: tuple[int, ...]
    buffer_of: tuple[int, ...]  # per tensor: the tensor whose buffer it uses (itself, or -1: not an activation)
    view_of: tuple[int, ...]  # per tensor: the tensor it is a view of (ALIASES), itself when it is none
    first_step: tuple[int, ...]  # per buffer-owning tensor: step it is allocated (-1: not a buffer)
    last_step: tuple[int, ...]  # per buffer-owning tensor: last step it is live
    unsized: tuple[int, ...]  # activation tensors whose size is unknown: counted as 0 bytes
    peak_bytes: int
    peak_step: int

    def live_at(self, step: int) -> list[int]:
        """Give the buffer-owning tensors live at a step."""
        return [t for t, (first, last) in enumerate(zip(self.first_step, self.last_step, strict=True))
                if 0 <= first <= step <= last]


def alias_roots(graph: ModelGraph, rules: InferenceRules, loop_body: bool = False) -> list[int]:
    """Give, per tensor, the tensor whose buffer it is a view of (itself when it is no view).

    A view (ALIASES) shares its input's buffer, whatever that is: an activation, a graph input or a weight.
    A graph output is never a view: onnxruntime gives every output a buffer of its own, except in a Loop body,
    where an Identity passing a body input (not the iteration number) through to an output shares it.
    """
    tensors = graph.tensors
    passed_through = {t for t in graph.inputs[1:]} | {t.index for t in tensors if t.kind == OUTER} \
        if loop_body else set()
    root = list(range(len(tensors)))
    # the rules' answer per operator kind, asked once each (keyed by op type alone in ONNX's domain '')
    sources: dict[tuple[str, str] | str, int | None] = {}
    for op in graph.ops:
        kind = op.op_type if not op.domain else (op.op_type, op.domain)
        source = sources.get(kind, -1)
        if source == -1:
            source = sources[kind] = rules.alias_input(op.op_type, op.domain)
        if source is None or source >= len(op.inputs) or op.inputs[source] < 0 or not op.outputs:
            continue
        out = op.outputs[0]
        if out >= 0 and (tensors[out].kind != OUTPUT
                         or (op.op_type == "Identity" and op.inputs[source] in passed_through)):
            root[out] = root[op.inputs[source]]
    if not graph.in_file_order:  # an out-of-order file may leave chains (in order, each input's root was final)
        for t in range(len(root)):
            while root[root[t]] != root[t]:
                root[t] = root[root[t]]
    return root


@dataclass(frozen=True)
class Lifetimes:
    """What liveness reads from the wiring and the order alone, before any size is known (so it can be made
    while shapes are still being inferred): each tensor's alias root, each buffer's first and last step, and per
    step what the buffer plan looks at."""

    owner: list[int]
    first: list[int]
    last: list[int]
    # per step: (the op's first output, its first input) where the output may take the input's buffer (the op
    # runs in place), else (-1, -1); the op's buffer-owning activation outputs where they may take a freed
    # buffer, else none; the tensors it reads or makes whose buffer dies there (before any output joins a
    # buffer), in the order the planner frees them: inputs, implicit inputs, outputs
    in_place: list[tuple[int, int]]
    take_freed: list[list[int]]
    dying: list[list[int]]
    activation: list[bool]  # per tensor: whether it is an activation (not an input, weight or graph output)
    transient: list[tuple[int, int]]  # (step, op) of the ops with transient bytes: subgraphs, expanded functions


# A buffer plan made (liveness's `plans`): the lifetimes it was made from, and its tensors' owners, first and last
# steps after it
Plan = tuple[Lifetimes, tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def lifetimes(graph: ModelGraph, order: Sequence[int], rules: InferenceRules, count_graph_outputs: bool = True,
              loop_body: bool = False) -> Lifetimes:
    """Give the size-free part of liveness (see Lifetimes) for the same arguments."""
    tensors = graph.tensors
    end = len(order) - 1
    position = [0] * len(graph.ops)
    for step, op_index in enumerate(order):
        position[op_index] = step
    # Buffer owners: views live in their input's buffer; in-place outputs join it later (union-find).
    owner = alias_roots(graph, rules, loop_body)
    first = [-1] * len(tensors)
    last = [-1] * len(tensors)
    used = [-1] * len(tensors)  # per tensor: the last step that reads or makes it
    for t in tensors:
        producer = t.producer
        if producer is None:
            continue
        made_at = last_use = position[producer]
        for c in t.consumers:
            if position[c] > last_use:
                last_use = position[c]
        index = t.index
        used[index] = last_use
        if count_graph_outputs and t.kind == OUTPUT:
            last_use = end
        root = owner[index]  # alias roots are compressed: a root is its own owner
        if root == index:
            first[root] = made_at
        if last_use > last[root]:
            last[root] = last_use
    # The rules' answers per operator kind, asked once each (a graph has few kinds and many nodes): the input an
    # output may take in place, whether outputs may take a freed buffer, whether the op expands intermediates.
    answers: dict[tuple[str, str] | str, tuple[int | None, bool, bool]] = {}
    activation = [t.kind == ACTIVATION for t in tensors]
    in_place: list[tuple[int, int]] = []
    take_freed: list[list[int]] = []
    no_outputs: list[int] = []
    none = (-1, -1)
    ops = graph.ops
    transient: list[tuple[int, int]] = []  # (step, op) of the ops with transient bytes: subgraphs, expanded functions
    for step, op_index in enumerate(order):
        op = ops[op_index]
        kind = op.op_type if not op.domain else (op.op_type, op.domain)  # (ONNX's domain: by op type alone)
        answer = answers.get(kind)
        if answer is None:
            answer = answers[kind] = (rules.in_place_input(op.op_type, op.domain),
                                      rules.may_take_freed(op.op_type, op.domain),
                                      op.op_type in EXPANDED_INTERMEDIATES and op.domain in ("", "ai.onnx"))
        if answer[2] or op.subgraphs:
            transient.append((step, op_index))
        outputs = op.outputs
        if len(outputs) == 1:  # (the usual case, without a list comprehension)
            out = outputs[0]
            made = [out] if out >= 0 and owner[out] == out and activation[out] else no_outputs
        else:
            made = [out for out in outputs if out >= 0 and owner[out] == out and activation[out]]
        inputs = op.inputs
        slot = answer[0]
        in_place.append((outputs[0], inputs[slot]) if slot is not None and made and made[0] == outputs[0]
                        and len(inputs) > slot and inputs[slot] >= 0 else none)
        take_freed.append(made if answer[1] else no_outputs)
    # A buffer dies at its last step; the tensors stored in it that this step reads or makes are those whose own
    # last use is that step. Freed buffers of equal size are taken most recently freed first, so their order
    # within a step is the planner's: by first appearance among the op's inputs, implicit inputs and outputs.
    dying: list[list[int]] = [[] for _ in order]
    for index, (step, root) in enumerate(zip(used, owner, strict=True)):
        if step >= 0 and step == last[root] and activation[root]:
            dying[step].append(index)  # (a graph input's, a weight's or a graph output's buffer is never freed)
    for step, found in enumerate(dying):
        if len(found) > 1:
            op = graph.ops[order[step]]
            slots = [*op.inputs, *op.implicit_inputs, *op.outputs]
            found.sort(key=slots.index)
    return Lifetimes(owner, first, last, in_place, take_freed, dying, activation, transient)


def liveness(graph: ModelGraph, order: Sequence[int], rules: InferenceRules, count_graph_outputs: bool = True,
             plan_shapes: Sequence[tuple[Dim, ...] | None] | None = None, loop_body: bool = False,
             prepared: Lifetimes | None = None, loop_peaks: Mapping[int, int] | None = None,
             scratch: Mapping[int, int] | None = None, plans: dict[object, Plan] | None = None) -> Timeline:
    """Give the timeline of live activation bytes when the graph runs in `order` under `rules`.

    `plan_shapes` are the shapes a runtime's planner compares to decide reuse (onnxruntime plans before the dims
    are bound, on symbolic shapes); by default the tensors' own shapes. `prepared`: lifetimes() of the same
    arguments, made beforehand. `loop_peaks`: per Loop op whose iterations are known, the most its first run holds
    (loops.loop_peaks: the body's buffers of every iteration, the carried values of two); its step holds that, its
    own outputs apart; a Loop without one holds its body's peak once. (The caller simulates the Loops: liveness
    does not import the loop simulation, which runs liveness on each body.) `scratch`: per op index, the bytes its
    kernel holds while it runs, above the tensors live then (a library's workspace: ExecutionProvider.op_scratch),
    counted with the step's transient bytes. `plans`: a cache its caller owns for one `prepared` (see
    pipeline.Schedules): the buffer plan depends only on `prepared`, the rules' reuse and the size keys, so a
    plan made for equal keys (another value of a searched dim, a what-if's sizes) is taken from it, not made again.
    """
    tensors = graph.tensors
    steps = len(order)
    end = steps - 1
    if prepared is None:
        prepared = lifetimes(graph, order, rules, count_graph_outputs, loop_body)
    # copies: the plan below changes them
    owner, first, last = list(prepared.owner), list(prepared.first), list(prepared.last)
    view_of = tuple(owner)

    def find(t: int) -> int:
        while owner[t] != t:
            owner[t] = owner[owner[t]]
            t = owner[t]
        return t

    # the buffer plan (_plan_buffers), on the sizes' keys: made once per keys where the caller keeps plans
    keys = _size_keys(graph, plan_shapes)
    plan_key = (tuple(keys), rules.reuse_freed) if plans is not None else None
    planned = plans.get(plan_key) if plans is not None else None
    if planned is not None and planned[0] is prepared:
        owner, first, last = list(planned[1]), list(planned[2]), list(planned[3])
    else:
        _plan_buffers(prepared, keys, rules.reuse_freed, owner, first, last, steps)
        if plans is not None:
            plans[plan_key] = (prepared, tuple(owner), tuple(first), tuple(last))
    # onnxruntime releases a buffer after the last node that reads any tensor stored in it; a buffer that no
    # node reads at all (an unread output such as LSTM's Y_h, TopK's indices, Dropout's mask, and no later
    # tensor reused it) has no release action and stays allocated until the run ends (measured; its
    # GenerateDeallocationPlan builds release actions from consumers only).
    # the buffers are planned: final (a tensor is mostly its own root or one step from it: find() for the rest)
    root_of = [t if (up := owner[t]) == t else up if owner[up] == up else find(t) for t in range(len(tensors))]
    read = {root_of[t.index] for t in tensors if t.consumers} if rules.reuse_freed else None
    buffer_of = [-1] * len(tensors)
    spans: list[tuple[int, int, int]] = []
    new_bytes = [0] * steps
    unsized = []
    for t in tensors:  # one pass: a large graph has hundreds of thousands
        index = t.index
        root = root_of[index]
        owning = t if root == index else tensors[root]
        kind = owning.kind
        if kind not in _OWNS_BUFFER or owning.producer is None or (kind == OUTPUT and not count_graph_outputs):
            continue
        buffer_of[index] = root
        if root != index:
            continue
        if read is not None and kind == ACTIVATION and index not in read and first[index] >= 0:
            last[index] = end  # (see above: an unread buffer is never released)
        size = t.nbytes
        if size is None:
            unsized.append(index)
            continue
        spans.append((size, first[root], last[root]))
        new_bytes[first[root]] += size

    subgraph_bytes = [0] * steps  # transient bytes while a step runs: control-flow bodies, expanded functions
    for step, op_index in prepared.transient:
        op = graph.ops[op_index]
        extra = EXPANDED_INTERMEDIATES.get(op.op_type, 0) if op.domain in ("", "ai.onnx") else 0
        if extra and op.outputs and op.outputs[0] >= 0:
            subgraph_bytes[step] += extra * (tensors[op.outputs[0]].nbytes or 0)
        if op.subgraphs and loop_peaks and op_index in loop_peaks and op.op_type == "Loop":
            own = sum(tensors[t].nbytes or 0 for t in op.outputs
                      if t >= 0 and root_of[t] == t and first[t] == step and buffer_of[t] == t)
            subgraph_bytes[step] += max(0, loop_peaks[op_index] - own)
        elif op.subgraphs:
            separate = op.op_type in BODY_OUTPUTS_SEPARATE
            subgraph_bytes[step] += max(subgraph_peak(sub, rules, separate, op.op_type == "Loop")
                                       for sub in op.subgraphs) + \
                BODY_STATE_BYTES.get(op.op_type, 0)

    if scratch:
        for step, op_index in enumerate(order):
            subgraph_bytes[step] += scratch.get(op_index, 0)
    live = live_bytes(spans, steps)
    if prepared.transient or scratch:
        live = [running + extra for running, extra in zip(live, subgraph_bytes, strict=True)]
    peak_step = live.index(max(live)) if steps else -1  # (the first step at the peak)
    return Timeline(
        order=tuple(order), live_bytes=tuple(live), new_bytes=tuple(new_bytes),
        subgraph_bytes=tuple(subgraph_bytes), buffer_of=tuple(buffer_of), view_of=view_of,
        first_step=tuple([f if b == i else -1 for i, (f, b) in enumerate(zip(first, buffer_of, strict=True))]),
        last_step=tuple(last), unsized=tuple(unsized),
        peak_bytes=live[peak_step] if steps else 0, peak_step=peak_step,
    )


def _plan_buffers(prepared: Lifetimes, keys: Sequence[int], reuse_freed: bool, owner: list[int], first: list[int],
                  last: list[int], steps: int) -> None:
    """Make the buffer plan in place (owner, first, last: lifetimes' copies), step by step as onnxruntime's planner
    makes it: each new output takes its dying first input's buffer (in place), or else a freed buffer of the same
    size (most recently freed first), or else a buffer of its own. A freed buffer that a later output takes stays
    allocated until that output dies."""
    activation = prepared.activation

    def find(t: int) -> int:
        while owner[t] != t:
            owner[t] = owner[owner[t]]
            t = owner[t]
        return t

    # Freed buffers by size: the planner takes the first match in its free list, the most recently freed.
    # (by size number, above 0: a scalar's freed buffer is never taken, so it is not listed)
    freed: dict[int, list[int]] = {}
    is_free: set[int] = set()
    for step, (out, reads), takers, dying in zip(range(steps), prepared.in_place, prepared.take_freed,
                                                 prepared.dying, strict=True):
        if out >= 0:
            source = reads if owner[reads] == reads else find(reads)
            key = keys[out]
            if source != out and activation[source] and last[source] == step and key != -1 and key == keys[reads]:
                owner[out] = source
                if last[out] > last[source]:
                    last[source] = last[out]
                first[out] = last[out] = -1
        for out in takers:
            if owner[out] != out:
                continue  # it took its input's buffer in place, above
            key = keys[out]
            if key > 0 and freed.get(key):
                target = freed[key].pop()
                is_free.discard(target)
                owner[out] = target
                if last[out] > last[target]:
                    last[target] = last[out]
                first[out] = last[out] = -1
        if reuse_freed:
            for tensor_id in dying:  # inputs first, then unread outputs
                root = owner[tensor_id]
                if owner[root] != root:
                    root = find(tensor_id)
                if last[root] == step and activation[root] and root not in is_free:
                    key = keys[root]
                    if key > 0:
                        found = freed.get(key)
                        if found is None:
                            freed[key] = [root]
                        else:
                            found.append(root)
                        is_free.add(root)


def _size_keys(graph: ModelGraph, plan_shapes: Sequence[tuple[Dim, ...] | None] | None) -> list[int]:
    """Give, per tensor, a number for what onnxruntime's SameSize compares: the element size and the static shape,
    each dim an equal value or an equal symbolic name (the planner's shapes where given). Equal sizes have equal
    numbers: above 0, or below -1 for a scalar (which is never reused); -1 where a dim has neither, or the size is
    unknown: such a buffer is never equal to another. (Numbers: the plan compares and looks them up per step.)"""
    made: dict[tuple[int, tuple[Dim, ...]], int] = {}  # shapes repeat: number each once
    numbers: dict[tuple[object, ...], int] = {}  # (element bits, *shape) -> its number
    keys: list[int] = []
    for t in graph.tensors:
        shape = t.shape if plan_shapes is None else plan_shapes[t.index]
        if shape is None or t.nbytes is None or None in shape:
            keys.append(-1)
            continue
        key = made.get((t.dtype, shape))
        if key is None:
            size = (element_bits(t.dtype), *shape)
            key = numbers.get(size)
            if key is None:
                key = numbers[size] = len(numbers) + 1 if shape else -len(numbers) - 2
            made[(t.dtype, shape)] = key
        keys.append(key)
    return keys


def live_bytes(spans: Iterable[tuple[int, int, int]], steps: int) -> list[int]:
    """Give the bytes live at each of `steps` steps, of buffers given as (bytes, first step, last step): a difference
    array and its running sum, linear in steps and buffers (the one sweep of inference and training)."""
    delta = [0] * (steps + 1)
    for nbytes, first, last in spans:
        delta[first] += nbytes
        delta[last + 1] -= nbytes
    return list(accumulate(delta[:steps]))


def subgraph_peak(sub: ModelGraph, rules: InferenceRules, count_outputs: bool = False, loop_body: bool = False) -> int:
    """Give the most bytes a subgraph holds at once: its intermediates, and its outputs when they are buffers of
    their own (a Loop's body) rather than its node's outputs (an If's branch)."""
    if not sub.ops:
        return 0
    return liveness(sub, model_order(sub), rules, count_graph_outputs=count_outputs, loop_body=loop_body).peak_bytes


def pattern_block_bytes(graph: ModelGraph, timeline: Timeline, alignment: int = 256,
                        sizes: Sequence[int | None] | None = None) -> int:
    """Give the size of the one block onnxruntime's memory pattern allocates from the second run on.

    Its MemPatternPlanner replays the first run's allocations and frees of planned buffers (graph outputs apart),
    each rounded up to `alignment` bytes (onnxruntime's kAllocAlignment, 256; with 64 the small shape tensors
    came out 192 bytes short each), placing each at the best-fitting gap between the blocks in use or in the free
    tail before the block's end (the smallest gap that holds it, else the end); the block is the highest end
    reached. `sizes`: each tensor's bytes, where not the graph's own.
    """
    nbytes = sizes if sizes is not None else [t.nbytes for t in graph.tensors]
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for t, first in enumerate(timeline.first_step):
        size = nbytes[t]
        if first < 0 or graph.tensors[t].kind != ACTIVATION or size is None:
            continue
        starts.setdefault(first, []).append(t)
        ends.setdefault(timeline.last_step[t], []).append(t)
    placed: list[tuple[int, int, int]] = []  # (offset, size, tensor), kept sorted by offset
    block = 0
    for step in range(len(timeline.order)):
        for t in starts.get(step, ()):
            size = -(-(nbytes[t] or 0) // alignment) * alignment
            best, waste, current = None, None, 0
            for index, (offset, length, _) in enumerate(placed):
                gap = offset - current
                if gap >= size and (waste is None or gap - size < waste):
                    best, waste = (index, current), gap - size
                current = max(current, offset + length)
            # the free tail between the blocks in use and the block's end is a gap too
            if block - current >= size and (waste is None or block - current - size < waste):
                best = (len(placed), current)
            if best is None:
                index, offset = len(placed), current
            else:
                index, offset = best
            placed.insert(index, (offset, size, t))
            block = max(block, offset + size)
        dead = set(ends.get(step, ()))
        if dead:
            placed = [p for p in placed if p[2] not in dead]
    return block
