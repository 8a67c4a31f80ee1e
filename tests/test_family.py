"""ModelFamily: the affine fast path gives exactly what full analysis gives, and falls back where it must."""

from __future__ import annotations

from collections.abc import Callable

import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

from benchmarks.llm_graphs import SHAPES, make_llama
from onnxmem.passes.pipeline import analyze
from onnxmem.plan.family import ModelFamily

from . import graphs
from .test_qdq import shared_dq_model


@pytest.mark.parametrize("value", [1, 2, 3, 100, 4097])
def test_fast_path_equals_full_analysis_on_an_mlp(value: int) -> None:
    family = ModelFamily(graphs.symbolic_mlp(), "batch")
    assert family.affine
    fast, exact = family.report(value), family.report(value, exact=True)
    assert fast.to_dict() == exact.to_dict()
    assert family.peak_activation_bytes(value) == exact.inference.peak_activation_bytes


@pytest.mark.parametrize(("search", "fixed"), [("batch", {"seq": 9, "past": 4}), ("seq", {"batch": 3, "past": 5}),
                                               ("past", {"batch": 2, "seq": 6})])
def test_fast_path_equals_full_analysis_on_a_decoder(search: str, fixed: dict[str, int]) -> None:
    # Attention scores are [batch, heads, seq, past + seq]: quadratic in seq, so step peaks are polynomials.
    family = ModelFamily(make_llama(SHAPES["tiny"]), search, fixed)
    assert family.affine
    for value in (1, 2, 5, 64, 333):
        exact = family.report(value, exact=True)
        assert family.report(value).to_dict() == exact.to_dict()
        assert family.peak_activation_bytes(value) == exact.inference.peak_activation_bytes
        assert family.inference_peak_bytes(value) == (exact.inference.peak_bytes, exact.inference.weights_bytes)


def test_strided_conv_over_image_size_is_not_affine_and_falls_back() -> None:
    # Output height floor((h - 3) / 2) + 1 is not affine in h: the family must analyse each value fully.
    w = oh.make_tensor("w", TensorProto.FLOAT, [4, 1, 3, 3], [0.0] * 36)
    model = graphs.model(
        [graphs.node("Conv", ["x", "w"], ["c"], strides=[2, 2]), graphs.node("Relu", ["c"], ["y"])],
        [graphs.value("x", [1, 1, "h", "h"])], [graphs.value("y", [1, 4, None, None])], [w])
    family = ModelFamily(model, "h")
    assert not family.affine
    for h in (3, 8, 9, 10, 31):
        exact = family.report(h, exact=True)
        out = 4 * ((h - 3) // 2 + 1) ** 2 * 4  # one [1,4,oh,oh] float32 tensor
        # While Relu runs: c and y (a graph output gets its own buffer, so Relu is not in place).
        assert exact.inference.peak_activation_bytes == 2 * out
        assert family.peak_activation_bytes(h) == 2 * out


def test_if_subgraphs_take_the_full_path() -> None:
    # then: t = x + x; else: u = x * x, v = u + u. The family does not model subgraphs: exact path.
    then_graph = oh.make_graph([graphs.node("Add", ["x", "x"], ["t"])], "then", [], [graphs.value("t", ["b", 16])])
    else_graph = oh.make_graph([graphs.node("Mul", ["x", "x"], ["u"]), graphs.node("Add", ["u", "u"], ["v"])],
                               "else", [], [graphs.value("v", ["b", 16])])
    model = graphs.model(
        [oh.make_node("If", ["cond"], ["z"], name="if", then_branch=then_graph, else_branch=else_graph)],
        [graphs.value("cond", [], TensorProto.BOOL), graphs.value("x", ["b", 16])], [graphs.value("z", ["b", 16])])
    family = ModelFamily(model, "b")
    assert not family.affine
    for b in (1, 6):
        # z (b*16*4 bytes) and the else branch's own u while v is computed (v is the If's output): 2 tensors.
        assert family.peak_activation_bytes(b) == 2 * b * 16 * 4


def _clip_chain() -> onnx.ModelProto:
    """x -> Exp -> Clip -> ReduceSum: onnxruntime's CPU Clip runs in place, CUDA's does not (rules.cuda.CUDA_IN_PLACE),
    so the peak (while Clip runs) is one buffer on the one and two on the other."""
    nodes = [oh.make_node("Exp", ["x"], ["e"], name="exp"),
             oh.make_node("Clip", ["e", "low", "high"], ["c"], name="clip"),
             oh.make_node("ReduceSum", ["c"], ["y"], name="sum", keepdims=1)]
    graph = oh.make_graph(nodes, "clip_chain", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
                          initializer=[oh.make_tensor("low", TensorProto.FLOAT, [], [0.0]),
                                       oh.make_tensor("high", TensorProto.FLOAT, [], [6.0])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


@pytest.mark.parametrize("provider", ["cuda", "cpu"])
@pytest.mark.parametrize("make", [_clip_chain, shared_dq_model], ids=["provider-rules", "qdq-copies"])
def test_fast_path_equals_the_report_a_user_gets(provider: str, make: Callable[[], onnx.ModelProto]) -> None:
    # The family's model and rules are the report's: the provider's buffer rules (CUDA's Clip is not in place) and
    # onnxruntime's change to QDQ models (a DequantizeLinear copied per reader), not the file's as given.
    model = make()
    family = ModelFamily(model, "batch", provider=provider)
    assert family.affine
    for value in (1, 3, 40):
        report = analyze(model, {"batch": value}, provider=provider)
        assert family.inference_peak_bytes(value) == (report.inference.peak_bytes, report.inference.weights_bytes)
        assert family.report(value).to_dict() == report.to_dict()


def test_the_providers_differ_on_the_clip_chain() -> None:
    # (what makes the test above able to fail: the two rule sets give two peaks)
    model = _clip_chain()
    assert analyze(model, {"batch": 8}, provider="cuda").inference.peak_bytes != \
        analyze(model, {"batch": 8}, provider="cpu").inference.peak_bytes
