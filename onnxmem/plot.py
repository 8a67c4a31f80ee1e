"""Pictures with matplotlib (the optional extra `plot`): the memory timeline, and memory against the searched dim.

matplotlib is imported inside the functions, so `import onnxmem` never pays for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import OnnxMemError, require_extra
from .render import format_bytes
from .report import FitResult
from .series import TimelineSeries, aggregated

PLOT_SUFFIXES = (".png", ".svg")
_POINTS = 2000
_PHASE_COLOURS = {"forward": "#4c72b0", "data": "#8c8c8c", "loss": "#dd8452", "backward": "#c44e52",
                  "optimizer": "#55a868"}


def save_plot(path: str | os.PathLike[str], timeline: TimelineSeries | None = None, fit: FitResult | None = None,
              budget_bytes: int | None = None) -> Path:
    """Draw the timeline and/or the fit curve (one panel each) into a .png or .svg file; give its path."""
    target = Path(path)
    if target.suffix.lower() not in PLOT_SUFFIXES:
        raise OnnxMemError(f"--plot {target}: the file must end in .png or .svg")
    if timeline is None and fit is None:
        raise ValueError("nothing to plot")
    plt = _pyplot()
    panels = [p for p in (timeline, fit) if p is not None]
    figure, axes = plt.subplots(len(panels), 1, figsize=(10, 4.2 * len(panels)), squeeze=False)
    try:
        row = 0
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


def draw_timeline(ax: Any, series: TimelineSeries, budget_bytes: int | None = None) -> None:
    """Draw live bytes over the steps of a run, coloured by phase, with the peak marked and labelled (a long run
    aggregated, see series.aggregated: each point the highest of its steps)."""
    series = aggregated(series, _POINTS)
    scale, unit = _scale(max([*series.live_bytes, budget_bytes or 0], default=1))
    n = len(series.live_bytes)
    values = [b / scale for b in series.live_bytes]
    edges = [*series.steps, series.total_steps] if series.steps else list(range(n + 1))  # in the run's steps
    ax.step(edges, [*values, values[-1]] if values else [0], where="post", color="#333333", linewidth=1)
    labelled: set[str] = set()
    ticks: list[tuple[float, str]] = []
    start = 0
    for i in range(1, n + 1):  # one filled run per stretch of the same phase
        if i < n and series.phases[i] == series.phases[start]:
            continue
        phase = series.phases[start]
        ax.fill_between(edges[start:i + 1], [*values[start:i], values[i - 1]], step="post", alpha=0.35,
                        color=_PHASE_COLOURS.get(phase, "#4c72b0"), label=None if phase in labelled else phase)
        labelled.add(phase)
        ticks.append(((start + i) / 2, phase))
        start = i
    if n:
        peak = series.live_bytes[series.peak_index]
        at = (edges[series.peak_index] + edges[series.peak_index + 1]) / 2
        right = at > edges[-1] / 2
        ax.plot([at], [peak / scale], "v", color="#c44e52")
        ax.annotate(f"peak {format_bytes(peak)}\n{_short(series.peak_label)}", (at, peak / scale),
                    textcoords="offset points", xytext=(-10 if right else 8, 8), fontsize=8,
                    ha="right" if right else "left")
    if len(ticks) > 1:
        ax.set_xticks([t for t, _ in ticks], [name for _, name in ticks], rotation=30, fontsize=8)
    if budget_bytes is not None:
        ax.axhline(budget_bytes / scale, color="#c44e52", linestyle="--", linewidth=1,
                   label=f"budget {format_bytes(budget_bytes)}")
    ax.set_title(f"Memory over the run ({series.title})")
    ax.set_xlabel("step (node in execution order)" if len(ticks) <= 1 else
                  "events of a first and a later training step, by phase")
    ax.set_ylabel(f"live bytes ({unit}): weights + inputs + live tensors")
    ax.set_ylim(0, max([*values, (budget_bytes or 0) / scale, 1e-9]) * 1.2)  # room for the peak's label
    ax.legend(loc="upper left", fontsize=8)


def draw_curve(ax: Any, fit: FitResult) -> None:
    """Draw the peak against the searched dim, the budget line and the answer."""
    points = list(fit.curve)
    scale, unit = _scale(max([p.required_bytes for p in points] + [fit.budget_bytes]))
    xs = [p.value for p in points]
    ax.plot(xs, [p.peak_bytes / scale for p in points], "o-", markersize=3, label="peak (estimate)")
    if any(p.required_bytes != p.peak_bytes for p in points):
        ax.plot(xs, [p.required_bytes / scale for p in points], "s--", markersize=3,
                label=f"after {fit.target.allocator} rounding")
    ax.axhline(fit.budget_bytes / scale, color="#c44e52", linestyle="--", linewidth=1,
               label=f"budget {format_bytes(fit.budget_bytes)}")
    if fit.max_value:
        best = next(p for p in points if p.value == fit.max_value)
        ax.plot([best.value], [best.required_bytes / scale], "*", markersize=12, color="#55a868",
                label=f"largest {fit.dim} that fits: {fit.max_value}")
    if len(set(xs)) > 1 and max(xs) / max(min(xs), 1) > 64:
        ax.set_xscale("log", base=2)
    ax.set_title(f"Memory against {fit.dim} ({fit.mode})")
    ax.set_xlabel(fit.dim)
    ax.set_ylabel(f"bytes ({unit})")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise require_extra("matplotlib", "plot", "Plotting") from None
    matplotlib.use("Agg")  # files only: never a window, works without a display
    import matplotlib.pyplot as plt

    return plt


def _scale(largest: int) -> tuple[int, str]:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= size:
            return size, unit
    return 1, "B"


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
