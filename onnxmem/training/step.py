"""Training memory: one training step (forward, loss, backward, optimizer step) scheduled over the forward graph.

The step is a sequence of events; every buffer (weight, input batch, activation, mask, activation gradient,
parameter gradient, optimizer state, temporary) lives from one event to another, and a difference array over
events gives the live bytes at each (as in liveness.py). What PyTorch does is the reference:

- data: weights and the input batch are live (and, after the first step, the optimizer state).
- forward: each op allocates its outputs (views allocate nothing); a tensor is freed after its last reader,
  unless an op keeps it for backward (rules/training.py), then after that op's backward. Only ops that have an
  input needing a gradient (from a trainable parameter) keep anything.
- loss: appended after the model's first float output (cross-entropy keeps its log-softmax). The model's
  outputs and the loss are held by the training loop until the end of the step.
- backward: the ops in reverse order; each allocates its inputs' gradients (or passes its output's gradient
  through), then frees its output gradients and what it kept. Parameter gradients live until the step ends
  (zero_grad(set_to_none=True) frees them at the next step).
- optimizer: states are created at the first step and live from then on; the update's temporaries are counted.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import onnx
from onnx import TensorProto

from onnxmem.errors import TrainingOptionError
from onnxmem.ir.graph import ACTIVATION, INPUT, OUTPUT, WEIGHT, ModelGraph, fx_arguments
from onnxmem.passes.liveness import live_bytes
from onnxmem.training.rules import (
    ATEN_SAVED_FOR_BACKWARD,
    ATEN_VIEWS,
    ATEN_WITH_DROPOUT,
    AUTOCAST_FP32,
    AUTOCAST_FP32_CPU,
    AUTOCAST_LOW_PRECISION,
    CHEAP_TO_RECOMPUTE,
    CPU_AUTOGRAD_BYTES_PER_NODE,
    CPU_CONVOLUTION,
    CPU_ISAS,
    DECOMPOSED,
    DEFAULT_SAVES,
    EIGHT_BIT_BLOCK,
    EIGHT_BIT_MIN_ELEMENTS,
    EVAL_MODULES,
    EXPORT_MODE_PROPERTY,
    EXPORTER_WEIGHT_NAME,
    FOLDED_ATEN,
    FOLDS_INTO,
    GRAPH_SIGNATURE_PROPERTY,
    LOSSES,
    NON_DIFFERENTIABLE_INPUTS,
    NOT_DIFFERENTIABLE,
    NOT_PARAMETER_KINDS,
    OPTIMIZER_ALIASES,
    OPTIMIZERS,
    RECURRENT,
    RECURRENT_WEIGHT_RELAYOUT,
    SAVED_FOR_BACKWARD,
    TRAINING_VIEWS,
    CpuIsa,
    Decomposed,
    Folded,
    OptimizerRule,
    Recurrent,
    Saves,
)
from onnxmem.views.report import (
    CheckpointWhatIf,
    PhaseRow,
    RecomputeRow,
    TrainingLiveRow,
    TrainingParameterGroup,
    TrainingReport,
    TrainingStep,
    TrainingTimeline,
    Warning,
)

PRECISIONS = ("fp32", "amp-fp16", "amp-bf16", "bf16")
OPTIMIZER_IMPLEMENTATIONS = ("auto", "foreach", "for-loop", "fused")
DEVICES = ("cuda", "cpu")
PHASES = ("data", "forward", "loss", "backward", "optimizer")
_FLOATS = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})
# Buffers whose name says they are running statistics, not parameters (PyTorch's BatchNorm buffers).
_BUFFER_NAMES = ("running_mean", "running_var", "num_batches_tracked")
# Inputs of an op that are buffers even when they are float initializers.
_BUFFER_INPUTS: dict[str, tuple[int, ...]] = {"BatchNormalization": (3, 4)}
_TOP_LIVE = 20
# Warnings a training report carries about its export: each is stated in the report's assumptions as
# '[code] message' (TrainingReport has no warnings of its own), and training_warnings gives them back.
EXPORT_WARNINGS = ("folded-normalization", "eval-export", "export-mode-unknown", "unmatched-pattern")
_ATEN_TARGET = re.compile(r"^torch\.ops\.aten\.([A-Za-z0-9_]+)\.")


@dataclass(frozen=True)
class TrainingOptions:
    """How the model is trained: optimizer, precision, what is trainable, accumulation, checkpointing."""

    optimizer: str = "adamw"  # a key of rules.training.OPTIMIZERS (or an alias: momentum, 8bit-adam, ...)
    precision: str = "fp32"  # fp32 | amp-fp16 | amp-bf16 (autocast, fp32 master weights) | bf16 (pure)
    freeze: tuple[str, ...] = ()  # fnmatch patterns of parameter names or module paths to freeze
    train: tuple[str, ...] = ()  # when given, only parameters matching one of these train
    grad_accum: int = 1  # micro-steps per optimizer step (the graph is bound at the micro-batch)
    micro_batch: int | None = None  # instead of grad_accum: the micro-batch size (the batch dim is divided by it)
    checkpoint: int | str | None = None  # activation checkpointing what-if: segments, or "auto" (sqrt n)
    loss: str = "cross_entropy"  # a key of rules.training.LOSSES, applied to the model's first float output
    batch_dim: str | None = None  # the dim that grad_accum divides; default: axis 0 of the first input
    optimizer_impl: str = "auto"  # auto (PyTorch's default on the device) | foreach | for-loop | fused
    device: str = "cuda"  # where PyTorch trains: cuda | cpu (dropout masks and the optimizer's default differ)
    # on CPU, PyTorch's intra-op threads (torch.get_num_threads()): which convolution kernel runs, and oneDNN's
    # gemm convolution keeps its scratch per thread (rules.training.CPU_CONVOLUTION)
    cpu_threads: int = 1
    # on CPU, the instruction set of the CPU that trains (a key of rules.training.CPU_ISAS: oneDNN's channel block
    # and which element sizes its convolutions run); None: the CPU onnxmem runs on (detect_cpu_isa)
    cpu_isa: str | None = None

    @property
    def isa(self) -> CpuIsa:
        """Give the CPU instruction set's kernel facts (rules.training.CPU_ISAS) of cpu_isa, or of this machine."""
        return CPU_ISAS[self.cpu_isa or detect_cpu_isa()]

    @property
    def accumulates(self) -> bool:
        """Say whether gradients accumulate over micro-steps (they are then live through later forwards)."""
        return self.grad_accum > 1 or self.micro_batch is not None

    @property
    def update_impl(self) -> str:
        """Give the optimizer update's implementation: PyTorch's default is foreach on CUDA, a for-loop on CPU."""
        if self.optimizer_impl != "auto":
            return self.optimizer_impl
        return "for-loop" if self.device == "cpu" else "foreach"

    def optimizer_rule(self) -> OptimizerRule:
        """Give the optimizer's rule; raises ValueError for an unknown name."""
        name = OPTIMIZER_ALIASES.get(self.optimizer, self.optimizer)
        if name not in OPTIMIZERS:
            raise TrainingOptionError(f"unknown optimizer '{self.optimizer}': choose one of {', '.join(OPTIMIZERS)}")
        return OPTIMIZERS[name]


@dataclass
class _Node:
    """A forward op of the step: a graph op or one of the loss's appended ops."""

    op_type: str
    domain: str
    name: str
    layer: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    graph_op: int | None  # index into graph.ops, or None for a loss op
    restored: bool = False  # an op the export folded away, simulated after the node it was folded into


@dataclass
class _Value:
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


@dataclass
class _Buffer:
    name: str
    category: str
    nbytes: int
    start: int
    end: int


class _Events:
    def __init__(self) -> None:
        self.phase: list[str] = []
        self.label: list[str] = []

    def add(self, phase: str, label: str) -> int:
        self.phase.append(phase)
        self.label.append(label)
        return len(self.phase) - 1


class Gemm(NamedTuple):
    """A GEMM a node runs in MKL on CPU (rules.training.MklGemmBuffers): its output C is M x N (row-major) over K;
    run by the node's backward; with bf16 operands into an fp32 result (gemm_bf16bf16f32, which converts them);
    A (M x K) or B (K x N) read transposed (stored K x M, N x K)."""

    m: int
    n: int
    k: int
    backward: bool = False
    low_precision: bool = False
    a_transposed: bool = False
    b_transposed: bool = False


@dataclass
class _Model:
    """Facts about the graph that every simulation reads: built once per training_memory call."""

    nodes: list[_Node]
    values: list[_Value]
    root: list[int]  # storage root of each value (views share their base's storage)
    members: dict[int, list[int]]  # storage root -> the values that live in it
    needs_grad: list[bool]  # per value
    differentiable: list[bool]  # per node: it has a backward (some input needs a gradient)
    params: list[int]  # trainable parameter values, in first-use order
    frozen: list[int]
    param_bytes: int  # at the training precision
    saved_by: dict[int, list[int]]  # storage root -> nodes that keep it for backward
    extras: dict[int, int]  # node -> bytes kept besides tensors (masks, indices, statistics)
    cast_copies: dict[tuple[int, int], int]  # (node, input value) -> bytes of autocast's low-precision copy
    weight_copies: dict[int, int]  # parameter value -> bytes of autocast's cached low-precision copy
    new_grads: dict[int, list[int]]  # node -> inputs whose gradient is a new buffer
    backward_temporaries: dict[int, int]  # node -> bytes its backward holds for a moment
    passthrough: dict[int, list[int]]  # node -> inputs whose gradient is the output's gradient
    unknown: dict[str, int]  # op types missing from SAVED_FOR_BACKWARD -> nodes
    model_output: int  # value the loss reads (or the loss itself)
    loss_value: int
    n_graph_nodes: int
    hidden: list[int] = field(default_factory=list)  # intermediates of decomposed ops simulated as one op
    restored: _Restored | None = None  # ops an export folded away, simulated again
    assumed: dict[str, int] = field(default_factory=dict)  # DECOMPOSED assumptions -> chains matched
    unmatched: tuple[str, ...] = ()  # freeze and train patterns that match no parameter
    # storage root -> the last node of the module calls it is an argument of (Python holds a module's arguments
    # until its forward returns), from the dynamo export's module scopes
    held_by_call: dict[int, int] = field(default_factory=dict)
    forward_temporaries: dict[int, int] = field(default_factory=dict)  # node -> bytes its forward holds a moment
    # node -> the autograd nodes PyTorch makes for it on CPU where not one (an unrolled recurrent op's cells)
    autograd_nodes: dict[int, int] = field(default_factory=dict)
    # node -> the oneDNN primitives it creates on CPU: (cache key, bytes, made by its backward)
    primitives: dict[int, tuple[tuple[tuple[object, ...], int, bool], ...]] = field(default_factory=dict)
    # node -> the GEMMs it runs through MKL on CPU, in order
    gemms: dict[int, tuple[Gemm, ...]] = field(default_factory=dict)


