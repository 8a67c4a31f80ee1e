"""Results as plain frozen dataclasses; to_dict() gives the versioned JSON form. Sizes are int bytes."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
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


_NOT_IN_JSON: dict[str, Any] = {"json": False}  # a field to_dict() leaves out (see plain)


@dataclass(frozen=True)
class KVCache:
    """A decoder's KV cache as onnxruntime holds it in one step (shapes.kvcache): the past key/value inputs the
    step reads (fed by the caller, held through the run) and the present outputs it writes in their place (the past
    and the step's new positions, allocated by the step), both held when the step ends."""

    past_bytes: int  # the past inputs (counted in the report's input_bytes)
    present_bytes: int  # the present outputs (activations: live from the op that writes them to the run's end)
    past_tensors: int  # a key and a value per layer, or one tensor per layer where the export packs them
    present_tensors: int
    dtype: str  # the cache's element type (FLOAT16, ...), "mixed" where its tensors differ
    unsized_tensors: int = 0  # cache tensors of unknown size, not counted

    @property
    def bytes(self) -> int:
        """The cache's bytes held when the step ends: past inputs + present outputs."""
        return self.past_bytes + self.present_bytes


@dataclass(frozen=True)
class InferenceTimeline:
    """The inference run step by step: at step s, node nodes[s] runs with live_bytes[s] bytes held (weights +
    inputs + live activations): the series every picture of the run draws; its maximum is the report's peak."""

    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    live_bytes: tuple[int, ...]

    def to_list(self) -> list[dict[str, Any]]:
        """Give the steps as JSON-ready objects {step, node, op_type, live_bytes}."""
        return [{"step": s, "node": node, "op_type": op_type, "live_bytes": live}
                for s, (node, op_type, live) in enumerate(zip(self.nodes, self.op_types, self.live_bytes,
                                                               strict=True))]


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
    sum_activation_bytes: int  # every computed tensor but views added up: what a hand count adds
    live_at_peak: tuple[LiveTensor, ...]  # largest first
    by_op_type: tuple[OpTypeRow, ...]
    by_layer: tuple[LayerRow, ...]
    unsized_tensors: int  # activations of unknown size, not counted: the peak is then a lower bound
    # activations onnxruntime keeps in host memory while the model runs on a device (the CUDA provider's CPU nodes,
    # Shape's outputs, MemcpyToHost copies), every one added up: not in the device figures above
    host_activation_bytes: int = 0
    # a decoder's KV cache: past inputs + present outputs, both held when the step ends (part of input_bytes and of
    # the activations, not added again to the peak); None where the model has no KV cache. Set from kv_cache.
    kv_cache_bytes: int | None = dataclasses.field(init=False, default=None)
    kv_cache: KVCache | None = None
    timeline: InferenceTimeline | None = dataclasses.field(default=None, compare=False, repr=False,
                                                           metadata=_NOT_IN_JSON)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_cache_bytes", None if self.kv_cache is None else self.kv_cache.bytes)


@dataclass(frozen=True)
class PhaseRow:
    """One phase of a training step: the most bytes live during it, and what is live when it ends."""

    phase: str  # data | forward | loss | backward | optimizer
    peak_bytes: int
    end_bytes: int
    peak_event: str  # the op (or update) at the phase's peak


@dataclass(frozen=True)
class TrainingStep:
    """A training step's memory profile (the first step creates the optimizer state; later steps start with it)."""

    step: str  # first | later
    peak_bytes: int
    peak_phase: str
    peak_event: str
    phases: tuple[PhaseRow, ...]


@dataclass(frozen=True)
class TrainingLiveRow:
    """What is live at the training peak, by category (weights, saved activations, gradients, ...)."""

    category: str
    bytes: int
    buffers: int
    largest: str  # names of the largest buffers of the category


@dataclass(frozen=True)
class TrainingParameterGroup:
    """Parameters of one module (the module path of the first op that reads them)."""

    layer: str
    parameters: int  # elements
    trainable_bytes: int
    frozen_bytes: int


@dataclass(frozen=True)
class RecomputeRow:
    """A cheap op whose kept output backward could recompute from inputs that are kept anyway."""

    node: str
    op_type: str
    tensor: str
    saved_bytes: int  # kept bytes it would free
    extra_flops: int  # one elementwise pass over the tensor


@dataclass(frozen=True)
class CheckpointWhatIf:
    """Activation checkpointing: the peak when all but the last of `segments` keep only their inputs."""

    segments: int
    peak_bytes: int
    saved_activation_bytes: int
    memory_saved_bytes: int  # the training peak without checkpointing minus peak_bytes
    forward_flops: int
    extra_forward_flops: int  # the checkpointed segments run forward twice


# The model-state categories a training timeline follows event by event (TrainingTimeline.first_states): what
# sharding divides or moves. "update temporaries" are the optimizer update's, apart from other temporaries.
STATE_SERIES = ("parameter gradients", "optimizer state", "low-precision weight copies", "update temporaries")


@dataclass(frozen=True)
class TrainingParameter:
    """One parameter of the step, in the order its first reader runs: what finds the unit ZeRO-3 gathers."""

    name: str
    module: str  # dotted module path of its first reader ('' where the file has no scopes)
    shape: tuple[int | str | None, ...] | None
    elements: int
    trainable: bool


@dataclass(frozen=True)
class TrainingTimeline:
    """A training step event by event (data, forward, loss, backward, optimizer): the first step's live bytes and
    a later step's (whose optimizer state exists from the start) at each event; the maximum is the report's peak."""

    phases: tuple[str, ...]  # per event
    events: tuple[str, ...]
    first_live_bytes: tuple[int, ...]
    later_live_bytes: tuple[int, ...]
    # per event, the bytes of each model-state category live (STATE_SERIES): what sharding divides; not in JSON
    first_states: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict, compare=False)
    later_states: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict, compare=False)
    parameters: tuple[TrainingParameter, ...] = dataclasses.field(default=(), compare=False)

    def to_list(self) -> list[dict[str, Any]]:
        """Give the events of both steps, the first step's then the later one's, as JSON-ready objects
        {step, run, phase, event, live_bytes}."""
        rows: list[dict[str, Any]] = []
        for run, live in (("first", self.first_live_bytes), ("later", self.later_live_bytes)):
            for phase, event, nbytes in zip(self.phases, self.events, live, strict=True):
                rows.append({"step": len(rows), "run": run, "phase": phase, "event": event, "live_bytes": nbytes})
        return rows


