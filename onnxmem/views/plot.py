"""Pictures with matplotlib (the optional extra `plot`): the memory timeline, and memory against the searched dim.

matplotlib is imported inside the functions, so `import onnxmem` never pays for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from onnxmem.errors import OnnxMemError, require_extra
from onnxmem.views.render import format_bytes, format_tick
from onnxmem.views.report import Arithmetic, FitResult
from onnxmem.views.series import TimelineSeries, aggregated, byte_unit, curve_axes, round_ticks, verdict_parts

PLOT_SUFFIXES = (".png", ".svg")
_POINTS = 2000
_PHASE_COLOURS = {"forward": "#4c72b0", "data": "#8c8c8c", "loss": "#dd8452", "backward": "#c44e52",
                  "optimizer": "#55a868"}


def save_plot(path: str | os.PathLike[str], timeline: TimelineSeries | None = None, fit: FitResult | None = None,
              budget_bytes: int | None = None, verdict: Arithmetic | None = None) -> Path:
    """Draw the verdict's sums (`verdict`, or the fit's at its answer), the timeline and/or the fit curve (one panel
    each) into a .png or .svg file; give its path."""
    target = Path(path)
    if target.suffix.lower() not in PLOT_SUFFIXES:
        raise OnnxMemError(f"--plot {target}: the file must end in .png or .svg")
    if timeline is None and fit is None:
        raise ValueError("nothing to plot")
    if verdict is None and fit is not None:
        verdict = fit.arithmetic
    plt = _pyplot()
    panels = [p for p in (verdict, timeline, fit) if p is not None]
    heights = [2.2 if p is verdict else 4.2 for p in panels]
    figure, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights)), squeeze=False,
                                gridspec_kw={"height_ratios": heights})
    try:
        row = 0
        if verdict is not None:
            draw_verdict(axes[row][0], verdict)
            row += 1
        if timeline is not None:
            draw_timeline(axes[row][0], timeline, budget_bytes)
            row += 1
        if fit is not None:
            draw_curve(axes[row][0], fit)
        figure.tight_layout()
        figure.savefig(target, format=target.suffix.lower()[1:], dpi=110)
    except OSError as exc:
        raise OnnxMemError(f"--plot {target}: could not write the picture: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)
    return target


def draw_verdict(ax: Any, a: Arithmetic) -> None:
    """Draw a verdict's sums as two bars, the parts the HTML page draws (series.verdict_parts): what is needed
    (the peak, the allocator's rounding) over the memory (the budget, the fixed costs), the budget line, the
    headroom or the shortfall, FITS or DOES NOT FIT in the title."""
    parts = verdict_parts(a)
    rows = {"needs": 1, "memory": 0}
    for bar in parts.bars:
        ax.barh(rows[bar.row], bar.bytes, left=bar.start, height=0.6, color=bar.colour, alpha=bar.opacity,
                edgecolor=bar.colour, label=bar.label)
    ax.axvline(a.budget_bytes, color="#c44e52", linestyle="--", linewidth=1)
    ax.set_yticks(list(rows.values()), list(rows))
    top = max(a.memory_bytes, a.required_bytes, 1)
    unit = byte_unit(top)
    ticks = round_ticks(top, unit)
    ax.set_xticks(ticks, [format_tick(t, unit) for t in ticks])
    ax.set_xlim(0, max(ticks[-1], top))
    ax.set_title(f"{'FITS' if a.fits else 'DOES NOT FIT'}: {parts.caption}", loc="left", fontsize=11,
                 fontweight="bold", color="#2a7a2a" if a.fits else "#b22222", pad=6)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(0, -0.25), ncol=min(len(handles), 3), fontsize=8,
              frameon=False)


def draw_timeline(ax: Any, series: TimelineSeries, budget_bytes: int | None = None) -> None:
    """Draw live bytes over the steps of a run, coloured by phase and named under the axis, with the peak marked and
    labelled inside the plot and the legend above it (a long run aggregated, see series.aggregated: each point the
    highest of its steps)."""
    series = aggregated(series, _POINTS)
    largest = max([*series.live_bytes, budget_bytes or 0, 1])
    n = len(series.live_bytes)
    values = list(series.live_bytes)
    edges = [*series.steps, series.total_steps] if series.steps else list(range(n + 1))  # in the run's steps
    floor = series.axis_floor  # (a model whose weights dominate: the axis starts just below them)
    if series.baseline_bytes:  # what the whole run holds (weights and inputs), in grey under the live tensors
        ax.axhspan(floor, series.baseline_bytes, color="#bbbbbb", alpha=0.5, linewidth=0,
                   label=f"weights + inputs {format_bytes(series.baseline_bytes)}")
        past = min(series.past_cache_bytes, series.baseline_bytes - floor)
        if past > 0:  # a decoder's past KV cache: the top of the inputs' band
            ax.axhspan(series.baseline_bytes - past, series.baseline_bytes, color="#8172b3", alpha=0.45, linewidth=0,
                       label=f"of which past KV cache {format_bytes(series.past_cache_bytes)}")
    ax.step(edges, [*values, values[-1]] if values else [0], where="post", color="#333333", linewidth=1)
    several = len(set(series.phases)) > 1
    labelled: set[str] = set() if several else set(series.phases)  # one phase: no legend entry, no names
    ticks: list[tuple[float, str]] = []
    start = 0
    for i in range(1, n + 1):  # one filled run per stretch of the same phase
        if i < n and series.phases[i] == series.phases[start]:
            continue
        phase = series.phases[start]
        ax.fill_between(edges[start:i + 1], [*values[start:i], values[i - 1]], max(series.baseline_bytes, floor),
                        step="post", alpha=0.35, color=_PHASE_COLOURS.get(phase, "#4c72b0"),
                        label=None if phase in labelled else phase)
        labelled.add(phase)
        if several and edges[i] - edges[start] >= 0.012 * len(phase) * edges[-1]:  # a name where it has room
            ticks.append(((edges[start] + edges[i]) / 2, phase))
        start = i
    if n:
        peak = series.live_bytes[series.peak_index]
        at = (edges[series.peak_index] + edges[series.peak_index + 1]) / 2
        right = at > edges[-1] / 2
        ax.plot([at], [peak], "v", color="#c44e52")
        # a budget line just above the peak would cross its label: the label sits on the line instead
        top = round_ticks(int((largest - floor) * 1.12), byte_unit(largest - floor))[-1]
        above = budget_bytes is not None and peak <= budget_bytes <= peak + 0.08 * top
        ax.annotate(f"peak {format_bytes(peak)}: {_short(series.peak_label)}",
                    (at, budget_bytes if above and budget_bytes is not None else peak),
                    textcoords="offset points", xytext=(-8 if right else 8, 4), fontsize=8,
                    ha="right" if right else "left", va="bottom")
    if several:  # phase names under the bars, and where the later step begins
        ax.set_xticks([t for t, _ in ticks], [name for _, name in ticks], fontsize=8)
        half = edges[-1] / 2
        ax.axvline(half, color="#888888", linestyle=":", linewidth=1)
        for x, text, align in ((half, "first step ", "right"), (half, " later step", "left")):
            ax.annotate(text, (x, 0), xycoords=("data", "axes fraction"), xytext=(0, -16),
                        textcoords="offset points", ha=align, va="top", fontsize=8)
    if budget_bytes is not None:
        ax.axhline(budget_bytes, color="#c44e52", linestyle="--", linewidth=1,
                   label=f"budget {format_bytes(budget_bytes)}")
    ax.set_title(f"Memory over the run ({series.title})", pad=24)
    ax.set_xlabel("events of a first and a later training step, by phase" if several else
                  "step (node in execution order)", labelpad=16 if several else 4)
    ax.set_ylabel("live bytes: weights + inputs + live tensors")
    _byte_axis(ax, largest, floor)
    ax.set_xlim(0, max(edges[-1], 1))
    _legend_above(ax)


def draw_curve(ax: Any, fit: FitResult) -> None:
    """Draw the peak against the searched dim, the budget line and the answer."""
    points = list(fit.curve)
    xs = [p.value for p in points]
    ax.plot(xs, [p.peak_bytes for p in points], "o-", markersize=3, label="peak (estimate)")
    if any(p.required_bytes != p.peak_bytes for p in points):
        ax.plot(xs, [p.required_bytes for p in points], "s--", markersize=3,
                label=f"after {fit.target.allocator} rounding")
    ax.axhline(fit.budget_bytes, color="#c44e52", linestyle="--", linewidth=1,
               label=f"budget {format_bytes(fit.budget_bytes)}")
    if fit.max_value:
        best = next(p for p in points if p.value == fit.max_value)
        ax.plot([best.value], [best.required_bytes], "*", markersize=12, color="#55a868",
                label=f"largest {fit.dim} that fits: {fit.max_value}")
    # the axes and ticks the HTML page draws too (series.curve_axes): log-log where the peak is not linear
    axes = curve_axes(fit)
    if axes.log:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(axes.x_ticks, [f"{v:,}" for v in axes.x_ticks])
        ax.set_yticks(axes.y_ticks, [format_tick(v, byte_unit(v)) for v in axes.y_ticks])
        ax.set_xlim(axes.x_ticks[0], axes.x_ticks[-1])
        ax.set_ylim(axes.y_ticks[0], axes.y_ticks[-1])
        ax.grid(axis="y", color="#e4e4e4", linewidth=0.8)
        ax.set_axisbelow(True)
        ax.set_xlabel(f"{fit.dim} (log scale)")
        ax.set_ylabel("bytes (log scale)")
    else:
        ax.set_yticks(axes.y_ticks, [format_tick(t, axes.y_unit) for t in axes.y_ticks])
        ax.set_ylim(0, axes.y_ticks[-1])
        ax.grid(axis="y", color="#e4e4e4", linewidth=0.8)
        ax.set_axisbelow(True)
        ax.set_xlim(0, axes.x_ticks[-1])
        ax.set_xticks(axes.x_ticks, [f"{v:,}" for v in axes.x_ticks])
        ax.set_xlabel(fit.dim)
        ax.set_ylabel("bytes")
    ax.set_title(f"Memory against {fit.dim} ({fit.mode})", pad=24)
    _legend_above(ax)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise require_extra("matplotlib", "plot", "Plotting") from None
    matplotlib.use("Agg")  # files only: never a window, works without a display
    import matplotlib.pyplot as plt

    return plt


def _byte_axis(ax: Any, largest: int, floor: int = 0) -> None:
    """Give a byte axis from `floor` 4 to 6 round ticks (series.round_ticks), reaching past the largest value so
    that a label above it stays inside the plot."""
    unit = byte_unit(largest)
    ticks = tuple(floor + t for t in round_ticks(int((largest - floor) * 1.12), byte_unit(largest - floor)))
    ax.set_yticks(ticks, [format_tick(t, unit) for t in ticks])
    ax.set_ylim(floor, ticks[-1])
    ax.grid(axis="y", color="#e4e4e4", linewidth=0.8)
    ax.set_axisbelow(True)


def _legend_above(ax: Any) -> None:
    """Put the legend in one row above the plot area, where no label drawn inside the plot can sit on it."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(handles), fontsize=8,
                  frameon=False, borderaxespad=0.2)


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
