"""One self-contained HTML page: the report, its pictures as inline SVG, and the live set at the peak.

The page has no script, no stylesheet link and no image file: it opens from disk in any browser, with no server
and no network. The charts are drawn here as plain SVG, so the page needs no optional extra.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from onnxmem.views.render import (
    check_answer,
    fit_answer,
    format_bytes,
    format_tick,
    render_check,
    render_fit,
    render_table,
    report_headline,
)
from onnxmem.views.report import CheckResult, FitResult, Report
from onnxmem.views.series import TimelineSeries, aggregated, byte_unit, round_ticks

# the plot area is [_PAD_L, _W - _PAD_R] x [_PAD_T, _H - _PAD_B]; the legend is drawn above it, phase names and the
# x axis's name below it
_W, _H, _PAD_L, _PAD_R, _PAD_T, _PAD_B = 900, 330, 80, 20, 36, 58
_HEADROOM = 1.12  # the y axis reaches past the peak, so that the peak's label sits inside the plot
_PHASE_COLOURS = {"forward": "#4c72b0", "data": "#8c8c8c", "loss": "#dd8452", "backward": "#c44e52",
                  "optimizer": "#55a868"}
_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1000px;color:#222}
pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
td.n{text-align:right}.fits{color:#2a7a2a}.nofit{color:#b22}svg{background:#fff;border:1px solid #ddd}
p.answer{font-size:17px;margin:.3em 0}"""


def report_page(report: Report, timeline: TimelineSeries | None = None) -> str:
    """Give the page of a report: its text, the memory timeline, and the tensors live at the peak."""
    inf = report.inference
    rows = [(t.name, _shape(t.shape), t.dtype, format_bytes(t.bytes), f"{t.op_type} {t.producer}")
            for t in inf.live_at_peak]
    body = [f"<h1>onnxmem report: {escape(report.model)}</h1>", *_answer(report_headline(report))]
    if timeline is not None:
        body += ["<h2>Memory over the run</h2>", svg_timeline(timeline)]
    t = report.training
    if t is not None:  # the training step's live set is the answer's: it comes first
        body += [f"<h2>Live at the training peak ({escape(t.peak_phase)} of the {escape(t.peak_step)} step, "
                 f"{escape(t.peak_event)}: {escape(format_bytes(t.peak_bytes))})</h2>",
                 _table(("category", "size", "buffers", "largest"),
                        [(r.category, format_bytes(r.bytes), str(r.buffers), r.largest) for r in t.live_at_peak],
                        numeric=(1, 2))]
    where = "inference peak" if t is not None else "peak"
    body += [f"<h2>Live at the {where} ({escape(inf.peak_op_type)} node {escape(inf.peak_node)}, "
             f"{escape(format_bytes(inf.peak_activation_bytes))} of activations)</h2>",
             _table(("tensor", "shape", "dtype", "size", "producer"), rows, numeric=(3,)),
             "<h2>Report</h2>", _details(render_table(report, top=20), 1 + len(report_headline(report)))]
    return _page(f"onnxmem report: {report.model}", body)


def fit_page(result: FitResult, timeline: TimelineSeries | None = None) -> str:
    """Give the page of a fit: the curve with the budget line, the timeline at the answer, and the text."""
    body = [f"<h1>onnxmem fit: {escape(result.model)}</h1>",
            f'<p class="answer {"fits" if result.max_value else "nofit"}"><b>{escape(fit_answer(result))}</b></p>',
            f"<h2>Memory against {escape(result.dim)}</h2>", svg_curve(result)]
    if timeline is not None:
        body += [f"<h2>Memory over the run at {escape(result.dim)}={max(result.max_value, result.step)}</h2>",
                 svg_timeline(timeline, result.budget_bytes)]
    body += ["<h2>Details</h2>", _details(render_fit(result, "table"), 2)]
    return _page(f"onnxmem fit: {result.model}", body)


