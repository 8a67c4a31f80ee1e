"""A Loop node's run on onnxruntime's CPU provider, simulated allocation by allocation: what its body allocates in
the arena on every iteration, and the most bytes it holds at a profile sample.

Read from onnxruntime's loop.cc (LoopImpl) and execution_frame.cc, and measured (fixtures/loop_subgraph.onnx and
the onnx.helper Loops of tests/test_loops.py): the Loop first allocates two scalars from the CPU arena, its
iteration number (int64) and its condition (bool). Each iteration runs the body in an execution frame of its own
(utils::ExecuteSubgraph): the body's outputs (the condition, the loop-carried values, the scan outputs) are
allocated in the arena like any node's, its intermediates too on an iteration that traces the body's memory
pattern, and in one block of the pattern's size (allocated when the frame is made, freed when it ends) on an
iteration whose feed shapes the body's session state has already traced. The pattern is cached per feed shapes
(the loop-carried values' shapes among them) for the session's life: from the second iteration on where the
loop-carried shapes do not change, and from the first in every later run. Before an iteration the previous
iteration's outputs become its feeds, which drops the outputs of the iteration before that. After the last
iteration the Loop allocates its own outputs and copies the last loop-carried values (and the concatenated scan
outputs) into them, then frees everything it held. The profile samples the arena after every body kernel.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import onnx

from onnxmem.ir.graph import ACTIVATION, OUTPUT, ModelGraph, Op
from onnxmem.passes.liveness import Timeline, liveness, pattern_block_bytes
from onnxmem.targets.ort.rules import InferenceRules
from onnxmem.views.report import Warning

ITERATION_SCALARS = (8, 1)  # LoopImpl::Initialize: the iteration number (int64) and the condition (bool)

Event = tuple[str, int, int]  # ("alloc", buffer id, bytes) or ("free", buffer id, 0); ("sample", 0, 0): a sample


@dataclass(frozen=True)
class LoopRun:
    """One run of a Loop node: its arena events, and its most requested bytes live at a profile sample."""

    events: tuple[Event, ...]  # the node's outputs among them (buffer id: the output tensor's index)
    sampled_peak: int  # the most bytes it holds at a sample (after each body kernel), its own outputs apart


def loop_trip_counts(graph: ModelGraph, model: onnx.ModelProto) -> dict[int, int]:
    """Give, per Loop op of the graph, how many iterations it runs where the model says so: its trip count `M`
    is a constant (an initializer or a Constant node) and its condition is absent or a constant true; a body that
    computes its condition may stop earlier (the count is then the most it runs)."""
    if not any(op.op_type == "Loop" for op in graph.ops):
        return {}
    constants: dict[str, onnx.TensorProto] = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                constants[node.output[0]] = value
    found: dict[int, int] = {}
    for op in graph.ops:
        if op.op_type != "Loop" or op.domain not in ("", "ai.onnx") or not op.inputs or op.inputs[0] < 0:
            continue
        trips = _scalar(constants.get(graph.tensors[op.inputs[0]].name))
        if len(op.inputs) > 1 and op.inputs[1] >= 0:
            condition = _scalar(constants.get(graph.tensors[op.inputs[1]].name))
            if condition is None:
                continue
            if not condition:
                trips = 0
        if trips is not None and trips >= 0:
            found[op.index] = trips
    return found


def _scalar(tensor: onnx.TensorProto | None) -> int | None:
    if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    from onnx import numpy_helper

    values = numpy_helper.to_array(tensor).reshape(-1)
    return int(values[0]) if values.size == 1 else None


def loop_run(graph: ModelGraph, op: Op, trips: int, rules: InferenceRules, traced: set[tuple[object, ...]],
             mem_pattern: bool = True, ids: Iterator[int] | None = None,
             own_outputs: Sequence[int] | None = None, replay_up_to: int | None = None) -> LoopRun:
    """Give the events of one run of the Loop `op` of `graph` for `trips` iterations (see the module's docstring).

    `traced`: the feed shapes whose body pattern the session holds, updated with those this run traces (the same
    set across runs); `mem_pattern`: whether the session's memory pattern is on; `ids`: fresh buffer ids (negative,
    unique across everything replayed on one arena); `own_outputs`: the Loop's outputs allocated in the arena
    (default: all; a later run places an intermediate output in the outer graph's pattern block instead).

    The work does not grow with `trips`: at most `replay_up_to` iterations (default: replayed_iterations) are
    replayed one by one; past them every iteration repeats the one before and keeps its scan outputs besides
    (iteration_peak), so the peak is arithmetic and the scan outputs the other iterations keep are one block.
    """
    fresh = ids if ids is not None else itertools.count(-(1 << 59), -1)
    body = op.subgraphs[0]
    from onnxmem.passes.orders import execution_order

    order = execution_order(body, "ort")
    timeline = liveness(body, order, rules, count_graph_outputs=True, loop_body=True)
    block = pattern_block_bytes(body, timeline)
    nbytes = [t.nbytes or 0 for t in body.tensors]
    carried_in = tuple(graph.tensors[t].shape for t in op.inputs[2:] if t >= 0)
    carried_out = tuple(body.tensors[t].shape for t in body.outputs[1:1 + len(op.inputs[2:])])
    outputs = [t for t in op.outputs if t >= 0] if own_outputs is None else list(own_outputs)
    replayed_count = min(trips, replayed_iterations(body) if replay_up_to is None else replay_up_to)

    events: list[Event] = []
    number, condition = next(fresh), next(fresh)
    events.extend((("alloc", number, ITERATION_SCALARS[0]), ("alloc", condition, ITERATION_SCALARS[1])))
    # The values LoopImpl holds (buffer ids; None: a value outside the arena, an outer tensor): its feeds from
    # the condition on (the iteration number is its own), the last iteration's fetches, its condition, the scan
    # outputs it keeps. A buffer is freed when none of them holds it any more.
    feeds: list[int | None] = [condition, *(None for _ in op.inputs[2:])]
    fetches: list[int | None] = []
    held_condition: int | None = condition
    kept: list[int | None] = []
    carried = len(op.inputs[2:])
    passed = _passed_through(body, timeline)
    peaks: list[int] = []  # the most bytes held at a sample of each iteration replayed
    live = {number: ITERATION_SCALARS[0], condition: ITERATION_SCALARS[1]}  # the buffers held before each iteration
    for iteration in range(replayed_count):
        start = len(events)
        before = [*feeds, held_condition]
        if iteration:
            feeds, kept = fetches[:1 + carried], [*kept, *fetches[1 + carried:]]  # SaveOutputsAndUpdateFeeds
            fetches = []
            events.extend(_released(before, [*feeds, held_condition, *kept]))
        key = carried_in if iteration == 0 else carried_out
        frame, made = _frame(body, timeline, block if mem_pattern and key in traced else None, nbytes, fresh)
        events.extend(frame)
        if mem_pattern:
            traced.add(key)
        # an output passed through from a feed (Identity of the condition) is that feed's value
        fetches = [feeds[passed[k] - 1] if i is None and passed[k] >= 1 else i for k, i in enumerate(made)]
        before_condition, held_condition = held_condition, fetches[0] if fetches else None
        events.extend(_released([before_condition], [*feeds, *fetches, held_condition, *kept]))
        peaks.append(_held_at_samples(live, events[start:]))
    skipped = []
    if trips > replayed_count:  # the scan outputs the iterations not replayed keep, as one block
        skipped = [next(fresh)]
        events.append(("alloc", skipped[0], (trips - replayed_count) * _kept_per_iteration(peaks)))
    sizes = {t: graph.tensors[t].nbytes or 0 for t in outputs}
    events.extend(("alloc", t, sizes[t]) for t in op.outputs if t in sizes)
    events.extend(_released([*feeds, *fetches, held_condition, *kept, number, *skipped], []))
    return LoopRun(tuple(events), max((iteration_peak(peaks, k) for k in _peak_candidates(peaks, trips)), default=0))


# Iterations 0 and 1 may trace the body's memory pattern (for the outer and for the carried shapes); from
# iteration 2 on every iteration allocates as the one before, in the pattern's block where the session has it,
# and keeps as many bytes more (its scan outputs): ITERATIONS_BEFORE_REPEAT replayed iterations show the line.
ITERATIONS_BEFORE_REPEAT = 4
# The most body steps replayed one by one for a Loop's run (iterations times the body's ops): the bound on the work
# a trip count can cause; past it, loop-iterations-summarized.
REPLAYED_BODY_STEPS = 1 << 16
# The most iterations replayed one by one, whatever the body's size (every smaller trip count is exact in the arena)
MOST_REPLAYED_ITERATIONS = 64


def replayed_iterations(body: ModelGraph) -> int:
    """Give how many iterations of a Loop whose body is `body` are replayed one by one (see loop_run)."""
    return max(ITERATIONS_BEFORE_REPEAT, min(MOST_REPLAYED_ITERATIONS, REPLAYED_BODY_STEPS // max(len(body.ops), 1)))


def iteration_peak(peaks: Sequence[int], iteration: int) -> int:
    """Give the most bytes iteration `iteration` holds at a sample, from the peaks of the iterations replayed
    (`peaks`, at least ITERATIONS_BEFORE_REPEAT of them where there are more iterations): an iteration past them
    holds what the last one held and the scan outputs kept by the iterations between."""
    if iteration < len(peaks):
        return peaks[iteration]
    return peaks[-1] + (iteration - len(peaks) + 1) * _kept_per_iteration(peaks)


def _kept_per_iteration(peaks: Sequence[int]) -> int:
    """Give the bytes each iteration past the replayed ones keeps (the growth of the last replayed iterations)."""
    return max(peaks[-1] - peaks[-2], 0) if len(peaks) >= 2 else 0


def _peak_candidates(peaks: Sequence[int], trips: int) -> list[int]:
    """Give the iterations among which a run of `trips` iterations holds its most: those replayed and the last."""
    return [*range(len(peaks)), *([trips - 1] if trips > len(peaks) else [])]


def _frame(body: ModelGraph, timeline: Timeline, block: int | None, nbytes: Sequence[int],
           fresh: Iterator[int]) -> tuple[list[Event], list[int | None]]:
    """Give one iteration's events (`block`: the pattern's size where the frame uses it, None where it traces)
    and the buffer ids of the body's outputs, in the body's output order (their buffers outlive the frame; None:
    an output passed through from a feed, no buffer of its own)."""
    ids: dict[int, int] = {}
    ending: dict[int, list[int]] = {}
    for t, first in enumerate(timeline.first_step):
        if first >= 0 and body.tensors[t].kind == ACTIVATION:
            ending.setdefault(timeline.last_step[t], []).append(t)
    events: list[Event] = []
    block_id = next(fresh) if block else None
    if block_id is not None:
        events.append(("alloc", block_id, block or 0))
    for step, op_index in enumerate(timeline.order):
        for t in body.ops[op_index].outputs:
            if t < 0 or timeline.first_step[t] != step:
                continue
            if body.tensors[t].kind == OUTPUT or block is None:
                ids[t] = next(fresh)
                events.append(("alloc", ids[t], nbytes[t]))
        events.append(("sample", 0, 0))
        if block is None:
            events.extend(("free", ids[t], 0) for t in ending.get(step, ()) if t in ids)
    if block_id is not None:
        events.append(("free", block_id, 0))
    made = [ids.get(timeline.buffer_of[t]) for t in body.outputs]
    return events, made


def branch_run(graph: ModelGraph, op: Op, rules: InferenceRules, traced: set[tuple[object, ...]],
               mem_pattern: bool = True, ids: Iterator[int] | None = None,
               own_outputs: Sequence[int] | None = None) -> LoopRun:
    """Give the events of one run of the If `op` (if.cc): its branch runs once in a frame of its own, whose
    outputs are the If's outputs (allocated through the If's fetch allocators, no copy) and whose intermediates
    are in the arena while the branch's pattern is traced (the first run), in its block after. Of two branches,
    the one with the larger pattern (validate keeps only the branch the profile shows ran)."""
    from onnxmem.passes.orders import execution_order

    fresh = ids if ids is not None else itertools.count(-(1 << 59), -1)
    runs = []
    for body in op.subgraphs:
        timeline = liveness(body, execution_order(body, "ort"), rules, count_graph_outputs=True, loop_body=True)
        runs.append((pattern_block_bytes(body, timeline), body, timeline))
    block, body, timeline = max(runs, key=lambda run: run[0])
    key = tuple(graph.tensors[t].shape for t in op.implicit_inputs)
    frame, made = _frame(body, timeline, block if mem_pattern and key in traced else None,
                         [t.nbytes or 0 for t in body.tensors], fresh)
    if mem_pattern:
        traced.add(key)
    own = set(t for t in op.outputs if t >= 0) if own_outputs is None else set(own_outputs)
    named = {i: t for i, t in zip(made, op.outputs, strict=False) if i is not None and t in own}
    dropped = {i for i in made if i is not None and i not in named}  # outputs placed elsewhere
    events = [(kind, named.get(buffer, buffer), size) for kind, buffer, size in frame if buffer not in dropped]
    return LoopRun(tuple(events), _sampled_peak(events))


def _released(before: Sequence[int | None], after: Sequence[int | None]) -> list[Event]:
    """Give the frees of the buffers held `before` that nothing holds `after`."""
    still = set(after)
    return [("free", i, 0) for i in dict.fromkeys(before) if i is not None and i not in still]


def _passed_through(body: ModelGraph, timeline: Timeline) -> list[int]:
    """Give, per body output, the position among the body's inputs of the input it passes through (an Identity
    sharing it: liveness.alias_roots), or -1."""
    position = {t: k for k, t in enumerate(body.inputs)}
    return [position.get(timeline.view_of[t], -1) for t in body.outputs]


def _sampled_peak(events: Sequence[Event]) -> int:
    """Give the most bytes live at a sample of `events`."""
    return _held_at_samples({}, events)


def _held_at_samples(live: dict[int, int], events: Sequence[Event]) -> int:
    """Give the most bytes live at a sample of `events`, `live` holding the buffers live before them (updated to
    those live after)."""
    total = sum(live.values())
    peak = 0
    for kind, buffer, size in events:
        if kind == "alloc":
            live[buffer] = size
            total += size
        elif kind == "free":
            total -= live.pop(buffer, 0)
        else:
            peak = max(peak, total)
    return peak


def replayed(events: Sequence[Event]) -> list[Event]:
    """Give the events an arena replays (samples dropped)."""
    return [e for e in events if e[0] != "sample"]


def loop_runs_by_op(graph: ModelGraph, trips: Mapping[int, int], rules: InferenceRules,
                    traced: dict[int, set[tuple[object, ...]]], mem_pattern: bool = True,
                    ids: Iterator[int] | None = None,
                    own_outputs: Mapping[int, Sequence[int]] | None = None) -> dict[int, LoopRun]:
    """Give one run of every Loop whose trip count is known (`trips`: loop_trip_counts), keyed by op index;
    `traced`: per op, the feed shapes its body's pattern was traced for (kept across runs)."""
    return {index: loop_run(graph, graph.ops[index], count, rules, traced.setdefault(index, set()), mem_pattern,
                            ids, None if own_outputs is None else own_outputs.get(index, ()))
            for index, count in trips.items() if graph.ops[index].subgraphs}


