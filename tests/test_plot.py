"""Pictures and the HTML page: files are written and non-empty, the page is self-contained, the extra is named."""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from onnx import TensorProto

import onnxmem
from benchmarks.llm_graphs import SHAPES, make_llama
from onnxmem.errors import MissingExtraError, OnnxMemError
from onnxmem.training.step import TrainingOptions
from onnxmem.views.html import check_page, fit_page, report_page
from onnxmem.views.series import inference_series, series_of, training_series

from . import graphs
from .cli import run, save

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Page(HTMLParser):
    """Collects what a page would fetch: any src/href attribute, script or link element."""

    def __init__(self) -> None:
        super().__init__()
        self.fetches: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag in ("script", "link", "img", "iframe", "object", "embed"):
            self.fetches.append(tag)
        self.fetches += [f"{k}={v}" for k, v in attrs if k in ("src", "href", "xlink:href")]


def assert_self_contained(page: str) -> _Page:
    parsed = _Page()
    parsed.feed(page)
    assert parsed.fetches == []
    assert "http://" not in page and "https://" not in page and "url(" not in page
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    return parsed


def test_inference_timeline_is_worked_by_hand() -> None:
    # fanout (T = 4 MiB) in the file's order: x stays; u0, u1, u2 accumulate; at s1 all four activations are live.
    series = inference_series(onnxmem.analyze(graphs.fanout(), order="model"))
    t = graphs.T
    assert series.live_bytes == (2 * t, 3 * t, 4 * t, 5 * t, 4 * t)
    assert series.peak_index == 3 and series.peak_label == "Add Add_s1"
    # onnxruntime's order (the default): u1, u0, s1 (x, u0, u1, s1 live), then u2 once u0 and u1 are gone
    series = inference_series(onnxmem.analyze(graphs.fanout()))
    assert series.live_bytes == (2 * t, 3 * t, 4 * t, 3 * t, 4 * t)
    assert series.peak_index == 2 and series.peak_label == "Add Add_s1"


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plots_are_written(tmp_path: Path, suffix: str) -> None:
    pytest.importorskip("matplotlib")
    from onnxmem.views.plot import save_plot

    result = onnxmem.fit(graphs.symbolic_mlp(), memory="1MiB")
    assert result.report is not None and result.report.dims["batch"] == result.max_value
    series = series_of(result.report)
    path = save_plot(tmp_path / f"fit{suffix}", timeline=series, fit=result, budget_bytes=result.budget_bytes)
    data = path.read_bytes()
    assert len(data) > 5000
    assert data.startswith(PNG_MAGIC) if suffix == ".png" else b"<svg" in data[:2000]