def check_page(result: CheckResult, timeline: TimelineSeries | None = None) -> str:
    """Give the page of a check: the verdict, the timeline against the budget, and the text."""
    verdict = (f'<p class="answer {"fits" if result.fits else "nofit"}"><b>{escape(check_answer(result))}</b><br>'
               f"peak {escape(format_bytes(result.peak_bytes))} at {escape(result.peak_where)}</p>")
    body = [f"<h1>onnxmem check: {escape(result.model)}</h1>", verdict]
    if timeline is not None:
        body += ["<h2>Memory over the run</h2>", svg_timeline(timeline, result.budget_bytes)]
    body += ["<h2>Details</h2>", _details(render_check(result, "table"), 3)]
    return _page(f"onnxmem check: {result.model}", body)


_BARS = 600  # a timeline is drawn in at most this many bars (see series.aggregated): the page stays small


def svg_timeline(series: TimelineSeries, budget_bytes: int | None = None) -> str:
    """Give an inline SVG of live bytes per step, coloured by phase and named under the bars, the peak marked and
    labelled inside the plot, the legend above it (a long run in at most _BARS bars, each the highest of its
    steps)."""
    series = aggregated(series, _BARS)
    n = len(series.live_bytes)
    floor = series.axis_floor  # (a model whose weights dominate: the axis starts just below them)
    ticks = tuple(floor + t for t in _byte_ticks(max([*series.live_bytes, budget_bytes or 0, 1]) - floor))
    edges = [*series.steps, series.total_steps] if series.steps else list(range(n + 1))  # in the run's steps
    place = _axis(0, max(edges[-1], 1), _PAD_L, _W - _PAD_R)

    def x(point: float) -> float:  # a point's left edge (point + 0.5: its middle)
        whole = int(point)
        return place(edges[whole] + (point - whole) * (edges[min(whole + 1, n)] - edges[whole]))

    y = _axis(floor, ticks[-1], _H - _PAD_B, _PAD_T)
    phases = list(dict.fromkeys(series.phases))
    parts = [_y_grid(ticks, y)]
    base = series.baseline_bytes
    if base:  # what the whole run holds (weights and inputs), in grey under the bars
        parts.append(f'<rect x="{_PAD_L}" y="{y(base):.1f}" width="{_W - _PAD_L - _PAD_R}" '
                     f'height="{y(floor) - y(base):.1f}" fill="#bbbbbb" fill-opacity="0.5"><title>weights and '
                     f"inputs: {escape(format_bytes(base))}</title></rect>"
                     f'<text x="{_PAD_L + 6}" y="{min(y(floor) - 4, y(base) + 13):.1f}" font-size="11" fill="#444">'
                     f"weights + inputs {escape(format_bytes(base))}"
                     f"{escape(f' (axis from {format_bytes(floor)})') if floor else ''}</text>")
    for i, value in enumerate(series.live_bytes):
        colour = _PHASE_COLOURS.get(series.phases[i], "#4c72b0")
        bottom = max(base, floor)
        parts.append(f'<rect x="{x(i):.1f}" y="{y(value):.1f}" width="{max(x(i + 1) - x(i), 0.5):.2f}" '
                     f'height="{max(y(bottom) - y(value), 0):.1f}" fill="{colour}" fill-opacity="0.6">'
                     f"<title>{escape(series.labels[i])}: {escape(format_bytes(value))}</title></rect>")
    parts.append(_x_frame())
    if len(phases) > 1:
        parts += _phase_names(series, x, n)
        x_label = "events of a first and a later training step, by phase"
    else:
        parts += _step_ticks(series.total_steps or n, place)
        x_label = "step (node in execution order)"
    parts.append(f'<text x="{(_PAD_L + _W - _PAD_R) / 2}" y="{_H - 6}" font-size="12" text-anchor="middle">'
                 f"{escape(x_label)}</text>")
    if budget_bytes is not None:
        parts.append(_budget_line(y(budget_bytes), budget_bytes))
    if n:
        peak = series.live_bytes[series.peak_index]
        px, py = x(series.peak_index + 0.5), y(peak)
        parts.append(f'<path d="M{px - 5:.1f},{py - 9:.1f} L{px + 5:.1f},{py - 9:.1f} L{px:.1f},{py - 1:.1f} Z" '
                     'fill="#c44e52"/>')
        anchor = "end" if px > _W / 2 else "start"
        label_x = px - 8 if anchor == "end" else px + 8
        parts.append(f'<text x="{label_x:.1f}" y="{max(py - 4, _PAD_T + 11):.1f}" font-size="11" '
                     f'text-anchor="{anchor}" fill="#222">'
                     f"peak {escape(format_bytes(peak))}: {escape(_short(series.peak_label))}</text>")
    if len(phases) > 1:  # the legend: above the plot area, never under a label drawn inside it
        for k, phase in enumerate(phases):
            parts.append(f'<rect x="{_PAD_L + 90 * k}" y="{_PAD_T - 24}" width="10" height="10" '
                         f'fill="{_PHASE_COLOURS.get(phase, "#4c72b0")}" fill-opacity="0.6"/>'
                         f'<text x="{_PAD_L + 14 + 90 * k}" y="{_PAD_T - 15}" font-size="11">{escape(phase)}</text>')
    return _svg(f"Memory over the run ({series.title})", parts)