def micro_batch_dims(model: onnx.ModelProto, dims: dict[str, int], options: TrainingOptions) -> dict[str, int]:
    """Give the dims a micro-step runs at: the batch dim divided by grad_accum (the same dims when it is 1)."""
    if not options.accumulates:
        return dict(dims)
    from onnxmem.shapes.dims import input_dims

    batch = options.batch_dim
    if batch is None:
        axis0 = [d.name for d in input_dims(model) if d.axis == 0]
        if not axis0:
            raise TrainingOptionError("gradient accumulation needs a batch dim: the inputs have no symbolic axis 0; "
                                      "name it with batch_dim")
        batch = axis0[0]
    if batch not in dims:
        raise TrainingOptionError(f"gradient accumulation: batch dim '{batch}' is not bound (bind it: "
                                  f"--dim {batch}=N, or dims={{'{batch}': N}} in Python)")
    if options.micro_batch is not None:
        if options.micro_batch < 1 or dims[batch] % options.micro_batch:
            raise TrainingOptionError(f"micro-batch {options.micro_batch} does not divide {batch}={dims[batch]}")
        return {**dims, batch: options.micro_batch}
    if dims[batch] % options.grad_accum:
        raise TrainingOptionError(f"gradient accumulation: {batch}={dims[batch]} is not a multiple of "
                                  f"{options.grad_accum} micro-steps")
    return {**dims, batch: dims[batch] // options.grad_accum}


def training_options(*, checkpoint: str | int | None = None, **values: object) -> \
        TrainingOptions:
    """Give TrainingOptions from command-line values ('--checkpoint 4' or 'auto'), checked."""
    segments: int | str | None = checkpoint
    if isinstance(checkpoint, str) and checkpoint != "auto":
        try:
            segments = int(checkpoint)
        except ValueError:
            raise TrainingOptionError(f"--checkpoint '{checkpoint}': expected a number of segments or 'auto'") \
                from None
    options = TrainingOptions(checkpoint=segments, **values)  # type: ignore[arg-type]
    _check_options(options)
    return options


def detect_cpu_isa(cpuinfo: str = "/proc/cpuinfo") -> str:
    """Give the key of rules.training.CPU_ISAS for the CPU this runs on: avx512 where its flags show AVX-512 BW, VL
    and DQ (what ATen and oneDNN require of their AVX-512 kernels), else avx2 (also where the flags cannot be read:
    not Linux, not x86)."""
    if cpuinfo not in _DETECTED:
        try:
            with open(cpuinfo, encoding="ascii", errors="replace") as file:
                flags = next((line.split(":", 1)[1].split() for line in file if line.startswith("flags")), [])
        except OSError:
            flags = []
        _DETECTED[cpuinfo] = "avx512" if {"avx512bw", "avx512vl", "avx512dq"} <= set(flags) else "avx2"
    return _DETECTED[cpuinfo]


_DETECTED: dict[str, str] = {}  # detect_cpu_isa's answer per file: read once


def resolve_optimizer(name: str) -> str:
    """Give the canonical optimizer name for a name or alias."""
    return OPTIMIZER_ALIASES.get(name, name)


def training_memory(graph: ModelGraph, order: Sequence[int], options: TrainingOptions) -> TrainingReport:
    """Give the training-step memory of a sized graph run in `order` (the graph is read, never changed)."""
    _check_options(options)
    rule = options.optimizer_rule()
    model = _build_model(graph, order, options)
    first = _simulate(model, options, rule, first_step=True)
    later = _simulate(model, options, rule, first_step=False)
    recompute_rows, recompute_peak = _recompute_what_if(model, options, rule)
    worst = first if first.peak >= later.peak else later
    weights_bytes = sum(v.nbytes for v in model.values if v.kind == WEIGHT)
    input_bytes = sum(v.nbytes for v in model.values if v.kind == INPUT)
    gradient_bytes = _param_grad_bytes(model, options)
    state_bytes = _optimizer_state_bytes(model, rule, options)
    saved_bytes = first.saved_at_backward_start
    hand = _hand_formula(model, options, rule, weights_bytes, input_bytes, gradient_bytes)
    checkpoint = _checkpoint_what_if(model, options, rule, max(first.peak, later.peak))
    return TrainingReport(
        optimizer=resolve_optimizer(options.optimizer),
        optimizer_impl=options.update_impl,
        precision=options.precision,
        loss=options.loss,
        grad_accum=options.grad_accum,
        export_mode=_export_mode(graph, model.restored),
        parameters=sum(model.values[p].numel or 0 for p in model.params + model.frozen),
        trainable_parameters=sum(model.values[p].numel or 0 for p in model.params),
        weights_bytes=weights_bytes,
        gradient_bytes=gradient_bytes,
        optimizer_state_bytes=state_bytes,
        saved_activation_bytes=saved_bytes,
        input_bytes=input_bytes,
        peak_bytes=worst.peak,
        peak_phase=worst.peak_phase,
        peak_step="first" if worst is first else "later",
        peak_event=worst.peak_label,
        first_step=first.as_step("first"),
        later_step=later.as_step("later"),
        live_at_peak=worst.live_rows,
        saved_by_op_type=_saved_by_op_type(model),
        parameter_groups=_parameter_groups(model),
        unknown_backward_ops=tuple(sorted(model.unknown)),
        recompute=recompute_rows,
        recompute_peak_bytes=max(first.peak, later.peak) if recompute_peak is None else recompute_peak,
        checkpoint=checkpoint,
        hand_formula_bytes=hand,
        assumptions=_assumptions(graph, model, options, rule),
        # (both steps simulate the same events: only the live bytes differ)
        timeline=TrainingTimeline(tuple(first.events.phase), tuple(first.events.label), tuple(first.live),
                                  tuple(later.live)),
    )


def training_warnings(report: TrainingReport) -> list[Warning]:
    """Give the warnings a training report carries: what the export folded or removed (stated in its assumptions
    as '[code] message'), operators without a backward rule."""
    warnings = []
    for note in report.assumptions:
        code, _, message = note[1:].partition("] ")
        if note.startswith("[") and code in EXPORT_WARNINGS:
            warnings.append(Warning(code, message))
    if report.unknown_backward_ops:
        warnings.append(Warning(
            "unknown-backward",
            f"operators {', '.join(report.unknown_backward_ops)} have no saved-for-backward rule: each is assumed to "
            "keep every float input and output for backward and to allocate a new gradient for every input",
        ))
    return warnings


def _check_options(options: TrainingOptions) -> None:
    options.optimizer_rule()
    if options.precision not in PRECISIONS:
        raise TrainingOptionError(f"unknown precision '{options.precision}': choose one of {', '.join(PRECISIONS)}")
    if options.optimizer_impl not in OPTIMIZER_IMPLEMENTATIONS:
        raise TrainingOptionError(f"unknown optimizer implementation '{options.optimizer_impl}': choose one of "
                         f"{', '.join(OPTIMIZER_IMPLEMENTATIONS)}")
    if options.device not in DEVICES:
        raise TrainingOptionError(f"unknown device '{options.device}': choose one of {', '.join(DEVICES)}")
    if options.loss not in LOSSES:
        raise TrainingOptionError(f"unknown loss '{options.loss}': choose one of {', '.join(LOSSES)}")
    if options.grad_accum < 1:
        raise TrainingOptionError("grad_accum must be at least 1")
    if options.cpu_threads < 1:
        raise TrainingOptionError("cpu_threads must be at least 1")
    if options.cpu_isa is not None and options.cpu_isa not in CPU_ISAS:
        raise TrainingOptionError(f"unknown CPU instruction set '{options.cpu_isa}': choose one of "
                                  f"{', '.join(CPU_ISAS)}")
    if isinstance(options.checkpoint, int) and options.checkpoint < 1:
        raise TrainingOptionError("checkpoint segments must be at least 1")
    if isinstance(options.checkpoint, str) and options.checkpoint != "auto":
        raise TrainingOptionError("checkpoint must be a number of segments or 'auto'")


# ---------------------------------------------------------------------------------------------------------------
# The model of the step: nodes, values at the training precision, what needs a gradient, what is kept.

def _rule(op_type: str, domain: str) -> Saves | None:
    if op_type.startswith("aten::"):
        return ATEN_SAVED_FOR_BACKWARD.get(op_type[len("aten::"):])
    key = op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"
    return SAVED_FOR_BACKWARD.get(key)


def _rule_key(node: _Node) -> str:
    """Give the node's key in the rule tables: its op type, 'domain::op type' outside ONNX's domain."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def _autocast_fp32(node: _Node, options: TrainingOptions) -> bool:
    """Say whether autocast runs the node in fp32: by CUDA's list, or on CPU the loss onnxmem appends and CPU's
    list."""
    if options.device == "cpu":
        return node.graph_op is None or _rule_key(node) in AUTOCAST_FP32_CPU
    return _rule_key(node) in AUTOCAST_FP32


def aten_op(origin: str) -> str:
    """Give the ATen op's name ('silu') from an Op.origin ('torch.ops.aten.silu.default %silu x'), or ""."""
    found = _ATEN_TARGET.match(origin)
    return found.group(1) if found else ""


def _numel(shape: tuple[object, ...] | None) -> int | None:
    if shape is None:
        return None
    count = 1
    for d in shape:
        if not isinstance(d, int):
            return None
        count *= d
    return count


def _float_bytes(precision: str, low: bool) -> int:
    if precision == "fp32":
        return 4
    if precision == "bf16":
        return 2
    return 2 if low else 4


def _matches(name: str, module: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(module, p)
               or fnmatch.fnmatchcase(module, p.rstrip(".*") + ".*") for p in patterns)


def _is_trainable_name(name: str, module: str, options: TrainingOptions) -> bool:
    if options.train and not _matches(name, module, options.train):
        return False
    return not _matches(name, module, options.freeze)


def module_path(layer: str) -> str:
    """Give a dotted module path from a node's scope: '/encoder/layers.0/attn' or a dynamo export's namespace."""
    if ":" in layer:  # ': pkg.Model/fc1: torch.nn.modules.linear.Linear/linear_3: aten.linear.default'
        names = [part.split(":")[0].strip() for part in layer.split("/")]
        return ".".join(n for n in names[:-1] if n)  # the last part names the ATen op, not a module
    return ".".join(p for p in layer.split("/") if p)


def _build_model(graph: ModelGraph, order: Sequence[int], options: TrainingOptions) -> _Model:
    """Give the facts every simulation of the step reads: the forward ops (decomposed ATen ops fused back) and the
    loss, the parameters, the sizes at the training precision, the storages, what needs a gradient and what each
    differentiable op keeps for backward."""
    values, nodes, hidden, restored, assumed = _forward(graph, order)
    n_graph_nodes = len(nodes)
    model_output, loss_value = _append_loss(graph, values, nodes, options)
    _wire(graph, values, nodes)
    params, frozen, unmatched = _parameters(graph, values, nodes, options)
    _size_at_precision(values, nodes, params + frozen, options)
    roots = _storage_roots(values, nodes, graph)
    needs_grad, differentiable = _gradient_flow(values, nodes, params)
    needs = _BackwardNeeds()
    for n, node in enumerate(nodes):
        if differentiable[n]:
            _backward_needs(graph, n, node, values, roots, needs_grad, options, needs)
    param_bytes = sum(values[t].nbytes for t in params)
    members: dict[int, list[int]] = {}
    for t, r in enumerate(roots):
        members.setdefault(r, []).append(t)
    return _Model(nodes, values, roots, members, needs_grad, differentiable, params, frozen, param_bytes,
                  needs.saved_by, needs.extras, needs.cast_copies, needs.weight_copies, needs.new_grads,
                  needs.backward_temporaries, needs.passthrough, needs.unknown, model_output, loss_value,
                  n_graph_nodes, hidden, restored, assumed, unmatched, _held_by_calls(nodes, values, roots),
                  needs.forward_temporaries, needs.autograd_nodes,
                  _cpu_primitives(nodes, values, needs_grad, differentiable, options),
                  _cpu_gemms(nodes, values, needs_grad, differentiable, options))


def _module_scopes(layer: str) -> list[str]:
    """Give the module calls a dynamo export's node is inside, outermost first, as scope prefixes (': pkg.M/enc:
    pkg.Encoder/add: aten.add' -> [': pkg.M', ': pkg.M/enc: pkg.Encoder']); none without module classes."""
    parts = layer.split("/")[:-1] if ":" in layer else []
    return ["/".join(parts[:i + 1]) for i in range(len(parts))]


def _held_by_calls(nodes: list[_Node], values: list[_Value], roots: list[int]) -> dict[int, int]:
    """Give, per activation storage passed into a module call (read inside a module scope, made outside that call),
    the last node of the call: the caller's frame holds the argument until the module's forward returns. A call is
    a run of nodes in the module's scope in the file's order (PyTorch's: the schedule may interleave calls), so a
    module called twice (ResNet's shared ReLU) makes two calls."""
    if not any(":" in node.layer for node in nodes):
        return {}  # no module classes in the scopes (not a dynamo export): no calls to hold arguments
    file_order = sorted(range(len(nodes)), key=lambda n: (nodes[n].graph_op is None, nodes[n].graph_op or 0, n))
    calls: list[list[int]] = [[] for _ in nodes]  # per node, the calls it is inside, as indices into `end`
    end: list[int] = []  # per call, its last node in `nodes`
    open_calls: dict[str, int] = {}  # scope -> the call the previous node in the file was inside
    for n in file_order:
        scopes = _module_scopes(nodes[n].layer)
        for scope in scopes:
            call = open_calls.get(scope)
            if call is None:
                call = len(end)
                end.append(n)
            end[call] = max(end[call], n)
            calls[n].append(call)
        open_calls = dict(zip(scopes, calls[n], strict=True))
    held: dict[int, int] = {}
    for n, node in enumerate(nodes):
        for t in node.inputs:
            producer = values[t].producer if t >= 0 else None
            if producer is None or values[roots[t]].kind in (WEIGHT, INPUT) or not _is_tensor(values[t]):
                continue
            made_in = set(calls[producer])
            for call in calls[n]:
                if call not in made_in and end[call] > held.get(roots[t], -1):
                    held[roots[t]] = end[call]
    return held


def _forward(graph: ModelGraph, order: Sequence[int]) -> \
        tuple[list[_Value], list[_Node], list[int], _Restored, dict[str, int]]:
    """Give the step's values (the graph's tensors), its forward nodes in `order` with the ops an export folded away
    restored, the ops exported from one ATen op or decomposed from one fused again, the intermediates those fused
    ops hide, what was restored and which decompositions were assumed."""
    values = [_Value(t.name, t.shape, _numel(t.shape), t.nbytes or 0, t.dtype in _FLOATS, t.kind,
                     is_sequence=t.dtype == 0) for t in graph.tensors]
    nodes = []
    for op_index in order:
        op = graph.ops[op_index]
        nodes.append(_Node(op.op_type, op.domain, op.name, op.layer, op.inputs, op.outputs, op_index))
    nodes, restored = _restore_folded(nodes, values, graph)
    nodes, grouped = _fuse_aten_groups(nodes, values, graph)
    nodes, hidden, assumed = _fuse_decomposed(nodes, values, graph)
    nodes = _read_recurrent_weights(nodes, values, graph)
    return values, nodes, grouped + hidden, restored, assumed


def _append_loss(graph: ModelGraph, values: list[_Value], nodes: list[_Node], options: TrainingOptions) -> \
        tuple[int, int]:
    """Append the loss's ops after the model's first float output (unless that output is already a scalar); give
    (the value the loss reads, the loss value)."""
    outputs = [t for t in graph.outputs if values[t].is_float]
    model_output = outputs[0] if outputs else (graph.outputs[0] if graph.outputs else -1)
    loss_value = model_output
    if model_output >= 0 and (values[model_output].numel or 0) > 1:
        previous = model_output
        for i, step in enumerate(LOSSES[options.loss]):
            numel = values[model_output].numel if step.output == "same" else 1
            values.append(_Value(f"loss/{step.op_type}", None, numel, 0, True, "loss"))
            out = len(values) - 1
            nodes.append(_Node(step.op_type, "", f"loss/{step.op_type}_{i}", "loss", (previous,), (out,), None))
            previous = out
        loss_value = previous
    return model_output, loss_value


def _wire(graph: ModelGraph, values: list[_Value], nodes: list[_Node]) -> None:
    """Set each value's producer and consumers (node positions; a subgraph's implicit reads included)."""
    for n, node in enumerate(nodes):
        for t in node.outputs:
            if t >= 0:
                values[t].producer = n
        for t in node.inputs:
            if t >= 0:
                values[t].consumers.append(n)
        if node.graph_op is not None:
            for t in graph.ops[node.graph_op].implicit_inputs:
                values[t].consumers.append(n)


def _parameters(graph: ModelGraph, values: list[_Value], nodes: list[_Node], options: TrainingOptions) -> \
        tuple[list[int], list[int], tuple[str, ...]]:
    """Give the trainable and the frozen parameters, in first-use order: float initializers that feed computation,
    not buffers (running statistics), not scalars; and the freeze/train patterns that match none of them."""
    unmatched = {("freeze", p) for p in options.freeze} | {("train", p) for p in options.train}
    buffers: set[int] = {graph.tensor_index[name] for name in _signature_buffers(graph) if name in graph.tensor_index}
    for node in nodes:
        for i in _BUFFER_INPUTS.get(node.op_type, ()):
            if i < len(node.inputs) and node.inputs[i] >= 0:
                buffers.add(node.inputs[i])
    params: list[int] = []
    frozen: list[int] = []
    seen: set[int] = set()
    for node in nodes:
        for t in node.inputs:
            v = values[t] if t >= 0 else None
            if v is None or t in seen or v.kind != WEIGHT or not v.is_float or graph.tensors[t].producer is not None:
                continue
            seen.add(t)
            if t in buffers or any(b in v.name for b in _BUFFER_NAMES) or (v.numel or 0) <= 1:
                continue
            module = module_path(node.layer)
            if unmatched:
                unmatched -= {(flag, p) for flag, p in unmatched if _matches(v.name, module, (p,))}
            if _is_trainable_name(v.name, module, options):
                params.append(t)
            else:
                frozen.append(t)
    return params, frozen, tuple(f"{flag} pattern '{p}'" for flag, p in sorted(unmatched))


def _signature_buffers(graph: ModelGraph) -> list[str]:
    """Give the weights the dynamo exporter's graph signature lists as buffers or constants, not parameters."""
    signature = graph.properties.get(GRAPH_SIGNATURE_PROPERTY, "")
    kinds = "|".join(NOT_PARAMETER_KINDS)
    return re.findall(rf": (?:{kinds}) target='([^']+)'", signature)


def _size_at_precision(values: list[_Value], nodes: list[_Node], parameters: list[int],
                       options: TrainingOptions) -> None:
    """Size the values at the training precision: parameters at the master precision, float inputs likewise,
    each op's float outputs at the width autocast (or the precision) gives them; the rest as stored."""
    low_precision = options.precision != "fp32"
    for t in parameters:
        v = values[t]
        v.nbytes = (v.numel or 0) * (2 if options.precision == "bf16" else 4)
    for v in values:
        if v.kind == INPUT and v.is_float and v.numel is not None:
            v.nbytes = v.numel * (2 if options.precision == "bf16" else 4)
    for node in nodes:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        if options.precision.startswith("amp-"):
            if key in AUTOCAST_LOW_PRECISION:
                size = 2
            elif _autocast_fp32(node, options):
                size = 4
            else:
                widths = [values[t].nbytes // (values[t].numel or 1) for t in node.inputs
                          if t >= 0 and values[t].is_float and values[t].kind != WEIGHT and values[t].numel]
                size = max(widths, default=4)
        else:
            size = _float_bytes(options.precision, low_precision)
        for t in node.outputs:
            numel = values[t].numel if t >= 0 else None
            if numel is not None and values[t].is_float:
                values[t].nbytes = numel * size


def _storage_roots(values: list[_Value], nodes: list[_Node], graph: ModelGraph) -> list[int]:
    """Give each value's storage root: PyTorch's views share their input's storage (the ONNX ops that are views in
    PyTorch, and any node the exporter marks with an ATen view op), and BatchNormalization's running statistics are
    updated in place."""
    root = list(range(len(values)))

    def find(t: int) -> int:
        while root[t] != t:
            root[t] = root[root[t]]
            t = root[t]
        return t

    for node in nodes:
        source = TRAINING_VIEWS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if source is None and node.graph_op is not None and not node.restored \
                and aten_op(graph.ops[node.graph_op].origin) in ATEN_VIEWS:
            tensors = [i for i, t in enumerate(node.inputs) if t >= 0 and _is_tensor(values[t])]
            source = tensors[0] if len(tensors) == 1 else None
        if source is None or source >= len(node.inputs) or node.inputs[source] < 0:
            continue
        for t in node.outputs:
            if t >= 0:
                root[t] = find(node.inputs[source])
    for node in nodes:
        if node.op_type == "BatchNormalization":
            for out, inp in ((1, 3), (2, 4)):
                if out < len(node.outputs) and node.outputs[out] >= 0 and inp < len(node.inputs):
                    root[node.outputs[out]] = find(node.inputs[inp])
    return [find(t) for t in range(len(values))]


def _gradient_flow(values: list[_Value], nodes: list[_Node], params: list[int]) -> tuple[list[bool], list[bool]]:
    """Give what needs a gradient (trainable parameters and what is computed from them), per value, and which
    nodes have a backward, per node."""
    needs_grad = [False] * len(values)
    for t in params:
        needs_grad[t] = True
    differentiable = [False] * len(nodes)
    for n, node in enumerate(nodes):
        settings = NON_DIFFERENTIABLE_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
        if not any(t >= 0 and needs_grad[t] and i not in settings for i, t in enumerate(node.inputs)):
            continue
        if node.op_type in NOT_DIFFERENTIABLE:
            continue
        differentiable[n] = True
        for t in node.outputs:
            if t >= 0 and (values[t].is_float or values[t].is_sequence):
                needs_grad[t] = True
    return needs_grad, differentiable


@dataclass
class _BackwardNeeds:
    """What the differentiable nodes keep for backward and allocate in it (see _Model's fields of these names)."""

    saved_by: dict[int, list[int]] = field(default_factory=dict)
    extras: dict[int, int] = field(default_factory=dict)
    cast_copies: dict[tuple[int, int], int] = field(default_factory=dict)
    weight_copies: dict[int, int] = field(default_factory=dict)
    new_grads: dict[int, list[int]] = field(default_factory=dict)
    backward_temporaries: dict[int, int] = field(default_factory=dict)
    passthrough: dict[int, list[int]] = field(default_factory=dict)
    unknown: dict[str, int] = field(default_factory=dict)
    forward_temporaries: dict[int, int] = field(default_factory=dict)
    autograd_nodes: dict[int, int] = field(default_factory=dict)


def _backward_needs(graph: ModelGraph, n: int, node: _Node, values: list[_Value], roots: list[int],
                    needs_grad: list[bool], options: TrainingOptions, needs: _BackwardNeeds) -> None:
    """Add what differentiable node `n` keeps for backward (by its rule in SAVED_FOR_BACKWARD), its extra buffers,
    its backward's temporaries and its inputs' gradients to `needs`."""
    rule = _rule(node.op_type, node.domain)
    if rule is None:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        needs.unknown[key] = needs.unknown.get(key, 0) + 1
        rule = DEFAULT_SAVES
    inputs = list(node.inputs)
    out0 = values[node.outputs[0]] if node.outputs and node.outputs[0] >= 0 else None
    _kept_for_backward(n, node, rule, values, roots, needs_grad, options, needs)
    extra = _extra_bytes(graph, n, node, rule, values, roots, out0, options, needs)
    if extra:
        needs.extras[n] = extra
    temporaries = needs.backward_temporaries
    if rule.batched_backward_temporaries and out0 is not None and not any(
            t >= 0 and values[roots[t]].kind == WEIGHT for t in inputs):
        temporaries[n] = rule.batched_backward_temporaries * out0.nbytes
    if options.precision.startswith("amp-") and _autocast_fp32(node, options):
        # autocast runs the op on an fp32 copy of a 16-bit input: backward makes that copy's fp32 gradient, then
        # casts it to the input's width (ToCopyBackward): the gradient is counted at the input's width, the fp32
        # one is wider by this much
        upcast = 0
        for t in inputs:
            numel = values[t].numel if t >= 0 and needs_grad[t] and values[t].is_float else None
            if numel and values[t].nbytes // numel < 4:
                upcast += (4 - values[t].nbytes // numel) * numel
        if upcast:
            temporaries[n] = temporaries.get(n, 0) + upcast
    per_output, per_input = rule.cpu_backward_temporaries
    scratch = _cpu_convolution_scratch(node, values, needs_grad, options) \
        if rule.cpu_convolution and options.device == "cpu" else None
    if scratch is not None:
        if scratch[0]:
            temporaries[n] = temporaries.get(n, 0) + scratch[0]
        if scratch[1]:
            needs.forward_temporaries[n] = needs.forward_temporaries.get(n, 0) + scratch[1]
    elif options.device == "cpu" and out0 is not None and (per_output or per_input):
        first_input = inputs[0] if inputs and inputs[0] >= 0 else None
        input_bytes = values[first_input].nbytes if first_input is not None and needs_grad[first_input] else 0
        output_bytes = out0.nbytes
        if rule.cpu_blocked_channels:
            block = options.isa.channel_block
            output_bytes = _channel_padded(out0, output_bytes, block)
            input_bytes = _channel_padded(values[first_input], input_bytes, block) if first_input is not None else 0
        temporaries[n] = temporaries.get(n, 0) + per_output * output_bytes + per_input * input_bytes
    settings = NON_DIFFERENTIABLE_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
    for i, t in enumerate(inputs):
        if t < 0 or not needs_grad[t] or i in settings:
            continue
        same_shape = out0 is not None and values[t].numel == out0.numel
        if i in rule.grad_passthrough and same_shape:
            needs.passthrough.setdefault(n, []).append(t)
        else:
            needs.new_grads.setdefault(n, []).append(t)


def _kept_for_backward(n: int, node: _Node, rule: Saves, values: list[_Value], roots: list[int],
                       needs_grad: list[bool], options: TrainingOptions, needs: _BackwardNeeds) -> None:
    """Add the tensors node `n` keeps for backward: the storages it saves, or under autocast the low-precision
    copies of the fp32 activations and weights it reads."""
    inputs = node.inputs
    kept: list[int] = []
    for i in rule.inputs:
        if i < len(inputs) and inputs[i] >= 0:
            kept.append(inputs[i])
    for i in rule.cross:
        if i < len(inputs) and inputs[i] >= 0 and any(
                j != i and t >= 0 and needs_grad[t] for j, t in enumerate(inputs)):
            kept.append(inputs[i])
    for i in rule.outputs:
        if i < len(node.outputs) and node.outputs[i] >= 0:
            kept.append(node.outputs[i])
    low = options.precision.startswith("amp-") and node.op_type in AUTOCAST_LOW_PRECISION
    for t in kept:
        v = values[t]
        if not v.is_float and v.kind in (WEIGHT, INPUT):
            continue
        if low and v.is_float and v.numel and v.kind == WEIGHT:
            needs.weight_copies[t] = v.numel * 2  # the cached cast copy is what the op keeps
            continue
        if low and v.is_float and v.numel and values[roots[t]].nbytes // max(values[roots[t]].numel or 1, 1) == 4:
            needs.cast_copies[(n, t)] = v.numel * 2  # a cast copy of an fp32 activation is what the op keeps
            continue
        if v.kind in (WEIGHT, INPUT):
            continue
        needs.saved_by.setdefault(roots[t], []).append(n)


def _extra_bytes(graph: ModelGraph, n: int, node: _Node, rule: Saves, values: list[_Value], roots: list[int],
                 out0: _Value | None, options: TrainingOptions, needs: _BackwardNeeds) -> int:
    """Give the bytes node `n` keeps for backward besides tensors: masks, indices, statistics, a recurrent op's
    workspace (its backward scratch goes to needs.backward_temporaries)."""
    extra = 0
    inputs = node.inputs
    if rule.extra_bits_per_output_element and out0 is not None and out0.numel is not None:
        carrier = rule.extra_output
        if carrier is not None and carrier < len(node.outputs) and node.outputs[carrier] >= 0:
            needs.saved_by.setdefault(roots[node.outputs[carrier]], []).append(n)
        elif rule.extra_like_output_on_cpu and options.device == "cpu":
            extra += out0.nbytes
        else:
            extra += (out0.numel * rule.extra_bits_per_output_element + 7) // 8
    if rule.stats and inputs and inputs[0] >= 0:
        extra += 4 * rule.stats_values * _stat_count(values[inputs[0]], rule)
    if rule.input_sized_extra and inputs and inputs[0] >= 0:
        extra += rule.input_sized_extra * values[inputs[0]].nbytes
    extra += _attention_extra_bytes(n, rule, inputs, values, roots, options, needs)
    if rule.recurrent:
        recurrent = RECURRENT[rule.recurrent]
        dims = _node_recurrent_dims(node, values)
        kept_bytes, scratch, forward = _recurrent_bytes(recurrent, dims, options.device)
        extra += kept_bytes
        if recurrent.cpu_contiguous_input and options.device == "cpu" and inputs and inputs[0] >= 0 \
                and _producer_op_type(graph, values[inputs[0]].name) == "Transpose":
            extra += values[inputs[0]].nbytes
        if recurrent.cpu_contiguous_output_grad and options.device == "cpu" and out0 is not None \
                and _read_transposed(graph, out0.name):
            needs.backward_temporaries[n] = needs.backward_temporaries.get(n, 0) + out0.nbytes
        if scratch:
            needs.backward_temporaries[n] = needs.backward_temporaries.get(n, 0) + scratch
        if forward:
            needs.forward_temporaries[n] = needs.forward_temporaries.get(n, 0) + forward
        if recurrent.cpu_unrolled_nodes != (0, 0) and options.device == "cpu" and dims is not None:
            per_step, per_layer = recurrent.cpu_unrolled_nodes
            needs.autograd_nodes[n] = dims[1] * (per_step * dims[0] + per_layer)
    return extra


@dataclass
class _Restored:
    """What an export folded or removed and the simulation restores: what the export warnings say."""

    folded_into: dict[str, list[str]] = field(default_factory=dict)  # module ('BatchNorm') -> nodes folded into
    kept_bytes_values: list[int] = field(default_factory=list)  # the restored ops' inputs (kept for backward)
    by_names: bool = False  # found by exporter weight names (no ATen marks), not by ATen marks
    eval_marks: bool = False  # an ATen op says the model was exported in eval mode
    eval_copies: dict[str, int] = field(default_factory=dict)  # op -> eval-mode copies simulated as that op
    p0_copies: dict[str, int] = field(default_factory=dict)  # op -> its p=0 copies in a train-mode export (aliases)


def _module_classes(layer: str) -> list[str]:
    """Give the module classes of a dynamo export's scope, outermost first (': pkg.M/drop: torch...Dropout/...')."""
    if ":" not in layer:
        return []
    return [part.split(":", 1)[1].strip() for part in layer.split("/")[:-1] if ":" in part]


def _restore_folded(nodes: list[_Node], values: list[_Value], graph: ModelGraph) -> tuple[list[_Node], _Restored]:
    """Give the nodes with the ops an export folded away simulated again (a BatchNorm after the node it was folded
    into, reading a new copy of that node's output; rules.training.FOLDED_ATEN, FOLDS_INTO) and eval-mode copies
    of train-mode ops made that op again (EVAL_MODULES), and what was restored."""
    restored = _Restored()
    groups: dict[str, list[int]] = {}
    folded: dict[int, Folded] = {}  # position of the node folded into -> the op restored after it
    trained = _traced_in_train_mode(graph)
    for n, node in enumerate(nodes):
        op = graph.ops[node.graph_op] if node.graph_op is not None else None
        name = aten_op(op.origin) if op is not None else ""
        if name in FOLDED_ATEN:
            restored.eval_marks |= FOLDED_ATEN[name].eval
            groups.setdefault(op.origin.split(" ", 2)[1] if op is not None else "", []).append(n)
        if node.op_type == "Identity":
            classes = _module_classes(node.layer)
            if classes and classes[-1] in EVAL_MODULES:
                made = EVAL_MODULES[classes[-1]]
                copies = restored.p0_copies if trained else restored.eval_copies
                copies[made] = copies.get(made, 0) + 1
                if not trained:
                    node.op_type = made
    for members in groups.values():
        rule = FOLDED_ATEN[aten_op(graph.ops[nodes[members[0]].graph_op].origin)]  # type: ignore[index]
        if not any(nodes[m].op_type == rule.restores for m in members):
            folded[members[-1]] = rule
    marked = any(op.origin for op in graph.ops)
    parameter_names = any(v.kind == WEIGHT and v.is_float and "." in v.name and not re.match(EXPORTER_WEIGHT_NAME,
                                                                                           v.name) for v in values)
    if not marked and parameter_names:
        readers = {t for node in nodes if node.op_type in {f.restores for f in FOLDS_INTO.values()}
                   for t in node.inputs}
        for n, node in enumerate(nodes):
            weight = node.inputs[1] if node.op_type in FOLDS_INTO and len(node.inputs) > 1 else -1
            if weight >= 0 and values[weight].kind == WEIGHT and re.match(EXPORTER_WEIGHT_NAME, values[weight].name) \
                    and node.outputs and node.outputs[0] not in readers:
                folded[n] = FOLDS_INTO[node.op_type]
                restored.by_names = True
    if not folded:
        return nodes, restored
    result: list[_Node] = []
    for n, node in enumerate(nodes):
        result.append(node)
        fold = folded.get(n)
        y = node.outputs[0] if fold is not None and node.outputs else -1
        if fold is None or y < 0 or not values[y].is_float:
            continue
        before = values[y]
        values.append(_Value(f"{before.name} (before the folded {fold.module})", before.shape, before.numel,
                             before.nbytes, True, ACTIVATION))
        copy = len(values) - 1
        node.outputs = (copy, *node.outputs[1:])
        result.append(_Node(fold.restores, "", f"{node.name} (folded {fold.module})", node.layer, (copy,), (y,),
                            node.graph_op, restored=True))
        restored.folded_into.setdefault(fold.module, []).append(node.name)
        restored.kept_bytes_values.append(copy)
    return result, restored


def _read_recurrent_weights(nodes: list[_Node], values: list[_Value], graph: ModelGraph) -> list[_Node]:
    """Give the nodes with the exporter's run-time re-layout of each recurrent op's weights dropped (the nodes of
    rules.training.RECURRENT_WEIGHT_RELAYOUT types that carry the op's fx node and compute only from parameters),
    the op reading the parameters instead (inputs W, R, B replaced by their first parameter, the others appended).
    The copies are no activations of PyTorch's step: the hand formula does not count them either."""
    producer: dict[int, int] = {}
    for n, node in enumerate(nodes):
        for t in node.outputs:
            if t >= 0:
                producer[t] = n

    def origin(n: int) -> str:
        node = nodes[n]
        return graph.ops[node.graph_op].origin if node.graph_op is not None and not node.restored else ""

    def parameters(t: int, key: str, chain: set[int]) -> list[int] | None:
        """The parameters float value t is laid out from (through nodes of the op's fx node), or None."""
        n = producer.get(t)
        if n is None:
            return [t] if values[t].kind == WEIGHT and values[t].is_float else None
        node = nodes[n]
        if node.op_type not in RECURRENT_WEIGHT_RELAYOUT or " ".join(origin(n).split(" ", 2)[:2]) != key:
            return None
        chain.add(n)
        found: list[int] = []
        for i in node.inputs:
            if i < 0 or not values[i].is_float:
                continue  # indices, shapes and axes
            leaves = parameters(i, key, chain)
            if leaves is None:
                return None
            found.extend(leaves)
        return found or None

    dropped: set[int] = set()
    rewired: dict[int, _Node] = {}
    for n, node in enumerate(nodes):
        rule = _rule(node.op_type, node.domain)
        if rule is None or not rule.recurrent:
            continue
        key = " ".join(origin(n).split(" ", 2)[:2])
        if not key:
            continue
        inputs = list(node.inputs)
        appended: list[int] = []
        chain: set[int] = set()
        for i in (1, 2, 3):
            if i >= len(inputs) or inputs[i] < 0:
                continue
            leaves = parameters(inputs[i], key, chain)
            if leaves is None or inputs[i] in leaves:
                continue
            inputs[i] = leaves[0]
            appended.extend(leaves[1:])
        if not chain:
            continue
        extra = [t for t in dict.fromkeys(appended) if t not in inputs]  # a parameter sliced thrice is read once
        rewired[n] = dataclasses.replace(node, inputs=(*inputs, *extra))
        dropped |= chain
    if not rewired:
        return nodes
    # a dropped node's outputs must have no reader but the chain and the recurrent ops it feeds
    kept_readers = {t for m, node in enumerate(nodes) if m not in dropped
                    for t in (rewired[m].inputs if m in rewired else node.inputs) if t >= 0}
    made = {t for m in dropped for t in nodes[m].outputs if t >= 0}
    if made & (kept_readers | set(graph.outputs)):
        return nodes
    return [rewired.get(m, node) for m, node in enumerate(nodes) if m not in dropped]


def _fuse_aten_groups(nodes: list[_Node], values: list[_Value], graph: ModelGraph) -> \
        tuple[list[_Node], list[int]]:
    """Give the nodes with each group exported from one ATen op of rules.training.ATEN_SAVED_FOR_BACKWARD (the
    nodes sharing the dynamo exporter's fx node) replaced by that op, at the group's last node; and the group's
    intermediates."""
    groups: dict[str, list[int]] = {}
    for n, node in enumerate(nodes):
        origin = graph.ops[node.graph_op].origin if node.graph_op is not None and not node.restored else ""
        if origin and aten_op(origin) in ATEN_SAVED_FOR_BACKWARD:
            groups.setdefault(" ".join(origin.split(" ", 2)[:2]), []).append(n)
    if not any(len(members) > 1 for members in groups.values()):
        return nodes, []
    readers: dict[int, list[int]] = {}
    for n, node in enumerate(nodes):
        for t in node.inputs:
            if t >= 0:
                readers.setdefault(t, []).append(n)
    graph_outputs = set(graph.outputs)
    fused: dict[int, _Node] = {}
    removed: set[int] = set()
    hidden: list[int] = []
    for key, members in groups.items():
        if len(members) < 2:
            continue
        made = {t for n in members for t in nodes[n].outputs if t >= 0}
        inside = set(members)
        last = members[-1]
        read_outside = [t for t in made if t in graph_outputs or any(r not in inside for r in readers.get(t, ()))]
        # the group's tensors read outside it; its shape arithmetic and constants may be read outside too (the
        # exporter shares a Constant between ops): those nodes stay, outside the fused op
        exported = [t for t in read_outside if _is_tensor(values[t])]
        # one result, read only after the group's last node (where the op is placed)
        if len(exported) != 1 or any(r not in inside and r < last for r in readers.get(exported[0], ())):
            continue
        kept = _producers_of(members, set(read_outside) - set(exported), nodes)
        external = [t for n in members for t in nodes[n].inputs
                    if t >= 0 and t not in made and values[t].is_float and (values[t].numel or 0) > 1]
        named = [graph.tensor_index[name] for name in fx_arguments(graph.ops[nodes[last].graph_op])  # type: ignore[index]
                 if name in graph.tensor_index]
        inputs = tuple(t for t in dict.fromkeys(named or external) if t in external)
        if not inputs:
            continue
        name = aten_op(key)
        if name in ATEN_WITH_DROPOUT and any(nodes[m].op_type == "Dropout" for m in members):
            name = ATEN_WITH_DROPOUT[name]
        fused[last] = _Node(f"aten::{name}", "", nodes[last].name, nodes[members[0]].layer, inputs,
                            (exported[0],), nodes[last].graph_op)
        removed.update(m for m in members[:-1] if m not in kept)
        hidden.extend(t for m in members if m not in kept for t in nodes[m].outputs if t >= 0 and t != exported[0])
    if not fused:
        return nodes, []
    return [fused.get(n, node) for n, node in enumerate(nodes) if n not in removed], hidden


def _is_tensor(value: _Value) -> bool:
    """Say whether a value is an activation-like tensor: float and more than one element (not a shape, an index
    or a scalar constant)."""
    return value.is_float and (value.numel is None or value.numel > 1)


def _producers_of(members: list[int], wanted: set[int], nodes: list[_Node]) -> set[int]:
    """Give the members of a group that make `wanted` and the members those read from, transitively."""
    made_by = {t: m for m in members for t in nodes[m].outputs if t >= 0}
    kept: set[int] = set()
    todo = [made_by[t] for t in wanted if t in made_by]
    while todo:
        m = todo.pop()
        if m not in kept:
            kept.add(m)
            todo.extend(made_by[t] for t in nodes[m].inputs if t in made_by)
    return kept


def _fuse_decomposed(nodes: list[_Node], values: list[_Value], graph: ModelGraph) -> \
        tuple[list[_Node], list[int], dict[str, int]]:
    """Give the nodes with every chain of rules.training.DECOMPOSED replaced by the one op it stands for (at the
    chain's last node), the intermediates the chains made, and how many chains each assumption covers. Nodes with
    ATen marks are never matched: the marks say which op they come from."""
    graph_outputs = set(graph.outputs)
    readers: dict[int, list[int]] = {}
    per_scope: dict[str, int] = {}
    for n, node in enumerate(nodes):
        for t in node.inputs:
            if t >= 0:
                readers.setdefault(t, []).append(n)
        if node.graph_op is not None:
            per_scope[node.layer] = per_scope.get(node.layer, 0) + 1
    fused: dict[int, _Node] = {}  # position of a chain's last node -> the op
    removed: set[int] = set()
    hidden: list[int] = []
    assumed: dict[str, int] = {}
    for n in range(len(nodes)):
        if n in removed or nodes[n].graph_op is None or graph.ops[nodes[n].graph_op].origin:  # type: ignore[index]
            continue
        for pattern in DECOMPOSED:
            chain = _match_chain(pattern, n, nodes, values, readers, graph_outputs)
            if chain is None or any(m in removed or m in fused for m in chain):
                continue
            first, last = nodes[chain[0]], nodes[chain[-1]]
            if pattern.own_scope and (not first.layer or per_scope.get(first.layer) != len(chain)
                                      or any(nodes[m].layer != first.layer for m in chain)):
                continue
            x = next(t for t in first.inputs if t >= 0 and values[t].numel != 1)
            fused[chain[-1]] = _Node(pattern.op_type, "", last.name, first.layer, (x,), (last.outputs[0],),
                                     last.graph_op)
            removed.update(chain[:-1])
            hidden.extend(nodes[m].outputs[0] for m in chain[:-1])
            if pattern.assumption:
                assumed[pattern.assumption] = assumed.get(pattern.assumption, 0) + 1
            break
    if not fused:
        return nodes, [], assumed
    return [fused.get(n, node) for n, node in enumerate(nodes) if n not in removed], hidden, assumed


def _match_chain(pattern: Decomposed, start: int, nodes: list[_Node], values: list[_Value],
                 readers: dict[int, list[int]], graph_outputs: set[int]) -> list[int] | None:
    """Give the positions of a chain of `pattern` starting at node `start`, or None."""

    def scalar(t: int) -> bool:
        return t >= 0 and values[t].numel == 1 and values[t].is_float

    node = nodes[start]
    if node.op_type != pattern.chain[0] or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    tensors = [t for t in node.inputs if t >= 0 and not scalar(t)]
    if len(tensors) != 1 or len(node.inputs) - len(tensors) != sum(scalar(t) for t in node.inputs):
        return None
    x = tensors[0]
    chain = [start]
    for i, op_type in enumerate(pattern.chain[1:], start=1):
        previous = nodes[chain[-1]].outputs[0]
        if previous in graph_outputs or len(readers.get(previous, [])) != 1:
            return None
        m = readers[previous][0]
        node = nodes[m]
        if node.op_type != op_type or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
            return None
        wanted = [previous, x] if i in pattern.reads_input else [previous]
        rest = list(node.inputs)
        for t in wanted:
            if t not in rest:
                return None
            rest.remove(t)
        if not all(scalar(t) for t in rest):
            return None
        chain.append(m)
    return chain


def _channel_padded(value: _Value, nbytes: int, block: int) -> int:
    """Give a tensor's bytes with its channels (axis 1) padded to oneDNN's channel block."""
    shape = value.shape
    if not nbytes or shape is None or len(shape) < 3 or not isinstance(shape[1], int) or shape[1] <= 0:
        return nbytes
    channels = shape[1]
    return nbytes * (-(-channels // block) * block) // channels


def _cpu_convolution_scratch(node: _Node, values: list[_Value], needs_grad: list[bool],
                             options: TrainingOptions) -> tuple[int, int] | None:
    """Give the bytes a Conv's backward and its forward allocate on CPU besides what they return
    (cpu_convolution_scratch), or None where its shapes are not all known (then the op's generic temporaries
    apply). Under autocast it runs in 16 bits."""
    known = _convolution_shapes(node, values, options)
    if known is None:
        return None
    shapes, element = known
    inputs = node.inputs
    bias = values[inputs[2]] if len(inputs) > 2 and inputs[2] >= 0 else None
    bias_bytes = (bias.numel or 0) * element if bias is not None else 0
    isa = options.isa
    backward = cpu_convolution_scratch(shapes[0], shapes[1], shapes[2], element, bias_bytes, needs_grad[inputs[0]],
                                       needs_grad[inputs[1]], options.cpu_threads, isa=isa)
    forward = cpu_convolution_scratch(shapes[0], shapes[1], shapes[2], element, bias_bytes, False, False,
                                      options.cpu_threads, forward=True, isa=isa)
    if backward is None or forward is None:
        return None
    return backward, forward


def _convolution_shapes(node: _Node, values: list[_Value], options: TrainingOptions) \
        -> tuple[list[tuple[int, ...]], int] | None:
    """Give a Conv's input, weight and output shapes and the element size it runs at (16 bits under autocast), or
    None where a shape is not known."""
    inputs = node.inputs
    if len(inputs) < 2 or inputs[0] < 0 or inputs[1] < 0 or not node.outputs or node.outputs[0] < 0:
        return None
    x, w, y = values[inputs[0]], values[inputs[1]], values[node.outputs[0]]
    shapes = []
    for value in (x, w, y):
        if value.shape is None or not all(isinstance(d, int) and d > 0 for d in value.shape):
            return None
        shapes.append(tuple(int(d) for d in value.shape))  # type: ignore[arg-type]
    if not x.numel or not x.nbytes:
        return None
    low = options.precision.startswith("amp-") and node.op_type in AUTOCAST_LOW_PRECISION
    return shapes, 2 if low else x.nbytes // x.numel


def _cpu_primitives(nodes: list[_Node], values: list[_Value], needs_grad: list[bool], differentiable: list[bool],
                    options: TrainingOptions) -> dict[int, tuple[tuple[tuple[object, ...], int, bool], ...]]:
    """Give, per node on CPU, the oneDNN primitives its forward and backward create (a Conv's:
    cpu_convolution_primitives; an exact GELU's: _gelu_primitives; an LSTM's: _lstm_primitives): cached by oneDNN,
    they are counted once per distinct key (_primitive_buffers)."""
    if options.device != "cpu":
        return {}
    made = {}
    channels_last = _channels_last(nodes, values)
    for n, node in enumerate(nodes):
        gelu = _gelu_primitives(node, nodes, values, needs_grad, differentiable[n], channels_last, options)
        if gelu:
            made[n] = gelu
            continue
        rule = _rule(node.op_type, node.domain)
        if rule is not None and rule.recurrent == "LSTM":
            lstm = _lstm_primitives(node, values, differentiable[n] and any(
                needs_grad[t] for t in node.inputs[:3] if t >= 0), options)
            if lstm:
                made[n] = lstm
            continue
        if rule is None or not rule.cpu_convolution:
            continue
        known = _convolution_shapes(node, values, options)
        if known is None:
            continue
        (x, w, y), element = known
        inputs = node.inputs
        backward = differentiable[n]
        primitives = cpu_convolution_primitives(x, w, y, element, backward and needs_grad[inputs[0]],
                                                backward and needs_grad[inputs[1]], options.cpu_threads, options.isa)
        if primitives:
            made[n] = primitives
    return made


def _lstm_primitives(node: _Node, values: list[_Value], backward: bool, options: TrainingOptions) \
        -> tuple[tuple[tuple[object, ...], int, bool], ...]:
    """Give the oneDNN primitives an LSTM node's training step creates on CPU (OnednnPrimitives.lstm_*): the
    process's first use, one per (input features, hidden, direction), one weight reorder where the input width is
    not the hidden size; all from its forward (measured as a whole: forward and backward). None where its backward
    does not run (an inference primitive: not measured) or its dims or an fp32 step are not known."""
    dims = _node_recurrent_dims(node, values)
    x = values[node.inputs[0]] if node.inputs and node.inputs[0] >= 0 else None
    if not backward or dims is None or x is None or not x.numel or x.nbytes // x.numel != 4:
        return ()
    _, directions, _, features, hidden = dims
    if not features or not hidden:
        return ()
    return tuple((key, nbytes, False) for key, nbytes in lstm_primitives(features, hidden, directions, options.isa))


def lstm_primitives(features: int, hidden: int, directions: int, isa: CpuIsa | None = None) \
        -> list[tuple[tuple[object, ...], int]]:
    """Give the oneDNN primitives (cache key, bytes) an LSTM layer of `features` inputs, `hidden` units and
    `directions` directions creates in a training step (OnednnPrimitives.lstm_*): the process's first use, one per
    (input features, hidden, direction), one weight reorder where the input width is not the hidden size. Layers
    share the primitives of equal keys (oneDNN's cache)."""
    sizes = (CPU_ISAS[detect_cpu_isa()] if isa is None else isa).primitives
    made: list[tuple[tuple[object, ...], int]] = [(("lstm first use",), sizes.lstm_first_use)]
    made += [(("lstm", features, hidden, direction), sizes.lstm_direction) for direction in range(directions)]
    if features != hidden:
        made.append((("lstm weights reorder", features, hidden), sizes.lstm_weights_reorder))
    return made


def cpu_convolution_scratch(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], element_bytes: int,
                            bias_bytes: int, input_grad: bool, weight_grad: bool, threads: int = 1,
                            forward: bool = False, isa: CpuIsa | None = None) -> int | None:
    """Give the bytes a 1-D or 2-D convolution's backward allocates on CPU besides the gradients it returns, at its
    peak (the rule in rules.training.CPU_CONVOLUTION), from its shapes: X [N, C, *spatial], W [OC, C / groups,
    *kernel], Y [N, OC, *out], on `threads` intra-op threads; None for other ranks. `forward`: what its forward
    allocates besides its output instead.

    Kernel and groups come from the shapes (ModelGraph keeps no attributes); a dim is strided when its output is
    shorter than the input less the kernel plus one (what stride 1 gives with no padding).
    """
    isa = CPU_ISAS[detect_cpu_isa()] if isa is None else isa
    rule = CPU_CONVOLUTION
    if not len(x) == len(w) == len(y) or len(x) not in (3, 4) or x[1] % w[1]:
        return None
    if not input_grad and not weight_grad and not forward:
        return 0
    batch, channels, spatial = x[0], x[1], x[2:]
    out_channels, group_channels, kernel, out_spatial = w[0], w[1], w[2:], y[2:]
    groups = channels // group_channels
    in_bytes, out_bytes, weight_bytes = (element_bytes * math.prod(s) for s in (x, y, w))
    if not weight_grad:
        bias_bytes = 0
    strided = any(o < s - k + 1 for o, s, k in zip(out_spatial, spatial, kernel, strict=True))
    one_by_one = all(k == 1 for k in kernel)
    kernel_elements, out_elements = math.prod(kernel), math.prod(out_spatial)
    # slow_conv2d, one group at a time: an im2col buffer (none for a 1x1 unstrided convolution)
    if not _runs_onednn(x, w, y, element_bytes, threads, isa):
        unfolded = not (one_by_one and out_spatial == spatial)
        columns = element_bytes * batch * group_channels * kernel_elements * out_elements if unfolded else 0
        if groups == 1:
            return columns
        # the groups' outputs (or input gradients) are made apart, then concatenated
        return max(columns, out_bytes) if forward else columns + (in_bytes if input_grad else 0)

    def padded(nbytes: int, n: int) -> int:
        return nbytes * (-(-n // isa.channel_block) * isa.channel_block) // n

    depthwise = groups > 1 and group_channels == 1
    flat = groups == 1 and channels == rule.flat_channels
    in_blocked = in_bytes if flat else padded(in_bytes, channels)
    out_blocked = padded(out_bytes, out_channels)
    weight_blocked = padded(weight_bytes, out_channels)
    if not depthwise and not flat:
        weight_blocked = padded(weight_blocked, group_channels)
    if forward:  # the input and weight reordered and the output blocked, then the blocked and the dense output
        blocked = (0 if flat else in_blocked) + weight_blocked + out_blocked
        return max(blocked, out_blocked + out_bytes) - out_bytes
    larger_kernel = any(k > s for k, s in zip(kernel, spatial, strict=True))
    gemm = larger_kernel or (max(kernel) > rule.depthwise_jit_max_kernel if depthwise
                             else kernel[-1] >= rule.jit_max_kernel_width)
    moments = []
    if input_grad:
        moments.append(out_blocked + weight_blocked + in_blocked)
        moments.append(in_blocked + in_bytes + (in_bytes if strided and not depthwise else 0))
    if weight_grad:
        made = (in_bytes if input_grad else 0) + bias_bytes
        if gemm:
            columns = element_bytes * group_channels * kernel_elements * out_elements
            # oneDNN threads over the batch (one scratch per thread) where each thread's output is small
            outer = out_elements // threads < rule.gemm_outer_threading_max_spatial and (batch > 1 or groups > 2)
            scratch = (threads if outer else 1) * (rule.gemm_weight_copies * weight_bytes + columns) \
                + rule.gemm_scratch_alignment
            if out_channels >= rule.gemm_pack_min_out_channels and out_elements > 1:
                scratch += (threads if outer else 1) * 4 * rule.gemm_pack_rows * group_channels * kernel_elements
            moments.append(made + weight_bytes + max(scratch, weight_bytes))
        else:
            moments.append(made + (0 if flat else in_blocked) + out_blocked + weight_blocked)
            moments.append(made + weight_blocked + weight_bytes)
    returned = (in_bytes if input_grad else 0) + (weight_bytes + bias_bytes if weight_grad else 0)
    return max(0, max(moments) - returned)


GELU_OPS = frozenset({"Gelu", "aten::gelu"})  # the ONNX op, the ATen op fused back (from its marks or erf chain)


def _gelu_primitives(node: _Node, nodes: list[_Node], values: list[_Value], needs_grad: list[bool], backward: bool,
                     channels_last: set[int], options: TrainingOptions) \
        -> tuple[tuple[tuple[object, ...], int, bool], ...]:
    """Give the oneDNN eltwise primitives an exact GELU creates on CPU (OnednnPrimitives.eltwise_gelu_*): one for
    its forward and one for its backward, keyed by its shape, and the process's first GELU's extra; none where ATen
    does not call oneDNN (a channels-last or one-element input, bf16, fp16). The graph keeps no attributes: a Gelu
    is taken as the exact (erf) one, nn.GELU's default (a tanh one creates none: at most 32.8 KB over per shape)."""
    if node.op_type not in GELU_OPS or node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] < 0:
        return ()
    x = values[node.inputs[0]]
    shape = _known_shape(x)
    # under autocast a GELU runs in the dtype its input comes in: 16 bits from a matmul or convolution (through a
    # bias Add, which autocast's linear makes 16-bit too)
    low = False
    if options.precision.startswith("amp-") and x.producer is not None:
        producer = nodes[x.producer]
        sources = [producer] + ([nodes[values[t].producer] for t in producer.inputs  # type: ignore[index]
                                 if t >= 0 and values[t].producer is not None]
                                if producer.op_type in ("Add", "Sub", "Mul", "Div") else [])
        low = any(p.op_type in AUTOCAST_LOW_PRECISION for p in sources)
    if shape is None or math.prod(shape) <= 1 or low or not x.numel or x.nbytes // x.numel != 4 \
            or node.inputs[0] in channels_last:
        return ()
    sizes = options.isa.primitives
    # the first-use key is the same for every GELU: counted once, at the first GELU's forward
    made: list[tuple[tuple[object, ...], int, bool]] = [(("eltwise gelu first use",), sizes.eltwise_gelu_first_use,
                                                         False),
                                                        (("eltwise gelu forward", shape), sizes.eltwise_gelu_forward,
                                                         False)]
    if backward and needs_grad[node.inputs[0]]:
        made.append((("eltwise gelu backward", shape), sizes.eltwise_gelu_backward, True))
    return tuple(made)


def _runs_onednn(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], element_bytes: int, threads: int,
                 isa: CpuIsa) -> bool:
    """Say whether PyTorch runs this 1-D or 2-D convolution in oneDNN (ATen's ConvParams::use_mkldnn for a float CPU
    tensor; a 1-D convolution runs as a 2-D one of height 1), else in slow_conv2d (rules.training.CPU_CONVOLUTION)."""
    rule = CPU_CONVOLUTION
    batch, groups, kernel = x[0], x[1] // w[1], w[2:]
    strided = any(o < s - k + 1 for o, s, k in zip(y[2:], x[2:], kernel, strict=True))
    one_by_one = all(k == 1 for k in kernel)
    return element_bytes in isa.mkldnn_element_bytes and (
        strided or batch >= rule.mkldnn_min_batch_1x1 or not one_by_one or threads > 1) and (
        groups > 1 or (len(kernel) == 2 and min(kernel) > 3) or batch > 1
        or math.prod(x) >= rule.mkldnn_min_batch1_numel)


def cpu_convolution_primitives(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], element_bytes: int,
                               input_grad: bool, weight_grad: bool, threads: int = 1,
                               isa: CpuIsa | None = None) -> tuple[tuple[tuple[object, ...], int, bool], ...]:
    """Give the oneDNN primitives a 1-D or 2-D convolution's forward and backward create on CPU, each as (its cache
    key, the heap bytes it keeps, whether its backward creates it), from its shapes (rules.training.OnednnPrimitives);
    none where PyTorch runs slow_conv2d or for other ranks. Two convolutions give the same key exactly where oneDNN's
    cache would hand the second the first's primitive (by shapes: the graph keeps no strides or pads, and a stride
    or pad shows in the output's shape)."""
    isa = CPU_ISAS[detect_cpu_isa()] if isa is None else isa
    if not len(x) == len(w) == len(y) or len(x) not in (3, 4) or x[1] % w[1] \
            or not _runs_onednn(x, w, y, element_bytes, threads, isa):
        return ()
    sizes, rule = isa.primitives, CPU_CONVOLUTION
    channels, group_channels, kernel, spatial = x[1], w[1], w[2:], x[2:]
    groups = channels // group_channels
    depthwise = groups > 1 and group_channels == 1
    flat = groups == 1 and channels == rule.flat_channels  # read as it is: no reorder
    one_by_one = all(k == 1 for k in kernel)
    strided = any(o < s - k + 1 for o, s, k in zip(y[2:], spatial, kernel, strict=True))
    kind = "depthwise" if depthwise else "one_by_one" if one_by_one else "jit"
    conv = (element_bytes, x, w, y)
    made: list[tuple[tuple[object, ...], int, bool]] = []

    def reorder(role: str, shape: tuple[int, ...], backward: bool) -> None:
        made.append((("reorder", role, element_bytes, shape), sizes.reorder, backward))

    forward_kind = "strided_one_by_one" if one_by_one and strided and not depthwise else kind
    made.append((("forward", *conv), getattr(sizes, f"forward_{forward_kind}"), False))
    if not flat:
        reorder("to blocked", x, False)
    reorder("weights" if depthwise else "weights forward", w, False)
    reorder("from blocked", y, False)
    if input_grad:
        if strided and not depthwise:  # brgconv_strided, in the channels-last layout
            data_kind = "strided_one_by_one" if one_by_one else "strided"
            reorder("to channels-last", y, True)
            reorder("weights strided", w, True)
            reorder("channels-last copy", x, True)
        else:
            data_kind = kind
            reorder("to blocked", y, True)
            reorder("weights" if depthwise else "weights backward", w, True)
            reorder("from blocked", x, True)
        made.append((("backward data", *conv), getattr(sizes, f"backward_data_{data_kind}"), True))
    if weight_grad:
        larger_kernel = any(k > s for k, s in zip(kernel, spatial, strict=True))
        gemm = larger_kernel or (max(kernel) > rule.depthwise_jit_max_kernel if depthwise
                                 else kernel[-1] >= rule.jit_max_kernel_width)
        made.append((("backward weights", *conv), getattr(sizes, f"backward_weights_{'gemm' if gemm else kind}"),
                     True))
        if not gemm:
            if not flat:
                reorder("to blocked", x, True)
            reorder("to blocked", y, True)
            reorder("weights gradient", w, True)
    return tuple(made)


def _known_shape(value: _Value) -> tuple[int, ...] | None:
    shape = value.shape
    if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)  # type: ignore[arg-type]


def _cpu_gemms(nodes: list[_Node], values: list[_Value], needs_grad: list[bool], differentiable: list[bool],
               options: TrainingOptions) -> dict[int, tuple[Gemm, ...]]:
    """Give, per node on CPU, the GEMMs it runs in MKL in its forward and backward (matmul_gemms, slow_conv2d's in
    slow_conv2d_gemms, flash attention's in flash_attention_gemms), for the packing buffers MKL keeps
    (rules.training.MklGemmBuffers)."""
    if options.device != "cpu":
        return {}
    made = {}
    channels_last = _channels_last(nodes, values)
    for n, node in enumerate(nodes):
        inputs = node.inputs
        if len(inputs) < 2 or min(inputs[:2]) < 0 or not node.outputs or node.outputs[0] < 0:
            continue
        low = options.precision.startswith("amp-") and node.op_type in AUTOCAST_LOW_PRECISION
        if node.op_type.startswith("aten::scaled_dot_product_attention"):
            attention = _attention_gemms(node, values, differentiable[n] and any(needs_grad[t] for t in inputs[:3]),
                                         low, options)
            if attention:
                made[n] = attention
            continue
        out = values[node.outputs[0]]
        if low or not out.numel or out.nbytes // out.numel not in options.isa.gemm.element_bytes:
            continue
        a, b, y = (_known_shape(values[t]) for t in (inputs[0], inputs[1], node.outputs[0]))
        if a is None or b is None or y is None:
            continue
        grads = differentiable[n] and needs_grad[inputs[0]], differentiable[n] and needs_grad[inputs[1]]
        gemms: tuple[Gemm, ...] = ()
        if node.domain in ("", "ai.onnx") and node.op_type in ("MatMul", "Gemm"):
            # B read transposed, as a Linear's weight: a Gemm's transB, a Transpose before it, or a weight the
            # exporter stored transposed (TorchScript's onnx::MatMul_* initializers of nn.Linear)
            producer, weight_b = values[inputs[1]].producer, values[inputs[1]]
            transposed = (b[0] == y[-1] and b[1] != y[-1]) if node.op_type == "Gemm" and len(b) == 2 \
                else (producer is not None and nodes[producer].op_type == "Transpose") or (
                    weight_b.kind == WEIGHT and re.match(EXPORTER_WEIGHT_NAME, weight_b.name) is not None)
            gemms = matmul_gemms(a, b, y, *grads, b_transposed=transposed)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Conv" and len(a) in (3, 4) \
                and not _runs_onednn(a, b, y, out.nbytes // out.numel, options.cpu_threads, options.isa):
            gemms = slow_conv2d_gemms(a, b, y, *grads, channels_last=inputs[0] in channels_last)
        if gemms:
            made[n] = gemms
    return made


def _attention_gemms(node: _Node, values: list[_Value], backward: bool, low: bool,
                     options: TrainingOptions) -> tuple[Gemm, ...]:
    """Give the MKL GEMMs of an aten::scaled_dot_product_attention node (q, k, v [, mask]): flash attention's
    (flash_attention_gemms) in the dtype it runs in (bf16 under autocast to bf16 or in a bf16 step; fp16 under
    autocast is not measured: none); with dropout, the math path's two batched matmuls, in fp32 on CPU under
    autocast too (rules.training's "scaled_dot_product_attention(dropout)"; MKL_VERBOSE shows sgemm), none in a
    bf16 step."""
    if len(node.inputs) < 3 or min(node.inputs[:3]) < 0:
        return ()
    q, k, v = (_known_shape(values[t]) for t in node.inputs[:3])
    if q is None or k is None or v is None or min(len(q), len(k), len(v)) < 2:
        return ()
    if node.op_type == "aten::scaled_dot_product_attention":
        x = values[node.inputs[0]]
        element = (2 if options.precision == "amp-bf16" else 0) if low else x.nbytes // max(x.numel or 1, 1)
        return flash_attention_gemms(q, k, v, backward, element, options.isa)
    if options.precision == "bf16":
        return ()
    batch, length, keys = q[:-2], q[-2], k[-2]
    scores = matmul_gemms((*batch, length, q[-1]), (*batch, q[-1], keys), (*batch, length, keys), backward, backward)
    output = matmul_gemms((*batch, length, keys), (*batch, keys, v[-1]), (*batch, length, v[-1]), backward, backward)
    return (*(g for g in scores + output if not g.backward), *(g for g in output + scores if g.backward))


def matmul_gemms(a: tuple[int, ...], b: tuple[int, ...], y: tuple[int, ...], input_grad: bool,
                 weight_grad: bool, b_transposed: bool = False) -> tuple[Gemm, ...]:
    """Give the GEMMs of torch.matmul (or a Gemm, a 2-D addmm) of `a` by `b` into `y` and of its backward: the
    output's, then the first input's gradient (grad @ B^T), then the second's (A^T @ grad; where `b` is read
    transposed, as a Linear's weight, PyTorch's mm_mat2_backward makes it in B's own layout: grad^T @ A, N x K).
    A 2-D `b` folds `a`'s batch dims into M (as torch.matmul does); batched on both sides, each matrix is one GEMM
    of the batch (bmm). `b` of one dim, or a 1-D `a`, is a matrix-vector product: none (MklGemmBuffers)."""
    if len(a) < 2 or len(b) < 2 or len(y) < 2:
        return ()
    m, n = y[-2], y[-1]
    if len(a) == 2 and len(b) == 2:  # a Gemm may carry transA / transB: K is the dim of A that is not M
        k = a[1] if a[0] == m else a[0]
    else:
        k = a[-1]
    if len(b) == 2:
        m = math.prod(y[:-1])
    gemms = [Gemm(m, n, k)]
    if input_grad:
        gemms.append(Gemm(m, k, n, True))
    if weight_grad:
        gemms.append(Gemm(n, k, m, True) if b_transposed and len(b) == 2 else Gemm(k, n, m, True))
    return tuple(gemms)


def slow_conv2d_gemms(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], input_grad: bool,
                      weight_grad: bool, channels_last: bool = False) -> tuple[Gemm, ...]:
    """Give the GEMMs of ATen's slow_conv2d (a 1-D or 2-D convolution not run by oneDNN), one sample and one group
    at a time (named by MKL_VERBOSE): the output (C_out/g x output positions, over C/g x kernel), the input's
    columns' gradient (C/g x kernel by output positions, over C_out/g), the weight's gradient (C_out/g by C/g x
    kernel, over the output positions). On a channels-last input each GEMM's output is the transpose (output
    positions x C_out/g, ...): its rows and columns swap."""
    groups = x[1] // w[1] if w[1] else 1
    out_channels, reduce, positions = w[0] // max(groups, 1), math.prod(w[1:]), math.prod(y[2:])
    gemms = [Gemm(out_channels, positions, reduce)]
    if input_grad:
        gemms.append(Gemm(reduce, positions, out_channels, True))
    if weight_grad:
        gemms.append(Gemm(out_channels, reduce, positions, True))
    if channels_last:
        gemms = [g._replace(m=g.n, n=g.m) for g in gemms]
    return tuple(gemms)


