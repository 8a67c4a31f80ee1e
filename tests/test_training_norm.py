"""torch.norm over some axes (ReduceL2 in the export: ConvNeXt-V2's GRN) keeps its input and the norm for backward,
as linalg_vector_norm's backward reads them (derivatives.yaml; saved-tensor hooks show exactly those two)."""

from __future__ import annotations

import onnx
import onnx.helper as oh
from onnx import TensorProto

import onnxmem
from onnxmem.training.step import TrainingOptions

from . import graphs

B, H, W, C = 4, 8, 8, 16


def grn() -> onnx.ModelProto:
    """y = x * ReduceL2(x, axes (1, 2), keepdims) for x [B, H, W, C] = x0 @ P."""
    axes = oh.make_tensor("axes", TensorProto.INT64, [2], [1, 2])
    return graphs.model(
        [oh.make_node("MatMul", ["x0", "P"], ["x"], name="/proj/MatMul"),
         oh.make_node("ReduceL2", ["x", "axes"], ["n"], name="/grn/ReduceL2", keepdims=1),
         oh.make_node("Mul", ["x", "n"], ["y"], name="/grn/Mul")],
        [graphs.value("x0", [B, H, W, C])], [graphs.value("y", [B, H, W, C])],
        [graphs.external_header("P", TensorProto.FLOAT, [C, C]), axes])


def test_reduce_l2_keeps_its_input_and_the_norm() -> None:
    report = onnxmem.analyze(grn(), None, training=TrainingOptions(optimizer="sgd", device="cpu", loss="mean"))
    assert report.training is not None and report.training.unknown_backward_ops == ()
    kept = dict(report.training.saved_by_op_type)
    assert kept["ReduceL2"] == B * H * W * C * 4 + B * C * 4
