"""The pipeline: model -> Analysis, by the passes load, graph, planner types, bind + infer, order, liveness,
summarize (and the training step). Every view reads an Analysis or its Report; a what-if is the same pipeline
run again on a changed model or with changed options."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx

from onnxmem.arguments import check_arguments
from onnxmem.errors import DimError
from onnxmem.ir.dtypes import dtype_name
from onnxmem.ir.graph import ACTIVATION, HOST, INPUT, OUTPUT, WEIGHT, ModelGraph, Op, Tensor, build_graph, layer_name
from onnxmem.ir.load import LoadedModel, load_model
from onnxmem.ir.tensor_types import UNKNOWN_TYPE, Dim, TensorType
from onnxmem.passes.liveness import Lifetimes, Plan, Timeline, lifetimes, liveness
from onnxmem.passes.loops import loop_peaks, loop_trip_counts, loop_warnings
from onnxmem.passes.orders import DEFAULT_ORDER, SIZE_DEPENDENT_ORDERS, execution_order
from onnxmem.shapes.dims import InputDim, input_dims
from onnxmem.shapes.kvcache import genai_dims, kv_cache_of
from onnxmem.shapes.sizing import SizedModel, bind_and_infer
from onnxmem.targets.ort import DEFAULT_PROVIDER, ExecutionProvider, execution_provider
from onnxmem.targets.ort.planner import (
    declared_dim_names,
    infer_symbolic,
    one_inference,
    placed_types,
    run_types,
    runtime_view,
    sizes_from_float_arithmetic,
)
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES, InferenceRules
from onnxmem.views.report import InferenceReport, InferenceTimeline, LayerRow, LiveTensor, OpTypeRow, Report, Warning

if TYPE_CHECKING:
    from onnxmem.targets.ort.base import OpScratch
    from onnxmem.training.step import TrainingOptions

_TOP_LIVE = 50  # tensors listed at the peak; the rest are summed in the totals

Model = str | os.PathLike[str] | onnx.ModelProto | LoadedModel


class Schedules:
    """A cache, for one wiring (its ops), of the size-free part of the passes after sizing: per order name, the
    order and its lifetimes (liveness.lifetimes), made at the first call that needs them. Its owner is the caller
    that sizes one wiring at many dims (fit's family: plan.family.ModelFamily), which gives it to each Sizing it
    makes (Sizing.schedules); a Sizing of another wiring is scheduled without it."""

    def __init__(self, ops: Sequence[Op]) -> None:
        self._ops = ops
        self._made: dict[str, tuple[InferenceRules, Sequence[int], Lifetimes]] = {}
        # the buffer plans made on those lifetimes, by size keys (liveness's `plans`: the Sizings of one wiring at
        # other values, or a what-if's sizes, mostly plan alike)
        self.plans: dict[object, Plan] = {}

    def schedule(self, graph: ModelGraph, order: str, rules: InferenceRules) -> tuple[Sequence[int], Lifetimes]:
        """Give the order of this name on the graph, and its lifetimes (each made once per order and rules)."""
        found = self._made.get(order) if graph.ops is self._ops else None
        if found is None or found[0] is not rules:
            made = execution_order(graph, order, rules)
            found = (rules, made, lifetimes(graph, made, rules))
            if graph.ops is self._ops:
                self._made[order] = found
        return found[1], found[2]


@dataclass(frozen=True)
class Sizing:
    """The passes up to sizing: the model's graph sized at its bound dims, and the shapes onnxruntime's planner
    compares. What follows (order, liveness, summaries, training) reads it and never changes it, so one Sizing
    serves every order and every training option."""

    loaded: LoadedModel
    graph: ModelGraph  # sized at `dims`
    dims: dict[str, int]  # every input dim, bound
    plan_shapes: tuple[tuple[Dim, ...] | None, ...] | None  # per tensor, the shape onnxruntime's planner compares
    warnings: tuple[Warning, ...]
    symbolic: Mapping[str, TensorType] | None  # the planner types (to size the graph at other dims)
    free: tuple[InputDim, ...]  # the model's free input dims
    default_dim: int | None
    provider: ExecutionProvider = execution_provider(DEFAULT_PROVIDER)
    # the model as given, where onnxruntime's changes made another (its QDQ copies, the CPU provider's Casts, the CUDA
    # provider's placement): a training step (PyTorch's, not onnxruntime's) reads this one
    given: LoadedModel | None = dataclasses.field(default=None, compare=False, repr=False)
    # the cache of orders its maker owns for Sizings of this wiring (see Schedules): None where it has none
    schedules: Schedules | None = dataclasses.field(default=None, compare=False, repr=False)
    # the symbolic types the provider's transform made of `given` (the model they are of, and the types): the
    # training step sizes that model from them, without another inference; None where none were made
    given_types: tuple[onnx.ModelProto, Mapping[str, TensorType]] | None = \
        dataclasses.field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Analysis:
    """One model analysed at one binding of its dims: what every pass made, and the report they give.

    The report, its JSON timeline, the plots, the HTML page, fit, check and the what-ifs all read this (or the
    Analysis of a changed model): the numbers a user sees are the numbers of one run of the passes.
    """

    sizing: Sizing
    graph: ModelGraph  # the inference graph, sized at `dims` (the training step reads its own: see after_sizing)
    order: tuple[int, ...]  # the ops in execution order
    timeline: Timeline  # inference liveness in that order
    report: Report

    @property
    def loaded(self) -> LoadedModel:
        return self.sizing.loaded

    @property
    def dims(self) -> dict[str, int]:
        return self.sizing.dims

    @property
    def plan_shapes(self) -> tuple[tuple[Dim, ...] | None, ...] | None:
        return self.sizing.plan_shapes


def analysis(model: Model | Sizing, dims: Mapping[str, int] | None = None, *, default_dim: int | None = None,
             order: str | Sequence[str] = DEFAULT_ORDER, rules: InferenceRules = DEFAULT_INFERENCE_RULES,
             training: TrainingOptions | None = None, provider: str | ExecutionProvider = DEFAULT_PROVIDER,
             progress: Callable[[str], None] | None = None) -> Analysis:
    """Run the passes once and give their results (see Analysis).

    Parameters
    ----------
    model
        A path to an ONNX file, a ModelProto, a model already loaded (load.load_model), or the Sizing of one (an
        earlier analysis's, or a changed one: the passes after sizing run on it; `dims` and `default_dim` are then
        not read).
    dims
        Values of the model's symbolic input dims, by name (e.g. {"batch": 8, "seq": 512}).
    default_dim
        The value of every symbolic dim not in `dims` (a warning names them); None: an unbound dim is an error.
    order
        An order's name (ort: onnxruntime's, the default; model: the file's node order; memory; topological) or
        the node names in the order they run.
    rules
        The buffer rules (aliases, in-place reuse) of the runtime.
    training
        Also simulate one training step with these options (report.training).
    provider
        The onnxruntime execution provider the inference report assumes, or its name (targets.ort.PROVIDERS):
        cuda (the default: the question is a GPU's) or cpu, whose missing float16 kernels add Casts.
    progress
        Called with a few words as each stage begins (the CLI shows them on a terminal); None: nothing is said.

    Returns
    -------
    Analysis

    Raises
    ------
    ModelFileError
        The file is not a readable ONNX model.
    DimError
        A symbolic dim is unbound or bound to a bad value.
    """
    check_arguments("analysis", model, dims, default_dim, order, provider, training, (Sizing,))
    if progress is not None and not isinstance(model, Sizing):
        progress("loading the model and sizing its tensors")
    sized = model if isinstance(model, Sizing) else sizing(model, dims, default_dim=default_dim, rules=rules,
                                                           provider=provider)
    if progress is not None:
        progress("order and liveness" + (", then the training step" if training is not None else ""))
    return after_sizing(sized, order, rules, training)


@dataclass
class PipelineRun:
    """What the stages of one run made so far (a run's working state: each stage reads what the ones before it made
    and adds its own; the results a caller sees are the frozen Sizing and Analysis)."""

    provider: ExecutionProvider
    rules: InferenceRules  # as the caller gave them (the provider's own stand in for the defaults)
    dims: Mapping[str, int] = dataclasses.field(default_factory=dict)
    default_dim: int | None = None
    order: str | Sequence[str] = DEFAULT_ORDER
    training: TrainingOptions | None = None
    model: Model | None = None
    mem_pattern: bool = True  # whether onnxruntime's memory pattern is on (liveness)
    given: LoadedModel | None = None  # load: the model as given
    loaded: LoadedModel | None = None  # provider: the model as the provider runs it
    notes: list[Warning] = dataclasses.field(default_factory=list)  # provider: what it changed
    free: list[InputDim] | None = None  # graph: the model's free input dims
    graph: ModelGraph | None = None  # graph
    symbolic: Mapping[str, TensorType] | None = None  # planner types
    symbolic_made: bool = False  # whether `symbolic` is made (a caller with another binding's may give them)
    sized: Sizing | None = None  # size
    steps: Sequence[int] | None = None  # order
    prepared: Lifetimes | None = None  # order: the size-free part of liveness, where the order is size-free
    timeline: Timeline | None = None  # liveness
    scratch: OpScratch | None = None  # liveness: what the provider's kernels hold while they run (op_scratch)
    trips: dict[int, int] | None = None  # liveness: the Loops' trip counts
    report: Report | None = None  # summarize (and training)

    @property
    def buffer_rules(self) -> InferenceRules:
        return self.provider.buffer_rules(self.rules)


def _load(run: PipelineRun) -> None:
    model = run.model
    run.given = model if isinstance(model, LoadedModel) else load_model(model)  # type: ignore[arg-type]


def _provider(run: PipelineRun) -> None:
    assert run.given is not None
    run.loaded, notes = run.provider.runtime_model(run.given, run.buffer_rules)
    run.notes = list(notes)


def _graph(run: PipelineRun) -> None:
    loaded = run.loaded
    assert loaded is not None
    if run.free is None:
        run.free = input_dims(loaded.proto)  # (a KV cache has thousands of inputs: read once)
    run.graph = build_graph(loaded.proto, metadata=loaded.nodes is None or loaded.nodes.metadata, facts=loaded.facts)


def _planner_types(run: PipelineRun) -> None:
    if not run.symbolic_made:
        loaded, given = run.loaded, run.given
        assert loaded is not None
        # a model the provider made by inserting copies: typed from the inference its transform made of the model
        # as given (placed_types), not inferred again
        placed = placed_types(given, loaded) if given is not None and loaded is not given and \
            _compares_shapes(run.buffer_rules) and run.free else None
        run.symbolic = placed if placed is not None else planner_types(loaded, run.buffer_rules, run.free, run.graph)
        run.symbolic_made = True


def _size(run: PipelineRun) -> None:
    loaded, graph, given = run.loaded, run.graph, run.given
    assert loaded is not None and graph is not None and run.free is not None
    symbolic = run.symbolic
    # dims the model's side files state (the model builder's head size in its genai_config.json), unless given
    implied, said = genai_dims(loaded.path or (given.path if given is not None else None), run.free)
    dims = {**implied, **run.dims}
    sized = size_graph(graph, loaded.proto, dims, run.default_dim, symbolic, run.free)
    plan_shapes = planner_shapes(graph, symbolic, loaded.proto, loaded.data)
    changed = given is not None and loaded is not given
    given_types = run_types(given.proto) if given is not None and changed else None
    run.sized = Sizing(loaded, graph, dict(sized.dims), None if plan_shapes is None else tuple(plan_shapes),
                       (*run.notes, *(said if implied.keys() - run.dims.keys() else ()), *sized.warnings,
                        *graph.warnings), symbolic, tuple(run.free), run.default_dim,
                       run.provider, given if changed else None,
                       given_types=None if given_types is None else (given.proto, given_types))  # type: ignore[union-attr]


def _order(run: PipelineRun) -> None:
    sized, order = run.sized, run.order
    assert sized is not None
    rules, graph = run.buffer_rules, sized.graph
    if isinstance(order, str) and order not in SIZE_DEPENDENT_ORDERS:
        if sized.schedules is not None:
            run.steps, run.prepared = sized.schedules.schedule(graph, order, rules)
        else:
            steps = run.steps = execution_order(graph, order, rules)
            run.prepared = lifetimes(graph, steps, rules)
    else:
        run.steps, run.prepared = execution_order(graph, order, rules), None


def _liveness(run: PipelineRun) -> None:
    sized = run.sized
    assert sized is not None and run.steps is not None
    graph = sized.graph
    run.trips = loop_trip_counts(graph, sized.loaded.proto)
    peaks = loop_peaks(graph, run.trips, run.buffer_rules, run.mem_pattern) if run.trips else None
    run.scratch = sized.provider.op_scratch(graph, sized.loaded.proto)
    plans = sized.schedules.plans if sized.schedules is not None and run.prepared is not None else None
    run.timeline = liveness(graph, run.steps, run.buffer_rules, plan_shapes=sized.plan_shapes, prepared=run.prepared,
                            loop_peaks=peaks, scratch=run.scratch.bytes_by_op, plans=plans)
    if run.timeline.peak_bytes >= BEYOND_ANY_MEMORY:
        _refuse_beyond_memory(graph)


# A peak of 2^1000 bytes or more (a tensor with thousands of symbolic dims, each given --default-dim: an activation,
# or an input only a Shape reads, which the timeline leaves out) is refused in one line: no view can print it
# (float() overflows past 2^1024, str() refuses ints of over 4300 digits). Smaller absurd peaks (a Loop of 2^62
# trips, an Expand to 2^64 elements) are answered: the figure says it all.
BEYOND_ANY_MEMORY = 2**1000


def _refuse_beyond_memory(graph: ModelGraph) -> None:
    largest = max(graph.tensors, key=lambda t: t.nbytes or 0)
    power = max(0, (largest.nbytes or 0).bit_length() - 1)  # (str() refuses ints over 4300 digits: say 2^n)
    raise DimError(f"at the bound dims the peak is beyond any memory (2^1000 bytes or more): tensor "
                   f"'{largest.name[:80]}' alone holds 2^{power} bytes or more ({len(largest.shape or ())} dims); "
                   "bind its dims (--dim NAME=VALUE) or give a smaller --default-dim")


def _summarize(run: PipelineRun) -> None:
    sized, timeline = run.sized, run.timeline
    assert sized is not None and timeline is not None and run.trips is not None
    scratch = run.scratch.warnings if run.scratch is not None else ()
    run.report = summarize(sized.loaded, sized.graph, sized.dims, [*sized.warnings, *scratch,
                                                                   *loop_warnings(sized.graph, run.trips)],
                           timeline, run.order, sized.provider.name)


def _training(run: PipelineRun) -> None:
    training, sized, report = run.training, run.sized, run.report
    if training is None:
        return
    assert sized is not None and report is not None
    # (imported here: the training step's modules and tables are start-up that an inference report never needs)
    from onnxmem.training.step import micro_batch_dims, training_memory, training_warnings

    # Gradient accumulation: a micro-step's activations are those of the micro-batch. The step is PyTorch's:
    # it reads the model as given, not as onnxruntime changes it to run it, with the measured rules.
    source = sized.given or sized.loaded
    proto = source.proto
    micro = micro_batch_dims(proto, dict(sized.dims), training)
    training_graph = sized.graph
    if micro != sized.dims or sized.given is not None:
        # (its wiring first: the sizing rules read it, so the symbolic types size it with no inference where
        # they can, as for the report's own graph)
        training_graph = build_graph(proto, facts=source.facts)
        own = sized.given_types
        symbolic = own[1] if own is not None and sized.given is not None and own[0] is proto else sized.symbolic
        size_graph(training_graph, proto, micro, sized.default_dim, symbolic, list(sized.free))
    # PyTorch runs the forward in program order, which an exported file keeps, and its backward in the reverse
    # of that order (the engine runs the ready function made last first), whatever order inference assumes
    result = training_memory(training_graph, execution_order(training_graph, "model", run.rules), training)
    run.report = dataclasses.replace(report, training=result, warnings=(*report.warnings, *training_warnings(result)))


@dataclass(frozen=True)
class Stage:
    """One pass of the pipeline: its name and the function that runs it on a PipelineRun."""

    name: str
    run: Callable[[PipelineRun], None]


# The pipeline, declared once: every report, fit's family, check, validate's estimate and every what-if runs these
# stages (or a part of them: a family sizes its probes, validate starts from the graph onnxruntime ran), through
# run_stages.
STAGES: tuple[Stage, ...] = (
    Stage("load", _load),  # the model file or proto
    Stage("provider", _provider),  # onnxruntime's changes on the provider (QDQ copies, Casts, placement)
    Stage("graph", _graph),  # the central graph
    Stage("planner types", _planner_types),  # the symbolic shapes onnxruntime's planner compares
    Stage("size", _size),  # bind the dims, infer shapes, size every tensor: a Sizing
    Stage("order", _order),  # the execution order (and its size-free lifetimes)
    Stage("liveness", _liveness),  # the timeline of live bytes
    Stage("summarize", _summarize),  # the report
    Stage("training", _training),  # the training step, where asked
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)
SIZING = ("load", "size")  # the stages up to a Sizing (first, last)
AFTER_SIZING = ("order", "training")  # the stages that read a Sizing


def run_stages(run: PipelineRun, first: str = STAGE_NAMES[0], last: str = STAGE_NAMES[-1]) -> PipelineRun:
    """Run the declared stages from `first` to `last` (inclusive), in their order, on `run`; give it."""
    start, stop = STAGE_NAMES.index(first), STAGE_NAMES.index(last)
    with one_inference(), _no_cycle_collection():  # (a transform and the planner types share one inference)
        for stage in STAGES[start:stop + 1]:
            stage.run(run)
    return run


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Hold Python's cyclic garbage collector off while the stages run, and give it back as it was. The stages make
    millions of objects that live to the end of the run (a large graph's ops, tensors and their lists), and each
    full collection walks all of them, to find no cycle to free: on a 100k-node graph a quarter of a report's time.
    Memory is still freed by reference counting as the stages drop it; cycles wait for the collector's next run."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def sizing(model: Model, dims: Mapping[str, int] | None = None, *, default_dim: int | None = None,
           rules: InferenceRules = DEFAULT_INFERENCE_RULES,
           provider: str | ExecutionProvider = DEFAULT_PROVIDER) -> Sizing:
    """Run the stages up to sizing (load, the provider's changes, graph, planner types, bind and infer): see
    Sizing, and analysis for the parameters."""
    run = PipelineRun(execution_provider(provider), rules, dims or {}, default_dim, model=model)
    sized = run_stages(run, *SIZING).sized
    assert sized is not None
    return sized


def after_sizing(sized: Sizing, order: str | Sequence[str] = DEFAULT_ORDER,
                 rules: InferenceRules = DEFAULT_INFERENCE_RULES, training: TrainingOptions | None = None,
                 mem_pattern: bool = True) -> Analysis:
    """Run the stages after sizing (order, liveness, summaries, the training step) on a Sizing."""
    run = run_stages(PipelineRun(sized.provider, rules, sized.dims, sized.default_dim, order, training,
                                 mem_pattern=mem_pattern, sized=sized), *AFTER_SIZING)
    assert run.steps is not None and run.timeline is not None and run.report is not None
    return Analysis(sized, sized.graph, tuple(run.steps), run.timeline, run.report)


def analyze(model: Model | Sizing, dims: Mapping[str, int] | None = None, *, default_dim: int | None = None,
            order: str | Sequence[str] = DEFAULT_ORDER, rules: InferenceRules = DEFAULT_INFERENCE_RULES,
            training: TrainingOptions | None = None, provider: str | ExecutionProvider = DEFAULT_PROVIDER,
            progress: Callable[[str], None] | None = None) -> Report:
    """Give the memory report of a model at the given binding of its dims: analysis(...).report.

    Parameters
    ----------
    model, dims, default_dim, order, rules, training, provider, progress
        As analysis's.

    Returns
    -------
    Report
        Inference (weights, inputs, the activation peak and where it is, by op type and by layer), and with
        `training` the memory of one training step (report.training).

    Raises
    ------
    ModelFileError
        The file is not a readable ONNX model.
    DimError
        A symbolic dim is unbound or bound to a bad value.
    """
    check_arguments("analyze", model, dims, default_dim, order, provider, training, (Sizing,))
    return analysis(model, dims, default_dim=default_dim, order=order, rules=rules, training=training,
                    provider=provider, progress=progress).report


def size_graph(graph: ModelGraph, model: onnx.ModelProto, dims: Mapping[str, int], default_dim: int | None,
               symbolic: Mapping[str, TensorType] | None, free: list[InputDim] | None = None) -> SizedModel:
    """Size the model's graph in place at the dims (see bind_and_infer; `free`: the model's input_dims where the
    caller has them); give the bound dims and warnings."""
    sized = bind_and_infer(model, dims, default_dim, symbolic=symbolic, graph=graph, free=free)
    graph.set_types(sized.types)
    return sized


def planner_types(loaded: LoadedModel, rules: InferenceRules, free: list[InputDim] | None = None,
                  wiring: ModelGraph | None = None) -> dict[str, TensorType] | None:
    """Give the types onnxruntime's planner compares to reuse buffers: the model's before its dims are bound
    (None where the graph's own shapes serve: no symbolic input dim, or no rule that compares shapes).

    The same types, evaluated at the bound dims, size the tensors without a second inference where they name
    every dim (see bind_and_infer). `free`: the model's input_dims, `wiring`: its graph, where the caller has them.
    """
    if not _compares_shapes(rules):
        return None
    free = input_dims(loaded.proto) if free is None else free
    if not free and not sizes_from_float_arithmetic(loaded.proto):
        return None
    return infer_symbolic(loaded.proto, loaded, free, wiring)


def _compares_shapes(rules: InferenceRules) -> bool:
    """Say whether the rules compare shapes (planner_types: the planner types are made only then)."""
    return bool(rules.in_place or rules.reuse_freed)


_UNCONVERTED: tuple[Dim, ...] = ("not converted yet",)  # (compared by identity: no view is this tuple)


def planner_shapes(graph: ModelGraph, symbolic: Mapping[str, TensorType] | None,
                   model: onnx.ModelProto | None = None, data: bytes | None = None) -> \
        list[tuple[Dim, ...] | None] | None:
    """Give, per tensor of the graph, its shape as the planner sees it (see planner_types; `model`: the model the
    graph is of, whose declared 'unk__N' names onnxruntime keeps: planner.runtime_view; `data`: its bytes as read,
    where the caller has them)."""
    if symbolic is None:
        return None
    views: dict[tuple[Dim, ...] | None, tuple[Dim, ...] | None] = {}  # shapes repeat: convert each once
    declared: frozenset[str] | None = None  # read from the model where a shape has a 'unk__N' name
    get, seen = symbolic.get, views.get
    shapes = []
    for t in graph.tensors:
        shape = get(t.name, UNKNOWN_TYPE)[1]
        view = seen(shape, _UNCONVERTED)
        if view is _UNCONVERTED:
            if declared is None and model is not None and shape is not None and \
                    any(isinstance(d, str) and d.startswith("unk__") for d in shape):
                # (bytes that hold no 'unk__' declare none: a search instead of a walk of every declared dim)
                declared = frozenset() if data is not None and b"unk__" not in data else declared_dim_names(model)
            view = views[shape] = runtime_view(shape, declared or ())
        shapes.append(view)
    return shapes


def summarize(loaded: LoadedModel, graph: ModelGraph, dims: Mapping[str, int], warnings: list[Warning],
              timeline: Timeline, order: str | Sequence[str], provider: str = DEFAULT_PROVIDER) -> Report:
    """Give the report of a sized graph and its inference timeline (the last pass)."""
    return Report(
        model=model_name(loaded),
        dims=dict(dims),
        order=order if isinstance(order, str) else "given",
        nodes=len(graph.ops),
        tensors=len(graph.tensors),
        opsets={(o.domain or "ai.onnx"): o.version for o in loaded.proto.opset_import},
        inference=summarize_inference(graph, timeline),
        warnings=(*loaded.warnings, *warnings, *size_warnings(graph, timeline)),
        provider=provider,
    )


def model_name(loaded: LoadedModel) -> str:
    """Give the name a report shows for the model: its path, else its graph's name."""
    return str(loaded.path) if loaded.path else (loaded.proto.graph.name or "<ModelProto>")


# ops that read only a tensor's shape, and ops a weight passes through on its way to the op that computes with it
# (an export's t() of a Linear weight, a cast, a reshape): a weight is attributed to the op that uses it as a weight
_SHAPE_READERS = frozenset({"Shape", "Size"})
_WEIGHT_PASSES = frozenset({"Cast", "Transpose", "Reshape", "Identity", "Unsqueeze", "Squeeze", "Flatten"})
_WEIGHT_PASS_DEPTH = 8


def _weight_user(graph: ModelGraph, weight: int, position: list[int]) -> int:
    """Give the first op (in the order run) that computes with a weight: through the ops it passes through
    (_WEIGHT_PASSES, as their data input), past ops that read only its shape; -1 where none does."""
    ops, best = graph.ops, -1
    frontier, depth = [weight], 0
    while frontier and depth <= _WEIGHT_PASS_DEPTH:
        following: list[int] = []
        for tensor in frontier:
            for c in graph.tensors[tensor].consumers:
                op = ops[c]
                if tensor not in op.inputs or op.op_type in _SHAPE_READERS:
                    continue
                if op.op_type in _WEIGHT_PASSES and op.inputs[0] == tensor and op.outputs and op.outputs[0] >= 0:
                    following.append(op.outputs[0])
                elif best < 0 or position[c] < position[best]:
                    best = c
        frontier, depth = following, depth + 1
    return best


def summarize_inference(graph: ModelGraph, timeline: Timeline) -> InferenceReport:
    """Give the inference part of a report from the graph and its timeline."""
    ops, buffer_of, view_of = graph.ops, timeline.buffer_of, timeline.view_of
    position = [0] * len(ops)
    for step, op_index in enumerate(timeline.order):
        position[op_index] = step
    weights_of = [0] * len(ops)  # per op: the bytes of the weights it is the first to read (as an input)
    allocated_of = [0] * len(ops)  # per op: the bytes of its outputs' own buffers
    by_dtype: dict[int, int] = {}
    input_bytes = computed_bytes = host_bytes = 0
    for t in graph.tensors:  # one pass: a large graph has hundreds of thousands
        kind = t.kind
        if kind == WEIGHT:
            by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + (t.nbytes or 0)
            first = _weight_user(graph, t.index, position)
            if first < 0:  # no op computes with it: the first op to read it as an input (not as a subgraph's)
                for c in t.consumers:
                    if (first < 0 or position[c] < position[first]) and t.index in ops[c].inputs:
                        first = c
            if first >= 0:
                weights_of[first] += t.nbytes or 0
            continue
        if kind == INPUT:
            input_bytes += t.nbytes or 0
            continue
        index = t.index
        if t.producer is not None:
            if buffer_of[index] == index:
                allocated_of[t.producer] += t.nbytes or 0
            if view_of[index] == index and kind in (ACTIVATION, OUTPUT):
                computed_bytes += t.nbytes or 0
                continue
        if kind == HOST and view_of[index] == index:
            host_bytes += t.nbytes or 0
    if input_bytes + sum(by_dtype.values()) >= BEYOND_ANY_MEMORY:  # (the timeline's peak leaves them out)
        _refuse_beyond_memory(graph)
    for op in ops:
        if op.subgraphs:  # the weights of its bodies, at every depth: the op that holds them is their reader
            weights_of[op.index] += _body_weights(op.subgraphs, by_dtype)
    by_op_type, by_layer = _op_rows(graph, timeline, weights_of, allocated_of)
    weights_bytes = sum(by_dtype.values())
    output_bytes = sum(graph.tensors[t].nbytes or 0 for t in graph.outputs)
    step = timeline.peak_step
    peak_op = graph.ops[timeline.order[step]] if step >= 0 else None
    live = [graph.tensors[t] for t in timeline.live_at(step)] if step >= 0 else []
    live.sort(key=lambda t: -(t.nbytes or 0))
    ops = graph.ops
    ordered_ops = [ops[i] for i in timeline.order]
    base = weights_bytes + input_bytes
    return InferenceReport(
        weights_bytes=weights_bytes,
        weights_by_dtype={dtype_name(k): v for k, v in sorted(by_dtype.items(), key=lambda kv: -kv[1])},
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        peak_activation_bytes=timeline.peak_bytes,
        peak_bytes=weights_bytes + input_bytes + timeline.peak_bytes,
        peak_node=peak_op.name if peak_op else "",
        peak_op_type=peak_op.op_type if peak_op else "",
        peak_step=step,
        sum_activation_bytes=computed_bytes,
        live_at_peak=tuple(_live_tensor(graph, t) for t in live[:_TOP_LIVE]),
        by_op_type=by_op_type,
        by_layer=by_layer,
        unsized_tensors=len(timeline.unsized),
        host_activation_bytes=host_bytes,
        kv_cache=kv_cache_of(graph),
        timeline=InferenceTimeline(tuple([op.name for op in ordered_ops]), tuple([op.op_type for op in ordered_ops]),
                                   tuple([base + live for live in timeline.live_bytes])),
    )


def inference_peak(graph: ModelGraph, timeline: Timeline) -> tuple[int, int]:
    """Give (peak bytes, weights bytes) of the inference report summarize_inference gives of the graph and its
    timeline (weights, its bodies' at every depth too, plus inputs plus the activation peak), without the rest of
    the report: what fit's what-ifs compare."""
    weights = inputs = 0
    for t in graph.tensors:
        if t.kind == WEIGHT:
            weights += t.nbytes or 0
        elif t.kind == INPUT:
            inputs += t.nbytes or 0
    bodies = [sub for op in graph.ops for sub in op.subgraphs]
    if bodies:
        weights += _body_weights(bodies, {})
    return weights + inputs + timeline.peak_bytes, weights


def _live_tensor(graph: ModelGraph, t: Tensor) -> LiveTensor:
    producer = graph.ops[t.producer] if t.producer is not None else None
    return LiveTensor(
        name=t.name, shape=t.shape, dtype=dtype_name(t.dtype), bytes=t.nbytes,
        producer=producer.name if producer else "", op_type=producer.op_type if producer else "",
        layer=producer.layer if producer else "",
    )


def _body_weights(bodies: Sequence[ModelGraph], by_dtype: dict[int, int]) -> int:
    """Add the bytes of the weights of `bodies` and of the bodies their ops hold, at every depth, to `by_dtype`
    (element type -> bytes), and give their total (iteratively: nesting depth is the file's)."""
    total = 0
    stack = list(bodies)
    while stack:
        body = stack.pop()
        for dtype, nbytes in body.own_weights.items():
            by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
            total += nbytes
        stack.extend(sub for op in body.ops for sub in op.subgraphs)
    return total


def _op_rows(graph: ModelGraph, timeline: Timeline, weights_of: list[int], allocated_of: list[int]) -> \
        tuple[tuple[OpTypeRow, ...], tuple[LayerRow, ...]]:
    """Give the rows by op type (the most bytes first) and by layer (in order of execution): nodes, the weight
    bytes they are the first to read (`weights_of`, per op), the bytes their outputs' buffers own
    (`allocated_of`), and (layers) the highest live bytes."""
    ops, live = graph.ops, timeline.live_bytes
    types: dict[str, list[int]] = {}
    layers: dict[str, list[int]] = {}
    row: list[int] = []
    layer = None
    for step, op_index in enumerate(timeline.order):
        op = ops[op_index]
        weights, allocated = weights_of[op_index], allocated_of[op_index]
        kind = types.get(op.op_type)
        if kind is None:
            kind = types[op.op_type] = [0, 0, 0]
        kind[0] += 1
        kind[1] += weights
        kind[2] += allocated
        if op.layer != layer:  # (the ops of a layer mostly run one after another)
            layer = op.layer
            name = layer_name(layer) or "(top level)"
            found = layers.get(name)
            row = layers[name] = [0, 0, 0, 0] if found is None else found
        row[0] += 1
        row[1] += weights
        row[2] += allocated
        if live[step] > row[3]:
            row[3] = live[step]
    ordered = sorted(types.items(), key=lambda kv: (-kv[1][2] - kv[1][1], kv[0]))
    return tuple(OpTypeRow(k, *v) for k, v in ordered), tuple(LayerRow(k, *v) for k, v in layers.items())


def size_warnings(graph: ModelGraph, timeline: Timeline) -> list[Warning]:
    """Give the unknown-shape warning naming the activations the timeline could not size, if any."""
    if not timeline.unsized:
        return []
    names = []
    for t in timeline.unsized[:10]:
        tensor = graph.tensors[t]
        producer = graph.ops[tensor.producer] if tensor.producer is not None else None
        where = f" from {producer.op_type} node '{producer.name}'" if producer else ""
        names.append(f"'{tensor.name}'{where} (shape {_shape_text(tensor.shape)})")
    more = f" and {len(timeline.unsized) - 10} more" if len(timeline.unsized) > 10 else ""
    return [Warning(
        "unknown-shape",
        f"{len(timeline.unsized)} activations have no known size and are not counted, so the activation peak "
        f"is a lower bound: {', '.join(names)}{more}",
    )]


def _shape_text(shape: tuple[object, ...] | None) -> str:
    if shape is None:
        return "unknown rank"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"

