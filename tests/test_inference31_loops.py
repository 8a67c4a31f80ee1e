"""Issue 31, data-dependent shapes inside a Loop's body: a NonZero or a NonMaxSuppression there is sized at the
count the user binds or the most it can give, as in an If's branch, and warned naming the Loop; the body's tensors,
its loop-carried outputs and its scan outputs (over a constant trip count) follow. They were unsized (warned
unknown-shape and loop-body-unsized), and the estimate below onnxruntime's run."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxmem

TRIPS, ELEMENTS = 3, 64


def const(name: str, value: object, dtype: type = np.int64) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.array(value, dtype), name))


def _model(body_nodes: list[onnx.NodeProto], carried: list[tuple[str, str, int, list[int]]], scans: list[str],
           inputs: list[onnx.ValueInfoProto], first: list[onnx.NodeProto]) -> onnx.ModelProto:
    """A Loop of TRIPS iterations over `body_nodes`; `carried`: (initial value, body output, type, shape) of each
    loop-carried value; `scans`: the body's scan outputs. The graph's outputs: the Loop's, each through an Identity."""
    body = helper.make_graph(
        [*body_nodes, helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         *[helper.make_tensor_value_info(f"{out}_in", dtype, shape) for _, out, dtype, shape in carried]],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         *[helper.make_tensor_value_info(out, dtype, None) for _, out, dtype, _ in carried],
         *[helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in scans]])
    outputs = [f"loop_{out}" for _, out, _, _ in carried] + [f"loop_{name}" for name in scans]
    nodes = [*first, const("trips", TRIPS), const("go", True, np.bool_),
             helper.make_node("Loop", ["trips", "go", *[initial for initial, _, _, _ in carried]], outputs,
                              body=body, name="the_loop"),
             *[helper.make_node("Identity", [name], [f"y{k}"]) for k, name in enumerate(outputs)]]
    graph = helper.make_graph(nodes, "loop", inputs, [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None)
                                                      for k in range(len(outputs))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def nonzero_loop(always: bool = False) -> onnx.ModelProto:
    """x [64]: each iteration i gathers the elements of x above i (`always`: of |x| + 3, every one), sums their
    exps into a loop-carried [1] and gives their sum as a [1] scan output."""
    body = [helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT), *(
            [helper.make_node("Abs", ["x"], ["magnitude"]), const("three", 3.0, np.float32),
             helper.make_node("Add", ["magnitude", "three"], ["tested"])] if always else
            [helper.make_node("Identity", ["x"], ["tested"])]),
            helper.make_node("Greater", ["tested", "fi"], ["mask"]), helper.make_node("NonZero", ["mask"], ["where"]),
            const("axis0", [0]), helper.make_node("Squeeze", ["where", "axis0"], ["index"]),
            helper.make_node("Gather", ["x", "index"], ["picked"], axis=0),
            helper.make_node("Exp", ["picked"], ["grown"]),
            helper.make_node("ReduceSum", ["grown", "axis0"], ["part"], keepdims=1),
            helper.make_node("Add", ["acc_in", "part"], ["acc"]),
            helper.make_node("ReduceSum", ["picked", "axis0"], ["summed"], keepdims=1)]
    return _model(body, [("start", "acc", TensorProto.FLOAT, [1])], ["summed"],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ELEMENTS])],
                  [const("start", [0.0], np.float32)])


def nms_loop() -> onnx.ModelProto:
    """boxes [1, 20, 4], scores [1, 2, 20]: each iteration runs NMS (at most 4 per class) on scores + i and sums
    the kept indices into a loop-carried [1] count."""
    body = [helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["scores", "fi"], ["shifted"]), const("per_class", [4]),
            const("iou", [0.5], np.float32),
            helper.make_node("NonMaxSuppression", ["boxes", "shifted", "per_class", "iou"], ["selected"]),
            helper.make_node("Cast", ["selected"], ["as_float"], to=TensorProto.FLOAT),
            helper.make_node("Exp", ["as_float"], ["grown"]), const("all_axes", [0, 1]),
            helper.make_node("ReduceSum", ["grown", "all_axes"], ["part"], keepdims=0),
            const("one", [1]), helper.make_node("Reshape", ["part", "one"], ["flat"]),
            helper.make_node("Add", ["acc_in", "flat"], ["acc"])]
    return _model(body, [("start", "acc", TensorProto.FLOAT, [1])], [],
                  [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 20, 4]),
                   helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2, 20])],
                  [const("start", [0.0], np.float32)])


