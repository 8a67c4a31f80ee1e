"""onnxruntime's EnsureUniqueDQForNodeUnit (qdq.unique_dequantize): a DequantizeLinear read by several nodes gets a
copy per reader at every optimization level, and the plain report counts the copies, checked against onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxmem
from onnxmem.ir.load import load_model
from onnxmem.targets.ort.qdq import unique_dequantize

WIDTH = 1024


def shared_dq_model(graph_output: bool = False) -> onnx.ModelProto:
    """x -> Quantize -> Dequantize (d), read by Relu, Sigmoid and Mul(d, d) (four edges); y = (relu + sigmoid) +
    mul. `graph_output`: d is a graph output too."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], name="quant"),
        helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["d"], name="dequant"),
        helper.make_node("Relu", ["d"], ["a"], name="relu"),
        helper.make_node("Sigmoid", ["d"], ["b"], name="sigmoid"),
        helper.make_node("Mul", ["d", "d"], ["m"], name="square"),
        helper.make_node("Add", ["a", "b"], ["c"], name="add1"),
        helper.make_node("Add", ["c", "m"], ["y"], name="add2"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])]
    if graph_output:
        outputs.append(helper.make_tensor_value_info("d", TensorProto.FLOAT, ["batch", WIDTH]))
    graph = helper.make_graph(
        nodes, "shared_dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])], outputs,
        initializer=[numpy_helper.from_array(np.array(0.05, dtype=np.float32), "scale"),
                     numpy_helper.from_array(np.array(128, dtype=np.uint8), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def dequantize_readers(model: onnx.ModelProto) -> list[tuple[str, int]]:
    """Give, for each DequantizeLinear, how many input slots read its output (one name per DQ)."""
    reads = [name for node in model.graph.node for name in node.input]
    return sorted((n.output[0], reads.count(n.output[0])) for n in model.graph.node
                  if n.op_type == "DequantizeLinear")


def test_each_reader_gets_its_own_dequantize() -> None:
    changed = unique_dequantize(load_model(shared_dq_model()))
    assert changed is not None
    # four edges: the first (Relu) keeps the original, the other three get a copy each, read once
    assert [count for _, count in dequantize_readers(changed.proto)] == [1, 1, 1, 1]
    assert len(changed.proto.graph.node) == 7 + 3
    onnx.checker.check_model(changed.proto)  # still in topological order


def test_a_dequantize_that_is_a_graph_output_is_kept_and_every_reader_gets_a_copy() -> None:
    changed = unique_dequantize(load_model(shared_dq_model(graph_output=True)))
    assert changed is not None
    assert len(changed.proto.graph.node) == 7 + 4
    assert dict(dequantize_readers(changed.proto))["d"] == 0  # the original is the graph output only


def test_a_dequantize_with_one_reader_is_left_as_it_is() -> None:
    model = shared_dq_model()
    del model.graph.node[3:]  # Relu only reads d
    model.graph.node.append(helper.make_node("Identity", ["a"], ["y"]))
    assert unique_dequantize(load_model(model)) is None


@pytest.mark.parametrize("graph_output", [False, True])
def test_the_plain_report_equals_onnxruntime_first_run(tmp_path: Path, graph_output: bool) -> None:
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    from onnxmem.measure.validate import validate

    model = shared_dq_model(graph_output)
    path = tmp_path / "shared_dq.onnx"
    onnx.save(model, str(path))
    # onnxruntime's own graph at level disable has the copies too
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "ran.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ran = onnx.load(str(tmp_path / "ran.onnx"))
    assert sorted(c for _, c in dequantize_readers(ran)) == \
        sorted(c for _, c in dequantize_readers(unique_dequantize(load_model(model)).proto))  # type: ignore[union-attr]
    for batch in (1, 8):
        measured = validate(path, {"batch": batch}, opt_level="disable", runs=1).runs[0].measured
        report = onnxmem.analyze(path, {"batch": batch}, provider="cpu")
        assert report.inference.peak_activation_bytes == measured.peak_activation_bytes