def flash_attention_gemms(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], backward: bool,
                          element_bytes: int, isa: CpuIsa | None = None) -> tuple[Gemm, ...]:
    """Give the distinct GEMMs, in the order they first run, of PyTorch's CPU flash attention of queries `q`
    (..., L, E), keys `k` (..., S, E) and values `v` (..., S, Ev), and of its backward
    (rules.training.CpuFlashAttention); none for an element size MKL does not run (MklGemmBuffers)."""
    rule = (CPU_ISAS[detect_cpu_isa()] if isa is None else isa)
    flash, low = rule.flash_attention, element_bytes in rule.gemm.low_precision_element_bytes
    if not low and element_bytes not in rule.gemm.element_bytes:
        return ()
    length, keys, e, ev = q[-2], k[-2], q[-1], v[-1]
    q_split = next((split for at_least, split in flash.q_split_by_length if length >= at_least), flash.q_split_min)

    def blocks(total: int, split: int) -> list[int]:
        split = min(split, total)
        return [split] + ([total % split] if split and total % split else []) if total > 0 else []

    def of(name: str, qb: int, kb: int, in_backward: bool) -> Gemm:
        shapes = {"scores": (qb, kb, e, False, True), "output": (qb, ev, kb, False, False),
                  "value_grad": (kb, ev, qb, True, False), "scores_grad": (qb, kb, ev, False, True),
                  "query_grad": (qb, e, kb, False, False), "key_grad": (kb, e, qb, True, False)}
        m, n, red, a_t, b_t = shapes[name]
        return Gemm(m, n, red, in_backward, low, a_t, b_t)

    pairs = [(qb, kb) for qb in blocks(length, q_split) for kb in blocks(keys, flash.kv_split)]
    made = [of(name, qb, kb, False) for qb, kb in pairs for name in ("scores", "output")]
    if backward:
        names = flash.backward_low_precision if low else flash.backward_fp32
        made += [of(name, qb, kb, True) for qb, kb in pairs for name in names]
    return tuple(dict.fromkeys(made))