def _shape(analysis: onnxmem.Analysis, name: str) -> tuple[int, ...] | None:
    """The shape of the tensor `name`, of the main graph or the Loop's body."""
    graphs = [analysis.graph, *(sub for op in analysis.graph.ops for sub in op.subgraphs)]
    return next(t.shape for graph in graphs for t in graph.tensors if t.name == name)


def _codes(analysis: onnxmem.Analysis) -> list[str]:
    return [w.code for w in analysis.report.warnings]


def test_a_nonzero_in_a_loop_body_is_bounded_and_warned() -> None:
    analysis = onnxmem.analysis(nonzero_loop(), provider="cpu")
    assert _shape(analysis, "where") == (1, ELEMENTS) and _shape(analysis, "grown") == (ELEMENTS,)
    assert _shape(analysis, "loop_acc") == (1,) and _shape(analysis, "loop_summed") == (TRIPS, 1)
    assert analysis.report.inference.unsized_tensors == 0
    assert "unknown-shape" not in _codes(analysis) and "loop-body-unsized" not in _codes(analysis)
    said = [w.message for w in analysis.report.warnings if w.code == "data-dependent-shape"]
    assert len(said) == 1 and f"nonzero={ELEMENTS}" in said[0] and "in the body of Loop node 'the_loop'" in said[0]
    given = onnxmem.analysis(nonzero_loop(), {"nonzero": 5}, provider="cpu")
    assert _shape(given, "picked") == (5,) and "nonzero=5 as given" in " ".join(w.message for w in
                                                                                given.report.warnings)


def test_an_nms_in_a_loop_body_is_bounded_and_warned() -> None:
    analysis = onnxmem.analysis(nms_loop(), provider="cpu")
    assert _shape(analysis, "selected") == (8, 3) and _shape(analysis, "grown") == (8, 3)
    assert analysis.report.inference.unsized_tensors == 0 and "loop-body-unsized" not in _codes(analysis)
    said = [w.message for w in analysis.report.warnings if w.code == "data-dependent-shape"]
    assert len(said) == 1 and "nms_boxes=8" in said[0] and "Loop node 'the_loop'" in said[0]


def test_a_carried_value_that_changes_size_is_not_bounded() -> None:
    """The loop-carried value grows by the kept elements each iteration: its first iteration's size does not hold
    for the next, so nothing is bounded from it (the Loop stays warned as before)."""
    body = [helper.make_node("Greater", ["x", "zero"], ["mask"]), helper.make_node("NonZero", ["mask"], ["where"]),
            const("axis0", [0]), helper.make_node("Squeeze", ["where", "axis0"], ["index"]),
            helper.make_node("Gather", ["x", "index"], ["picked"], axis=0),
            helper.make_node("Concat", ["acc_in", "picked"], ["acc"], axis=0)]
    model = _model(body, [("start", "acc", TensorProto.FLOAT, [1])], [],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ELEMENTS])],
                   [const("start", [0.0], np.float32), const("zero", 0.0, np.float32)])
    analysis = onnxmem.analysis(model, provider="cpu")
    assert "data-dependent-shape" not in _codes(analysis) and "loop-body-unsized" in _codes(analysis)


@pytest.mark.parametrize(("model", "always"), [("nonzero", True), ("nonzero", False), ("nms", False)])
def test_the_loop_bound_holds_against_onnxruntime(tmp_path, model: str, always: bool) -> None:
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    path = tmp_path / f"{model}.onnx"
    onnx.save(nonzero_loop(always) if model == "nonzero" else nms_loop(), str(path))
    result = validate(path, runs=1)  # (the first run: what the plain report answers)
    first = result.runs[0]
    assert first.activation_difference_bytes >= 0
    assert result.raw_estimate.peak_activation_bytes >= first.measured.peak_activation_bytes
    assert not [w for w in result.warnings if w.code in ("unknown-shape", "loop-body-unsized")]
