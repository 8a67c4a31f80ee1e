"""Estimates that may be low for a reason onnxmem can see carry a named warning: a frozen LSTM on CPU runs oneDNN's
inference primitive, whose forward scratch is not modelled (unmodelled-kernel)."""

from __future__ import annotations

import onnx
import onnx.helper as oh
from onnx import TensorProto

import onnxmem
from onnxmem.training.step import TrainingOptions

from . import graphs

T, B, I, H = 16, 8, 32, 64  # noqa: E741


def lstm_head() -> onnx.ModelProto:
    """LSTM (X [T,B,I]) -> its last hidden state Y_h [1,B,H] -> a Gemm head 'fc' [B,10]."""
    return graphs.model(
        [oh.make_node("LSTM", ["X", "W", "R", "B", "", "h0", "c0"], ["Y", "Y_h", "Y_c"], name="/lstm/LSTM",
                      hidden_size=H),
         oh.make_node("Reshape", ["Y_h", "shape"], ["h"], name="/Reshape"),
         oh.make_node("Gemm", ["h", "fc.weight", "fc.bias"], ["y"], name="/fc/Gemm", transB=1)],
        [graphs.value("X", [T, B, I]), graphs.value("h0", [1, B, H]), graphs.value("c0", [1, B, H])],
        [graphs.value("y", [B, 10])],
        [graphs.external_header("W", TensorProto.FLOAT, [1, 4 * H, I]),
         graphs.external_header("R", TensorProto.FLOAT, [1, 4 * H, H]),
         graphs.external_header("B", TensorProto.FLOAT, [1, 8 * H]),
         graphs.external_header("fc.weight", TensorProto.FLOAT, [10, H]),
         graphs.external_header("fc.bias", TensorProto.FLOAT, [10]),
         oh.make_tensor("shape", TensorProto.INT64, [2], [B, H])])


def codes(**options: object) -> set[str]:
    report = onnxmem.analyze(lstm_head(), None, training=TrainingOptions(optimizer="sgd", **options))  # type: ignore[arg-type]
    return {w.code for w in report.warnings}


def test_a_frozen_lstm_on_cpu_is_warned_about() -> None:
    assert "unmodelled-kernel" in codes(device="cpu", train=("fc.*",))


def test_a_trained_lstm_or_one_on_cuda_is_not() -> None:
    assert "unmodelled-kernel" not in codes(device="cpu")
    assert "unmodelled-kernel" not in codes(device="cuda", train=("fc.*",))


def wide_frozen_front() -> onnx.ModelProto:
    """x [64, 8] -> MatMul 'front' [8, 1024] -> Relu -> MatMul 'head' [1024, 2]: the front's two 256 KiB tensors
    are the largest of the step; frozen, they are made without autograd and nothing keeps them."""
    return graphs.model(
        [oh.make_node("MatMul", ["x", "front.weight"], ["h"], name="/front/MatMul"),
         oh.make_node("Relu", ["h"], ["r"], name="/front/Relu"),
         oh.make_node("MatMul", ["r", "head.weight"], ["y"], name="/head/MatMul")],
        [graphs.value("x", [64, 8])], [graphs.value("y", [64, 2])],
        [graphs.external_header("front.weight", TensorProto.FLOAT, [8, 1024]),
         graphs.external_header("head.weight", TensorProto.FLOAT, [1024, 2])])


def test_a_peak_in_a_frozen_forward_is_warned_about_and_a_trained_one_is_not() -> None:
    def codes_of(**options: object) -> set[str]:
        report = onnxmem.analyze(wide_frozen_front(), None, training=TrainingOptions(
            optimizer="sgd", device="cpu", **options))  # type: ignore[arg-type]
        assert report.training is not None
        return {w.code for w in report.warnings} | {report.training.first_step.peak_phase}

    frozen = codes_of(train=("head.*",))
    assert "eager-lifetimes" in frozen and "forward" in frozen
    assert "eager-lifetimes" not in codes_of()


def test_a_training_answer_names_its_own_unsized_tensors_not_the_providers() -> None:
    # a custom op whose output shape nothing can infer, on the default CUDA provider (which places the op on the
    # host and names its copies '..._CUDAExecutionProvider'): the inference side warns unknown-shape with the
    # provider's names; the training step warns training-unknown-shape with the model's own, and a training answer
    # shows only its own
    import numpy as np

    from onnxmem.views.render import shown_warnings

    weight = onnx.numpy_helper.from_array(np.zeros((64, 64), np.float32), "W")
    nodes = [oh.make_node("MatMul", ["x", "W"], ["a"]), oh.make_node("Foo", ["a"], ["b"], domain="custom"),
             oh.make_node("MatMul", ["b", "W"], ["y"])]
    model = oh.make_model(oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                                        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight]),
                          opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("custom", 1)])
    report = onnxmem.analyze(model, {"batch": 8}, training=TrainingOptions(device="cpu"))
    by_code = {w.code: w.message for w in report.warnings}
    assert "ExecutionProvider" in by_code["unknown-shape"]
    own = by_code["training-unknown-shape"]
    assert "'y'" in own and "ExecutionProvider" not in own and "lower bound" in own
    about, inference = shown_warnings(report.warnings, training=True, inference_shown=True)
    assert "training-unknown-shape" in {w.code for w in about} and "unknown-shape" not in {w.code for w in about}
    assert "unknown-shape" in {w.code for w in inference}
    sized = onnxmem.analyze(graphs.symbolic_mlp(), {"batch": 8}, training=TrainingOptions(device="cpu"))
    assert "training-unknown-shape" not in {w.code for w in sized.warnings}
