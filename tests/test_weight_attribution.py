"""Weights are attributed to the op that computes with them: through the ops they pass through (an export's
Transpose of a Linear weight, a Cast, a Reshape), past ops that read only their shape (Shape, Size)."""

from __future__ import annotations

import onnx.helper as oh
from onnx import TensorProto

import onnxmem

from . import graphs


def test_a_transposed_weight_whose_shape_is_read_first_belongs_to_its_matmul() -> None:
    # W [8, 4] fp32 (128 B): Shape(W) runs first, then Transpose(W) -> MatMul(x, W^T); a second weight B [8] is read
    # by the Add directly
    model = graphs.model(
        [oh.make_node("Shape", ["W"], ["s"], name="/shape"),
         oh.make_node("Transpose", ["W"], ["wt"], name="/t", perm=[1, 0]),
         oh.make_node("MatMul", ["x", "wt"], ["m"], name="/mm"),
         oh.make_node("Add", ["m", "B"], ["y"], name="/add")],
        [graphs.value("x", [2, 4])], [graphs.value("y", [2, 8]), graphs.value("s", [2], TensorProto.INT64)],
        [graphs.external_header("W", TensorProto.FLOAT, [8, 4]),
         graphs.external_header("B", TensorProto.FLOAT, [8])])
    report = onnxmem.analyze(model, None, provider="cpu")
    assert report.inference is not None
    weights = {row.op_type: row.weight_bytes for row in report.inference.by_op_type}
    assert weights.get("MatMul") == 8 * 4 * 4 and weights.get("Add") == 8 * 4
    assert not weights.get("Shape") and not weights.get("Transpose")
    assert report.inference.weights_bytes == 8 * 4 * 4 + 8 * 4