# ops whose output takes the memory format of their input (TensorIterator's elementwise ops, a convolution)
LAYOUT_PRESERVING = frozenset({"Relu", "Gelu", "Sigmoid", "Tanh", "Erf", "Mul", "Add", "Sub", "Div", "Identity",
                               "Dropout", "Conv", "HardSigmoid", "HardSwish", "Clip", "LeakyRelu", "Elu", "Neg",
                               "Sqrt", "Pow", "Softplus", "Mish"})


def _channels_last(nodes: list[_Node], values: list[_Value]) -> set[int]:
    """Give the 4-D values PyTorch holds in the channels-last layout: a Transpose back from NHWC (x.permute(0, 3, 1,
    2), as timm's LayerNorm2d makes) and what elementwise ops and convolutions make from it (the first 4-D input
    of the output's shape decides, as TensorIterator's first operand does)."""
    found: set[int] = set()
    for node in nodes:
        if not node.outputs or node.outputs[0] < 0 or not node.inputs or node.inputs[0] < 0:
            continue
        y = values[node.outputs[0]].shape
        if y is None or len(y) != 4:
            continue
        if node.op_type == "Transpose":
            x = values[node.inputs[0]].shape
            if x is not None and len(x) == 4 and tuple(y) == (x[0], x[3], x[1], x[2]) and tuple(x) != tuple(y):
                found.add(node.outputs[0])
        elif node.op_type in LAYOUT_PRESERVING:
            first = next((t for t in node.inputs if t >= 0 and values[t].shape is not None
                          and len(values[t].shape or ()) == 4
                          and (node.op_type == "Conv" or values[t].shape == y)), -1)
            if first in found:
                found.add(node.outputs[0])
    return found