def svg_curve(result: FitResult) -> str:
    """Give an inline SVG of the peak against the searched dim (linear axes), with the budget line and the
    answer."""
    points = list(result.curve)
    ticks = _byte_ticks(max([p.required_bytes for p in points] + [result.budget_bytes, 1]))
    x_ticks = round_ticks(max(p.value for p in points))
    x = _axis(0, x_ticks[-1], _PAD_L, _W - _PAD_R)
    y = _axis(0, ticks[-1], _H - _PAD_B, _PAD_T)
    parts = [_y_grid(ticks, y), _x_frame(), _budget_line(y(result.budget_bytes), result.budget_bytes)]
    bottom = _H - _PAD_B
    parts += [f'<line x1="{x(v):.1f}" y1="{bottom}" x2="{x(v):.1f}" y2="{bottom + 4}" stroke="#444"/>'
              f'<text x="{x(v):.1f}" y="{bottom + 16}" font-size="11" text-anchor="middle">{v:,}</text>'
              for v in x_ticks]
    parts.append(f'<text x="{(_PAD_L + _W - _PAD_R) / 2}" y="{_H - 6}" font-size="12" text-anchor="middle">'
                 f"{escape(result.dim)}</text>")
    path = " ".join(f"{'M' if i == 0 else 'L'}{x(p.value):.1f},{y(p.required_bytes):.1f}"
                    for i, p in enumerate(points))
    parts.append(f'<path d="{path}" fill="none" stroke="#4c72b0" stroke-width="1.5"/>')
    for p in points:
        colour = "#55a868" if p.fits else "#c44e52"
        parts.append(f'<circle cx="{x(p.value):.1f}" cy="{y(p.required_bytes):.1f}" r="2.5" fill="{colour}">'
                     f"<title>{escape(result.dim)}={p.value}: {escape(format_bytes(p.required_bytes))}</title>"
                     "</circle>")
    if result.max_value:
        best = next(p for p in points if p.value == result.max_value)
        parts.append(f'<text x="{x(best.value) - 6:.1f}" y="{y(best.required_bytes) - 8:.1f}" font-size="11" '
                     f'text-anchor="end">largest {escape(result.dim)} that fits: {best.value}</text>')
    return _svg(f"Memory against {result.dim}", parts)


def _byte_ticks(largest: int) -> tuple[int, ...]:
    return round_ticks(int(largest * _HEADROOM), byte_unit(largest))


def _y_grid(ticks: Sequence[int], y: Callable[[float], float]) -> str:
    unit = byte_unit(ticks[-1])
    return "".join(f'<line x1="{_PAD_L}" y1="{y(v):.1f}" x2="{_W - _PAD_R}" y2="{y(v):.1f}" stroke="#e4e4e4"/>'
                   f'<text x="{_PAD_L - 6}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">'
                   f"{escape(format_tick(v, unit))}</text>" for v in ticks)