@dataclass(frozen=True)
class TrainingReport:
    """Training memory of one step: each part apart, and the peak of the whole step with its phase."""

    optimizer: str
    optimizer_impl: str  # foreach | for-loop | fused
    precision: str  # fp32 | amp-fp16 | amp-bf16 | bf16
    loss: str
    grad_accum: int
    export_mode: str  # training | eval | either (the graph has no Dropout or BatchNormalization)
    parameters: int  # elements of all parameters, trainable and frozen
    trainable_parameters: int
    weights_bytes: int  # every weight at the training precision (parameters, buffers, constants)
    gradient_bytes: int  # parameter gradients
    optimizer_state_bytes: int
    saved_activation_bytes: int  # kept for backward when backward starts (model and loss)
    input_bytes: int
    peak_bytes: int  # the whole step's peak: weights, state, input batch and all else live then
    peak_phase: str
    peak_step: str  # first | later: the step whose peak is higher
    peak_event: str
    first_step: TrainingStep
    later_step: TrainingStep
    live_at_peak: tuple[TrainingLiveRow, ...]
    saved_by_op_type: tuple[tuple[str, int], ...]
    parameter_groups: tuple[TrainingParameterGroup, ...]
    unknown_backward_ops: tuple[str, ...]  # op types given the conservative default rule
    recompute: tuple[RecomputeRow, ...]
    recompute_peak_bytes: int  # the peak if every recompute candidate were recomputed
    checkpoint: CheckpointWhatIf | None
    hand_formula_bytes: int  # weights x (2 + optimizer states) + 2 x every activation + inputs
    assumptions: tuple[str, ...]
    timeline: TrainingTimeline | None = dataclasses.field(default=None, compare=False, repr=False,
                                                          metadata=_NOT_IN_JSON)


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
    training: TrainingReport | None = None
    provider: str = "cuda"  # the onnxruntime execution provider the report assumes (cpu: float16 Casts)

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        """Give the report as JSON-ready builtins (the documented schema); `timeline`: with inference.timeline[]
        (and training.timeline[]), the live bytes at every step."""
        result = plain(self)
        if timeline:
            if self.inference.timeline is not None:
                result["inference"]["timeline"] = self.inference.timeline.to_list()
            if self.training is not None and self.training.timeline is not None:
                result["training"]["timeline"] = self.training.timeline.to_list()
        return result


def plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    names = field_names(type(value))  # type: ignore[arg-type]  # classes are hashable
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


