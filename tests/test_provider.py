"""The provider-aware report: on onnxruntime's CPU provider a float16 model runs partly in float32, between the
Casts onnxruntime inserts around operators without a float16 kernel; the report counts them, and equals what
onnxruntime allocates."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxmem
from onnxmem.ir.load import load_model
from onnxmem.targets.ort.cpu.float16 import cpu_float16_casts
from onnxmem.targets.ort.planner import infer_symbolic

F16 = TensorProto.FLOAT16


def half_mlp() -> onnx.ModelProto:
    """x (fp16 [batch, 64]) -> MatMul w1 -> Relu -> MatMul w2 -> Add x2 -> y (fp16): no float16 CPU kernel for
    MatMul, Relu or Add, so all of them run in float32; Reshape between them has one (it moves data only)."""
    w1 = numpy_helper.from_array(np.ones((64, 128), np.float16), "w1")
    w2 = numpy_helper.from_array(np.ones((128, 64), np.float16), "w2")
    shape = numpy_helper.from_array(np.array([-1, 128], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["r2"], name="reshape"),
             helper.make_node("MatMul", ["r2", "w2"], ["o"], name="mm2"),
             helper.make_node("Add", ["o", "x"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", F16, ["batch", 64])],
                              [helper.make_tensor_value_info("y", F16, ["batch", 64])], initializer=[w1, w2, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_casts_go_where_onnxruntime_puts_them() -> None:
    loaded = load_model(half_mlp())
    changed = cpu_float16_casts(loaded, infer_symbolic(loaded.proto))
    assert changed is not None
    casts = [(n.input[0], onnx.helper.get_attribute_value(n.attribute[0])) for n in changed.proto.graph.node
             if n.op_type == "Cast"]
    # x and both weights cast to float32 once each (x read twice); only y cast back (the rest stays float32, and
    # the Reshape between two converted nodes is converted too)
    assert sorted(casts) == sorted([("x", TensorProto.FLOAT), ("w1", TensorProto.FLOAT), ("w2", TensorProto.FLOAT),
                                    ("InsertedPrecisionFreeCast_y", F16)])
    cuda = onnxmem.analyze(half_mlp(), {"batch": 8})
    cpu = onnxmem.analyze(half_mlp(), {"batch": 8}, provider="cpu")
    assert cuda.provider == "cuda" and cpu.provider == "cpu"
    assert [w.code for w in cpu.warnings] == ["cpu-float16-casts"] and not cuda.warnings
    assert cpu.inference.peak_activation_bytes > 2 * cuda.inference.peak_activation_bytes


def test_a_float32_model_is_the_same_on_both_providers() -> None:
    from . import graphs

    assert onnxmem.analyze(graphs.symbolic_mlp(), {"batch": 4}, provider="cpu").inference == \
        onnxmem.analyze(graphs.symbolic_mlp(), {"batch": 4}).inference


@pytest.mark.parametrize("batch", [1, 8])
def test_the_cpu_report_equals_onnxruntimes_first_run(batch: int) -> None:
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    result = validate(half_mlp(), {"batch": batch}, opt_level="disable", runs=1)
    measured = result.runs[0].measured.peak_activation_bytes
    assert result.raw_estimate.peak_activation_bytes == measured  # the plain report, provider cpu
    assert onnxmem.analyze(half_mlp(), {"batch": batch}).inference.peak_activation_bytes < measured  # cuda's


def test_an_unknown_provider_is_a_clear_error() -> None:
    with pytest.raises(onnxmem.OnnxMemError, match="unknown provider 'tpu'"):
        onnxmem.analyze(half_mlp(), {"batch": 1}, provider="tpu")


def half_gather() -> onnx.ModelProto:
    """ids (int64) -> Add one -> Gather from a float16 table -> Add a float16 bias -> y: Gather has a float16 CPU
    kernel, Add has none. The Gather reads a node's output (an input edge), its float16 input is an initializer
    (no edge) and its float16 output goes only to the Add: onnxruntime forces it to float32 too
    (IsIsolatedFp16NodeOnCpu), casting the table rather than the Gather's output."""
    table = numpy_helper.from_array(np.ones((100, 64), np.float16), "table")
    bias = numpy_helper.from_array(np.ones((64,), np.float16), "bias")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    nodes = [helper.make_node("Add", ["ids", "one"], ["ids1"], name="shift"),
             helper.make_node("Gather", ["table", "ids1"], ["e"], name="gather"),
             helper.make_node("Add", ["e", "bias"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "gather", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 8])],
                              [helper.make_tensor_value_info("y", F16, ["batch", 8, 64])],
                              initializer=[table, bias, one])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def half_residual() -> onnx.ModelProto:
    """Two residual blocks in float16: LayerNormalization (a float16 CPU kernel), MatMuls by [256, 256] weights and
    residual Adds (none): the second norm sits between converted nodes and runs in float32 too, and the weights'
    Casts, which onnxruntime indexes after the model's nodes, run where its reverse depth-first order reaches them."""
    weights = [numpy_helper.from_array(np.full((256, 256), 0.01, np.float16), f"w{i}") for i in range(3)]
    scale = numpy_helper.from_array(np.ones((256,), np.float16), "g")
    shift = numpy_helper.from_array(np.zeros((256,), np.float16), "b")
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], name="ln"),
             helper.make_node("MatMul", ["n", "w0"], ["q"], name="mm0"),
             helper.make_node("Add", ["q", "n"], ["r"], name="res0"),
             helper.make_node("LayerNormalization", ["r", "g", "b"], ["n1"], name="ln1"),
             helper.make_node("MatMul", ["n1", "w1"], ["h"], name="mm1"),
             helper.make_node("MatMul", ["h", "w2"], ["h2"], name="mm2"),
             helper.make_node("Add", ["h2", "n1"], ["y"], name="res1")]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", F16, ["batch", 256])],
                              [helper.make_tensor_value_info("y", F16, ["batch", 256])],
                              initializer=[*weights, scale, shift])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_isolated_float16_node_with_an_initializer_input_runs_in_float32() -> None:
    loaded = load_model(half_gather())
    changed = cpu_float16_casts(loaded, infer_symbolic(loaded.proto))
    assert changed is not None
    casts = sorted((n.input[0], onnx.helper.get_attribute_value(n.attribute[0])) for n in changed.proto.graph.node
                   if n.op_type == "Cast")
    assert casts == sorted([("table", TensorProto.FLOAT), ("bias", TensorProto.FLOAT),
                            ("InsertedPrecisionFreeCast_y", F16)])


