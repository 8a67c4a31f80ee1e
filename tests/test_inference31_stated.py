"""Issue 31, data-dependent counts the graph states: a TorchScript trace of an MoE's eager experts loop bakes the
count of experts hit into a Split of a NonZero's output; the count follows from that Split (its sizes' sum), a
Squeeze of the axis (1) or a Reshape to a constant shape, warned with the node that states it. The experts' own
NonZero, on one class of a OneHot of TopK indices, finds at most one hot element per token: it is bounded there,
not at every element of its input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxmem

EXPERTS, TOP, HIDDEN = 4, 2, 8


def const(name: str, value: object, dtype: type = np.int64) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.array(value, dtype), name))


def eager_moe(traced_hits: int = EXPERTS) -> onnx.ModelProto:
    """transformers' eager experts as TorchScript traces them: logits [tokens, 4] -> top-2 -> one_hot(5 classes,
    the last never hit) -> permute(2, 1, 0) -> hit = (mask.sum((1, 2)) > 0).nonzero() -> a Split of it into the
    `traced_hits` experts the trace saw -> per expert: where(mask[expert]) -> its tokens' rows of x, relu, summed
    into the output."""
    nodes = [const("k", [TOP]), helper.make_node("TopK", ["logits", "k"], ["weights", "picked"], axis=-1),
             const("depth", [EXPERTS + 1]), const("on_off", [0, 1]),
             helper.make_node("OneHot", ["picked", "depth", "on_off"], ["hot"], axis=-1),
             helper.make_node("Transpose", ["hot"], ["mask"], perm=[2, 1, 0]), const("sum_axes", [1, 2]),
             helper.make_node("ReduceSum", ["mask", "sum_axes"], ["hits"], keepdims=0), const("zero", 0),
             helper.make_node("Greater", ["hits", "zero"], ["hit"]), helper.make_node("NonZero", ["hit"], ["where"]),
             helper.make_node("Transpose", ["where"], ["experts"], perm=[1, 0]), const("ones", [1] * traced_hits),
             helper.make_node("Split", ["experts", "ones"], [f"part{e}" for e in range(traced_hits)], axis=0),
             const("both", [0, 1]), const("row", 1)]
    total = ""
    for e in range(traced_hits):
        nodes += [helper.make_node("Squeeze", [f"part{e}", "both"], [f"expert{e}"]),
                  helper.make_node("Gather", ["mask", f"expert{e}"], [f"mine{e}"], axis=0),
                  helper.make_node("NonZero", [f"mine{e}"], [f"found{e}"]),
                  helper.make_node("Gather", [f"found{e}", "row"], [f"tokens{e}"], axis=0),
                  helper.make_node("Gather", ["x", f"tokens{e}"], [f"rows{e}"], axis=0),
                  helper.make_node("Relu", [f"rows{e}"], [f"relu{e}"]), const(f"axes{e}", [0]),
                  helper.make_node("ReduceSum", [f"relu{e}", f"axes{e}"], [f"out{e}"], keepdims=1)]
        if total:
            nodes.append(helper.make_node("Add", [total, f"out{e}"], [f"total{e}"]))
        total = f"total{e}" if total else f"out{e}"
    nodes.append(helper.make_node("Identity", [total], ["y"]))
    graph = helper.make_graph(nodes, "eager_moe",
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["tokens", EXPERTS]),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", HIDDEN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _shape(analysis: onnxmem.Analysis, name: str) -> tuple[int, ...] | None:
    return next(t.shape for t in analysis.graph.tensors if t.name == name)


def _said(analysis: onnxmem.Analysis) -> list[str]:
    return [w.message for w in analysis.report.warnings if w.code == "data-dependent-shape"]


def test_the_split_states_the_count_of_experts_hit() -> None:
    analysis = onnxmem.analysis(eager_moe(), {"tokens": 16}, provider="cpu")
    assert analysis.report.inference.unsized_tensors == 0
    assert _shape(analysis, "where") == (1, EXPERTS) and _shape(analysis, "part3") == (1, 1)
    said = _said(analysis)
    assert len(said) == 1 + EXPERTS
    assert f"nonzero={EXPERTS}, the count Split node" in said[0] and f"otherwise: {EXPERTS + 1}" in said[0]
    # a count the user binds names the experts' NonZeros; the Split's count stays the only one a run can give
    given = onnxmem.analysis(eager_moe(), {"tokens": 16, "nonzero": 3}, provider="cpu")
    assert _shape(given, "where") == (1, EXPERTS) and _shape(given, "found0") == (2, 3)


def test_one_class_of_a_one_hot_of_top_k_holds_one_hot_element_per_token() -> None:
    analysis = onnxmem.analysis(eager_moe(), {"tokens": 16}, provider="cpu")
    # mask[expert] is [top, tokens]: every element would be 32; one of the top-2 per token at most is the expert
    assert _shape(analysis, "found0") == (2, 16) and _shape(analysis, "rows0") == (16, HIDDEN)
    assert "nonzero=16 (one hot element per index of OneHot node" in _said(analysis)[1]
    assert "at most one in 2 hot" in _said(analysis)[1]


def _with_reader(reader: list[onnx.NodeProto], shape: list[int] | None) -> onnx.ModelProto:
    """x [8] -> NonZero -> Transpose [n, 1] -> `reader` (reading 'column') -> y."""
    nodes = [const("zero", 0.0, np.float32), helper.make_node("Greater", ["x", "zero"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["where"]),
             helper.make_node("Transpose", ["where"], ["column"], perm=[1, 0]), *reader]
    graph = helper.make_graph(nodes, "reader", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("reader", "count", "by"), [
    ([const("target", [3, 2]), helper.make_node("Reshape", ["column", "target"], ["y"])], 6, "Reshape node"),
    ([const("axes", [0, 1]), helper.make_node("Squeeze", ["column", "axes"], ["y"])], 1, "Squeeze node"),
    ([const("axes", [1]), helper.make_node("Squeeze", ["column", "axes"], ["flat"]), const("sizes", [2, 3]),
      helper.make_node("Split", ["flat", "sizes"], ["y", "rest"])], 5, "Split node"),
])
def test_a_reader_states_the_count(reader: list[onnx.NodeProto], count: int, by: str) -> None:
    analysis = onnxmem.analysis(_with_reader(reader, None), provider="cpu")
    assert _shape(analysis, "where") == (1, count)
    assert f"nonzero={count}, the count {by}" in _said(analysis)[0]


@pytest.mark.parametrize("reader", [
    [const("target", [-1, 2]), helper.make_node("Reshape", ["column", "target"], ["y"])],  # (any even count)
    [const("sizes", [1]), helper.make_node("Split", ["column", "sizes"], ["y"], axis=1)],  # (another axis)
    [const("target", [40]), helper.make_node("Reshape", ["column", "target"], ["y"])],  # (40 > the 8 it gives)
    [const("a", [3, 1]), helper.make_node("Reshape", ["column", "a"], ["y"]), const("b", [4, 1]),  # (two disagree)
     helper.make_node("Reshape", ["column", "b"], ["z"])],
])
def test_no_count_is_stated_where_the_reader_allows_several(reader: list[onnx.NodeProto]) -> None:
    analysis = onnxmem.analysis(_with_reader(reader, None), provider="cpu")
    assert _shape(analysis, "where") == (1, 8)
    assert "nonzero=8 (every element of its input non-zero)" in _said(analysis)[0]


@pytest.mark.parametrize("level", ["disable", "basic"])
def test_the_eager_moe_is_never_below_onnxruntime(tmp_path, level: str) -> None:
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    path = tmp_path / "eager_moe.onnx"
    onnx.save(eager_moe(), str(path))
    result = validate(path, {"tokens": 64}, opt_level=level, runs=1)  # (every expert hit: the traced Split runs)
    first = result.runs[0]
    assert first.activation_difference_bytes >= 0
    assert result.raw_estimate.peak_activation_bytes >= first.measured.peak_activation_bytes
    assert not [w for w in result.warnings if w.code == "unknown-shape"]