@functools.cache
def field_names(cls: type) -> tuple[str, ...] | None:
    """Give a dataclass's JSON field names (None for any other type; fields marked _NOT_IN_JSON are left out),
    once per class: a report of a deep model has tens of thousands of rows. `schema` comes first, so that a reader
    of a JSON document knows what it reads from its first key; the others keep their order."""
    if not dataclasses.is_dataclass(cls):
        return None
    names = tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("json", True))
    return ("schema", *(n for n in names if n != "schema")) if "schema" in names else names


# --- Plan: fit and check (onnxmem/plan/fit.py) --------------------------------------------------------------------

FIT_SCHEMA = "onnxmem.fit/1"
CHECK_SCHEMA = "onnxmem.check/1"


@dataclass(frozen=True)
class ReserveItem:
    """A fixed cost the process pays before the model gets anything, and where its figure comes from."""

    name: str  # cuda-context | workspaces | reserve
    bytes: int
    source: str  # "stated default: ..." | "measured: ..." | "given with --reserve"


@dataclass(frozen=True)
class Target:
    """Where the model must fit: the device's memory, the fixed costs taken off it, and the allocator's rounding."""

    memory_bytes: int
    memory_source: str  # "--memory 24GiB" | "A100-80GB: nominal capacity"
    gpu: str  # the catalog name, or "" when --memory was given
    runtime: str  # onnxruntime | pytorch | "" (none named: no workspaces, exact allocation)
    reserve: tuple[ReserveItem, ...]
    reserve_bytes: int
    allocator: str  # exact | onnxruntime-arena | pytorch-caching
    allocator_rule: str  # what the rounding is, in words


@dataclass(frozen=True)
class Sharding:
    """Model states per GPU when N GPUs divide them as ZeRO (DeepSpeed) or FSDP does; activations stay per GPU."""

    stage: str  # ddp | zero1 | zero2 | zero3 | fsdp
    gpus: int
    weights_bytes: int  # per GPU
    gradient_bytes: int
    optimizer_state_bytes: int
    gathered_bytes: int  # zero3/fsdp: the gathered unit's weights and gradients while it runs
    unsharded_bytes: int  # the same states on one GPU
    per_gpu_bytes: int  # weights + gradients + optimizer states + gathered, per GPU
    saved_bytes: int  # unsharded - per GPU
    offload: str = "none"  # none | optimizer | params | both: what lives in CPU memory (DeepSpeed's offload)
    cpu_bytes: int = 0  # CPU memory per node as DeepSpeed's estimator counts it (its 1.5 buffer factor)
    gathered_unit: str = ""  # what one gathered unit is and how it was found
    gathered_parameters: int = 0  # elements of that unit
    update_temporary_bytes: int = 0  # the optimizer update's temporaries per GPU (each rank updates its shard)
    activation_bytes: int = 0  # per GPU at the peak: all but the model states (activations, inputs, temporaries)
    peak_bytes: int = 0  # per GPU: per_gpu_bytes + activation_bytes at the step's worst event
    peak_event: str = ""  # that event: step, phase and event


@dataclass(frozen=True)
class FitPoint:
    """The estimate at one value of the searched dim."""

    value: int
    peak_bytes: int  # the estimator's total peak (per GPU when sharded)
    required_bytes: int  # the peak after the allocator's rounding: what must fit in the budget
    fits: bool


@dataclass(frozen=True)
class LinearFit:
    """peak = intercept + slope x value, from the peaks at 1 and 2, checked at every other value evaluated."""

    intercept_bytes: int
    slope_bytes: int  # bytes per unit of the searched dim (per sample, for batch)
    verified: bool  # True: every evaluated value agrees exactly
    checked_values: tuple[int, ...]


@dataclass(frozen=True)
class WhatIf:
    """One change that would lower the peak, with the peak it gives (same binding, same target)."""

    change: str
    peak_bytes: int
    saved_bytes: int
    detail: str
    fits: bool | None = None  # whether this change alone makes it fit the budget (None: no budget to fit)


# What rounds the peak up to the bytes required, by allocator (Target.allocator): named in every answer.
ROUNDED_BY = {"exact": "no --runtime: no allocator rounding",
              "onnxruntime-arena": "onnxruntime's arena regions",
              "pytorch-caching": "PyTorch's 2 MiB segments and fragmentation"}


@dataclass(frozen=True)
class Arithmetic:
    """The sums behind a verdict, each figure in bytes: memory - fixed_costs = budget; peak + allocator_rounding =
    required; budget - required = headroom (negative: short by that much)."""

    memory_bytes: int
    fixed_costs_bytes: int  # the runtime's fixed costs (Target.reserve) taken off the memory
    budget_bytes: int
    peak_bytes: int  # the estimator's peak (per GPU when sharded)
    allocator_rounding_bytes: int  # required - peak: what the allocator holds beyond the peak (its regions)
    rounded_by: str  # what rounds it: onnxruntime's arena regions, PyTorch's segments, nothing
    required_bytes: int
    headroom_bytes: int
    fits: bool


