"""Fit's and check's inference what-ifs read a changed model's peak from the stages up to its timeline
(pipeline.inference_peak), not from a whole report: the same peak and weights its report states."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

import onnxmem.plan.fit as fit_module
from benchmarks.llm_graphs import SHAPES, make_llama
from onnxmem.ir.load import LoadedModel
from onnxmem.passes.pipeline import Sizing, analysis, inference_peak
from onnxmem.shapes.dims import input_dims

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODELS = sorted(p.name for p in FIXTURES.glob("*.onnx"))


@pytest.mark.parametrize("provider", ["cuda", "cpu"])
@pytest.mark.parametrize("name", MODELS)
def test_inference_peak_is_the_reports(name: str, provider: str) -> None:
    model = onnx.load(str(FIXTURES / name), load_external_data=False)
    dims = {"batch": 8} if any(d.name == "batch" for d in input_dims(model)) else {}
    analysed = analysis(str(FIXTURES / name), dims, default_dim=16, provider=provider)
    inference = analysed.report.inference
    assert inference_peak(analysed.graph, analysed.timeline) == (inference.peak_bytes, inference.weights_bytes)


def _if_with_branch_weights() -> onnx.ModelProto:
    """An If whose branches each add a weight of their own (bytes the report counts as the If's)."""
    def branch(name: str, value: float) -> onnx.GraphProto:
        weight = oh.make_tensor(f"{name}_w", TensorProto.FLOAT, [64], [value] * 64)
        return oh.make_graph([oh.make_node("Add", ["x", f"{name}_w"], [f"{name}_y"])], name, [],
                             [oh.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["batch", 64])],
                             initializer=[weight])
    graph = oh.make_graph(
        [oh.make_node("If", ["cond"], ["y"], then_branch=branch("then", 1.0), else_branch=branch("else", 2.0))],
        "if_weights",
        [oh.make_tensor_value_info("cond", TensorProto.BOOL, []),
         oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_subgraph_weights_count_in_the_peak() -> None:
    analysed = analysis(_if_with_branch_weights(), {"batch": 8})
    bodies = [sub for op in analysed.graph.ops for sub in op.subgraphs]
    assert bodies and all(body.own_weights for body in bodies)
    peak, weights = inference_peak(analysed.graph, analysed.timeline)
    assert weights == analysed.report.inference.weights_bytes == 2 * 64 * 4
    assert peak == analysed.report.inference.peak_bytes


@pytest.mark.parametrize("provider", ["cuda", "cpu"])
def test_each_what_if_peak_is_its_full_analysis(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[tuple[str, int]] = []
    timeline_of = fit_module._timeline_of

    def compared(model: Sizing | LoadedModel, dims: dict[str, int] | None, order: str, at: Sizing):  # type: ignore[no-untyped-def]
        graph, timeline, loaded = timeline_of(model, dims, order, at)
        whole = analysis(model, dims, default_dim=at.default_dim, order=order, provider=at.provider).report.inference
        assert inference_peak(graph, timeline) == (whole.peak_bytes, whole.weights_bytes)
        checked.append((order, whole.peak_bytes))
        return graph, timeline, loaded

    monkeypatch.setattr(fit_module, "_timeline_of", compared)
    model = make_llama(SHAPES["tiny"])
    result = fit_module.check(model, {"batch": 4, "seq": 16, "past": 8}, memory="1GiB", provider=provider)
    # halving the batch, the memory order, float16 and the KV cache's what-ifs: each through the light path
    assert len(checked) >= 4 and any(order == "memory" for order, _ in checked)
    peaks = {w.peak_bytes for w in result.what_ifs}
    assert peaks <= {peak for _, peak in checked}
    fitted = fit_module.fit(model, memory="64MiB", dims={"seq": 16, "past": 8}, provider=provider)
    assert fitted.bounded and fitted.what_ifs
