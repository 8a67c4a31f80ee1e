"""Training memory: one training step (forward, loss, backward, optimizer step) scheduled over the forward graph.

The step is a sequence of events; every buffer (weight, input batch, activation, mask, activation gradient,
parameter gradient, optimizer state, temporary) lives from one event to another, and a difference array over
events gives the live bytes at each (as in passes/liveness.py). What PyTorch does is the reference:

- data: weights and the input batch are live (and, after the first step, the optimizer state).
- forward: each op allocates its outputs (views allocate nothing); a tensor is freed after its last reader,
  unless an op keeps it for backward (rules.py), then after that op's backward. Only ops that have an
  input needing a gradient (from a trainable parameter) keep anything.
- loss: appended after the model's first float output (cross-entropy keeps its log-softmax). The model's
  outputs and the loss are held by the training loop until the end of the step.
- backward: the ops in reverse order; each allocates its inputs' gradients (or passes its output's gradient
  through), then frees its output gradients and what it kept. Parameter gradients live until the step ends
  (zero_grad(set_to_none=True) frees them at the next step).
- optimizer: states are created at the first step and live from then on; the update's temporaries are counted.

What depends on the device PyTorch trains on (its kernels' scratch and workspaces, its libraries' buffers, the
autograd graph's heap, autocast's fp32 ops, the default update) is asked of a DeviceModel (onnxmem/targets/torch/).
This module is the entry point: options.py (TrainingOptions), model.py and export.py (the step's facts),
schedule.py and simulate.py (its events and buffers), optimizers.py, whatifs.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxmem.ir.graph import INPUT, WEIGHT, ModelGraph, module_path
from onnxmem.passes.liveness import live_bytes
from onnxmem.training.export import (
    EXPORT_WARNINGS,
    RECOMMENDED_EXPORT,
    Restored,
    checkpoint_layers,
    export_findings,
    export_mode,
)
from onnxmem.training.model import StepModel, build_model
from onnxmem.training.optimizers import optimizer_state_bytes, param_grad_bytes
from onnxmem.training.options import (
    PRECISIONS,
    TrainingOptions,
    check_options,
    micro_batch_dims,
    resolve_optimizer,
    training_options,
)
from onnxmem.training.rules import AUTOCAST_LOW_PRECISION, OptimizerRule
from onnxmem.training.schedule import Buffer
from onnxmem.training.simulate import Run, simulate
from onnxmem.training.whatifs import checkpoint_what_if, hand_formula, layer_segments, recompute_what_if
from onnxmem.views.report import (
    STATE_SERIES,
    TrainingParameter,
    TrainingParameterGroup,
    TrainingReport,
    TrainingTimeline,
    Warning,
)

__all__ = ["PRECISIONS", "TrainingOptions", "micro_batch_dims", "training_memory", "training_options",
           "training_warnings"]


def training_memory(graph: ModelGraph, order: Sequence[int], options: TrainingOptions) -> TrainingReport:
    """Give the training-step memory of a sized graph run in `order` (the graph is read, never changed)."""
    check_options(options)
    rule = options.optimizer_rule()
    model = build_model(graph, order, options)
    segments, blocks = (layer_segments(model, options.checkpoint_levels, checkpoint_layers(graph))
                        if options.checkpoints_layers else (None, ""))
    first = simulate(model, options, rule, True, segments)
    later = simulate(model, options, rule, False, segments)
    recompute_rows, recompute_peak = recompute_what_if(model, options, rule, segments)
    worst = first if first.peak >= later.peak else later
    weights_bytes = sum(v.nbytes for v in model.values if v.kind == WEIGHT)
    input_bytes = sum(v.nbytes for v in model.values if v.kind == INPUT)
    gradient_bytes = param_grad_bytes(model, options)
    state_bytes = optimizer_state_bytes(model, rule, options)
    saved_bytes = first.saved_at_backward_start
    hand = hand_formula(model, options, rule, weights_bytes, input_bytes, gradient_bytes)
    checkpoint = checkpoint_what_if(model, options, rule, max(first.peak, later.peak))
    return TrainingReport(
        optimizer=resolve_optimizer(options.optimizer),
        optimizer_impl=options.update_impl,
        precision=options.precision,
        loss=options.loss,
        grad_accum=options.grad_accum,
        export_mode=export_mode(graph, model.restored),
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
        assumptions=(*_assumptions(graph, model, options, rule), *_eager_lifetimes(graph, model, first, later),
                     *_autocast_lifetimes(model, options, max(first.peak, later.peak)),
                     *_unsized(model), *_checkpointed(blocks)),
        # (both steps simulate the same events: only the live bytes differ)
        timeline=TrainingTimeline(tuple(first.events.phase), tuple(first.events.label), tuple(first.live),
                                  tuple(later.live), _state_series(first), _state_series(later),
                                  _parameters(model)),
    )


def _state_series(run: Run) -> dict[str, tuple[int, ...]]:
    """Give, per model-state category (STATE_SERIES), its live bytes at every event of a run: what sharding
    divides (plan/sharding.py reads them)."""
    def category(b: Buffer) -> str:
        return "update temporaries" if b.category == "temporaries" and b.name.endswith("update temporaries") \
            else b.category

    events = len(run.live)
    return {c: tuple(live_bytes(((b.nbytes, b.start, b.end) for b in run.buffers if category(b) == c), events))
            for c in STATE_SERIES}


def _parameters(model: StepModel) -> tuple[TrainingParameter, ...]:
    """Give every parameter, trainable then frozen, each in the order its first reader runs."""
    rows = []
    for trainable, items in ((True, model.params), (False, model.frozen)):
        for t in items:
            v = model.values[t]
            reader = v.consumers[0] if v.consumers else None
            rows.append((reader if reader is not None else len(model.nodes), TrainingParameter(
                v.name, module_path(model.nodes[reader].layer) if reader is not None else "", v.shape,
                v.numel or 0, trainable)))
    return tuple(row for _, row in sorted(rows, key=lambda r: r[0]))


def training_warnings(report: TrainingReport) -> list[Warning]:
    """Give the warnings a training report carries: what the export folded or removed (stated in its assumptions
    as '[code] message'), operators without a backward rule."""
    warnings = []
    for note in report.assumptions:
        code, _, message = note[1:].partition("] ")
        if note.startswith("[") and code in (*EXPORT_WARNINGS, "checkpoint-layers"):
            warnings.append(Warning(code, message))
    if report.unknown_backward_ops:
        warnings.append(Warning(
            "unknown-backward",
            f"operators {', '.join(report.unknown_backward_ops)} have no saved-for-backward rule: each is assumed to "
            "keep every float input and output for backward and to allocate a new gradient for every input",
        ))
    return warnings



def _saved_by_op_type(model: StepModel) -> tuple[tuple[str, int], ...]:
    """Give the bytes kept for backward per op type (a storage counted once, by the first op that keeps it)."""
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


def _parameter_groups(model: StepModel) -> tuple[TrainingParameterGroup, ...]:
    """Give the parameters per module path: elements, trainable and frozen bytes."""
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



def _checkpointed(blocks: str) -> tuple[str, ...]:
    """Give the '[checkpoint-layers] message' note naming the blocks checkpoint="layers" checkpoints ('' none)."""
    if not blocks:
        return ()
    return (f"[checkpoint-layers] activation checkpointing per block: {blocks}; each keeps only its inputs in "
            "forward and is recomputed, one block at a time, in backward (torch.utils.checkpoint, "
            "use_reentrant=False); where the model checkpoints other modules, the estimate differs",)


def _unsized(model: StepModel) -> tuple[str, ...]:
    """Give the '[training-unknown-shape] message' note where float tensors of the step have no known size (counted
    as 0 bytes): named as the model names them (the step reads the model as given, not as a provider placed it)."""
    names = [v.name for v in model.values if v.is_float and v.numel is None and v.kind != WEIGHT]
    if not names:
        return ()
    shown = ", ".join(f"'{n}'" for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    count = f"{len(names)} tensors of the training step have" if len(names) > 1 else \
        "1 tensor of the training step has"
    return (f"[training-unknown-shape] {count} no known size, counted as 0 bytes "
            f"(with its gradient and what backward keeps of it), so the step's peak is a "
            f"lower bound: {shown}; bind their dims (--dim) or give the operators that make them shapes",)


def _eager_lifetimes(graph: ModelGraph, model: StepModel, *runs: Run) -> tuple[str, ...]:
    """Give the '[eager-lifetimes] message' note where a step's peak is at a forward op that runs without autograd
    (a frozen part: nothing is kept there, so the peak is what is live at that moment): the step counts each tensor
    freed after its last reader, except a module's arguments (held until the module returns) and, where the export
    carries the exporter's stack traces (Op.frames), a variable a statement binds (held until rebound or its frame
    returns: training/lifetimes.py); eager code may hold others longer (benchmarks/training_zoo_single_ops.py)."""
    for run in runs:
        node = run.peak_event - 1  # (event 0 is the data; each node's forward follows in order)
        if run.peak_phase == "forward" and 0 <= node < len(model.nodes) and not model.differentiable[node]:
            op = model.nodes[node]
            if any(o.frames for o in graph.ops):
                held = ("a module's arguments are counted held until it returns, and a variable a statement binds "
                        "until it is rebound or its function returns, read from the export's stack traces; a tensor "
                        "held otherwise is not (in an attribute or a container, or where the traces do not tell the "
                        "frames apart: Qwen2-MoE's batched_mm experts hold one gathered copy of the expert weights "
                        "while gathering the next)")
            else:
                held = ("a module's arguments are counted held until it returns; Python variables are not, as the "
                        "export carries no stack traces to read them from (the dynamo exporter's "
                        "pkg.torch.onnx.stack_trace: onnxmem.torch.export_for_training keeps them)")
            return (f"[eager-lifetimes] the step's peak is at {op.op_type} {op.name}, which runs without autograd "
                    "(nothing is kept for backward there): each tensor is counted as freed after its last reader, "
                    "but eager model code frees it only when its variable is rebound or the forward holding it "
                    f"returns ({held}), so the peak may be higher than estimated",)
    return ()


# the share of the step's peak from which an fp32 tensor that autocast only casts is named (_autocast_lifetimes)
AUTOCAST_HELD_SHARE = 0.05


def _autocast_lifetimes(model: StepModel, options: TrainingOptions, peak: int) -> tuple[str, ...]:
    """Give the '[eager-lifetimes] message' note where, under autocast, an fp32 activation of at least
    AUTOCAST_HELD_SHARE of the step's peak is read (directly or through views) only by ops that run in 16 bits:
    they keep their 16-bit copy and the step frees the fp32 tensor after its last reader, but eager code frees it
    only when its variable is rebound or its forward returns (in fp32 the op keeps the tensor itself, so the
    variable changes nothing). Measured: transformers' Qwen2-MoE batched_mm experts hold the gathered fp32 gate_up
    copy while gathering down_proj's, 8.2 MB above the estimate (benchmarks/training_zoo_amp_ops.py experts_bmm)."""
    if not options.precision.startswith("amp-") or peak <= 0:
        return ()
    readers: dict[int, set[str]] = {}
    for n, node in enumerate(model.nodes):
        out = node.outputs[0] if node.outputs else -1
        for t in node.inputs:
            if t >= 0 and model.differentiable[n] and (out < 0 or model.root[out] != model.root[t]):
                readers.setdefault(model.root[t], set()).add(node.op_type)
    held = []
    for r, ops in readers.items():
        v = model.values[r]
        if v.kind in (WEIGHT, INPUT) or not v.is_float or not v.numel or v.nbytes // v.numel != 4 \
                or r in model.saved_by or v.nbytes < AUTOCAST_HELD_SHARE * peak:
            continue
        if ops <= AUTOCAST_LOW_PRECISION:
            held.append(v)
    if not held:
        return ()
    held.sort(key=lambda v: -v.nbytes)
    shown = ", ".join(f"'{v.name}' ({v.nbytes:,} B)" for v in held[:3]) + \
        (f" and {len(held) - 3} more" if len(held) > 3 else "")
    return (f"[eager-lifetimes] under autocast {len(held)} fp32 tensor(s) of at least "
            f"{int(AUTOCAST_HELD_SHARE * 100)}% of the peak are read only by ops that run in 16 bits (which keep "
            f"their 16-bit copy): {shown}; each is counted as freed after its last reader, but eager model code "
            "frees it only when its variable is rebound or the forward holding it returns (Qwen2-MoE's batched_mm "
            "experts hold the gathered fp32 expert weights while gathering the next), so the peak may be higher "
            "than estimated by up to their size",)