def arithmetic_of(target: Target, budget: int, peak: int, required: int) -> Arithmetic:
    """Give the arithmetic of a verdict at one binding: the target's memory and fixed costs, the peak and the
    allocator's rounding of it."""
    return Arithmetic(memory_bytes=target.memory_bytes, fixed_costs_bytes=target.memory_bytes - budget,
                      budget_bytes=budget, peak_bytes=peak, allocator_rounding_bytes=required - peak,
                      rounded_by=ROUNDED_BY.get(target.allocator, target.allocator), required_bytes=required,
                      headroom_bytes=budget - required, fits=required <= budget)


@dataclass(frozen=True)
class FitResult:
    """The largest value of one dim whose peak fits a budget, found by evaluating the estimator (`onnxmem fit`)."""

    model: str
    dim: str
    dims: dict[str, int]  # the other dims, fixed
    mode: str  # inference | training
    target: Target
    budget_bytes: int  # memory - reserve: what the model's tensors may take, allocator rounding included
    max_value: int  # 0: nothing fits, not even 1
    max_power_of_two: int  # 0: nothing fits
    bounded: bool  # False: even search_limit fits (the dim barely moves memory)
    search_limit: int
    monotonic: bool  # the evaluated peaks never decrease as the value grows
    evaluations: int
    curve: tuple[FitPoint, ...]  # every value evaluated, ascending
    linear: LinearFit | None  # None: the peak is not linear in the dim
    sharding: Sharding | None
    what_ifs: tuple[WhatIf, ...]  # at max_value + 1: what would make the next value fit
    notes: tuple[str, ...]
    warnings: tuple[Warning, ...]
    schema: str = FIT_SCHEMA
    step: int = 1  # every value searched is a multiple of this (gradient accumulation: the micro-steps or micro-batch)
    # gives the report at max_value (at 1 where nothing fits), made on its first call and kept by the callable (fit
    # passes a functools.cache): see `report`; the result itself is never written after it is made
    report_at_answer: Callable[[], Report] | None = dataclasses.field(default=None, compare=False, repr=False,
                                                                      metadata=_NOT_IN_JSON)
    # the verdict's sums at the answer (at the first value searched where nothing fits): made from the curve
    arithmetic: Arithmetic | None = dataclasses.field(init=False, default=None)

    def __post_init__(self) -> None:
        value = self.max_value or self.step
        point = next((p for p in self.curve if p.value == value), None)
        if point is not None:
            object.__setattr__(self, "arithmetic", arithmetic_of(self.target, self.budget_bytes, point.peak_bytes,
                                                                 point.required_bytes))

    @property
    def report(self) -> Report | None:
        """The report at max_value (at 1 where nothing fits): what the pictures of the answer draw. Made on first
        use (the search itself needs no summaries) by report_at_answer, which keeps it."""
        return None if self.report_at_answer is None else self.report_at_answer()

    def to_dict(self) -> dict[str, Any]:
        """Give the result as JSON-ready builtins (the documented schema)."""
        return plain(self)


@dataclass(frozen=True)
class CheckResult:
    """Whether the model at its bound dims fits a budget (`onnxmem check`: exit 0 fits, 1 does not)."""

    model: str
    dims: dict[str, int]
    mode: str  # inference | training
    target: Target
    budget_bytes: int
    peak_bytes: int  # the estimator's total peak (per GPU when sharded)
    required_bytes: int  # the peak after the allocator's rounding
    headroom_bytes: int  # budget - required; negative when it does not fit
    fits: bool
    peak_where: str  # the node (inference) or phase and event (training) of the peak
    sharding: Sharding | None
    what_ifs: tuple[WhatIf, ...]
    warnings: tuple[Warning, ...]
    schema: str = CHECK_SCHEMA
    report: Report | None = dataclasses.field(default=None, compare=False, repr=False, metadata=_NOT_IN_JSON)
    arithmetic: Arithmetic = dataclasses.field(init=False)  # the verdict's sums, from the fields above

    def __post_init__(self) -> None:
        object.__setattr__(self, "arithmetic", arithmetic_of(self.target, self.budget_bytes, self.peak_bytes,
                                                             self.required_bytes))

    def to_dict(self) -> dict[str, Any]:
        """Give the result as JSON-ready builtins (the documented schema)."""
        return plain(self)
