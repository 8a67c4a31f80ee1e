"""Render reports as a terminal table, JSON or markdown: the only place sizes become text."""

from __future__ import annotations

import json
from collections.abc import Sequence

from .report import Report

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


def render(report: Report, fmt: str, top: int = 10) -> str:
    """Give the report in the named format: table, json or markdown."""
    if fmt == "json":
        return render_json(report)
    if fmt == "markdown":
        return render_markdown(report, top)
    return render_table(report, top)


def render_json(report: Report) -> str:
    """Give the report as its versioned JSON document."""
    return json.dumps(report.to_dict(), indent=2)


def _shape(shape: Sequence[object] | None) -> str:
    if shape is None:
        return "?"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        cells_and_widths = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in cells_and_widths).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _summary_rows(report: Report) -> list[tuple[str, str, str]]:
    inf = report.inference
    rows = [
        ("weights", format_bytes(inf.weights_bytes), f"{inf.weights_bytes:,} B"),
        ("inputs", format_bytes(inf.input_bytes), f"{inf.input_bytes:,} B"),
        ("peak activations", format_bytes(inf.peak_activation_bytes), f"{inf.peak_activation_bytes:,} B"),
        ("total peak", format_bytes(inf.peak_bytes), f"{inf.peak_bytes:,} B"),
    ]
    return rows


def render_table(report: Report, top: int = 10) -> str:
    """Give the report as text for a terminal."""
    inf = report.inference
    dims = ", ".join(f"{k}={v}" for k, v in report.dims.items()) or "none"
    out = [
        f"onnxmem report: {report.model}",
        f"dims: {dims}   nodes: {report.nodes}   order: {report.order}",
        "",
        "Inference memory",
        *_table(("part", "size", "bytes"), _summary_rows(report), right=(1, 2)),
        f"peak at step {inf.peak_step}: {inf.peak_op_type} node '{inf.peak_node}'",
        f"sum of all activations (what a hand count adds up): {format_bytes(inf.sum_activation_bytes)}; "
        f"live at once at most: {format_bytes(inf.peak_activation_bytes)}",
    ]
    if inf.weights_by_dtype:
        out.append("weights by dtype: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in inf.weights_by_dtype.items()))
    out += ["", f"Live at the peak (largest {min(top, len(inf.live_at_peak))} of {len(inf.live_at_peak)})"]
    out += _table(
        ("tensor", "shape", "dtype", "size", "producer"),
        [(t.name, _shape(t.shape), t.dtype, format_bytes(t.bytes), f"{t.op_type} {t.producer}")
         for t in inf.live_at_peak[:top]],
        right=(3,),
    )
    out += ["", "By operator type"]
    out += _table(
        ("op type", "nodes", "weights", "activations"),
        [(r.op_type, str(r.nodes), format_bytes(r.weight_bytes), format_bytes(r.output_bytes))
         for r in inf.by_op_type[:top]],
        right=(1, 2, 3),
    )
    layers = sorted(inf.by_layer, key=lambda r: -r.peak_live_bytes)[:top]
    if len(inf.by_layer) > 1:
        out += ["", "Layers with the highest live memory"]
        out += _table(
            ("layer", "nodes", "weights", "activations", "peak live"),
            [(r.layer, str(r.nodes), format_bytes(r.weight_bytes), format_bytes(r.output_bytes),
              format_bytes(r.peak_live_bytes)) for r in layers],
            right=(1, 2, 3, 4),
        )
    if report.warnings:
        out += ["", "Warnings"] + [f"- {w}" for w in report.warnings]
    return "\n".join(out)


def render_markdown(report: Report, top: int = 10) -> str:
    """Give the report as a markdown document."""
    inf = report.inference
    dims = ", ".join(f"`{k}={v}`" for k, v in report.dims.items()) or "none"
    out = [f"# onnxmem report: `{report.model}`", "", f"dims: {dims} · nodes: {report.nodes} · order: {report.order}",
           "", "| part | size | bytes |", "|---|---:|---:|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in _summary_rows(report)]
    out += ["", f"Peak at step {inf.peak_step}: `{inf.peak_op_type}` node `{inf.peak_node}`.", "",
            "## Live at the peak", "", "| tensor | shape | dtype | size | producer |", "|---|---|---|---:|---|"]
    out += [f"| `{t.name}` | {_shape(t.shape)} | {t.dtype} | {format_bytes(t.bytes)} | {t.op_type} `{t.producer}` |"
            for t in inf.live_at_peak[:top]]
    out += ["", "## By operator type", "", "| op type | nodes | weights | activations |", "|---|---:|---:|---:|"]
    out += [f"| {r.op_type} | {r.nodes} | {format_bytes(r.weight_bytes)} | {format_bytes(r.output_bytes)} |"
            for r in inf.by_op_type[:top]]
    if report.warnings:
        out += ["", "## Warnings", ""] + [f"- `{w.code}`: {w.message}" for w in report.warnings]
    return "\n".join(out) + "\n"
