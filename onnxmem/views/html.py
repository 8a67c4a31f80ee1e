"""One self-contained HTML page: the report, its pictures as inline SVG, and the live set at the peak.

The page has no script, no stylesheet link and no image file: it opens from disk in any browser, with no server
and no network. The charts are drawn here as plain SVG, so the page needs no optional extra.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from onnxmem.views.document import Answer, Block, Heading, Title, html_table, to_html
from onnxmem.views.render import (
    check_blocks,
    fit_blocks,
    format_bytes,
    format_tick,
    report_blocks,
)
from onnxmem.views.report import Arithmetic, CheckResult, FitResult, Report
from onnxmem.views.series import (
    CurveAxes,
    TimelineSeries,
    aggregated,
    byte_unit,
    curve_axes,
    round_ticks,
    verdict_parts,
)

# the plot area is [_PAD_L, _W - _PAD_R] x [_PAD_T, _H - _PAD_B]; the legend is drawn above it, phase names and the
# x axis's name below it
_W, _H, _PAD_L, _PAD_R, _PAD_T, _PAD_B = 900, 330, 80, 20, 36, 58
_HEADROOM = 1.12  # the y axis reaches past the peak, so that the peak's label sits inside the plot
_CHAR = 6.4  # the width of a character of an 11 px label, at most (sans-serif digits and lower case): for layout
_PHASE_COLOURS = {"forward": "#4c72b0", "data": "#8c8c8c", "loss": "#dd8452", "backward": "#c44e52",
                  "optimizer": "#55a868"}
# The page fits a laptop's window (1280 px and narrower): a column of at most 1180 px, pictures scaled to it, tables
# whose long names break anywhere rather than widen the page.
_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em auto;padding:0 1em;max-width:1180px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:1.4em}code{font-size:12px}
h1,h2,p,li,code,td.w{overflow-wrap:anywhere}
table{border-collapse:collapse;font-size:13px;max-width:100%}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;white-space:nowrap}
svg{display:block;width:100%;max-width:900px;height:auto;background:#fff;border:1px solid #ddd}
.answer p{margin:.15em 0}.answer .verdict{font-size:17px;font-weight:bold}.answer .arithmetic{margin-left:1.5em}
.fits .verdict{color:#2a7a2a}.nofit .verdict{color:#b22}"""


def _page_of(blocks: list[Block], pictures: list[str], title: str) -> str:
    """Give a page: the title and the answers (the blocks' first), the pictures, then the rest of the blocks."""
    lead = 0
    while lead < len(blocks) and isinstance(blocks[lead], (Title, Answer)):
        lead += 1
    return _page(title, [*to_html(blocks[:lead]), *pictures, *to_html(blocks[lead:])])


def report_page(report: Report, timeline: TimelineSeries | None = None) -> str:
    """Give the page of a report: the answer, the memory timeline, the live set at the peak (the training step's
    first where there is one: it is the answer's), then every other table of the text as a table."""
    pictures = ["<h2>Memory over the run</h2>", svg_timeline(timeline)] if timeline is not None else []
    t, inf = report.training, report.inference
    if t is not None:
        pictures += [f"<h2>Live at the training peak ({escape(t.peak_phase)} of the {escape(t.peak_step)} step, "
                     f"{escape(t.peak_event)}: {escape(format_bytes(t.peak_bytes))})</h2>",
                     html_table(("category", "size", "buffers", "largest"),
                                [(r.category, format_bytes(r.bytes), str(r.buffers), r.largest)
                                 for r in t.live_at_peak], right=(1, 2), wrap_columns=(3,))]
    where = "inference peak" if t is not None else "peak"
    pictures += [f"<h2>Live at the {where} ({escape(inf.peak_op_type)} node {escape(inf.peak_node)}, "
                 f"{escape(format_bytes(inf.peak_activation_bytes))} of activations)</h2>",
                 html_table(("tensor", "shape", "dtype", "size", "producer"),
                            [(r.name, _shape(r.shape), r.dtype, format_bytes(r.bytes), f"{r.op_type} {r.producer}")
                             for r in inf.live_at_peak], right=(3,), code=(0, 4))]
    blocks = _without(report_blocks(report, top=20), ("Live at the peak", "Live at the training peak"))
    return _page_of(blocks, pictures, f"onnxmem report: {report.model}")


def _without(blocks: list[Block], headings: tuple[str, ...]) -> list[Block]:
    """Give the blocks less the sections whose heading starts with one of `headings` (drawn apart on the page)."""
    kept: list[Block] = []
    dropping = False
    for block in blocks:
        if isinstance(block, Heading):
            dropping = block.text.startswith(headings)
        if not dropping:
            kept.append(block)
    return kept


