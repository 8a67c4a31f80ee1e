"""cuDNN's convolution workspace in the CUDA provider's answer: the provider declares the scratch a Conv holds
while it runs (ExecutionProvider.op_scratch, from the measured table targets/ort/cuda/tables.py), liveness counts it
above the tensors live at the Conv's step, and a Conv whose workspace is not known is named in a warning."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from onnxmem.passes.liveness import liveness
from onnxmem.passes.pipeline import analysis
from onnxmem.targets.ort.cpu.provider import CPU
from onnxmem.targets.ort.cuda.provider import CUDA
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES

BATCH = 2
# tiny_cnn's second conv (tables.CUDNN_CONV_WORKSPACE: x + w + 16 bytes), float32:
X_BYTES = BATCH * 64 * 64 * 64 * 4  # 2,097,152
W_BYTES = 128 * 64 * 3 * 3 * 4  # 294,912
Y_BYTES = BATCH * 128 * 32 * 32 * 4  # 1,048,576 (stride 2, pads 1: 64 -> 32)
WORKSPACE = X_BYTES + W_BYTES + 16  # 2,392,080


def conv_model(channels: int = 64, shape: list[int | str] | None = None, **attributes: object) -> onnx.ModelProto:
    """One Conv, x -> y, with a 3x3 weight of 128 filters (stride 2, pads 1 unless given)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [128, channels, 3, 3], [0.0] * (128 * channels * 9))
    conv: dict[str, object] = {"strides": [2, 2], "pads": [1, 1, 1, 1], **attributes}
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **conv)  # type: ignore[arg-type]
    return helper.make_model(helper.make_graph([node], "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])


def measured_conv() -> onnx.ModelProto:
    return conv_model(shape=["n", 64, 64, 64])


def test_cuda_provider_declares_the_measured_workspace() -> None:
    run = analysis(measured_conv(), {"n": BATCH}, provider="cuda")
    scratch = CUDA.op_scratch(run.graph, run.loaded.proto)
    assert dict(scratch.bytes_by_op) == {0: WORKSPACE}
    assert scratch.warnings == ()


def test_cpu_provider_declares_none() -> None:
    run = analysis(measured_conv(), {"n": BATCH}, provider="cpu")
    scratch = CPU.op_scratch(run.graph, run.loaded.proto)
    assert dict(scratch.bytes_by_op) == {} and scratch.warnings == ()


def test_liveness_counts_scratch_at_the_op_step() -> None:
    run = analysis(measured_conv(), {"n": BATCH}, provider="cuda")
    rules = CUDA.buffer_rules(DEFAULT_INFERENCE_RULES)
    plain = liveness(run.graph, run.timeline.order, rules)
    counted = liveness(run.graph, run.timeline.order, rules, scratch={0: WORKSPACE})
    # the only activation is y (a graph output, live from the Conv on); the workspace is live while the Conv runs
    assert plain.peak_bytes == Y_BYTES
    assert counted.peak_bytes == Y_BYTES + WORKSPACE
    assert counted.subgraph_bytes == (WORKSPACE,)


def test_cuda_report_counts_the_workspace_and_cpu_report_does_not() -> None:
    cuda = analysis(measured_conv(), {"n": BATCH}, provider="cuda").report.inference
    cpu = analysis(measured_conv(), {"n": BATCH}, provider="cpu").report.inference
    assert cpu.peak_activation_bytes == Y_BYTES
    assert cuda.peak_activation_bytes == Y_BYTES + WORKSPACE


def test_unmeasured_shape_is_named_not_counted() -> None:
    run = analysis(conv_model(channels=32, shape=["n", 32, 64, 64]), {"n": BATCH}, provider="cuda")
    scratch = CUDA.op_scratch(run.graph, run.loaded.proto)
    assert dict(scratch.bytes_by_op) == {}
    [warning] = scratch.warnings
    assert warning.code == "cuda-conv-workspace" and "(conv)" in warning.message and "0 bytes" in warning.message


@pytest.mark.parametrize(("model", "dims"), [
    pytest.param(conv_model(shape=None), {}, id="input-of-unknown-shape"),
    # (pads=None: make_node leaves the attribute out)
    pytest.param(conv_model(shape=["n", 64, 64, 64], auto_pad="SAME_UPPER", pads=None), {"n": BATCH}, id="auto-pad"),
])
def test_hostile_conv_gets_the_warning_without_a_traceback(model: onnx.ModelProto, dims: dict[str, int]) -> None:
    run = analysis(model, dims, provider="cuda")
    scratch = CUDA.op_scratch(run.graph, run.loaded.proto)
    assert dict(scratch.bytes_by_op) == {}
    assert [w.code for w in scratch.warnings] == ["cuda-conv-workspace"]


def test_report_carries_the_warning_for_an_unknown_shape() -> None:
    report = analysis(conv_model(shape=None), provider="cuda").report
    assert "cuda-conv-workspace" in [w.code for w in report.warnings]
    cpu = analysis(conv_model(shape=None), provider="cpu").report
    assert "cuda-conv-workspace" not in [w.code for w in cpu.warnings]