def _x_frame() -> str:
    bottom = _H - _PAD_B
    return (f'<line x1="{_PAD_L}" y1="{bottom}" x2="{_W - _PAD_R}" y2="{bottom}" stroke="#444"/>'
            f'<line x1="{_PAD_L}" y1="{_PAD_T}" x2="{_PAD_L}" y2="{bottom}" stroke="#444"/>')


def _phase_names(series: TimelineSeries, x: Callable[[float], float], n: int) -> list[str]:
    """Give each stretch of one phase its name under the bars (where it has room), and a line where the later
    step begins."""
    parts = []
    bottom = _H - _PAD_B
    start = 0
    for i in range(1, n + 1):
        if i < n and series.phases[i] == series.phases[start]:
            continue
        left, right = x(start), x(i)
        name = series.phases[start]
        if right - left >= 6.2 * len(name):
            parts.append(f'<text x="{(left + right) / 2:.1f}" y="{bottom + 14}" font-size="11" '
                         f'text-anchor="middle" fill="{_PHASE_COLOURS.get(name, "#4c72b0")}">{escape(name)}</text>')
        start = i
    half = series.total_steps // 2 if series.steps else n // 2
    if half:
        middle = _axis(0, max(series.total_steps or n, 1), _PAD_L, _W - _PAD_R)(half)
        parts.append(f'<line x1="{middle:.1f}" y1="{_PAD_T}" x2="{middle:.1f}" y2="{bottom + 32}" stroke="#888" '
                     f'stroke-dasharray="3 3"/>'
                     f'<text x="{middle - 6:.1f}" y="{bottom + 30}" font-size="11" text-anchor="end">first step</text>'
                     f'<text x="{middle + 6:.1f}" y="{bottom + 30}" font-size="11">later step</text>')
    return parts


def _step_ticks(steps: int, place: Callable[[float], float]) -> list[str]:
    bottom = _H - _PAD_B
    return [f'<line x1="{place(v):.1f}" y1="{bottom}" x2="{place(v):.1f}" y2="{bottom + 4}" stroke="#444"/>'
            f'<text x="{place(v):.1f}" y="{bottom + 16}" font-size="11" text-anchor="middle">{v:,}</text>'
            for v in round_ticks(max(steps, 1)) if v <= steps]


def _axis(low: float, high: float, start: float, end: float) -> Callable[[float], float]:
    span = (high - low) or 1

    def place(value: float) -> float:
        return start + (value - low) / span * (end - start)

    return place


def _budget_line(y: float, budget: int) -> str:
    return (f'<line x1="{_PAD_L}" y1="{y:.1f}" x2="{_W - _PAD_R}" y2="{y:.1f}" stroke="#c44e52" '
            f'stroke-dasharray="6 4"/><text x="{_W - _PAD_R - 4}" y="{y - 4:.1f}" font-size="11" '
            f'text-anchor="end" fill="#c44e52">budget {escape(format_bytes(budget))}</text>')


def _svg(title: str, parts: Sequence[str]) -> str:
    return (f'<svg width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
            f'role="img"><title>{escape(title)}</title>{"".join(parts)}</svg>')


def _details(text: str, answered: int) -> str:
    """Give the text output as the page's detail, less its first `answered` lines (the title and the answer, which
    head the page)."""
    return f"<pre>{escape(chr(10).join(text.split(chr(10))[answered:]).strip(chr(10)))}</pre>"


def _answer(lines: Sequence[str]) -> list[str]:
    """Give a report's answer (render.report_headline) as the page's first paragraph, its first line in bold."""
    return [f'<p class="answer"><b>{escape(lines[0])}</b>' + "".join(f"<br>{escape(line)}" for line in lines[1:])
            + "</p>"]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{escape(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(title: str, body: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def _shape(shape: Sequence[object] | None) -> str:
    return "?" if shape is None else "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _short(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
