"""Every view shows the analysed numbers: the JSON timeline, the plotted and HTML series, fit's answer and every
what-if equal the report of the same (or the changed) model, on every fixture."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

import onnxmem
from benchmarks.fixture_dims import dims_for, fixture_paths
from onnxmem.cli.commands import main
from onnxmem.ir.load import load_model
from onnxmem.passes.half_precision import half_precision
from onnxmem.views.html import check_page, report_page
from onnxmem.views.render import format_bytes
from onnxmem.views.series import aggregated, series_of

from . import graphs

FIXTURES = fixture_paths()


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_the_timeline_peaks_at_the_reported_peak_in_onnxruntimes_order(path: Path) -> None:
    for batch in (1, 8, 32):
        dims = dims_for(path, batch)
        report = onnxmem.analyze(path, dims)
        assert report.order == "ort" and report == onnxmem.analyze(path, dims, order="ort")
        inference = report.inference
        steps = report.to_dict(timeline=True)["inference"]["timeline"]
        assert len(steps) == report.nodes
        assert [s["step"] for s in steps] == list(range(report.nodes))
        live = [s["live_bytes"] for s in steps]
        assert max(live) == inference.peak_bytes == live[inference.peak_step]
        assert steps[inference.peak_step]["node"] == inference.peak_node
        # the series a plot draws is the same, and so is the aggregated one a page draws
        series = series_of(report)
        assert series.live_bytes == tuple(live) and series.peak_index == inference.peak_step
        small = aggregated(series, 7)
        assert len(small.live_bytes) <= 7 + 1 or len(set(series.phases)) > 1
        assert max(small.live_bytes) == small.live_bytes[small.peak_index] == inference.peak_bytes
        assert "timeline" not in report.to_dict()["inference"]  # only when asked


@pytest.mark.parametrize("name", ["mlp", "cnn_bn_residual", "transformer_encoder", "lstm"])
def test_the_training_timeline_peaks_at_the_training_peak(name: str) -> None:
    path = Path(__file__).resolve().parent.parent / "fixtures" / f"{name}.onnx"
    report = onnxmem.analyze(path, dims_for(path, 8), training=onnxmem.TrainingOptions(optimizer="adamw"))
    assert report.training is not None
    events = report.to_dict(timeline=True)["training"]["timeline"]
    assert {e["run"] for e in events} == {"first", "later"}
    assert {"data", "forward", "backward", "optimizer"} <= {e["phase"] for e in events}
    assert max(e["live_bytes"] for e in events) == report.training.peak_bytes
    series = series_of(report)
    assert max(series.live_bytes) == series.live_bytes[series.peak_index] == report.training.peak_bytes
    assert max(aggregated(series, 40).live_bytes) == report.training.peak_bytes
    for phase in report.training.first_step.phases:  # the phase table is the same events' maxima
        first = [e["live_bytes"] for e in events if e["run"] == "first" and e["phase"] == phase.phase]
        assert max(first) == phase.peak_bytes and first[-1] == phase.end_bytes


@pytest.mark.parametrize("name", ["mlp", "transformer_encoder", "gpt_decoder", "unet", "cnn_bn_residual"])
def test_what_ifs_are_the_reports_of_the_changed_model(name: str) -> None:
    path = Path(__file__).resolve().parent.parent / "fixtures" / f"{name}.onnx"
    dims = dims_for(path, 32)
    result = onnxmem.check(path, dims, memory="1KiB", order="model")
    assert result.report == onnxmem.analyze(path, dims, order="model")
    figures = {w.change: w.peak_bytes for w in result.what_ifs}
    half = onnxmem.analyze(half_precision(load_model(path)), dims, order="model").inference
    assert half.unsized_tensors == result.report.inference.unsized_tensors  # the conversion sizes what was sized
    assert figures["float32 -> float16 (weights and activations)"] == half.peak_bytes
    memory_order = onnxmem.analyze(path, dims, order="memory").inference.peak_bytes
    assert figures.get("memory-aware execution order", result.peak_bytes) == min(memory_order, result.peak_bytes)
    assert figures["batch 32 -> 16"] == onnxmem.analyze(path, {**dims, "batch": 16}, order="model").inference.peak_bytes


@pytest.mark.parametrize("name", ["transformer_encoder", "cnn_bn_residual"])
def test_fits_what_ifs_are_the_reports_at_the_next_value(name: str) -> None:
    # fit's what-ifs are made at the first value that does not fit, from its Sizing (no inference there)
    path = Path(__file__).resolve().parent.parent / "fixtures" / f"{name}.onnx"
    fixed = {k: v for k, v in dims_for(path, 1).items() if k != "batch"}
    budget = onnxmem.analyze(path, {**fixed, "batch": 40}).inference.peak_bytes
    result = onnxmem.fit(path, memory=budget, dims=fixed)
    at = {**fixed, "batch": result.max_value + 1}
    figures = {w.change: w.peak_bytes for w in result.what_ifs}
    assert figures["float32 -> float16 (weights and activations)"] == \
        onnxmem.analyze(half_precision(load_model(path)), at).inference.peak_bytes
    memory_order = onnxmem.analyze(path, at, order="memory").inference.peak_bytes
    peak = onnxmem.analyze(path, at).inference.peak_bytes
    assert figures.get("memory-aware execution order", peak) == min(memory_order, peak)


def test_half_precision_of_an_all_float_model_halves_every_byte() -> None:
    model = graphs.symbolic_mlp()
    full = onnxmem.analyze(model, {"batch": 8}).inference
    half = onnxmem.analyze(half_precision(load_model(model)), {"batch": 8}).inference
    assert half.peak_bytes * 2 == full.peak_bytes and half.weights_bytes * 2 == full.weights_bytes
    assert half.weights_by_dtype == {"FLOAT16": full.weights_bytes // 2}


def test_half_precision_keeps_float32_only_operands() -> None:
    # Resize's scales stay float32 (its schema allows nothing else); the data it resizes becomes float16.
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")], "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    half = half_precision(load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])))
    assert half.proto.graph.initializer[0].data_type == TensorProto.FLOAT
    assert half.proto.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    report = onnxmem.analyze(half)
    assert report.inference.peak_activation_bytes == 4 * 16 * 16 * 2


@pytest.mark.parametrize(("name", "memory", "dims"), [
    ("gpt_decoder", "24GiB", {"seq": 512}),  # the case whose plot drew the answer above the budget line
    ("transformer_encoder", "512MiB", {}),
    ("unet", "256MiB", {}),
])
def test_fits_answer_is_the_report_it_draws(name: str, memory: str, dims: dict[str, int]) -> None:
    path = Path(__file__).resolve().parent.parent / "fixtures" / f"{name}.onnx"
    fixed = {k: v for k, v in dims_for(path, 1).items() if k != "batch"} | dims
    result = onnxmem.fit(path, memory=memory, dims=fixed, what_if=False)
    assert result.max_value > 0 and result.report is not None
    exact = onnxmem.analyze(path, {**fixed, "batch": result.max_value})
    assert result.report == exact
    series = series_of(result.report)
    point = next(p for p in result.curve if p.value == result.max_value)
    assert max(series.live_bytes) == point.peak_bytes <= result.budget_bytes


def test_cli_timeline_json_and_html_headline(tmp_path: Path) -> None:
    path = str(Path(__file__).resolve().parent.parent / "fixtures" / "transformer_encoder.onnx")
    dims = [a for k, v in dims_for(Path(path), 8).items() for a in ("--dim", f"{k}={v}")]
    done = CliRunner().invoke(main, ["report", path, *dims, "--format", "json", "--timeline"])
    assert done.exit_code == 0, done.stderr
    data = json.loads(done.stdout)
    live = [s["live_bytes"] for s in data["inference"]["timeline"]]
    assert max(live) == data["inference"]["peak_bytes"]
    plain = CliRunner().invoke(main, ["report", path, *dims, "--format", "json"])
    assert "timeline" not in json.loads(plain.stdout)["inference"]
    report = onnxmem.analyze(path, dims_for(Path(path), 8))
    assert f"peak {format_bytes(report.inference.peak_bytes)}" in report_page(report, series_of(report))
    gate = onnxmem.check(path, dims_for(Path(path), 8), memory="1GiB")
    assert gate.report is not None and f"peak {format_bytes(gate.peak_bytes)}" in check_page(gate,
                                                                                             series_of(gate.report))


def test_a_large_timeline_is_drawn_aggregated_with_its_peak() -> None:
    model = onnx.load(str(Path(__file__).resolve().parent.parent / "fixtures" / "gpt_decoder.onnx"))
    report = onnxmem.analyze(model, {"batch": 2, "seq": 16})
    series = series_of(report)
    small = aggregated(series, 10)
    assert len(small.live_bytes) < len(series.live_bytes)
    assert small.live_bytes[small.peak_index] == report.inference.peak_bytes
    assert small.peak_label == series.peak_label and small.total_steps == len(series.live_bytes)
    assert list(small.steps) == sorted(small.steps) and small.steps[0] == 0


def test_a_model_whose_weights_dominate_is_drawn_above_them() -> None:
    # weights_mlp: 1 MiB of weights and a few KiB of activations: the weights are a band apart, and the axis starts
    # just below them, so the activations' steps are visible (no solid block)
    path = Path(__file__).resolve().parent.parent / "fixtures" / "weights_mlp.onnx"
    report = onnxmem.analyze(path, default_dim=2)
    series = series_of(report)
    inference = report.inference
    assert series.baseline_bytes == inference.weights_bytes + inference.input_bytes
    assert 0 < series.axis_floor <= series.baseline_bytes < inference.peak_bytes
    page = report_page(report, series)
    assert "weights + inputs" in page and f"peak {format_bytes(inference.peak_bytes)}" in page
    small = series_of(onnxmem.analyze(graphs.fanout()))
    assert small.axis_floor == 0  # activations dominate: the axis starts at 0


def test_a_training_what_if_reads_the_model_as_given_as_the_report_does() -> None:
    # On the CPU provider onnxruntime casts a float16 decoder's ops without a float16 kernel (another model); the
    # training step reads the model as given, in the report and in the what-if at half the batch alike.
    from onnxmem.training.step import TrainingOptions

    path = Path(__file__).resolve().parent.parent / "fixtures" / "gpt_decoder.onnx"
    model = half_precision(load_model(path))
    dims = dims_for(path, 8)
    options = TrainingOptions(optimizer="adamw")
    sized = onnxmem.analysis(model, dims, training=options, provider="cpu").sizing
    assert sized.given is not None  # (what makes this test able to fail: the runtime's model is another)
    result = onnxmem.check(model, dims, memory="1KiB", training=options, provider="cpu")
    figures = {w.change: w.peak_bytes for w in result.what_ifs}
    half = onnxmem.analyze(model, {**dims, "batch": 4}, training=options, provider="cpu").training
    assert half is not None and figures["batch 8 -> 4"] == half.peak_bytes
