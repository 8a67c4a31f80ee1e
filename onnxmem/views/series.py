"""The series a picture of a run draws, read from a Report's own timeline (never computed a second way)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnxmem.views.report import Report


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
                          baseline_bytes=inference.weights_bytes + inference.input_bytes)


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