def fit_page(result: FitResult, timeline: TimelineSeries | None = None) -> str:
    """Give the page of a fit: the answer and its sums (drawn), the curve with the budget line, the timeline at the
    answer, then the tables."""
    pictures = []
    if result.arithmetic is not None:
        pictures += [f"<h2>The sums at {escape(result.dim)}={max(result.max_value, result.step)}</h2>",
                     svg_verdict(result.arithmetic)]
    pictures += [f"<h2>Memory against {escape(result.dim)}</h2>", svg_curve(result)]
    if timeline is not None:
        pictures += [f"<h2>Memory over the run at {escape(result.dim)}={max(result.max_value, result.step)}</h2>",
                     svg_timeline(timeline, result.budget_bytes)]
    return _page_of(fit_blocks(result), pictures, f"onnxmem fit: {result.model}")


def check_page(result: CheckResult, timeline: TimelineSeries | None = None) -> str:
    """Give the page of a check: the verdict and its sums (drawn: FITS or DOES NOT FIT, the headroom), the timeline
    against the budget, then the tables."""
    pictures = ["<h2>The verdict's sums</h2>", svg_verdict(result.arithmetic)]
    if timeline is not None:
        pictures += ["<h2>Memory over the run</h2>", svg_timeline(timeline, result.budget_bytes)]
    return _page_of(check_blocks(result), pictures, f"onnxmem check: {result.model}")