def mkl_gemm_block(m: int, n: int, k: int, element_bytes: int = 4, isa: CpuIsa | None = None) -> int:
    """Give the bytes of the packing block MKL takes for an M x N output over K (rules.training.MklGemmBuffers);
    0 for a small-matrix GEMM (a matrix-vector product among them) or a dtype MKL's GEMMs do not run. bf16
    operands (`element_bytes` 2) are packed as fp32, so their block is fp32's."""
    rule = (CPU_ISAS[detect_cpu_isa()] if isa is None else isa).gemm
    if m < rule.rows_min or n < rule.columns_min or k < 1 \
            or element_bytes not in rule.element_bytes + rule.low_precision_element_bytes:
        return 0
    if k <= rule.k_block_min:
        kc = rule.k_block_min
    elif k <= rule.k_block:
        kc = k
    elif k < 2 * rule.k_block:
        kc = k // 2
    else:
        kc = rule.k_block
    columns = -(-n // rule.column_multiple) * rule.column_multiple
    return rule.block + 4 * kc * (min(columns, rule.columns_max) + min(rule.rows_per_row * m, rule.rows_max))


def mkl_call_gemm(transa: str, transb: str, m: int, n: int, k: int, low_precision: bool = False) -> Gemm:
    """Give the Gemm of a column-major MKL call as MKL_VERBOSE shows it (transa, transb, m, n, k): C^T = op(B)^T
    op(A)^T, so M = n, N = m, and A is MKL's B, B MKL's A."""
    return Gemm(n, m, k, False, low_precision, transb == "T", transa == "T")


def mkl_gemm_requests(gemm: Gemm, isa: CpuIsa | None = None) -> list[int]:
    """Give the buffers (bytes, in the order asked) a GEMM takes from MKL's pool: its block; with bf16 operands
    first an fp32 copy of B and one of A (rules.training.MklGemmBuffers). No buffer (an empty list) for a matrix-vector
    product."""
    rule = (CPU_ISAS[detect_cpu_isa()] if isa is None else isa).gemm
    block = mkl_gemm_block(gemm.m, gemm.n, gemm.k, 2 if gemm.low_precision else 4, isa)
    if not gemm.low_precision or min(gemm.m, gemm.n) <= 1:
        return [block] if block else []

    def converted(rows: int, contiguous: int) -> int:
        return 4 * rows * (-(-contiguous // rule.converted_multiple) * rule.converted_multiple)

    a = converted(gemm.k, gemm.m) if gemm.a_transposed else converted(gemm.m, gemm.k)
    b = converted(gemm.n, gemm.k) if gemm.b_transposed else converted(gemm.k, gemm.n)
    # MKL's A (column-major) is B here: converted first; a small-matrix GEMM converts without a block (measured)
    return [b, a, block] if block else [b, a]


def mkl_gemm_held(gemms: Sequence[Gemm], isa: CpuIsa | None = None) -> list[tuple[int, int]]:
    """Give what MKL's pool gains over GEMMs run one after another in a fresh process, as (index of the GEMM that
    makes it, bytes): a GEMM's request takes the smallest free buffer of the pool that fits, else makes one
    (mkl_gemm_requests); the first fp32 GEMM also takes MklGemmBuffers.first_use, the first bf16 one
    low_precision_first_use (low_precision_first_use_after_fp32 after an fp32 one). The process holds the sum from
    then on."""
    rule = (CPU_ISAS[detect_cpu_isa()] if isa is None else isa).gemm
    pool: list[int] = []
    held: list[tuple[int, int]] = []
    fp32_ran = low_ran = False  # (the first of each kind takes its first use)
    for i, gemm in enumerate(gemms):
        requests = mkl_gemm_requests(gemm, isa)
        free = sorted(pool)
        made = 0
        if requests and gemm.low_precision and not low_ran:
            made = rule.low_precision_first_use_after_fp32 if fp32_ran else rule.low_precision_first_use
            low_ran = True
        elif requests and not gemm.low_precision and not fp32_ran:
            made = rule.first_use
            fp32_ran = True
        for size in requests:
            fits = next((j for j, f in enumerate(free) if f >= size), None)
            if fits is None:
                pool.append(size)
                made += size
            else:
                del free[fits]
        if made:
            held.append((i, made))
    return held


def _onednn_ld(n: int) -> int:
    """Give oneDNN's leading dimension for n floats: a multiple of 16, not of 256 (4K aliasing)."""
    ld = -(-n // 16) * 16
    return ld + 16 if ld % 256 == 0 else ld


def _producer_op_type(graph: ModelGraph, name: str) -> str:
    """Give the op type of the graph op that makes tensor `name` ("" for a weight, an input or a loss value)."""
    index = graph.tensor_index.get(name)
    producer = graph.tensors[index].producer if index is not None else None
    return graph.ops[producer].op_type if producer is not None else ""


def _read_transposed(graph: ModelGraph, name: str) -> bool:
    """Say whether tensor `name` is read through a Transpose (directly or after a Squeeze or Reshape)."""
    index = graph.tensor_index.get(name)
    if index is None:
        return False
    for op in (graph.ops[c] for c in graph.tensors[index].consumers):
        if op.op_type == "Transpose":
            return True
        if op.op_type in ("Squeeze", "Reshape") and op.outputs and op.outputs[0] >= 0 \
                and any(graph.ops[c].op_type == "Transpose" for c in graph.tensors[op.outputs[0]].consumers):
            return True
    return False


def _node_recurrent_dims(node: _Node, values: list[_Value]) -> tuple[int, int, int, int, int] | None:
    """Give (T steps, D directions, B batch, I features, H hidden) of a recurrent node (_recurrent_dims), from the
    ONNX node's shapes: W [D, gates x H, I], R [D, gates x H, H], X of T x B x I elements, Y_h or initial_h of
    D x B x H (any layout)."""

    def shape(i: int, sources: tuple[int, ...]) -> tuple[int | str | None, ...] | None:
        t = sources[i] if i < len(sources) else -1
        return values[t].shape if t >= 0 else None

    x = values[node.inputs[0]] if node.inputs and node.inputs[0] >= 0 else None
    return _recurrent_dims(shape(1, node.inputs), shape(2, node.inputs), x,
                           shape(1, node.outputs) or shape(5, node.inputs), shape(0, node.outputs))


def _recurrent_bytes(rule: Recurrent, dims: tuple[int, int, int, int, int] | None, device: str) -> \
        tuple[int, int, int]:
    """Give what a recurrent op of these dims (_node_recurrent_dims) keeps besides its tensors (workspace), its
    backward's scratch and its forward's, in bytes."""
    if dims is None:
        return 0, 0, 0
    steps, directions, batch, features, hidden = dims
    per_value = 4 * directions * steps * batch * hidden
    if device == "cuda":
        return per_value * rule.cuda_values, 0, 0
    if rule.cpu_unrolled:
        return per_value * rule.cpu_unrolled, 0, per_value * rule.cpu_unrolled_forward
    if not features:
        return 0, 0, 0  # oneDNN's workspace needs the input's features
    gates = _onednn_ld(rule.gates * hidden)
    rows = steps * gates + rule.state_rows * (steps + 1) * _onednn_ld(max(features, hidden)) \
        + (rule.diff_rows * (steps + 1) - 1) * _onednn_ld(hidden)
    workspace = 4 * batch * rows
    # the weights reordered, the gates' scratch, the final states' gradients (zeros when unused) and the
    # initial states' gradients
    scratch = 4 * gates * (features + hidden + steps * batch) + 4 * 4 * batch * hidden
    return directions * workspace, directions * scratch, 0


def _recurrent_dims(w: tuple[int | str | None, ...] | None, r: tuple[int | str | None, ...] | None,
                    x: _Value | None, states: tuple[int | str | None, ...] | None,
                    y: tuple[int | str | None, ...] | None) -> tuple[int, int, int, int, int] | None:
    """Give (T steps, D directions, B batch, I features, H hidden) of a recurrent node: from its weights
    W [D, gates x H, I] and R [D, gates x H, H] and its states [D, B, H] where those are known, else from its
    output Y [T, D, B, H] (layout 0, the one exporters write) and input X [T, B, I] (weights the exporter
    reorders at run time have no static shape)."""
    if x is None:
        return None
    if x.numel is not None and w is not None and r is not None and states is not None and len(w) == 3 and len(r) == 3:
        directions, features, hidden = w[0], w[2], r[2]
        state_numel = _numel(states)
        if all(isinstance(d, int) and d > 0 for d in (directions, features, hidden)) and state_numel:
            assert isinstance(directions, int) and isinstance(features, int) and isinstance(hidden, int)
            batch = state_numel // (directions * hidden)
            return x.numel // max(batch * features, 1), directions, batch, features, hidden
    if y is not None and len(y) == 4 and all(isinstance(d, int) and d > 0 for d in y):
        steps, directions, batch, hidden = (int(d) for d in y)  # type: ignore[arg-type]
        features = x.shape[2] if x.shape is not None and len(x.shape) == 3 else None
        return steps, directions, batch, features if isinstance(features, int) else 0, hidden
    return None


def _attention_extra_bytes(n: int, rule: Saves, inputs: tuple[int, ...], values: list[_Value], roots: list[int],
                           options: TrainingOptions, needs: _BackwardNeeds) -> int:
    """Give the bytes an attention op keeps besides its inputs' storages: the [..., q_len, kv_len] tensors and the
    copies its rule names (in fp32 where the rule computes in fp32 on CPU); an input it keeps as it is goes to
    needs.saved_by."""

    def widened(value: _Value, nbytes: int) -> int:
        width = value.nbytes // value.numel if value.numel else 4
        return nbytes * 4 // width if upcast and 0 < width < 4 else nbytes

    upcast = rule.fp32_on_cpu and options.device == "cpu"
    extra = 0
    if rule.attention_probabilities and len(inputs) > 1 and inputs[0] >= 0 and inputs[1] >= 0:
        query = values[inputs[0]]
        extra += rule.attention_probabilities * widened(query, _attention_bytes(query, values[inputs[1]]))
    extra += sum(widened(values[inputs[i]], values[inputs[i]].nbytes) for i in rule.copies
                 if i < len(inputs) and inputs[i] >= 0)
    for i in rule.copies_when_view:
        t = inputs[i] if i < len(inputs) else -1
        if t >= 0 and (roots[t] != t or widened(values[t], values[t].nbytes) != values[t].nbytes):
            extra += widened(values[t], values[t].nbytes)  # a copy: of the reshaped view, or in fp32
        elif t >= 0 and values[t].kind not in (WEIGHT, INPUT):
            needs.saved_by.setdefault(t, []).append(n)
    return extra


def _stat_count(value: _Value, rule: Saves) -> int:
    """Give how many statistics a norm keeps: one per channel (axis 1), or per row of the axes before
    rule.stats_axis."""
    shape = value.shape
    if value.numel is None or not shape:
        return 0
    if rule.stats == "channels":
        return shape[1] if len(shape) > 1 and isinstance(shape[1], int) else 0
    # ModelGraph keeps no attributes; every exporter we know writes LayerNormalization's axis as -1
    rows = 1
    for d in shape[:rule.stats_axis % len(shape)]:
        rows *= d if isinstance(d, int) else 1
    return rows


def _attention_bytes(query: _Value, key: _Value) -> int:
    """Give the bytes of one [..., q_len, kv_len] tensor of attention from q [..., q_len, E] and k [..., kv_len, E]
    (at q's element size)."""
    q_shape, k_shape = query.shape, key.shape
    if not q_shape or not k_shape or not query.numel or not isinstance(q_shape[-1], int) \
            or not isinstance(k_shape[-2] if len(k_shape) > 1 else None, int) or not q_shape[-1]:
        return 0
    kv_len = k_shape[-2]
    assert isinstance(kv_len, int)
    return query.nbytes // q_shape[-1] * kv_len


# ---------------------------------------------------------------------------------------------------------------
# The simulation: events, buffers, and the live bytes at each event.

@dataclass
class _Run:
    events: _Events
    buffers: list[_Buffer]
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
        by_category: dict[str, list[_Buffer]] = {}
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


def _simulate(model: _Model, options: TrainingOptions, rule: OptimizerRule, first_step: bool,
              segments: list[tuple[int, int]] | None = None, recomputed: frozenset[int] = frozenset()) -> _Run:
    """Give the live bytes at every event of one training step.

    `segments`: checkpointed ranges [start, end) of node positions (they keep only their inputs and are
    recomputed in backward); `recomputed`: storage roots recomputed in backward instead of kept.
    """
    step = _schedule(model, options, segments or [])
    buffers = _Buffers()
    for v in model.values:  # the baseline: weights and the input batch, for the whole step
        if v.kind == WEIGHT:
            buffers.add(v.name, "weights", v.nbytes, step.data, step.end)
        elif v.kind == INPUT:
            buffers.add(v.name, "input batch", v.nbytes, step.data, step.end)
    _forward_buffers(model, step, buffers, recomputed)
    _recompute_buffers(model, step, buffers)
    _kept_extras(model, step, buffers)
    _backward_buffers(model, options, step, buffers)
    _optimizer_buffers(model, options, rule, step, buffers, first_step)
    _autograd_graph_buffers(model, options, step, buffers)
    # oneDNN's primitives and MKL's blocks are made once per process: with gradient accumulation the micro-step
    # simulated (a later one, see _backward_buffers) starts with those the first micro-step made
    made_before = not first_step or options.accumulates
    _primitive_buffers(model, step, buffers, not made_before)
    _gemm_buffers(model, options, step, buffers, not made_before)
    live = live_bytes(((b.nbytes, b.start, b.end) for b in buffers), len(step.events.phase))
    peak_event = max(range(len(live)), key=live.__getitem__)
    saved = sum(b.nbytes for b in buffers if b.category == "saved activations" and b.start <= step.seed <= b.end)
    return _Run(step.events, buffers, live, live[peak_event], peak_event, saved)


@dataclass
class _Schedule:
    """The events of one step in order (data, forward, loss, backward with the recomputes of checkpointed segments,
    optimizer), and where each node's forward, recompute and backward fall among them (-1: none)."""

    events: _Events
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


class _Buffers(list[_Buffer]):
    def add(self, name: str, category: str, nbytes: int, start: int, end: int) -> None:
        """Add a buffer live from event `start` to `end` (an empty one is left out)."""
        if nbytes > 0:
            self.append(_Buffer(name, category, nbytes, start, max(start, end)))


def _schedule(model: _Model, options: TrainingOptions, segments: list[tuple[int, int]]) -> _Schedule:
    nodes = model.nodes
    ev = _Events()
    data = ev.add("data", "data")
    fwd = [ev.add("loss" if node.graph_op is None else "forward", f"{node.op_type} {node.name}") for node in nodes]
    segment_of = [-1] * len(nodes)
    for s, (start, end) in enumerate(segments):
        for n in range(start, end):
            segment_of[n] = s
    bwd = [-1] * len(nodes)
    rec = [-1] * len(nodes)
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
        for m in range(start, end):
            rec[m] = ev.add("backward", f"recompute {nodes[m].op_type} {nodes[m].name}")
        for m in range(end - 1, start - 1, -1):
            if model.differentiable[m]:
                bwd[m] = ev.add("backward", f"backward of {nodes[m].op_type} {nodes[m].name}")
        n = start - 1
    if options.update_impl == "for-loop":
        opt_events = [ev.add("optimizer", f"update {model.values[p].name}") for p in model.params] or \
            [ev.add("optimizer", "update")]
    else:
        opt_events = [ev.add("optimizer", "update (all parameters)")]
    return _Schedule(ev, data, fwd, bwd, rec, seed, opt_events, len(ev.phase) - 1, segments, segment_of)


def _forward_buffers(model: _Model, step: _Schedule, buffers: _Buffers, recomputed: frozenset[int]) -> None:
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
        for alias in _aliases(model, t):
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


def _autograd_graph_buffers(model: _Model, options: TrainingOptions, step: _Schedule, buffers: _Buffers) -> None:
    """Add PyTorch's autograd graph on CPU (rules.training.CPU_AUTOGRAD_BYTES_PER_NODE per differentiable op and
    trainable parameter): from the op's forward (its recompute inside a checkpointed segment, until its backward)
    or the parameter's first use, to the step's end."""
    if options.device != "cpu":
        return
    each = CPU_AUTOGRAD_BYTES_PER_NODE
    for n, node in enumerate(model.nodes):
        if not model.differentiable[n]:
            continue
        nbytes = each * model.autograd_nodes.get(n, 1)
        if step.segment_of[n] >= 0:
            buffers.add(f"{node.name} (autograd node)", "autograd graph", nbytes, step.rec[n], step.bwd[n])
        else:
            buffers.add(f"{node.name} (autograd node)", "autograd graph", nbytes, step.fwd[n], step.end)
    for t in model.params:
        users = [step.fwd[c] for c in model.values[t].consumers]
        buffers.add(f"{model.values[t].name} (gradient accumulator)", "autograd graph", each,
                    min(users, default=step.data), step.end)


def _primitive_buffers(model: _Model, step: _Schedule, buffers: _Buffers, first_step: bool) -> None:
    """Add oneDNN's cached primitives (rules.training.OnednnPrimitives): each distinct one from the event that
    first creates it (a Conv's forward, or its backward) to the step's end; in a later step, held from its start."""
    created: dict[tuple[object, ...], tuple[int, int]] = {}
    for n, primitives in model.primitives.items():
        for key, nbytes, backward in primitives:
            event = step.bwd[n] if backward else step.rec[n] if step.fwd[n] < 0 else step.fwd[n]
            if event < 0:
                continue
            if key not in created or event < created[key][1]:
                created[key] = (nbytes, event)
    for key, (nbytes, event) in created.items():
        buffers.add(f"{' '.join(map(str, key))} (oneDNN primitive)", "oneDNN primitives", nbytes,
                    event if first_step else step.data, step.end)


def _gemm_buffers(model: _Model, options: TrainingOptions, step: _Schedule, buffers: _Buffers,
                  first_step: bool) -> None:
    """Add MKL's GEMM buffers (rules.training.MklGemmBuffers): the GEMMs of the step in the order they run, each
    that finds no free buffer in MKL's pool for what it asks adding one, held from it to the step's end (to the
    process's end: in a later step, from its start)."""
    runs = []
    for n, gemms in model.gemms.items():
        for i, gemm in enumerate(gemms):
            event = step.bwd[n] if gemm.backward else step.rec[n] if step.fwd[n] < 0 else step.fwd[n]
            if event >= 0:
                runs.append((event, i, gemm))
    runs.sort()
    for index, nbytes in mkl_gemm_held([gemm for _, _, gemm in runs], options.isa):
        event, _, gemm = runs[index]
        kind = "bf16 GEMM buffers" if gemm.low_precision else "sgemm block"
        buffers.add(f"MKL {kind} ({gemm.m}x{gemm.n}x{gemm.k})", "MKL GEMM buffers", nbytes,
                    event if first_step else step.data, step.end)


def _recompute_buffers(model: _Model, step: _Schedule, buffers: _Buffers) -> None:
    """Add the recompute incarnations of the activations inside checkpointed segments."""
    nodes, values, roots, rec, bwd = model.nodes, model.values, model.root, step.rec, step.bwd
    for start, end in step.segments:
        for m in range(start, end):
            for t in nodes[m].outputs:
                if t < 0 or roots[t] != t or values[t].kind in (WEIGHT, INPUT):
                    continue
                last = rec[m]
                for alias in _aliases(model, t):
                    for c in values[alias].consumers:
                        if start <= c < end:
                            last = max(last, rec[c])
                for saver in model.saved_by.get(t, []):
                    if start <= saver < end:
                        last = max(last, bwd[saver])
                buffers.add(values[t].name, "saved activations", values[t].nbytes, rec[m], last)


def _kept_extras(model: _Model, step: _Schedule, buffers: _Buffers) -> None:
    """Add the masks, indices and statistics nodes keep, forward temporaries, and autocast's low-precision
    copies."""
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
        if step.segment_of[n] >= 0:
            buffers.add(name, "temporaries", nbytes, rec[n], rec[n])
    for (n, t), nbytes in model.cast_copies.items():
        start = rec[n] if step.segment_of[n] >= 0 else fwd[n]
        buffers.add(f"{values[t].name} (low-precision copy)", "saved activations", nbytes, start, bwd[n])
    for t, nbytes in model.weight_copies.items():
        users = [n for n in values[t].consumers if model.differentiable[n]]
        first_use = min((fwd[n] for n in users), default=step.end_of_forward)
        last_use = max([bwd[n] for n in users] + [step.end_of_forward])
        buffers.add(f"{values[t].name} (low-precision copy)", "low-precision weight copies", nbytes, first_use,
                    last_use)


def _backward_buffers(model: _Model, options: TrainingOptions, step: _Schedule, buffers: _Buffers) -> None:
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
        buffers.append(_Buffer("loss gradient", "activation gradients", 4, step.seed, step.seed))
        hold(model.loss_value, len(buffers) - 1)
    grad_of_output_size = _grad_bytes_per_value(model, options)
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
                buffers.append(_Buffer(f"grad {values[t].name}", "activation gradients", old.nbytes, e, e))
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
            buffers.append(_Buffer(f"grad {values[t].name}", "activation gradients", size, e, e))
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


def _optimizer_buffers(model: _Model, options: TrainingOptions, rule: OptimizerRule, step: _Schedule,
                       buffers: _Buffers, first_step: bool) -> None:
    """Add the optimizer's states (made in the first step, there from the start of a later one) and its update's
    temporaries."""
    values, params, opt_events = model.values, model.params, step.opt_events
    impl = options.update_impl
    states = _state_bytes_per_param(model, rule, options)
    for i, p in enumerate(params):
        at = opt_events[i] if impl == "for-loop" else opt_events[0]
        created = (opt_events[0] if rule.states_created_at_once else at) if first_step else step.data
        buffers.add(f"{values[p].name} (optimizer state)", "optimizer state", states[p], created, step.end)
    transient_factor = {"for-loop": rule.transient_for_loop, "foreach": rule.transient_foreach, "fused": 0}[impl]
    if not transient_factor:
        return
    if impl == "for-loop":
        for i, p in enumerate(params):
            buffers.add(f"{values[p].name} (update temporaries)", "temporaries",
                        transient_factor * values[p].nbytes, opt_events[i], opt_events[i])
    else:
        buffers.add("update temporaries", "temporaries", transient_factor * model.param_bytes, opt_events[0],
                    opt_events[0])


def _aliases(model: _Model, root: int) -> list[int]:
    return model.members.get(root, [root])


def _grad_bytes_per_value(model: _Model, options: TrainingOptions) -> list[int]:
    """Give the bytes of each value's gradient: its own size (parameters: at the master precision)."""
    return [v.nbytes for v in model.values]


def _param_grad_bytes(model: _Model, options: TrainingOptions) -> int:
    return sum(model.values[p].nbytes for p in model.params)


def _state_bytes_per_param(model: _Model, rule: OptimizerRule, options: TrainingOptions) -> dict[int, int]:
    states: dict[int, int] = {}
    for p in model.params:
        v = model.values[p]
        numel = v.numel or 0
        element = v.nbytes // numel if numel else 4
        size = 0
        if rule.state_bits and numel >= EIGHT_BIT_MIN_ELEMENTS:
            size += rule.states * (numel * rule.state_bits // 8 + 4 * math.ceil(numel / EIGHT_BIT_BLOCK))
        else:
            size += rule.states * numel * (4 if rule.state_bits else element)
        if rule.factored:
            size += _factored_state_elements(v, model) * element
        if rule.step_tensor:
            size += 4
        states[p] = size
    return states


def _factored_state_elements(value: _Value, model: _Model) -> int:
    """Give Adafactor's statistics: a row and a column vector for a matrix, a full one for a vector."""
    shape = value.shape
    numel = value.numel or 0
    if shape is None or len(shape) < 2 or not isinstance(shape[-1], int) or not isinstance(shape[-2], int) \
            or not shape[-1] or not shape[-2]:
        return numel
    return numel // shape[-1] + numel // shape[-2]


def _optimizer_state_bytes(model: _Model, rule: OptimizerRule, options: TrainingOptions) -> int:
    return sum(_state_bytes_per_param(model, rule, options).values())


# ---------------------------------------------------------------------------------------------------------------
# Summaries, what-ifs and the hand formula.

def _hand_formula(model: _Model, options: TrainingOptions, rule: OptimizerRule, weights_bytes: int,
                  input_bytes: int, gradient_bytes: int) -> int:
    """Give the CS231n rule of thumb: weights, gradients and states, every activation twice, the inputs."""
    activations = sum(v.nbytes for t, v in enumerate(model.values)
                      if model.root[t] == t and v.kind not in (WEIGHT, INPUT, "loss") and v.producer is not None)
    activations += sum(model.values[t].nbytes for t in model.hidden)  # the graph's own nodes, as exported
    states = rule.states * model.param_bytes
    return weights_bytes + gradient_bytes + states + 2 * activations + input_bytes


def _saved_by_op_type(model: _Model) -> tuple[tuple[str, int], ...]:
    totals: dict[str, int] = {}
    counted: set[int] = set()
    for r, savers in sorted(model.saved_by.items(), key=lambda kv: min(kv[1])):
        if r in counted:
            continue
        counted.add(r)
        op_type = model.nodes[min(savers)].op_type
        totals[op_type] = totals.get(op_type, 0) + model.values[r].nbytes
    for n, nbytes in model.extras.items():
        totals[model.nodes[n].op_type] = totals.get(model.nodes[n].op_type, 0) + nbytes
    return tuple(sorted(totals.items(), key=lambda kv: -kv[1]))


def _parameter_groups(model: _Model) -> tuple[TrainingParameterGroup, ...]:
    groups: dict[str, list[int]] = {}
    for trainable, items in ((True, model.params), (False, model.frozen)):
        for t in items:
            consumer = model.values[t].consumers[0] if model.values[t].consumers else None
            layer = module_path(model.nodes[consumer].layer) if consumer is not None else ""
            row = groups.setdefault(layer or "(top level)", [0, 0, 0])
            numel = model.values[t].numel or 0
            row[0] += numel
            row[1 if trainable else 2] += model.values[t].nbytes
    return tuple(TrainingParameterGroup(k, v[0], v[1], v[2]) for k, v in groups.items())


def _recompute_what_if(model: _Model, options: TrainingOptions,
                       rule: OptimizerRule) -> tuple[tuple[RecomputeRow, ...], int | None]:
    """Give the cheap ops whose kept output could be recomputed from inputs kept anyway, and the peak then (None
    where there is none: the peak stays)."""
    kept = set(model.saved_by)
    candidates: list[RecomputeRow] = []
    roots: set[int] = set()
    for n, node in enumerate(model.nodes):
        if node.op_type not in CHEAP_TO_RECOMPUTE or not node.outputs or node.outputs[0] < 0:
            continue
        out = model.root[node.outputs[0]]
        if out not in kept or model.values[out].kind in (OUTPUT, "loss"):
            continue
        sources = [model.root[t] for t in node.inputs if t >= 0]
        if not all(s in kept or model.values[s].kind in (WEIGHT, INPUT) for s in sources):
            continue
        if any(model.values[s].producer == n for s in sources):
            continue
        roots.add(out)
        candidates.append(RecomputeRow(node.name, node.op_type, model.values[out].name, model.values[out].nbytes,
                                       model.values[out].numel or 0))
    if not candidates:
        return (), None
    first = _simulate(model, options, rule, True, recomputed=frozenset(roots))
    later = _simulate(model, options, rule, False, recomputed=frozenset(roots))
    candidates.sort(key=lambda r: -r.saved_bytes)
    return tuple(candidates), max(first.peak, later.peak)


def _flops(model: _Model, n: int) -> int:
    """Give an op's forward FLOPs: 2 per multiply-add for products and convolutions, 1 per output element else."""
    node = model.nodes[n]
    out = model.values[node.outputs[0]] if node.outputs and node.outputs[0] >= 0 else None
    if out is None or out.numel is None:
        return 0
    if node.op_type in ("MatMul", "Gemm") and node.inputs and node.inputs[0] >= 0:
        shape = model.values[node.inputs[0]].shape
        k = shape[-1] if shape and isinstance(shape[-1], int) else 1
        return 2 * out.numel * k
    if node.op_type in ("Conv", "ConvTranspose") and len(node.inputs) > 1 and node.inputs[1] >= 0:
        shape = model.values[node.inputs[1]].shape
        per_output = 1
        for d in (shape or ())[1:]:
            per_output *= d if isinstance(d, int) else 1
        return 2 * out.numel * per_output
    return out.numel


def _checkpoint_what_if(model: _Model, options: TrainingOptions, rule: OptimizerRule,
                        peak: int) -> CheckpointWhatIf | None:
    """Give the peak with activation checkpointing in k segments (the last segment is not checkpointed)."""
    if options.checkpoint is None:
        return None
    graph_nodes = [n for n in range(model.n_graph_nodes)]
    differentiable = [n for n in graph_nodes if model.differentiable[n]]
    if options.checkpoint == "auto":
        segments = max(1, math.isqrt(len(differentiable)))
    else:
        segments = int(options.checkpoint)
    ranges = _segment_ranges(model, segments)
    forward_flops = sum(_flops(model, n) for n in graph_nodes)
    extra = sum(_flops(model, n) for start, end in ranges for n in range(start, end))
    first = _simulate(model, options, rule, True, segments=ranges)
    later = _simulate(model, options, rule, False, segments=ranges)
    return CheckpointWhatIf(
        segments=len(ranges) + 1,
        peak_bytes=max(first.peak, later.peak),
        saved_activation_bytes=first.saved_at_backward_start,
        memory_saved_bytes=peak - max(first.peak, later.peak),
        forward_flops=forward_flops,
        extra_forward_flops=extra,
    )


def _segment_ranges(model: _Model, segments: int) -> list[tuple[int, int]]:
    """Give the checkpointed ranges: k - 1 segments of about equal kept bytes, cut where little crosses."""
    n = model.n_graph_nodes
    if segments <= 1 or n < 2:
        return []
    kept_at = [0] * n
    for r, savers in model.saved_by.items():
        first = min(savers)
        if first < n:
            kept_at[first] += model.values[r].nbytes
    for node, nbytes in model.extras.items():
        if node < n:
            kept_at[node] += nbytes
    total = sum(kept_at)
    crossing = [0] * (n + 1)  # bytes produced before cut p and read at or after it
    for t, v in enumerate(model.values):
        if model.root[t] != t or v.producer is None or v.producer >= n or v.kind in (WEIGHT, INPUT):
            continue
        last = max((c for a in _aliases(model, t) for c in model.values[a].consumers), default=v.producer)
        if last > v.producer:
            crossing[v.producer + 1] += v.nbytes
            crossing[min(last, n - 1) + 1] -= v.nbytes
    for p in range(1, n + 1):
        crossing[p] += crossing[p - 1]
    cuts: list[int] = []
    running = 0
    cumulative = []
    for p in range(n):
        running += kept_at[p]
        cumulative.append(running)
    window = max(1, n // (4 * segments))
    for j in range(1, segments):
        target = total * j / segments
        nearest = min(range(1, n), key=lambda p: abs(cumulative[p - 1] - target))
        lo, hi = max(1, nearest - window), min(n - 1, nearest + window)
        best = min(range(lo, hi + 1), key=lambda p: (crossing[p], abs(p - nearest)))
        if not cuts or best > cuts[-1]:
            cuts.append(best)
    bounds = [0, *cuts]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def _traced_in_train_mode(graph: ModelGraph) -> bool:
    """Say whether the graph shows a train-mode trace: a Dropout node, a BatchNormalization that updates its running
    statistics, or export_for_training's record of the mode."""
    return graph.properties.get(EXPORT_MODE_PROPERTY) == "training" or any(
        op.op_type == "Dropout" or (op.op_type == "BatchNormalization" and len([t for t in op.outputs if t >= 0]) > 1)
        for op in graph.ops)


def _export_mode(graph: ModelGraph, restored: _Restored | None = None) -> str:
    kinds = {op.op_type for op in graph.ops}
    if restored is not None and restored.eval_marks:
        return "eval"
    if _traced_in_train_mode(graph):
        return "training"
    if "BatchNormalization" in kinds or (restored is not None and (restored.by_names or restored.eval_copies)):
        return "eval"
    return "either"


# What to do instead of an export that folded or removed training memory.
RECOMMENDED_EXPORT = ("export in train mode with BatchNorm and Dropout kept: onnxmem.torch.export_for_training(model, "
                      "args, path), or torch.onnx.export(model.train(), args, path, dynamo=True, optimize=False)")


def _export_findings(model: _Model, mode: str) -> list[str]:
    """Give the export warnings as '[code] message': ops the export folded (restored and counted here), an
    eval-mode export (its Dropout layers are gone: not counted)."""
    restored = model.restored or _Restored()
    findings = []
    removed_dropout = ("the export was made in eval mode, which removes Dropout: the masks of any Dropout layers "
                       "the model has are not counted")
    if restored.folded_into:
        kept = sum(model.values[t].nbytes for t in restored.kept_bytes_values)
        layers = "; ".join(f"{len(nodes)} {module} layer(s) into {', '.join(nodes[:3])}"
                           + (", ..." if len(nodes) > 3 else "") for module, nodes in restored.folded_into.items())
        how = ("Conv weights with an exporter's name, not a parameter's, say so" if restored.by_names
               else "the ATen ops that mark those nodes say so")
        findings.append(f"[folded-normalization] the export folded {layers} ({how}): the graph lacks what they keep "
                        f"for backward in training. They are simulated again after those nodes (their inputs, "
                        f"{kept:,} bytes, and statistics are counted)"
                        + (f"; {removed_dropout}" if mode == "eval" else "") + ". For an exact estimate, "
                        + RECOMMENDED_EXPORT)
    elif mode == "eval":
        copies = ", ".join(f"{count} {op}" for op, count in restored.eval_copies.items())
        kept_as_copies = f" ({copies} layer(s) it kept as copies are simulated in train mode)" if copies else ""
        findings.append(f"[eval-export] {removed_dropout}{kept_as_copies}; BatchNorm is assumed to train on batch "
                        f"statistics. For an exact estimate, {RECOMMENDED_EXPORT}")
    return findings


def _assumptions(graph: ModelGraph, model: _Model, options: TrainingOptions, rule: OptimizerRule) -> \
        tuple[str, ...]:
    mode = _export_mode(graph, model.restored)
    notes = [
        "one step: zero_grad(set_to_none=True), forward, loss, backward, optimizer step; the training loop holds "
        "the model's output and the loss until the step ends",
        f"loss: {options.loss}" + (" (log-softmax kept for backward)" if options.loss == "cross_entropy" else ""),
        f"optimizer update: {options.update_impl}"
        + {"foreach": " (PyTorch's default on CUDA: temporaries over all parameters at once)",
           "for-loop": " (PyTorch's default on CPU: temporaries for one parameter at a time)",
           "fused": " (no temporaries)"}[options.update_impl],
    ]
    if mode == "training":
        notes.append("training-mode export: Dropout keeps a mask, BatchNorm uses batch statistics")
        copies = (model.restored or _Restored()).p0_copies
        if copies:
            notes.append(f"{', '.join(f'{count} {op}' for op, count in copies.items())} layer(s) exported as copies "
                         "in a train-mode trace: dropout with p=0, which returns its input (nothing kept)")
    elif mode == "eval":
        notes.append("eval-mode export: BatchNorm assumed to train (keeps its input and batch statistics); "
                     "Dropout layers an eval export removes are not counted")
    else:
        notes.append(f"[export-mode-unknown] the graph has no Dropout or BatchNormalization and does not say the "
                     f"mode it was exported in: if the model has Dropout, an eval-mode export removed it and its "
                     f"masks are not counted (PyTorch keeps one per dropped tensor). To be sure, {RECOMMENDED_EXPORT}")
    notes.extend(f"{text}: {count} place(s)" for text, count in model.assumed.items())
    notes.extend(_export_findings(model, mode))
    if model.unmatched:
        notes.append(f"[unmatched-pattern] no parameter's name or module path matches {', '.join(model.unmatched)}"
                     f": {'it changes' if len(model.unmatched) == 1 else 'they change'} nothing (the report's "
                     "parameter groups list the module paths)")
    if options.precision.startswith("amp-"):
        notes.append("mixed precision: fp32 master weights, gradients and optimizer state; MatMul/Gemm/Conv run in "
                     "16 bits on 16-bit copies of their inputs and weights; Softmax, LayerNorm and the loss in fp32")
    if options.accumulates:
        notes.append("gradient accumulation: activations at the micro-batch; "
                     "from the second micro-step on, parameter gradients are live through forward")
    return tuple(notes)


