"""Render reports as a terminal table, JSON or markdown: the only place sizes become text."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from onnxmem.views.document import (
    Answer,
    Block,
    Bullets,
    Heading,
    Para,
    Table,
    Title,
    text_table,
    to_markdown,
    to_text,
)
from onnxmem.views.report import (
    Arithmetic,
    CheckResult,
    FitResult,
    Report,
    Sharding,
    Target,
    TrainingReport,
    Warning,
    WhatIf,
    field_names,
    plain,
)
from onnxmem.views.safe import markdown_text

if TYPE_CHECKING:
    from onnxmem.measure.validate import Validation

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int | None) -> str:
    """Give a size for people: '12.0 MiB'; exact bytes under 1 KiB; 'unknown' for None."""
    if n is None:
        return "unknown"
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{n} B" if unit == 0 else f"{value:.2f} {_UNITS[unit]}"


def format_tick(n: int, unit: int) -> str:
    """Give an axis tick for people: `n` bytes in `unit` (1, KiB, MiB, ...; series.byte_unit) with no trailing
    zeros: '0', '2.5 MiB', '200 MiB'."""
    if n == 0:
        return "0"
    name = _UNITS[max(0, unit.bit_length() - 1) // 10]
    return f"{n / unit:.3f}".rstrip("0").rstrip(".") + f" {name}"


def render(report: Report, fmt: str, top: int = 10, timeline: bool = False, width: int | None = None) -> str:
    """Give the report in the named format: table, json or markdown (`timeline`: JSON with the timelines, see
    Report.to_dict)."""
    if fmt == "json":
        return json_text(report.to_dict(timeline=True)) if timeline else render_json(report)
    if fmt == "markdown":
        return render_markdown(report, top)
    return render_table(report, top, width)


def render_json(report: Report) -> str:
    """Give the report as its versioned JSON document (report.to_dict(), written)."""
    return json_text(report)


def json_text(value: object) -> str:
    """Give json.dumps(report.plain(value), indent=2): the same text, made faster (the standard library writes
    indented JSON in pure Python, generator by generator, after plain() has copied every dataclass into a dict;
    this reads the dataclasses as it writes them)."""
    try:
        return _json(value, "\n")
    except _NotPlain:
        return json.dumps(plain(value), indent=2)


class _NotPlain(Exception):
    """A value json_text leaves to json.dumps: a dict key that is not a str, a type JSON does not know."""


def _json(value: object, pad: str) -> str:
    kind = type(value)
    if kind is dict:
        if not value:
            return "{}"
        inner = pad + "  "
        items = []
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                raise _NotPlain
            items.append(f"{inner}{_json_string(key)}: {_json(item, inner)}")
        return "{" + ",".join(items) + pad + "}"
    if kind is list or kind is tuple:
        if not value:
            return "[]"
        inner = pad + "  "
        return "[" + ",".join([inner + _json(item, inner) for item in value]) + pad + "]"  # type: ignore[attr-defined]
    if kind is str:
        return _json_string(value)  # type: ignore[arg-type]
    if kind is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if kind is float and math.isfinite(value):  # type: ignore[arg-type]
        return float.__repr__(value)
    names = field_names(kind)  # type: ignore[arg-type]  # classes are hashable
    if names is not None:  # a dataclass: the dict plain() makes of it, written as it is read
        if not names:
            return "{}"
        inner = pad + "  "
        items = []
        for name in names:  # (a field name is an identifier: written as json writes it, in quotes)
            item = getattr(value, name)
            of = type(item)
            text = int.__repr__(item) if of is int else _json_string(item) if of is str else _json(item, inner)
            items.append(f'{inner}"{name}": {text}')
        return "{" + ",".join(items) + pad + "}"
    if isinstance(value, (dict, list, tuple)):
        raise _NotPlain
    return json.dumps(value)  # NaN, Infinity, a subclass of a builtin: json's own words; else its TypeError


_json_string = json.encoder.encode_basestring_ascii  # as json.dumps writes strings (ensure_ascii)


def _shape(shape: Sequence[object] | None) -> str:
    if shape is None:
        return "?"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> list[str]:
    return text_table(headers, rows, right)


def _write(blocks: Sequence[Block], fmt: str, width: int | None) -> str:
    return to_markdown(blocks) if fmt == "markdown" else to_text(blocks, width)


def _summary_rows(report: Report) -> list[tuple[str, str, str]]:
    inf = report.inference
    rows = [
        ("weights", format_bytes(inf.weights_bytes), f"{inf.weights_bytes:,} B"),
        ("inputs", format_bytes(inf.input_bytes), f"{inf.input_bytes:,} B"),
        ("peak activations", format_bytes(inf.peak_activation_bytes), f"{inf.peak_activation_bytes:,} B"),
        ("total peak", format_bytes(inf.peak_bytes), f"{inf.peak_bytes:,} B"),
    ]
    if inf.kv_cache_bytes is not None:  # a decoder's: part of the inputs and activations above, not added again
        rows.append(("KV cache (past + present)", format_bytes(inf.kv_cache_bytes), f"{inf.kv_cache_bytes:,} B"))
    return rows


def kv_cache_line(report: Report) -> str | None:
    """Give the KV cache's line (report.inference.kv_cache): its bytes, its past inputs and present outputs, where
    each is counted; None where the model has no KV cache."""
    kv = report.inference.kv_cache
    if kv is None:
        return None
    unsized = f"; {kv.unsized_tensors} cache tensors of unknown size not counted" if kv.unsized_tensors else ""
    return (f"KV cache {format_bytes(kv.bytes)} ({kv.bytes:,} B, {kv.dtype}) = past inputs "
            f"{format_bytes(kv.past_bytes)} ({kv.past_tensors} tensors, in the inputs) + present outputs "
            f"{format_bytes(kv.present_bytes)} ({kv.present_tensors} tensors, among the activations): both held "
            f"when the step ends{unsized}")


def report_answers(report: Report) -> list[Answer]:
    """Give the answer of a report: the peak, where it is, and its sum (weights + inputs + activations live; with
    training, the training step's peak first: model states + all else live)."""
    inf = report.inference
    answers = []
    t = report.training
    if t is not None:
        live = sum(r.bytes for r in t.live_at_peak if r.category not in _STATE_CATEGORIES)
        answers.append(Answer((
            f"training step peak {format_bytes(t.peak_bytes)} in {t.peak_phase} of the {t.peak_step} step",
            f"= model states {format_bytes(t.peak_bytes - live)} (weights, gradients, optimizer) + all else live "
            f"{format_bytes(live)}", f"at {t.peak_event}")))
    answers.append(Answer((
        f"{'inference peak' if t is not None else 'total peak'} {format_bytes(inf.peak_bytes)} at step "
        f"{inf.peak_step} ({inf.peak_op_type} node '{inf.peak_node}')",
        f"= weights {format_bytes(inf.weights_bytes)} + inputs {format_bytes(inf.input_bytes)} + activations live "
        f"{format_bytes(inf.peak_activation_bytes)}")))
    return answers


def report_headline(report: Report) -> list[str]:
    """Give the answer of a report as lines (report_answers' lines, one after another)."""
    return [line for answer in report_answers(report) for line in answer.lines]


_STATE_CATEGORIES = ("weights", "parameter gradients", "optimizer state")
# Warnings about onnxruntime's inference figures, not about a training step's (which PyTorch runs on the model as
# given): the provider's notes, and unknown-shape, which names the inference graph's tensors (a provider's copies
# among them); the step says its own (training-unknown-shape, training/step.py).
INFERENCE_ONLY_WARNINGS = frozenset({"cuda-host-nodes", "cuda-conv-workspace", "cpu-float16-casts", "unknown-shape"})


def report_blocks(report: Report, top: int = 10) -> list[Block]:
    """Give a report as blocks: the answer first (report_answers), then the detail."""
    inf = report.inference
    dims = ", ".join(f"{k}={v}" for k, v in report.dims.items()) or "none"
    out: list[Block] = [Title("report", report.model), *report_answers(report), Para(""),
                        Para(f"dims: {dims}   nodes: {report.nodes}   order: {report.order}   provider: "
                             f"{report.provider}"),
                        Heading("Inference memory"),
                        Table(("part", "size", "bytes"), tuple(_summary_rows(report)), right=(1, 2)),
                        Para(f"peak at step {inf.peak_step}: {inf.peak_op_type} node '{inf.peak_node}'"),
                        Para(f"sum of all activations (what a hand count adds up): "
                             f"{format_bytes(inf.sum_activation_bytes)}; live at once at most: "
                             f"{format_bytes(inf.peak_activation_bytes)}")]
    kv = kv_cache_line(report)
    if kv is not None:
        out.append(Para(kv))
    if inf.host_activation_bytes:
        out.append(Para(f"in host memory, not counted on the device (onnxruntime's CUDA provider): "
                        f"{format_bytes(inf.host_activation_bytes)} of activations"))
    if inf.weights_by_dtype:
        out.append(Para("weights by dtype: " + ", ".join(f"{k} {format_bytes(v)}"
                                                         for k, v in inf.weights_by_dtype.items())))
    out += [Heading(f"Live at the peak (largest {min(top, len(inf.live_at_peak))} of {len(inf.live_at_peak)})"),
            Table(("tensor", "shape", "dtype", "size", "producer"),
                  tuple((t.name, _shape(t.shape), t.dtype, format_bytes(t.bytes), f"{t.op_type} {t.producer}")
                        for t in inf.live_at_peak[:top]), right=(3,), code=(0, 4)),
            Heading("By operator type"),
            Table(("op type", "nodes", "weights", "activations"),
                  tuple((r.op_type, str(r.nodes), format_bytes(r.weight_bytes), format_bytes(r.output_bytes))
                        for r in inf.by_op_type[:top]), right=(1, 2, 3))]
    layers = sorted(inf.by_layer, key=lambda r: -r.peak_live_bytes)[:top]
    if len(inf.by_layer) > 1:
        out += [Heading("Layers with the highest live memory"),
                Table(("layer", "nodes", "weights", "activations", "peak live"),
                      tuple((r.layer, str(r.nodes), format_bytes(r.weight_bytes), format_bytes(r.output_bytes),
                             format_bytes(r.peak_live_bytes)) for r in layers), right=(1, 2, 3, 4), code=(0,))]
    if report.training is not None:
        out += _training_blocks(report.training, top)
    out += warning_blocks(report.warnings, training=report.training is not None, inference_shown=True)
    return out


def render_table(report: Report, top: int = 10, width: int | None = None) -> str:
    """Give the report as text for a terminal in `width` columns (None: document.output_width()): the answer
    first (report_answers), then the detail."""
    return to_text(report_blocks(report, top), width)


def render_markdown(report: Report, top: int = 10) -> str:
    """Give the report as a markdown document (the same blocks as the text)."""
    return to_markdown(report_blocks(report, top))


def _training_blocks(t: TrainingReport, top: int) -> list[Block]:
    """Give the training section: the parts, the step's peak and its phase, the per-phase profile, what-ifs."""

    def size(n: int) -> tuple[str, str]:
        return format_bytes(n), f"{n:,} B"

    trainable = f"{t.trainable_parameters:,} of {t.parameters:,} parameters trainable"
    parts = [("weights", t.weights_bytes), ("gradients", t.gradient_bytes),
             ("optimizer states", t.optimizer_state_bytes), ("saved activations (backward start)",
                                                             t.saved_activation_bytes),
             ("input batch", t.input_bytes), ("peak of the step", t.peak_bytes),
             ("hand formula (params x (2 + states) + 2 x activations)", t.hand_formula_bytes)]
    out: list[Block] = [
        Heading(f"Training memory ({t.optimizer}, {t.precision}, {t.export_mode}-mode export; {trainable})"),
        Table(("part", "size", "bytes"), tuple((name, *size(n)) for name, n in parts), right=(1, 2), wrap=(0,)),
        Para(f"peak in {t.peak_phase} of the {t.peak_step} step, at {t.peak_event}"),
        Heading("Training step by phase (live bytes: peak during the phase, and at its end)")]
    rows = []
    for step in (t.first_step, t.later_step):
        rows += [(step.step, p.phase, format_bytes(p.peak_bytes), format_bytes(p.end_bytes), p.peak_event)
                 for p in step.phases]
    out += [Table(("step", "phase", "peak", "at end", "where"), tuple(rows), right=(2, 3), wrap=(4,)),
            Heading("Live at the training peak"),
            Table(("category", "size", "buffers", "largest"),
                  tuple((r.category, format_bytes(r.bytes), str(r.buffers), r.largest) for r in t.live_at_peak),
                  right=(1, 2), wrap=(3,))]
    if t.saved_by_op_type:
        out += [Heading("Kept for backward, by operator type"),
                Table(("op type", "kept"), tuple((k, format_bytes(v)) for k, v in t.saved_by_op_type[:top]),
                      right=(1,))]
    if t.recompute:
        out += [Heading(f"Recompute in backward instead of keeping (peak then {format_bytes(t.recompute_peak_bytes)})"),
                Table(("node", "op type", "tensor", "kept bytes saved"),
                      tuple((r.node, r.op_type, r.tensor, format_bytes(r.saved_bytes)) for r in t.recompute[:top]),
                      right=(3,), code=(0, 2))]
    if t.checkpoint is not None:
        c = t.checkpoint
        extra = f"{100 * c.extra_forward_flops / c.forward_flops:.0f}%" if c.forward_flops else "?"
        out += [Heading("Activation checkpointing (what-if)"),
                Para(f"{c.segments} segments: peak {format_bytes(c.peak_bytes)} (saves "
                     f"{format_bytes(c.memory_saved_bytes)}), kept for backward "
                     f"{format_bytes(c.saved_activation_bytes)}; extra forward compute {extra} "
                     f"({c.extra_forward_flops:,} of {c.forward_flops:,} FLOPs)")]
    out += [Heading("Assumed"), Bullets(tuple(t.assumptions))]
    return out


# --- Plan: fit and check ----------------------------------------------------------------------------------------


def arithmetic_lines(a: Arithmetic, target: Target, per_gpu: bool = False) -> list[str]:
    """Give a verdict's sums in two lines: what is needed (the peak and the allocator's rounding, named) and the
    budget (the memory less the runtime's fixed costs)."""
    peak = f"peak{' per GPU' if per_gpu else ''} {format_bytes(a.peak_bytes)}"
    rounding = a.allocator_rounding_bytes
    if target.allocator == "exact":
        needs = f"{peak} ({a.rounded_by})"
    else:
        needs = f"{peak} {'-' if rounding < 0 else '+'} {a.rounded_by} {format_bytes(abs(rounding))}"
    budget = f"budget {format_bytes(a.budget_bytes)} = memory {format_bytes(a.memory_bytes)}"
    budget += f" - fixed costs {format_bytes(a.fixed_costs_bytes)} ({target.runtime or 'given'})" \
        if a.fixed_costs_bytes else " (no fixed costs)"
    return [f"needs {format_bytes(a.required_bytes)} = {needs}", budget]


def fit_blocks(result: FitResult) -> list[Block]:
    """Give a fit result as blocks: the answer and its sums at the answer first, then the curve and the what-ifs."""
    dim = result.dim
    others = ", ".join(f"{k}={v}" for k, v in result.dims.items()) or "none"
    lines = [fit_answer(result)]
    a = result.arithmetic
    if a is not None:
        value = result.max_value or result.step
        room = f"headroom {format_bytes(a.headroom_bytes)}" if a.fits else f"short by {format_bytes(-a.headroom_bytes)}"
        at = f"at {dim}={value}: needs {format_bytes(a.required_bytes)}, {room}"
        after = next((p for p in result.curve if p.value == result.max_value + result.step), None)
        if result.max_value and after is not None and not after.fits:
            at += f"; at {after.value}: over by {format_bytes(after.required_bytes - result.budget_bytes)}"
        lines += [at, *arithmetic_lines(a, result.target, result.sharding is not None)]
    out: list[Block] = [Title("fit", result.model), Answer(tuple(lines), result.max_value > 0), Para(""),
                        Para(f"searched: {dim}   other dims: {others}   mode: {result.mode}"
                             + _shard_words(result.sharding)),
                        *_target_blocks(result.target, result.budget_bytes),
                        *(Para(line) for line in sharding_lines(result.sharding))]
    notes = [n for n in result.notes if not n.startswith(("nothing fits", "largest "))]  # (the answer's)
    if notes:
        out.append(Bullets(tuple(notes)))
    if result.linear:
        lin = result.linear
        checked = f"verified at {len(lin.checked_values)} other values" if lin.verified else "not verified"
        out.append(Para(f"peak = {format_bytes(lin.intercept_bytes)} + {format_bytes(lin.slope_bytes)} x {dim}   "
                        f"({lin.intercept_bytes} + {lin.slope_bytes} x {dim} bytes; {checked})"))
    rows = tuple((str(p.value), format_bytes(p.peak_bytes), format_bytes(p.required_bytes), "yes" if p.fits else "no")
                 for p in result.curve if _shown(p.value, result))
    out += [Heading("Memory against " + dim), Table((dim, "peak", "required", "fits"), rows, right=(0, 1, 2))]
    out += _what_if_blocks(result.what_ifs, f"What would let {dim}={result.max_value + result.step} fit")
    out += warning_blocks(result.warnings, training=result.mode == "training")
    return out


def render_fit(result: FitResult, fmt: str, width: int | None = None) -> str:
    """Give a fit result in the named format: table (in `width` columns), json or markdown."""
    if fmt == "json":
        return json_text(result)
    return _write(fit_blocks(result), fmt, width)


def fit_answer(result: FitResult) -> str:
    """Give a fit's answer in one line: the largest value that fits and against what budget, or nothing fits."""
    dim, budget = result.dim, format_bytes(result.budget_bytes)
    if dim == "gpus":  # (the fewest that fit: memory falls as GPUs are added)
        if result.max_value == 0:
            return (f"nothing fits: even {result.search_limit} GPUs need "
                    f"{format_bytes(_point(result, result.search_limit))} each, more than the budget {budget} (what "
                    "does not divide: activations, replicated states)")
        return f"fewest GPUs that fit: {result.max_value} (budget {budget} per GPU)"
    if result.max_value == 0:
        return (f"nothing fits: {dim}={result.step} needs {format_bytes(_point(result, result.step))}, more than the "
                f"budget {budget}")
    if not result.bounded:
        return f"every {dim} up to {result.search_limit} fits in {budget} (the peak barely grows with {dim})"
    return (f"largest {dim} that fits: {result.max_value} (largest power of two: {result.max_power_of_two}; budget "
            f"{budget})")


def check_answer(result: CheckResult) -> str:
    """Give a check's verdict in one line: FITS or DOES NOT FIT, what it needs of the budget, and the headroom."""
    verdict = "FITS" if result.fits else "DOES NOT FIT"
    headroom = "headroom" if result.headroom_bytes >= 0 else "short by"
    return (f"{verdict}: needs {format_bytes(result.required_bytes)} of {format_bytes(result.budget_bytes)} "
            f"({headroom} {format_bytes(abs(result.headroom_bytes))})")


def check_answer_lines(result: CheckResult) -> list[str]:
    """Give a check's verdict (check_answer) and its sums: needs = peak + rounding, budget = memory - fixed
    costs, and where the peak is."""
    return [check_answer(result), *arithmetic_lines(result.arithmetic, result.target, result.sharding is not None),
            f"peak at {result.peak_where} ({result.peak_bytes:,} B)"]


def check_blocks(result: CheckResult) -> list[Block]:
    """Give a check result as blocks: the verdict and its sums first, then the target, the what-ifs, warnings."""
    dims = ", ".join(f"{k}={v}" for k, v in result.dims.items()) or "none"
    out: list[Block] = [Title("check", result.model), Answer(tuple(check_answer_lines(result)), result.fits),
                        Para(""), Para(f"dims: {dims}   mode: {result.mode}" + _shard_words(result.sharding)),
                        *_target_blocks(result.target, result.budget_bytes),
                        *(Para(line) for line in sharding_lines(result.sharding))]
    kv = kv_cache_line(result.report) if result.report is not None else None
    if kv is not None and result.mode == "inference":
        out.append(Para(kv))
    out += _what_if_blocks(result.what_ifs, "What would lower the peak")
    out += warning_blocks(result.warnings, training=result.mode == "training")
    return out


def render_check(result: CheckResult, fmt: str, width: int | None = None) -> str:
    """Give a check result in the named format: table (in `width` columns), json or markdown."""
    if fmt == "json":
        return json_text(result)
    return _write(check_blocks(result), fmt, width)


def target_label(target: Target, budget: int) -> str:
    """Give what a budget figure includes, in one line: memory, fixed costs taken off, allocator."""
    reserve = " + ".join(f"{r.name} {format_bytes(r.bytes)}" for r in target.reserve) or "no fixed costs"
    where = target.gpu or "memory"
    return f"{where} {format_bytes(target.memory_bytes)} - ({reserve}) = budget {format_bytes(budget)}; " \
           f"allocator: {target.allocator}"


def _target_blocks(target: Target, budget: int) -> list[Block]:
    return [Heading("Target"), Para(target_label(target, budget)),
            Bullets((f"memory: {target.memory_source}",
                     *(f"{r.name} {format_bytes(r.bytes)}: {r.source}" for r in target.reserve),
                     f"allocator {target.allocator}: {target.allocator_rule}"))]


def sharding_lines(s: Sharding | None) -> list[str]:
    """Give the lines that say what one GPU holds when the states are sharded (none unsharded)."""
    if s is None:
        return []
    lines = [f"model states per GPU: {format_bytes(s.per_gpu_bytes)}: weights {format_bytes(s.weights_bytes)}, "
             f"gradients {format_bytes(s.gradient_bytes)}, optimizer states {format_bytes(s.optimizer_state_bytes)}, "
             f"gathered {format_bytes(s.gathered_bytes)} (one GPU alone: {format_bytes(s.unsharded_bytes)})"]
    if s.peak_bytes:
        lines.append(f"per GPU at the peak: activations and the rest {format_bytes(s.activation_bytes)} (update "
                     f"temporaries over one shard: {format_bytes(s.update_temporary_bytes)}) at {s.peak_event}")
    if s.gathered_unit:
        lines.append(f"gathered unit: {s.gathered_unit} ({s.gathered_parameters:,} parameters)")
    if s.offload != "none" or s.cpu_bytes:
        lines.append(f"offload: {s.offload}; CPU memory per node {format_bytes(s.cpu_bytes)} (DeepSpeed's estimate, "
                     "with its 1.5 buffer factor)")
    return lines


def _shard_words(sharding: Sharding | None) -> str:
    return f"   sharding: {sharding.stage} over {sharding.gpus} GPUs (per-GPU figures)" if sharding else ""


def _shown(value: int, result: FitResult) -> bool:
    # the table shows powers of two (of the multiplier, with a step), the answer and the value after it; JSON has
    # every value evaluated
    multiple = value // result.step
    return multiple & (multiple - 1) == 0 or value in (result.max_value, result.max_value + result.step)


def _point(result: FitResult, value: int) -> int:
    return next((p.required_bytes for p in result.curve if p.value == value), 0)


def _what_if_blocks(what_ifs: Sequence[WhatIf], title: str) -> list[Block]:
    if not what_ifs:
        return []
    judged = any(w.fits is not None for w in what_ifs)  # a budget to fit: say whether each change alone fits
    headers = ("change", "peak", "saves", *(("fits",) if judged else ()), "how")
    rows = tuple((w.change, format_bytes(w.peak_bytes), format_bytes(w.saved_bytes),
                  *((("yes" if w.fits else "no"),) if judged else ()), w.detail) for w in what_ifs)
    return [Heading(title), Table(headers, rows, right=(1, 2), wrap=(0, len(headers) - 1))]


def shown_warnings(warnings: Sequence[Warning], training: bool, inference_shown: bool = False) \
        -> tuple[list[Warning], list[Warning]]:
    """Give the warnings an answer shows, as (about the answer, about the inference figures alone): on a training
    answer, onnxruntime's inference notes (INFERENCE_ONLY_WARNINGS) are not about the step: a report, which also
    shows the inference figures, lists them apart; fit and check, whose answer is the step's, leave them out (JSON
    keeps every warning)."""
    if not training:
        return list(warnings), []
    inference = [w for w in warnings if w.code in INFERENCE_ONLY_WARNINGS]
    return [w for w in warnings if w.code not in INFERENCE_ONLY_WARNINGS], inference if inference_shown else []


def warning_blocks(warnings: Sequence[Warning], training: bool = False, inference_shown: bool = False) -> list[Block]:
    """Give the Warnings section (see shown_warnings: a training answer's inference notes apart or left out)."""
    about, inference = shown_warnings(warnings, training, inference_shown)
    out: list[Block] = []
    if about:
        out += [Heading("Warnings"), Bullets(tuple(str(w) for w in about))]
    if inference:
        out += [Heading("Warnings about the inference figures (not the training step)"),
                Bullets(tuple(str(w) for w in inference))]
    return out


def _markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(markdown_text(c) for c in r) + " |" for r in rows)]