def svg_verdict(a: Arithmetic) -> str:
    """Give an inline SVG of a verdict's sums: what is needed (the peak, then the allocator's rounding) over the
    memory (the budget, then the fixed costs), the budget line between them, the headroom (or the shortfall)
    marked, and FITS or DOES NOT FIT above (series.verdict_parts: the same parts the PNG draws)."""
    width, left, right = _W, 90, 20
    parts_of = verdict_parts(a)
    top = max(a.memory_bytes, a.required_bytes, 1)
    x = _axis(0, round_ticks(top, byte_unit(top))[-1], left, width - right)  # (the PNG's axis: draw_verdict)
    rows = {"needs": 48, "memory": 88}
    out = [f'<text x="{left}" y="22" font-size="16" font-weight="bold" '
           f'fill="{"#2a7a2a" if a.fits else "#b22222"}">{"FITS" if a.fits else "DOES NOT FIT"}: '
           f"{escape(parts_of.caption)}</text>"]
    for name, y in rows.items():
        out.append(f'<text x="{left - 8}" y="{y + 13}" font-size="12" text-anchor="end">{name}</text>')
    for part in parts_of.bars:
        y = rows[part.row]
        x0, x1 = x(part.start), x(part.start + part.bytes)
        out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="18" fill="{part.colour}" '
                   f'fill-opacity="{part.opacity}" stroke="{part.colour}"><title>{escape(part.label)}</title></rect>')
    bx = x(a.budget_bytes)
    out.append(f'<line x1="{bx:.1f}" y1="{rows["needs"] - 8}" x2="{bx:.1f}" y2="{rows["memory"] + 26}" '
               'stroke="#c44e52" stroke-dasharray="6 4"/>')
    # the legend: one entry per part, laid out left to right, a new row where the next would not fit
    lx, ly = float(left), 136
    for part in parts_of.bars:
        text = part.label
        room = 16 + _CHAR * len(text) + 18
        if lx + room > width - right and lx > left:
            lx, ly = float(left), ly + 18
        out.append(f'<rect x="{lx:.1f}" y="{ly - 10}" width="11" height="11" fill="{part.colour}" '
                   f'fill-opacity="{part.opacity}" stroke="{part.colour}"/>'
                   f'<text x="{lx + 16:.1f}" y="{ly}" font-size="11">{escape(text)}</text>')
        lx += room
    height = ly + 14
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img"><title>'
            f'{escape(parts_of.caption)}</title>{"".join(out)}</svg>')


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
    base_box = None  # (left, right, baseline y) of its label, which the peak's label must not cover
    if base:  # what the whole run holds (weights and inputs), in grey under the bars
        text = f"weights + inputs {format_bytes(base)}" + (f" (axis from {format_bytes(floor)})" if floor else "")
        if series.past_cache_bytes:
            text += f", of which past KV cache {format_bytes(series.past_cache_bytes)}"
        base_y = min(y(floor) - 4, y(base) + 13)
        base_box = (_PAD_L + 6, _PAD_L + 6 + _CHAR * len(text), base_y)
        past = min(series.past_cache_bytes, base - floor)
        if past > 0:  # a decoder's past KV cache: the top of the inputs' band
            parts.append(f'<rect x="{_PAD_L}" y="{y(base):.1f}" width="{_W - _PAD_R - _PAD_L}" '
                         f'height="{y(base - past) - y(base):.1f}" fill="#8172b3" fill-opacity="0.45"><title>past KV '
                         f"cache (inputs): {escape(format_bytes(series.past_cache_bytes))}</title></rect>")
        parts.append(f'<rect x="{_PAD_L}" y="{y(base):.1f}" width="{_W - _PAD_L - _PAD_R}" '
                     f'height="{y(floor) - y(base):.1f}" fill="#bbbbbb" fill-opacity="0.5"><title>weights and '
                     f"inputs: {escape(format_bytes(base))}</title></rect>"
                     f'<text x="{_PAD_L + 6}" y="{base_y:.1f}" font-size="11" fill="#444">{escape(text)}</text>')
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
    peak_box = None
    if n:
        peak = series.live_bytes[series.peak_index]
        px, py = x(series.peak_index + 0.5), y(peak)
        parts.append(f'<path d="M{px - 5:.1f},{py - 9:.1f} L{px + 5:.1f},{py - 9:.1f} L{px:.1f},{py - 1:.1f} Z" '
                     'fill="#c44e52"/>')
        anchor = "end" if px > _W / 2 else "start"
        label_x = px - 8 if anchor == "end" else px + 8
        text = f"peak {format_bytes(peak)}: {_short(series.peak_label)}"
        label_y = max(py - 4, _PAD_T + 11)
        if budget_bytes is not None and label_y - 12 <= y(budget_bytes) <= label_y + 3:  # the line would cross it
            label_y = max(y(budget_bytes) - 4, _PAD_T + 11)
        span = _CHAR * len(text)
        left_x = label_x - span if anchor == "end" else label_x
        if base_box is not None and left_x < base_box[1] and base_box[0] < left_x + span and \
                abs(label_y - base_box[2]) < 13:  # over the weights' label: above it
            label_y = max(base_box[2] - 14, _PAD_T + 11)
        peak_box = (label_x - span if anchor == "end" else label_x, label_x if anchor == "end" else label_x + span,
                    label_y)
        parts.append(f'<text x="{label_x:.1f}" y="{label_y:.1f}" font-size="11" text-anchor="{anchor}" '
                     f'fill="#222">{escape(text)}</text>')
    if budget_bytes is not None:  # its label above the line, or below it where the peak's label is there
        by = y(budget_bytes)
        right = _W - _PAD_R - 4
        left = right - _CHAR * len(_budget_text(budget_bytes))
        below = peak_box is not None and peak_box[0] < right and left < peak_box[1] and \
            abs((by - 4) - peak_box[2]) < 13
        parts.append(_budget_line(by, budget_bytes, below=below))
    if len(phases) > 1:  # the legend: above the plot area, never under a label drawn inside it
        for k, phase in enumerate(phases):
            parts.append(f'<rect x="{_PAD_L + 90 * k}" y="{_PAD_T - 24}" width="10" height="10" '
                         f'fill="{_PHASE_COLOURS.get(phase, "#4c72b0")}" fill-opacity="0.6"/>'
                         f'<text x="{_PAD_L + 14 + 90 * k}" y="{_PAD_T - 15}" font-size="11">{escape(phase)}</text>')
    return _svg(f"Memory over the run ({series.title})", parts)