@pytest.mark.parametrize("build", [half_gather, half_residual])
def test_the_cpu_report_runs_the_inserted_casts_where_onnxruntime_does(build) -> None:  # type: ignore[no-untyped-def]
    # the plain report on the file as given (the provider's Casts placed as onnxruntime places and orders them)
    # equals onnxruntime's first run; before, half_residual came out -1,536 B at batch 1 and +2,048 B at batch 8
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    for batch in (1, 8):
        result = validate(build(), {"batch": batch}, opt_level="disable", runs=1)
        assert result.raw_estimate.peak_activation_bytes == result.runs[0].measured.peak_activation_bytes


@pytest.mark.parametrize("norms", [1, 2])
def test_a_float16_layer_norms_scale_and_bias_are_held_as_float32(norms: int) -> None:
    # LayerNormalization runs in float16 on the CPU provider; its kernel converts the [64] float16 scale and bias to
    # float32 copies when the session is created (LayerNormImpl::PrePack): 2 x 64 x 4 B in the arena, for each
    # norm, even where two norms read the same scale and bias
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    scale = numpy_helper.from_array(np.ones((64,), np.float16), "g")
    shift = numpy_helper.from_array(np.zeros((64,), np.float16), "b")
    names = ["x", *(f"n{i}" for i in range(norms - 1)), "y"]
    nodes = [helper.make_node("LayerNormalization", [names[i], "g", "b"], [names[i + 1]], name=f"ln{i}")
             for i in range(norms)]
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", F16, ["batch", 64])],
                              [helper.make_tensor_value_info("y", F16, ["batch", 64])], initializer=[scale, shift])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    run = validate(model, {"batch": 4}, runs=1).runs[0]
    assert run.measured.weights_bytes == norms * 2 * 64 * 4
    assert run.estimated.weights_bytes == run.measured.weights_bytes
    assert run.estimated.arena_held_bytes == run.measured.arena_held_bytes
