"""Issue 31, data-dependent shapes: NonZero, NonMaxSuppression and a TopK whose k is computed from the data are
sized at the count the user binds by name (nonzero, nms_boxes, topk_k) or else at the most the operator can give,
and a data-dependent-shape warning names the count used (they were unsized and warned unknown-shape)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

import onnxmem
from onnxmem.errors import DimError


def _save(model: onnx.ModelProto, tmp_path, name: str) -> str:
    model.ir_version = 8
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)
    return path


def _mask_model(always: bool) -> onnx.ModelProto:
    """x [batch, 16] -> the elements of x above 0 (NonZero, GatherND) -> exp. `always`: of |x| + 1 instead, every
    element, so the run's count is the bound."""
    nodes = [helper.make_node("Abs", ["x"], ["magnitude"]), helper.make_node("Add", ["magnitude", "one"], ["shifted"]),
             helper.make_node("Greater", ["shifted" if always else "x", "zero"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["where"]), helper.make_node("Transpose", ["where"], ["indices"]),
             helper.make_node("GatherND", ["x", "indices"], ["kept"]), helper.make_node("Exp", ["kept"], ["y"])]
    graph = helper.make_graph(nodes, "mask", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
                                           helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _nms_model() -> onnx.ModelProto:
    """boxes [1, 10, 4], scores [1, 2, 10], at most 3 boxes per class -> the kept boxes' indices, times 2."""
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "per_class", "iou"], ["selected"]),
             helper.make_node("Mul", ["selected", "two"], ["y"])]
    graph = helper.make_graph(nodes, "nms", [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 10, 4]),
                                             helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
                              initializer=[helper.make_tensor("per_class", TensorProto.INT64, [1], [3]),
                                           helper.make_tensor("iou", TensorProto.FLOAT, [1], [0.5]),
                                           helper.make_tensor("two", TensorProto.INT64, [], [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _shape(analysis: onnxmem.Analysis, name: str) -> tuple[int, ...] | None:
    return next(t.shape for t in analysis.graph.tensors if t.name == name)


def test_nonzero_is_sized_at_every_element_and_warned(tmp_path) -> None:
    analysis = onnxmem.analysis(_save(_mask_model(False), tmp_path, "mask"), {"batch": 3}, provider="cpu")
    assert _shape(analysis, "where") == (2, 48) and _shape(analysis, "kept") == (48,)
    codes = [w.code for w in analysis.report.warnings]
    assert "unknown-shape" not in codes and codes.count("data-dependent-shape") == 1
    assert "nonzero=48" in next(w.message for w in analysis.report.warnings if w.code == "data-dependent-shape")


def test_a_bound_count_sizes_the_outputs(tmp_path) -> None:
    path = _save(_mask_model(False), tmp_path, "mask")
    analysis = onnxmem.analysis(path, {"batch": 3, "nonzero": 5}, provider="cpu")
    assert _shape(analysis, "kept") == (5,) and _shape(analysis, "y") == (5,)
    assert "nonzero=5 as given" in next(w.message for w in analysis.report.warnings
                                        if w.code == "data-dependent-shape")
    with pytest.raises(DimError, match="nonzero=-1"):
        onnxmem.analysis(path, {"batch": 3, "nonzero": -1}, provider="cpu")


def test_nms_is_sized_at_max_boxes_per_class_times_classes(tmp_path) -> None:
    path = _save(_nms_model(), tmp_path, "nms")
    analysis = onnxmem.analysis(path, provider="cpu")
    assert _shape(analysis, "selected") == (6, 3) and _shape(analysis, "y") == (6, 3)
    assert "nms_boxes=6" in next(w.message for w in analysis.report.warnings if w.code == "data-dependent-shape")
    assert _shape(onnxmem.analysis(path, {"nms_boxes": 0}, provider="cpu"), "y") == (0, 3)


def test_a_model_without_such_an_operator_still_refuses_the_name(tmp_path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path, "plain")
    with pytest.raises(DimError, match="unknown dim nonzero"):
        onnxmem.analysis(path, {"batch": 2, "nonzero": 3}, provider="cpu")


@pytest.mark.parametrize(("always", "model"), [(True, "mask"), (False, "mask"), (False, "nms")])
def test_the_bound_holds_against_onnxruntime(tmp_path, always: bool, model: str) -> None:
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    path = _save(_mask_model(always) if model == "mask" else _nms_model(), tmp_path, model)
    result = validate(path, {"batch": 4} if model == "mask" else {}, runs=2)
    differences = [run.activation_difference_bytes for run in result.runs]
    assert all(d >= 0 for d in differences)
    if always:  # every element is kept: the bound is the run's count, to the byte
        assert differences == [0, 0]
