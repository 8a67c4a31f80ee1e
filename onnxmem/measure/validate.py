"""validate(): run the model in onnxruntime and compare what it allocated with the estimate, run by run.

The estimate is made on the graph onnxruntime actually ran (its optimized model), in the order it ran the nodes
(from its profile), with the rule tables that mirror its planner. A first run allocates tensor by tensor: its
activation peak is the liveness peak. From the second run on, with the memory pattern, onnxruntime allocates one
block for every intermediate planned in the first run and holds it for the whole run, graph outputs on top: the
steady-state estimate is the peak of intermediates (outputs apart) plus the outputs. Weights: onnxruntime's arena
holds only the weights its kernels prepack (MatMul/Gemm right-hand sides), which it pads; plain initializers live
outside the arena and are not measured.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnxmem.arguments import check_arguments
from onnxmem.ir.graph import ModelGraph, build_graph
from onnxmem.ir.load import load_model
from onnxmem.passes.liveness import Timeline, pattern_block_bytes
from onnxmem.passes.loops import loop_runs_by_op, loop_trip_counts, loop_warnings
from onnxmem.passes.orders import execution_order
from onnxmem.passes.pipeline import Sizing, after_sizing, analysis, planner_shapes, size_warnings
from onnxmem.shapes.infer import declared_types
from onnxmem.shapes.sizing import bind_and_infer
from onnxmem.targets.ort import ExecutionProvider, execution_provider
from onnxmem.targets.ort.arena import arena_weight_bytes, session_held_bytes
from onnxmem.targets.ort.planner import infer_symbolic
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES
from onnxmem.targets.ort.saved import saved_graph_facts
from onnxmem.views.report import Warning, plain

SCHEMA = "onnxmem.validate/1"


@dataclass(frozen=True)
class Figures:
    """Bytes of one run, measured or estimated."""

    peak_activation_bytes: int
    weights_bytes: int  # weights the runtime's allocator holds (CPU: prepacked MatMul/Gemm weights)
    # what the CPU arena holds from the system at the run's end (its regions and reserved bytes; estimated by
    # onnxmem.targets.ort.arena's simulation of the first run);
    # -1 where not measured or not estimated (CUDA: arena bypassed)
    arena_held_bytes: int = -1


@dataclass(frozen=True)
class RunValidation:
    """One run: the measurement, the estimate and their difference."""

    run_index: int
    phase: str  # "first" (tensor by tensor) or "steady" (memory pattern block, second run on)
    measured: Figures
    estimated: Figures
    activation_difference_bytes: int  # estimated - measured
    activation_difference_percent: float | None  # of measured; None when measured is 0
    weights_difference_bytes: int
    measured_peak_node: str


@dataclass(frozen=True)
class Validation:
    """What onnxruntime allocated against what onnxmem estimated, with every pinned setting."""

    model: str
    provider: str
    opt_level: str
    dims: dict[str, int]
    settings: dict[str, str]
    runs: tuple[RunValidation, ...]
    raw_estimate: Figures  # `onnxmem report` on the model as given (its own order): what a user sees
    nodes_run: int  # nodes in the graph onnxruntime ran
    notes: tuple[str, ...]
    warnings: tuple[Warning, ...]
    schema: str = field(default=SCHEMA)

    @property
    def exact(self) -> bool:
        """Say whether every run agrees to the byte on activations."""
        return all(r.activation_difference_bytes == 0 for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        """Give the validation as JSON-ready builtins (schema onnxmem.validate/1)."""
        return plain(self)


def validate(model: str | os.PathLike[str] | onnx.ModelProto, dims: Mapping[str, int] | None = None, *,
             provider: str | ExecutionProvider = "cpu", opt_level: str = "disable", runs: int = 2,
             mem_pattern: bool = True,
             default_dim: int | None = None) -> Validation:
    """Give the comparison of onnxruntime's real allocations with the estimate, for each of `runs` runs.

    Parameters
    ----------
    model
        A path to an ONNX file or a ModelProto.
    dims, default_dim
        As analyze.analysis.
    provider
        The execution provider or its name (targets.ort.PROVIDERS): "cpu" (the `cpu` extra) or "cuda" (the `gpu`
        extra and an NVIDIA GPU). It names the measurement that runs the model.
    opt_level
        onnxruntime's graph optimization level: disable, basic, extended or all.
    runs
        Runs to measure: the first allocates tensor by tensor, later ones use the memory pattern.
    mem_pattern
        Whether onnxruntime's memory pattern is on.

    Returns
    -------
    Validation
        Per run, the measured and estimated bytes; `raw_estimate`: analyze's figures for the model as given.

    Raises
    ------
    MissingExtraError
        onnxruntime is not installed.
    RuntimeMeasurementError
        onnxruntime could not run the model.
    """
    check_arguments("validate", model, dims, default_dim, provider=provider)
    from onnxmem.measure.inputs import make_feeds

    loaded = load_model(model)
    sized = bind_and_infer(loaded.proto, dims or {}, default_dim)
    feeds = make_feeds(loaded.proto, sized.dims)
    source: str | onnx.ModelProto = str(loaded.path) if loaded.path else loaded.proto
    target = execution_provider(provider)
    measured = target.measure(source, feeds, opt_level=opt_level, runs=runs, mem_pattern=mem_pattern)
    ran = measured.optimized_model if measured.optimized_model is not None else loaded.proto
    ran_sized = bind_and_infer(ran, _dims_of(ran, sized.dims))
    graph = build_graph(ran, ran_sized.types, facts=saved_graph_facts(ran))  # (the nodes onnxruntime added)
    unnamed = {i for i, node in enumerate(ran.graph.node) if not node.name}
    order = ran_order(graph, measured.execution_order, unnamed) if measured.execution_order else []
    taken = take_ran_branches(graph, measured.execution_order)
    # onnxruntime's planner compares what its own inference finds (infer_symbolic mirrors it) and what the file
    # declares in value_info, which it loads and the saved graph carries.
    plan_types = {**infer_symbolic(ran), **declared_types(ran)}
    # where the provider's changes typed some tensors otherwise (the CPU provider's converted float16 nodes)
    plan_types = target.validate_plan_types(ran, loaded.proto, plan_types)
    plan = planner_shapes(graph, plan_types, ran)
    # the declared stages after sizing (pipeline.STAGES: order, liveness, ...) on the graph onnxruntime ran, in the
    # order it ran it
    ran_loaded = dataclasses.replace(loaded, proto=ran, data=None, nodes=None) if ran is not loaded.proto else loaded
    ran_sizing = Sizing(ran_loaded, graph, dict(ran_sized.dims), None if plan is None else tuple(plan),
                        tuple(ran_sized.warnings), None, (), None, target)
    ran_names: str | list[str] = [graph.ops[i].name for i in order] if measured.execution_order else "ort"
    # (the provider's own buffer rules, as a report on it uses: ExecutionProvider.buffer_rules)
    analysed = after_sizing(ran_sizing, ran_names, DEFAULT_INFERENCE_RULES, mem_pattern=mem_pattern)
    timeline = analysed.timeline
    trips = loop_trip_counts(graph, ran)
    first = timeline.peak_bytes
    steady = pattern_block_bytes(graph, timeline) + _outside_pattern_peak(graph, timeline,
                                                                          _later_loop_bytes(graph, timeline, trips))
    weights = target.validate_weights(graph, ran, loaded.proto)
    # graph inputs the provider copies into its memory before each run (the CUDA provider's feeds)
    inputs = sum(target.session_weights(graph, ran, loaded.proto).inputs_per_run)
    first, steady = first + inputs, steady + inputs
    observed_runs = [(run.run_index, run.peak_activation_bytes, target.validate_measured_weights(measured, run))
                     for run in measured.runs]
    notes = target.validate_notes(measured)
    first_held = later_held = -1  # where the measurement does not see the arena (the CUDA one bypasses it)
    if target.measures_arena:
        # The arena's regions after a first run and after a later one (its memory pattern block taken from what
        # the first run freed, or a new region), simulated.
        first_held, later_held = session_held_bytes(graph, timeline, ran, target, loaded.proto, mem_pattern)
    results = []
    for run_index, peak, held in observed_runs:
        pattern = mem_pattern and run_index > 0
        estimate = Figures(steady if pattern else first, weights, later_held if pattern else first_held)
        observed = Figures(peak, held, getattr(measured.runs[run_index], "arena_held_bytes", -1))
        difference = estimate.peak_activation_bytes - peak
        results.append(RunValidation(
            run_index=run_index, phase="steady" if pattern else "first", measured=observed, estimated=estimate,
            activation_difference_bytes=difference,
            activation_difference_percent=round(100 * difference / peak, 3) if peak else None,
            weights_difference_bytes=weights - held,
            measured_peak_node=getattr(measured.runs[run_index], "peak_node", "")))
    raw = analysis(loaded, sized.dims, provider=target).report.inference
    return Validation(
        model=str(loaded.path) if loaded.path else "<ModelProto>", provider=target.name, opt_level=opt_level,
        dims=dict(sized.dims), settings=dict(measured.settings), runs=tuple(results),
        raw_estimate=Figures(raw.peak_activation_bytes, raw.weights_bytes), nodes_run=len(graph.ops),
        notes=(*notes, *_control_flow_notes(graph, taken)),
        # (the estimate's own: the provider's scratch, e.g. a convolution whose cuDNN workspace is not measured;
        # each warning once)
        warnings=tuple(dict.fromkeys((*loaded.warnings, *sized.warnings, *ran_sized.warnings,
                                      *size_warnings(graph, timeline), *loop_warnings(graph, trips),
                                      *analysed.report.warnings))))


def ran_order(graph: ModelGraph, names: Sequence[str], unnamed: Collection[int] = ()) -> list[int]:
    """Give the graph's ops in the order a profile lists them (its names).

    Nodes that onnxruntime expands from functions (HardSwish into HardSigmoid and Mul, ...) are unnamed in its
    saved graph and named '<OpType>_<its node index>' in its profile, numbered in the order it expanded them, not
    the order it saved or ran them. Such a name is matched to an unnamed op of that type whose inputs are made
    already (the one the runtime could run then), the first in file order among those. Names of If/Loop body nodes
    match nothing in the main graph and are skipped. `unnamed`: the ops whose node has no name in the saved graph
    (the graph names them '<OpType>_<position>', which may equal another node's name in the profile).
    """
    by_name = {op.name: op.index for op in graph.ops if op.index not in unnamed}
    listed = set(names)
    spare: dict[str, list[int]] = defaultdict(list)  # per op type: the ops no profile name names, in file order
    for op in graph.ops:
        if op.index in unnamed or op.name not in listed:
            spare[op.op_type].append(op.index)
    producers = [[graph.tensors[t].producer for t in (*op.inputs, *op.implicit_inputs) if t >= 0] for op in graph.ops]
    done = {op.index for op in graph.ops if op.op_type == "Constant"}  # initializers to the runtime: run first

    def ready(op: int) -> bool:
        return all(p is None or p in done for p in producers[op])

    order: list[int] = []
    for name in dict.fromkeys(names):
        named = by_name.get(name)
        candidates = spare.get(name.rsplit("_", 1)[0], [])
        pick = named if named is not None and named not in done and ready(named) else \
            next((c for c in candidates if ready(c)), named if named is not None and named not in done else
                 (candidates[0] if candidates else None))
        if pick is None:
            continue
        if pick in candidates:
            candidates.remove(pick)
        order.append(pick)
        done.add(pick)
    return execution_order(graph, [graph.ops[i].name for i in order])


def _dims_of(model: onnx.ModelProto, dims: Mapping[str, int]) -> dict[str, int]:
    from onnxmem.shapes.dims import input_dims

    names = {d.name for d in input_dims(model)}
    return {k: v for k, v in dims.items() if k in names}


def _later_loop_bytes(graph: ModelGraph, timeline: Timeline, trips: Mapping[int, int]) -> dict[int, int]:
    """Give, per step of a Loop whose trip count is known, the most bytes its second run holds outside the outer
    pattern's block (loops.loop_run, after a first run traced its body's pattern), its graph outputs apart."""
    traced: dict[int, set[tuple[object, ...]]] = {}
    loop_runs_by_op(graph, trips, DEFAULT_INFERENCE_RULES, traced)  # the first run traces the bodies' patterns
    later = loop_runs_by_op(graph, trips, DEFAULT_INFERENCE_RULES, traced)
    position = {op: step for step, op in enumerate(timeline.order)}
    outputs = set(graph.outputs)
    return {position[index]: max(0, run.sampled_peak - sum(graph.tensors[t].nbytes or 0
                                                            for t in graph.ops[index].outputs if t in outputs))
            for index, run in later.items() if index in position}


def _outside_pattern_peak(graph: ModelGraph, timeline: Timeline, loops: Mapping[int, int] | None = None) -> int:
    """Give the most bytes allocated outside the memory-pattern block at once: graph outputs (from their producer
    to the end) and, while their node runs, If/Loop bodies (`loops`: per step, a Loop's own figure)."""
    produced_at = [0] * len(timeline.order)
    position = {op: step for step, op in enumerate(timeline.order)}
    for t in graph.outputs:
        tensor = graph.tensors[t]
        if tensor.producer is not None and tensor.producer in position:
            produced_at[position[tensor.producer]] += tensor.nbytes or 0
    peak = outputs = 0
    for step, body in enumerate(timeline.subgraph_bytes):
        outputs += produced_at[step]
        if loops and step in loops:
            body = loops[step]
        peak = max(peak, outputs + body)
    return peak


def take_ran_branches(graph: ModelGraph, names: Sequence[str]) -> list[str]:
    """Keep, for each If of the main graph, only the branch whose nodes the profile lists (`names`: the nodes
    that ran); give the names of the If nodes so resolved. An If whose branch the profile does not tell apart
    keeps both (the estimate counts the larger)."""
    ran = set(names) - {op.name for op in graph.ops}
    resolved = []
    for op in graph.ops:
        if op.op_type != "If" or len(op.subgraphs) != 2:
            continue
        hit = [sub for sub in op.subgraphs if any(inner.name in ran for inner in sub.ops)]
        if len(hit) == 1:
            op.subgraphs = (hit[0],)
            resolved.append(op.name)
    return resolved


def _control_flow_notes(graph: ModelGraph, taken: Sequence[str]) -> tuple[str, ...]:
    notes = []
    if taken:
        notes.append(f"If nodes ({', '.join(taken[:5])}): the estimate counts the branch onnxruntime ran (its "
                     "profile names the branch's nodes); `onnxmem report` counts the larger branch")
    unresolved = [op.name for op in graph.ops if op.op_type == "If" and op.name not in taken]
    if unresolved:
        notes.append(f"If nodes ({', '.join(unresolved[:5])}): the estimate counts the larger branch, the run takes "
                     "the branch its condition selects, so the estimate is an upper bound there")
    return tuple(notes)


__all__ = ["Figures", "RunValidation", "Validation", "arena_weight_bytes", "take_ran_branches", "validate"]