def loop_warnings(graph: ModelGraph, trips: Mapping[int, int]) -> list[Warning]:
    """Give the warnings for the Scans (their iterations are not simulated: scan-not-simulated) and the Loops whose
    run the estimate cannot simulate: its trip count or its condition not
    a constant (the estimate counts the body once: what onnxruntime holds besides is bounded in the message), or
    a body that computes its condition (the estimate runs every iteration the trip count allows: an upper bound)."""
    warnings = []
    for op in graph.ops:
        if op.op_type == "Scan" and op.domain in ("", "ai.onnx") and op.subgraphs:
            warnings.append(_scan_warning(graph, op))
        if op.op_type != "Loop" or op.domain not in ("", "ai.onnx") or not op.subgraphs:
            continue
        body = op.subgraphs[0]
        if op.index not in trips:
            carried = sum(graph.tensors[t].nbytes or 0 for t in op.inputs[2:] if t >= 0)
            scans = sum(body.tensors[t].nbytes or 0 for t in body.outputs[1 + len(op.inputs[2:]):])
            warnings.append(Warning("loop-iterations-unknown", (
                f"Loop node '{op.name}': its trip count or condition is not a constant, so the estimate counts its "
                f"body once; onnxruntime also holds the loop-carried values of the iteration before ({carried:,} "
                f"bytes) and keeps each iteration's scan outputs ({scans:,} bytes an iteration) until it ends")))
        elif any(t.nbytes is None for t in body.tensors if t.kind in (ACTIVATION, OUTPUT)):
            unsized = [t.name for t in body.tensors if t.kind in (ACTIVATION, OUTPUT) and t.nbytes is None]
            warnings.append(Warning("loop-body-unsized", (
                f"Loop node '{op.name}': {len(unsized)} tensors of its body have no known size "
                f"({', '.join(unsized[:5])}{' ...' if len(unsized) > 5 else ''}) and count 0 bytes in each of its "
                f"{trips[op.index]} iterations, "
                "so its bytes are a lower bound")))
        if op.index in trips and trips[op.index] > replayed_iterations(body):
            warnings.append(Warning("loop-iterations-summarized", (
                f"Loop node '{op.name}': of its {trips[op.index]:,} iterations the estimate replays the first "
                f"{replayed_iterations(body)} one by one; every later one repeats the one before and keeps its scan "
                "outputs, so its peak is worked out exactly, and the arena's held bytes count the scan outputs the "
                "others keep as one block")))
        if op.index in trips and trips[op.index] > 0 and body.outputs and not _condition_passed(body):
            warnings.append(Warning("loop-may-stop-early", (
                f"Loop node '{op.name}': its body computes its condition, so it may stop before its trip count "
                f"({trips[op.index]}); the estimate runs every iteration, an upper bound")))
    return warnings