TARGETS_SCHEMA = "onnxmem.targets/1"


def targets_document() -> dict[str, object]:
    """Give the GPU catalog, the runtimes' fixed costs and the allocators as a JSON-ready document (schema
    onnxmem.targets/1; sizes in bytes)."""
    from onnxmem.plan.fit import ALLOCATORS, RUNTIMES
    from onnxmem.plan.gpus import GPUS

    return {
        "schema": TARGETS_SCHEMA,
        "gpus": [{"name": g.name, "memory_bytes": g.memory_bytes, "source": g.source} for g in GPUS.values()],
        "runtimes": [{"name": r.name, "allocator": r.allocator,
                      "fixed_costs": [{"name": c.name, "bytes": c.bytes, "source": c.source} for c in r.fixed_costs]}
                     for r in RUNTIMES.values()],
        "allocators": [{"name": a.name, "rule": a.rule} for a in ALLOCATORS.values()],
    }


def render_targets(width: int | None = None) -> str:
    """Give the GPU catalog, the runtimes' fixed costs and the allocators, with where each figure comes from (in
    `width` columns)."""
    from onnxmem.plan.fit import ALLOCATORS, RUNTIMES
    from onnxmem.plan.gpus import GPUS

    blocks: list[Block] = [
        Para("GPUs (--gpu NAME)"),
        Table(("name", "memory", "bytes"), tuple((g.name, format_bytes(g.memory_bytes), f"{g.memory_bytes:,}")
                                                 for g in GPUS.values()), right=(1, 2)),
        *(Para(f"memory: {s}") for s in sorted({g.source for g in GPUS.values()})),
        Heading("Runtimes (--runtime NAME): fixed costs taken off the memory (--reserve SIZE replaces them)")]
    for runtime in RUNTIMES.values():
        blocks += [Para(f"{runtime.name}: allocator {runtime.allocator}"),
                   *(Para(f"{r.name} {format_bytes(r.bytes)}: {r.source}", indent=2) for r in runtime.fixed_costs)]
    blocks += [Heading("Allocators"), *(Para(f"{a.name}: {a.rule}") for a in ALLOCATORS.values())]
    return to_text(blocks, width)