def _assumptions(graph: ModelGraph, model: StepModel, options: TrainingOptions, rule: OptimizerRule) -> \
        tuple[str, ...]:
    """Give what the report assumes, and the export's warnings as '[code] message'."""
    mode = export_mode(graph, model.restored)
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
        copies = (model.restored or Restored()).p0_copies
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
    notes.extend(export_findings(model.restored, model.values, mode))
    if model.unmatched:
        notes.append(f"[unmatched-pattern] no parameter's name or module path matches {', '.join(model.unmatched)}"
                     f": {'it changes' if len(model.unmatched) == 1 else 'they change'} nothing (the report's "
                     "parameter groups list the module paths)")
    notes.extend(options.device_model.unmodelled(model.nodes, model.values, model.needs_grad, model.differentiable,
                                                 options.precision))
    if model.reenabling_modules:
        notes.append(f"[grad-reenabled] {', '.join(model.reenabling_modules)} make(s) its input require a gradient "
                     "in train mode (transformers: `hidden_states.requires_grad = True` unless "
                     "model.freeze_feature_encoder() was called), so its frozen ops keep their activations and are "
                     "counted; after freeze_feature_encoder() the estimate is high by those activations")
    if model.tied_patterns:
        notes.append(f"[tied-weight-pattern] {'; '.join(model.tied_patterns)}: a weight tied to another module "
                     "is listed once by PyTorch's named_parameters, under the module that registered it first, so "
                     "a pattern applied to named_parameters does not reach it by the other name; it is matched by "
                     "named_parameters' name here (a module's requires_grad_() would reach it by either)")
    if options.precision.startswith("amp-"):
        notes.append("mixed precision: fp32 master weights, gradients and optimizer state; MatMul/Gemm/Conv run in "
                     "16 bits on 16-bit copies of their inputs and weights; Softmax, LayerNorm and the loss in fp32")
    if options.accumulates:
        notes.append("gradient accumulation: activations at the micro-batch; "
                     "from the second micro-step on, parameter gradients are live through forward")
    return tuple(notes)