def svg_curve(result: FitResult) -> str:
    """Give an inline SVG of the peak (and the bytes required after the allocator's rounding) against the searched
    dim, with the budget line and the answer, on the axes and ticks the PNG has (series.curve_axes: log-log where
    the peak is not linear in the dim); the legend above the plot, as the PNG's."""
    points = list(result.curve)
    axes = curve_axes(result)
    x, y = _curve_place(axes)
    bottom = _H - _PAD_B
    parts = [_curve_grid(axes, y), _x_frame(), _budget_line(y(result.budget_bytes), result.budget_bytes, label=False)]
    parts += [f'<line x1="{x(v):.1f}" y1="{bottom}" x2="{x(v):.1f}" y2="{bottom + 4}" stroke="#444"/>'
              f'<text x="{x(v):.1f}" y="{bottom + 16}" font-size="11" text-anchor="middle">{v:,}</text>'
              for v in axes.x_ticks]
    scale = " (log scale)" if axes.log else ""
    parts.append(f'<text x="{(_PAD_L + _W - _PAD_R) / 2}" y="{_H - 6}" font-size="12" text-anchor="middle">'
                 f"{escape(result.dim + scale)}</text>")
    legend = [("peak (estimate)", "#4c72b0", "")]
    lines = [("peak_bytes", "#4c72b0", "")]
    if any(p.required_bytes != p.peak_bytes for p in points):
        lines.append(("required_bytes", "#dd8452", ' stroke-dasharray="5 3"'))
        legend.append((f"after {result.target.allocator} rounding", "#dd8452", ' stroke-dasharray="5 3"'))
    for attribute, colour, dash in lines:
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(p.value):.1f},{y(getattr(p, attribute)):.1f}"
                        for i, p in enumerate(points))
        parts.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}/>')
    for p in points:
        colour = "#55a868" if p.fits else "#c44e52"
        parts.append(f'<circle cx="{x(p.value):.1f}" cy="{y(p.required_bytes):.1f}" r="2.5" fill="{colour}">'
                     f"<title>{escape(result.dim)}={p.value}: {escape(format_bytes(p.required_bytes))}</title>"
                     "</circle>")
    legend.append((f"budget {format_bytes(result.budget_bytes)}", "#c44e52", ' stroke-dasharray="6 4"'))
    if result.max_value:
        best = next(p for p in points if p.value == result.max_value)
        parts.append(f'<circle cx="{x(best.value):.1f}" cy="{y(best.required_bytes):.1f}" r="6" fill="none" '
                     'stroke="#2a7a2a" stroke-width="2"/>')
        legend.append((f"largest {result.dim} that fits: {result.max_value}", "#2a7a2a", ""))
    parts += _line_legend(legend)
    return _svg(f"Memory against {result.dim}", parts)


def _curve_place(axes: CurveAxes) -> tuple[Callable[[float], float], Callable[[float], float]]:
    if not axes.log:
        return (_axis(0, axes.x_ticks[-1], _PAD_L, _W - _PAD_R), _axis(0, axes.y_ticks[-1], _H - _PAD_B, _PAD_T))
    x_low, x_high = math.log2(axes.x_ticks[0]), math.log2(axes.x_ticks[-1])
    y_low, y_high = math.log2(axes.y_ticks[0]), math.log2(axes.y_ticks[-1])
    x_line = _axis(x_low, x_high, _PAD_L, _W - _PAD_R)
    y_line = _axis(y_low, y_high, _H - _PAD_B, _PAD_T)
    return (lambda v: x_line(math.log2(max(v, 1e-9))), lambda v: y_line(math.log2(max(v, 1e-9))))


def _curve_grid(axes: CurveAxes, y: Callable[[float], float]) -> str:
    return "".join(f'<line x1="{_PAD_L}" y1="{y(v):.1f}" x2="{_W - _PAD_R}" y2="{y(v):.1f}" stroke="#e4e4e4"/>'
                   f'<text x="{_PAD_L - 6}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">'
                   f"{escape(format_tick(v, axes.y_unit or byte_unit(v)))}</text>" for v in axes.y_ticks)


def _line_legend(entries: Sequence[tuple[str, str, str]]) -> list[str]:
    """Give a legend of lines in one row above the plot area (a second row where the first is full)."""
    parts, lx, ly = [], float(_PAD_L), _PAD_T - 20
    for text, colour, dash in entries:
        room = 26 + _CHAR * len(text) + 14
        if lx + room > _W - _PAD_R and lx > _PAD_L:
            lx, ly = float(_PAD_L), ly + 13
        parts.append(f'<line x1="{lx:.1f}" y1="{ly - 4}" x2="{lx + 20:.1f}" y2="{ly - 4}" stroke="{colour}" '
                     f'stroke-width="2"{dash}/><text x="{lx + 26:.1f}" y="{ly}" font-size="11">{escape(text)}</text>')
        lx += room
    return parts


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


def _budget_line(y: float, budget: int, label: bool = True, below: bool = False) -> str:
    line = (f'<line x1="{_PAD_L}" y1="{y:.1f}" x2="{_W - _PAD_R}" y2="{y:.1f}" stroke="#c44e52" '
            'stroke-dasharray="6 4"/>')
    if not label:
        return line
    return line + (f'<text x="{_W - _PAD_R - 4}" y="{y + 13 if below else y - 4:.1f}" font-size="11" '
                   f'text-anchor="end" fill="#c44e52">{escape(_budget_text(budget))}</text>')


def _budget_text(budget: int) -> str:
    return f"budget {format_bytes(budget)}"


def _svg(title: str, parts: Sequence[str]) -> str:
    return (f'<svg width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
            f'role="img"><title>{escape(title)}</title>{"".join(parts)}</svg>')


def _page(title: str, body: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def _shape(shape: Sequence[object] | None) -> str:
    return "?" if shape is None else "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _short(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
