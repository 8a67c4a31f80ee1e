"""Advanced indexing (w[idx], exported as GatherND) keeps only its indices for backward, as PyTorch's index does
(benchmarks/training_single_ops.py --gathernd): a mixture of experts that gathers each token's expert weights keeps
the gathered weights only where the product that reads them does."""

from __future__ import annotations

import onnx
import onnx.helper as oh
from onnx import TensorProto

import onnxmem
from onnxmem.training.step import TrainingOptions
from onnxmem.views.report import TrainingReport

from . import graphs

E, D, F, N = 4, 64, 32, 6  # experts, model width, expert width, token rows


def gathered_experts() -> onnx.ModelProto:
    """h = x [N,1,D] @ P [D,D]; idx [N,1] int64 -> GatherND(W [E,D,F], idx) = Wg [N,D,F]; h @ Wg -> y [N,1,F]."""
    return graphs.model(
        [oh.make_node("MatMul", ["x", "P"], ["h"], name="/proj/MatMul"),
         oh.make_node("GatherND", ["W", "idx"], ["Wg"], name="/experts/GatherND"),
         oh.make_node("MatMul", ["h", "Wg"], ["y"], name="/experts/MatMul")],
        [graphs.value("x", [N, 1, D]), graphs.value("idx", [N, 1], TensorProto.INT64)],
        [graphs.value("y", [N, 1, F])],
        [graphs.external_header("W", TensorProto.FLOAT, [E, D, F]),
         graphs.external_header("P", TensorProto.FLOAT, [D, D])])


def training(precision: str) -> TrainingReport:
    report = onnxmem.analyze(gathered_experts(), None, training=TrainingOptions(
        optimizer="sgd", device="cpu", loss="mean", precision=precision))
    assert report.training is not None and not report.training.unknown_backward_ops
    return report.training


def test_gathernd_keeps_its_indices_and_the_product_keeps_the_gathered_weights() -> None:
    # GatherND keeps its indices (a graph input here: the batch's); the second MatMul keeps h and Wg in fp32
    kept = dict(training("fp32").saved_by_op_type)
    assert "GatherND" not in kept
    assert kept["MatMul"] == N * D * 4 + N * D * F * 4


def test_under_autocast_the_gathered_weights_are_kept_only_as_the_16_bit_copy() -> None:
    # the MatMuls keep 16-bit copies of h and Wg (and of the input x, for P's gradient); nothing keeps the fp32 Wg
    # (as an unknown op GatherND kept it: N x D x F x 4 more)
    amp = training("amp-bf16")
    assert "GatherND" not in dict(amp.saved_by_op_type)
    assert amp.saved_activation_bytes == (N * D + N * D * F + N * D) * 2
