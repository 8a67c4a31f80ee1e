"""Weights that live in control-flow bodies (a subgraph's initializers, its Constant nodes) are session memory
as the main graph's are: onnxruntime's SessionState holds a subgraph's initializers from session creation (each
body has its own SessionState, made as the session is), so they count in weights_bytes, each once, at any depth."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

import onnxmem

MiB = 1 << 20


def _value(name: str, dims: list[int], dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, dims)


def _model() -> onnx.ModelProto:
    """y, yz = If(c): the then-branch holds w (an initializer, float32 [1024, 1024]) and a Loop whose body holds
    a Constant k (float32 [256]); the else-branch holds no weight. The main graph's one weight is M, the trip
    count (int64 scalar)."""
    k = helper.make_tensor("k", TensorProto.FLOAT, [256], bytes(1024), raw=True)
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Constant", [], ["k"], value=k),
         helper.make_node("Add", ["a_in", "k"], ["a_out"])],
        "deep", [_value("i", [], TensorProto.INT64), _value("c_in", [], TensorProto.BOOL), _value("a_in", [256])],
        [_value("c_out", [], TensorProto.BOOL), _value("a_out", [256])])
    w = helper.make_tensor("w", TensorProto.FLOAT, [1024, 1024], bytes(4 * MiB), raw=True)
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t_out"]),
         helper.make_node("Loop", ["M", "", "z"], ["t_z"], name="inner", body=body)],
        "t", [], [_value("t_out", [1024]), _value("t_z", [256])], initializer=[w])
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e_out"]), helper.make_node("Neg", ["z"], ["e_z"])],
        "e", [], [_value("e_out", [1024]), _value("e_z", [256])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y", "yz"], name="gate", then_branch=then_branch, else_branch=else_branch)],
        "g", [_value("x", [1024]), _value("z", [256]), _value("c", [], TensorProto.BOOL)],
        [_value("y", [1024]), _value("yz", [256])],
        initializer=[helper.make_tensor("M", TensorProto.INT64, [], [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_weights_in_bodies_at_every_depth_are_counted_once() -> None:
    report = onnxmem.analyze(_model(), {})
    # main graph: M, int64 scalar = 8 bytes; then-branch: w, 1024 * 1024 float32 = 4 MiB;
    # the Loop's body inside it: k, 256 float32 = 1 KiB. 8 + 4,194,304 + 1,024 = 4,195,336.
    assert report.inference.weights_bytes == 8 + 4 * MiB + 1024 == 4_195_336
    assert report.inference.weights_by_dtype == {"FLOAT": 4 * MiB + 1024, "INT64": 8}
    assert report.inference.peak_bytes >= report.inference.weights_bytes
    found = [w for w in report.warnings if w.code == "subgraph-weights"]
    assert len(found) == 1
    message = found[0].message
    assert "\n" not in message
    assert message.startswith(f"2 weights ({4 * MiB + 1024:,} bytes)")
    assert "counted in weights_bytes" in message
    assert f"graph 't' of If node 'gate', 'then_branch': 1 ({4 * MiB:,} bytes)" in message
    assert "graph 'deep' of Loop node 'inner', 'body': 1 (1,024 bytes)" in message