def render_validation(result: Validation, fmt: str, width: int | None = None) -> str:
    """Give a validation (estimate against onnxruntime's allocations) as a table (in `width` columns), JSON or
    markdown."""
    if fmt == "json":
        return json_text(result)
    dims = ", ".join(f"{k}={v}" for k, v in result.dims.items()) or "none"

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:+.2f}%"

    rows = []
    for run in result.runs:
        rows.append((f"run {run.run_index} ({run.phase})", "activations",
                     format_bytes(run.measured.peak_activation_bytes),
                     format_bytes(run.estimated.peak_activation_bytes),
                     f"{run.activation_difference_bytes:+,} B", pct(run.activation_difference_percent)))
        rows.append(("", "weights in arena", format_bytes(run.measured.weights_bytes),
                     format_bytes(run.estimated.weights_bytes), f"{run.weights_difference_bytes:+,} B", ""))
    verdict = "exact: every run agrees to the byte" if result.exact else "differs: see the notes"
    blocks: list[Block] = [
        Title("validate", result.model), Para(""),
        Para(f"provider: {result.provider}   opt level: {result.opt_level}   dims: {dims}   nodes run: "
             f"{result.nodes_run}"), Para(""),
        Table(("run", "part", "measured", "estimated", "difference", "%"), tuple(rows), right=(2, 3, 4, 5)),
        Para(""),
        Para(f"{verdict}; `onnxmem report` on the model as given estimates "
             f"{format_bytes(result.raw_estimate.peak_activation_bytes)} of activations"), Para(""),
        Bullets(("settings: " + ", ".join(f"{k}={v}" for k, v in result.settings.items()),
                 *(f"note: {note}" for note in result.notes))),
        *warning_blocks(result.warnings)]
    return _write(blocks, fmt, width)