def _condition_passed(body: ModelGraph) -> bool:
    """Say whether a Loop body's condition output is its condition input (an Identity of it, or the input)."""
    condition = body.outputs[0]
    producer = body.tensors[condition].producer
    if producer is None:
        return body.inputs[1:2] == [condition]
    op = body.ops[producer]
    return op.op_type == "Identity" and list(op.inputs[:1]) == body.inputs[1:2]


def _scan_warning(graph: ModelGraph, op: Op) -> Warning:
    """Give the warning for a Scan, whose iterations the estimate does not simulate (scan.cc's ScanImpl: two
    alternating buffers per state variable, each iteration's outputs written into the Scan's outputs): the
    estimate counts its body once; the message bounds what it misses (measured on onnx.helper Scans: within the
    body's peak and two state buffers each way)."""
    from onnxmem.passes.liveness import subgraph_peak
    from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES

    states = sum(graph.tensors[t].nbytes or 0 for t in op.outputs[:_state_count(graph, op)] if t >= 0)
    bound = subgraph_peak(op.subgraphs[0], DEFAULT_INFERENCE_RULES, True) + 2 * states
    return Warning("scan-not-simulated", (
        f"Scan node '{op.name}': its iterations are not simulated (the estimate counts its body once); "
        f"onnxruntime keeps two buffers per state variable and writes each iteration into its outputs, so its "
        f"peak and the arena's held bytes may differ by up to {bound:,} bytes either way"))


def _state_count(graph: ModelGraph, op: Op) -> int:
    """Give how many of a Scan's leading outputs are state variables: the body's first inputs and outputs are its
    states (num_scan_inputs is not kept: a leading input and output of the same type are counted as a state, which
    can only widen the bound)."""
    body = op.subgraphs[0]
    count = 0
    for given, made in zip(body.inputs, body.outputs, strict=False):
        if (body.tensors[given].dtype, body.tensors[given].shape) != (body.tensors[made].dtype,
                                                                      body.tensors[made].shape):
            break
        count += 1
    return count


def loop_peaks(graph: ModelGraph, trips: Mapping[int, int], rules: InferenceRules, mem_pattern: bool = True) -> \
        dict[int, int]:
    """Give, per Loop op of the graph whose iterations are known (`trips`: loop_trip_counts), the most its first
    run holds (loop_run's sampled peak; `mem_pattern`: the session's memory pattern, which the body's later
    iterations use): what liveness counts at its step."""
    return {index: loop_run(graph, graph.ops[index], count, rules, set(), mem_pattern).sampled_peak
            for index, count in trips.items() if graph.ops[index].op_type == "Loop" and graph.ops[index].subgraphs}
