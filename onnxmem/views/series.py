"""The series a picture of a run draws, read from a Report's own timeline (never computed a second way)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnxmem.views.report import Arithmetic, FitResult, Report


@dataclass(frozen=True)
class TimelineSeries:
    """Total bytes live at each point of a run (weights and inputs included), for a plot or a page."""

    title: str
    labels: tuple[str, ...]  # per point: the node (inference) or the event (training)
    phases: tuple[str, ...]  # per point: forward | data | loss | backward | optimizer
    live_bytes: tuple[int, ...]
    peak_index: int
    peak_label: str
    steps: tuple[int, ...] = ()  # per point: its first step in the run, where points aggregate several (else ())
    total_steps: int = 0  # the run's steps (events, for training)
    baseline_bytes: int = 0  # held through the whole run (inference: weights and inputs), drawn as a band apart
    past_cache_bytes: int = 0  # of the baseline, a decoder's past KV cache inputs (drawn as a band of its own)

    @property
    def axis_floor(self) -> int:
        """Give where a picture's byte axis starts: 0, or, where the baseline is most of the peak (a model whose
        weights dominate, which would draw a solid block), a round value just below the baseline."""
        top = max(self.live_bytes, default=0)
        if not self.baseline_bytes or self.baseline_bytes < FLOOR_FROM * top:
            return 0
        step = round_ticks(max(top - self.baseline_bytes, 1), byte_unit(top))[1]
        return (self.baseline_bytes // step) * step


# The share of the peak from which the baseline starts the axis (see TimelineSeries.axis_floor).
FLOOR_FROM = 0.6


def series_of(report: Report) -> TimelineSeries:
    """Give the training step's series where the report has one, else the inference run's."""
    return training_series(report) if report.training is not None else inference_series(report)


def inference_series(report: Report) -> TimelineSeries:
    """Give the inference run's live bytes at every step: weights + inputs + live activations; its maximum is
    report.inference.peak_bytes, at report.inference.peak_step."""
    timeline = report.inference.timeline
    if timeline is None:
        raise ValueError("the report has no inference timeline")
    labels = tuple(f"{op_type} {node}" for op_type, node in zip(timeline.op_types, timeline.nodes, strict=True))
    step = max(report.inference.peak_step, 0)
    inference = report.inference
    return TimelineSeries(_title("inference", report), labels, ("forward",) * len(labels), timeline.live_bytes,
                          step, labels[step] if labels else "", total_steps=len(labels),
                          baseline_bytes=inference.weights_bytes + inference.input_bytes,
                          past_cache_bytes=inference.kv_cache.past_bytes if inference.kv_cache is not None else 0)


def training_series(report: Report) -> TimelineSeries:
    """Give a training step's live bytes event by event, the first step's then a later step's; its maximum is
    report.training.peak_bytes."""
    training = report.training
    if training is None or training.timeline is None:
        raise ValueError("the report has no training timeline")
    timeline = training.timeline
    labels: list[str] = []
    live: list[int] = []
    for run, values in (("first", timeline.first_live_bytes), ("later", timeline.later_live_bytes)):
        labels += [f"{run} step, {event}" for event in timeline.events]
        live += values
    peak = max(range(len(live)), key=live.__getitem__) if live else 0
    return TimelineSeries(_title("training step", report), tuple(labels), timeline.phases * 2, tuple(live), peak,
                          labels[peak] if labels else "", total_steps=len(labels))


def aggregated(series: TimelineSeries, points: int) -> TimelineSeries:
    """Give the series in at most `points` points, each the highest of a run of consecutive steps of one phase
    (so the peak and every phase's own peak stay exact); the series itself where it has no more points."""
    n = len(series.live_bytes)
    if n <= points:
        return series
    width = -(-n // points)
    labels: list[str] = []
    phases: list[str] = []
    live: list[int] = []
    steps: list[int] = []
    start = 0
    while start < n:
        end = min(start + width, n)
        phase = series.phases[start]
        end = next((i for i in range(start + 1, end) if series.phases[i] != phase), end)  # a phase ends a point
        top = max(range(start, end), key=series.live_bytes.__getitem__)
        if start <= series.peak_index < end:
            top = series.peak_index
        labels.append(series.labels[top])
        phases.append(phase)
        live.append(series.live_bytes[top])
        steps.append(start)
        start = end
    peak = steps.index(max(s for s in steps if s <= series.peak_index))
    return TimelineSeries(series.title, tuple(labels), tuple(phases), tuple(live), peak, series.peak_label,
                          tuple(steps), n, series.baseline_bytes)


def _title(what: str, report: Report) -> str:
    bound = ", ".join(f"{k}={v}" for k, v in report.dims.items())
    return f"{what}, {bound}" if bound else what


def round_ticks(largest: int, unit: int = 1) -> tuple[int, ...]:
    """Give 4 to 6 evenly spaced round values from 0, the last at least `largest`: the step is 1, 2, 2.5 or 5 times a
    power of ten of `unit` (bytes: pass the KiB, MiB or GiB the axis is written in, see byte_unit), never a
    fraction of a byte."""
    value = max(largest, 1) / unit
    exponent = math.floor(math.log10(value / 5)) if value > 5 else 0
    for scale in (10 ** (exponent - 1), 10 ** exponent, 10 ** (exponent + 1)):
        for mantissa in (1, 2, 2.5, 5):
            step = mantissa * scale
            if step * unit < 1 or (step * unit) % 1:
                continue
            count = math.ceil(value / step - 1e-9)
            if count <= 5:
                whole = int(step * unit)
                return tuple(whole * i for i in range(max(count, 3) + 1))
    whole = max(1, -(-max(largest, 1) // 5))  # (not reached: 5 x 10^(e+1) always holds the value)
    return tuple(whole * i for i in range(6))


def byte_unit(largest: int) -> int:
    """Give the binary unit (1, KiB, MiB, GiB, TiB) a byte axis up to `largest` is written in."""
    unit = 1
    while largest >= unit * 1024 and unit < 2**40:
        unit *= 1024
    return unit


# --- the pictures of a verdict and of a fit's curve: what the PNG and the HTML page both draw --------------------


@dataclass(frozen=True)
class VerdictBar:
    """One part of a verdict's picture: a stretch of a row ('needs' or 'memory') from `start`, `bytes` long."""

    row: str
    start: int
    bytes: int
    label: str
    colour: str
    opacity: float


@dataclass(frozen=True)
class VerdictParts:
    """A verdict drawn: the caption above, the parts of its two rows (needs: peak, rounding, headroom or
    shortfall; memory: budget, fixed costs)."""

    caption: str
    bars: tuple[VerdictBar, ...]


def verdict_parts(a: Arithmetic) -> VerdictParts:
    """Give the parts a picture of a verdict's sums draws (report.Arithmetic: every figure its own)."""
    from onnxmem.views.render import format_bytes

    bars = []
    rounding = a.allocator_rounding_bytes
    if rounding >= 0:
        bars.append(VerdictBar("needs", 0, a.peak_bytes, f"peak {format_bytes(a.peak_bytes)}", "#4c72b0", 0.7))
        if rounding:
            bars.append(VerdictBar("needs", a.peak_bytes, rounding, f"{a.rounded_by} {format_bytes(rounding)}",
                                   "#dd8452", 0.7))
    else:
        bars.append(VerdictBar("needs", 0, a.required_bytes, f"needs {format_bytes(a.required_bytes)} (peak "
                               f"{format_bytes(a.peak_bytes)} - {a.rounded_by} {format_bytes(-rounding)})",
                               "#4c72b0", 0.7))
    if a.fits:
        bars.append(VerdictBar("needs", a.required_bytes, a.headroom_bytes,
                               f"headroom {format_bytes(a.headroom_bytes)}", "#55a868", 0.25))
    else:
        bars.append(VerdictBar("needs", a.budget_bytes, -a.headroom_bytes,
                               f"short by {format_bytes(-a.headroom_bytes)}", "#c44e52", 0.45))
    bars.append(VerdictBar("memory", 0, a.budget_bytes, f"budget {format_bytes(a.budget_bytes)}", "#8c8c8c", 0.3))
    if a.fixed_costs_bytes:
        bars.append(VerdictBar("memory", a.budget_bytes, a.fixed_costs_bytes,
                               f"fixed costs {format_bytes(a.fixed_costs_bytes)}", "#444444", 0.6))
    room = f"headroom {format_bytes(a.headroom_bytes)}" if a.fits else f"short by {format_bytes(-a.headroom_bytes)}"
    caption = f"needs {format_bytes(a.required_bytes)} of {format_bytes(a.budget_bytes)} ({room})"
    return VerdictParts(caption, tuple(bars))


@dataclass(frozen=True)
class CurveAxes:
    """The axes of a fit's curve: logarithmic (base 2, both) or linear, and their ticks (bytes on y)."""

    log: bool
    x_ticks: tuple[int, ...]
    y_ticks: tuple[int, ...]
    y_unit: int  # linear: the unit every y tick is written in (log: each tick in its own, see tick_unit)


def curve_axes(fit: FitResult) -> CurveAxes:
    """Give the axes a fit's curve is drawn on: a straight line drawn straight, so linear axes where the peak is
    linear in the dim, and where it is not (attention in seq) and the values span more than 64x, both axes
    logarithmic (a power law is a line too) with ticks at powers of two, written as numbers and sizes."""
    xs = [p.value for p in fit.curve] or [1]
    largest = max([p.required_bytes for p in fit.curve] + [fit.budget_bytes, 1])
    if fit.linear is None and len(set(xs)) > 1 and max(xs) / max(min(xs), 1) > 64:
        smallest = max(min([p.peak_bytes for p in fit.curve] + [fit.budget_bytes]), 1)
        return CurveAxes(True, _powers_of_two(max(min(xs), 1), max(xs)), _powers_of_two(smallest, largest), 0)
    return CurveAxes(False, round_ticks(max(xs)), round_ticks(int(largest * 1.12), byte_unit(largest)),
                     byte_unit(largest))


def _powers_of_two(low: int, high: int, most: int = 9) -> tuple[int, ...]:
    """Give powers of two from the one at or below `low` to the one at or above `high`, every k-th so that at most
    `most` are given (the last always reaching `high`)."""
    first, last = max(low, 1).bit_length() - 1, max(high - 1, 1).bit_length()
    every = -(-(last - first + 1) // most)
    exponents = list(range(first, last + 1, every))
    if exponents[-1] < last:
        exponents.append(exponents[-1] + every)
    return tuple(2**e for e in exponents)


def tick_unit(value: int) -> int:
    """Give the unit a log axis's tick is written in: its own (1 GiB, 512 MiB)."""
    return byte_unit(value)