def test_cli_plots_for_report_fit_and_check(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    model = save(make_llama(SHAPES["tiny"], TensorProto.FLOAT), tmp_path / "tiny.onnx")
    dims = ("--dim", "seq=16", "--dim", "past=1")
    for command, extra in (("report", ("--dim", "batch=2")), ("fit", ("--memory", "4MiB")),
                           ("check", ("--dim", "batch=2", "--budget", "4MiB", "--training"))):
        out_file = tmp_path / f"{command}.png"
        code, _, err = run(command, model, *dims, *extra, "--plot", str(out_file))
        assert code == 0, err
        assert out_file.read_bytes().startswith(PNG_MAGIC) and out_file.stat().st_size > 5000


def test_plot_needs_a_png_or_svg_name(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from onnxmem.views.plot import save_plot

    with pytest.raises(OnnxMemError, match=r"\.png or \.svg"):
        save_plot(tmp_path / "fit.bmp", timeline=series_of(onnxmem.analyze(graphs.chain())))


def test_missing_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxmem.views.plot import save_plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(MissingExtraError, match=r'pip install ".\[plot\]" in a clone of onnxmem'):
        save_plot(tmp_path / "x.png", timeline=series_of(onnxmem.analyze(graphs.chain())))
    code, _, err = run("report", save(graphs.chain(), tmp_path / "m.onnx"), "--plot", str(tmp_path / "x.png"))
    assert code == 2 and "onnxmem[plot]" in err


def test_html_pages_are_self_contained() -> None:
    model = graphs.fanout()
    report = onnxmem.analyze(model)
    page = report_page(report, series_of(report))
    parsed = assert_self_contained(page)
    assert "svg" in parsed.tags and "table" in parsed.tags
    assert "Add_s1" in page  # the peak node, named
    for t in report.inference.live_at_peak:
        assert t.name in page  # the live set at the peak
    result = onnxmem.fit(graphs.symbolic_mlp(), memory="1MiB")
    assert result.report is not None
    page = fit_page(result, series_of(result.report))
    assert_self_contained(page)
    # the answer's sums, the curve and the timeline (the page changed on purpose: its verdict is drawn too)
    assert page.count("<svg") == 3 and f"largest batch that fits: {result.max_value}" in page
    gate = onnxmem.check(model, memory="15MiB")
    assert gate.report is not None
    assert "DOES NOT FIT" in assert_self_contained_and_return(check_page(gate, series_of(gate.report)))


def assert_self_contained_and_return(page: str) -> str:
    assert_self_contained(page)
    return page


def test_html_through_the_cli_including_training(tmp_path: Path) -> None:
    model = save(make_llama(SHAPES["tiny"], TensorProto.FLOAT), tmp_path / "tiny.onnx")
    dims = ("--dim", "seq=16", "--dim", "past=1", "--dim", "batch=2")
    code, out, err = run("report", model, *dims, "--training", "--format", "html")
    assert code == 0, err
    parsed = assert_self_contained(out)
    assert "svg" in parsed.tags and "backward" in out
    page = tmp_path / "report.html"
    page.write_text(out)
    assert page.stat().st_size > 2000
    code, out, _ = run("check", model, *dims, "--budget", "1KiB", "--format", "html")
    assert code == 1 and "DOES NOT FIT" in out
    assert_self_contained(out)


def test_training_timeline_has_both_steps_and_marks_the_peak() -> None:
    model = make_llama(SHAPES["tiny"], TensorProto.FLOAT)
    report = onnxmem.analyze(model, {"batch": 2, "seq": 16, "past": 1}, training=TrainingOptions())
    assert report.training is not None
    series = training_series(report)
    assert {"forward", "backward", "optimizer"} <= set(series.phases)
    assert max(series.live_bytes) == report.training.peak_bytes
    assert series.live_bytes[series.peak_index] == report.training.peak_bytes


# --- charts that read: the answer first, labels apart, phase names, round ticks, straight lines straight ----------

def _svg_texts(page: str) -> list[tuple[float, str]]:
    import re

    return [(float(y), text) for y, text in re.findall(r'<text x="[^"]*" y="([^"]*)"[^>]*>([^<]*)</text>', page)]


def test_training_page_leads_with_the_training_answer_and_keeps_labels_apart() -> None:
    from onnxmem.views import html

    model = make_llama(SHAPES["tiny"], TensorProto.FLOAT)
    report = onnxmem.analyze(model, {"batch": 2, "seq": 16, "past": 1}, training=TrainingOptions())
    page = report_page(report, series_of(report))
    assert page.index("training step peak") < page.index("<svg")
    assert page.index("Live at the training peak") < page.index("Live at the inference peak")
    texts = _svg_texts(page)
    legend = [y for y, t in texts if t in ("data", "forward", "loss", "backward", "optimizer") and y < html._PAD_T]
    peak = [y for y, t in texts if t.startswith("peak ")]
    assert len(legend) == 5 and len(peak) == 1
    assert peak[0] >= html._PAD_T + 10 > max(legend)  # the peak's label is inside the plot, the legend above it
    bottom = html._H - html._PAD_B
    under = {t for y, t in texts if y > bottom and t in ("forward", "backward")}
    assert under == {"forward", "backward"}  # phase names under the bars
    assert {"first step", "later step"} <= {t for _, t in texts}
    ticks = [t for y, t in texts if t == "0" or t.endswith("iB")]
    assert 4 <= len(ticks) <= 6 and "2 MiB" in ticks  # round ticks: 0, 0.5 MiB ... or 0, 1 MiB, 2 MiB ...


def test_fit_page_says_nothing_fits_once() -> None:
    result = onnxmem.fit(graphs.symbolic_mlp(), memory=1000)
    assert result.report is not None
    page = fit_page(result, series_of(result.report))
    assert page.count("nothing fits") == 1 and "that fits: 0" not in page


def test_fit_curve_axes_are_linear_where_the_peak_is() -> None:
    pytest.importorskip("matplotlib")
    from onnxmem.views.plot import _pyplot, draw_curve, draw_timeline

    plt = _pyplot()
    linear = onnxmem.fit(graphs.symbolic_mlp(), memory="64MiB", what_if=False)
    assert linear.linear is not None and max(p.value for p in linear.curve) > 64  # wide enough for a log axis
    quadratic = onnxmem.fit(make_llama(SHAPES["tiny"], TensorProto.FLOAT), memory="40MiB", search="seq",
                            dims={"batch": 2, "past": 1}, what_if=False)
    assert quadratic.linear is None
    figure, axes = plt.subplots(3, 1)
    try:
        draw_curve(axes[0], linear)
        draw_curve(axes[1], quadratic)
        assert (axes[0].get_xscale(), axes[0].get_yscale()) == ("linear", "linear")
        assert (axes[1].get_xscale(), axes[1].get_yscale()) == ("log", "log")
        assert 4 <= len(axes[0].get_yticks()) <= 6
        report = onnxmem.analyze(make_llama(SHAPES["tiny"], TensorProto.FLOAT), {"batch": 2, "seq": 16, "past": 1},
                                 training=TrainingOptions())
        draw_timeline(axes[2], training_series(report), budget_bytes=4 * 2**20)
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
        legend = axes[2].get_legend().get_window_extent(renderer)
        plot = axes[2].get_window_extent(renderer)
        assert legend.y0 >= plot.y1 - 1  # above the plot area: no label inside it can sit on it
        peak_label = next(t for t in axes[2].texts if t.get_text().startswith("peak "))
        assert not peak_label.get_window_extent(renderer).overlaps(legend)
        names = [t.get_text() for t in axes[2].get_xticklabels()]
        assert "forward" in names and "backward" in names
    finally:
        plt.close(figure)
