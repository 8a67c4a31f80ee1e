"""Tiny graphs built with onnx.helper for golden tests. T is one float32 [1,1024,1024] tensor: 4 MiB."""

from __future__ import annotations

import onnx
import onnx.helper as oh
from onnx import TensorProto

SHAPE = [1, 1024, 1024]
T = 4 * 1024 * 1024


def value(
    name: str, shape: list[int | str | None] | None = None, dtype: int = TensorProto.FLOAT
) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, dtype, SHAPE if shape is None else shape)


def model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
          initializers: list[onnx.TensorProto] | None = None, opset: int = 18) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "test", inputs, outputs, initializer=initializers or [])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def node(op: str, inputs: list[str], outputs: list[str], **attrs: object) -> onnx.NodeProto:
    return oh.make_node(op, inputs, outputs, name=f"{op}_{outputs[0]}", **attrs)


def chain() -> onnx.ModelProto:
    """x -> a=Add -> b=Mul -> c=Sub -> y=Add: each op reads one T and writes a new T."""
    return model(
        [node("Add", ["x", "x"], ["a"]), node("Mul", ["a", "a"], ["b"]), node("Sub", ["b", "b"], ["c"]),
         node("Add", ["c", "c"], ["y"])],
        [value("x")], [value("y")])


def fanout() -> onnx.ModelProto:
    """x feeds u0, u1, u2; s1 = u0 + u1; y = s1 + u2."""
    return model(
        [node("Add", ["x", "x"], ["u0"]), node("Mul", ["x", "x"], ["u1"]), node("Sub", ["x", "x"], ["u2"]),
         node("Add", ["u0", "u1"], ["s1"]), node("Add", ["s1", "u2"], ["y"])],
        [value("x")], [value("y")])


def skip() -> onnx.ModelProto:
    """a = x + x is kept across b and c for the skip connection y = c + a."""
    return model(
        [node("Add", ["x", "x"], ["a"]), node("Mul", ["a", "a"], ["b"]), node("Mul", ["b", "b"], ["c"]),
         node("Add", ["c", "a"], ["y"])],
        [value("x")], [value("y")])


def inplace() -> onnx.ModelProto:
    """a = x + x; b = Relu(a); c = Sigmoid(b); y = c + c: Relu and Sigmoid write over their dying input."""
    return model(
        [node("Add", ["x", "x"], ["a"]), node("Relu", ["a"], ["b"]), node("Sigmoid", ["b"], ["c"]),
         node("Add", ["c", "c"], ["y"])],
        [value("x")], [value("y")])


def alias() -> onnx.ModelProto:
    """a = x + x; r = Reshape(a, [1024,1024]); u = Unsqueeze(r, [0]); y = u + u: r and u are views of a."""
    shape = oh.make_tensor("shape", TensorProto.INT64, [2], [1024, 1024])
    axes = oh.make_tensor("axes", TensorProto.INT64, [1], [0])
    return model(
        [node("Add", ["x", "x"], ["a"]), node("Reshape", ["a", "shape"], ["r"]),
         node("Unsqueeze", ["r", "axes"], ["u"]), node("Add", ["u", "u"], ["y"])],
        [value("x")], [value("y")], [shape, axes])


def if_branches() -> onnx.ModelProto:
    """z = If(cond): then t1 = x + x, out = t1 * t1; else e1 = Concat(x, x) (2T), s0, s1 = Split(e1), out = s0 + s1.

    y = z + x. Both branches read x from the outer graph.
    """
    then_graph = oh.make_graph(
        [node("Add", ["x", "x"], ["t1"]), node("Mul", ["t1", "t1"], ["t_out"])], "then", [], [value("t_out")])
    else_graph = oh.make_graph(
        [node("Concat", ["x", "x"], ["e1"], axis=1), node("Split", ["e1"], ["s0", "s1"], axis=1, num_outputs=2),
         node("Add", ["s0", "s1"], ["e_out"])], "else", [], [value("e_out")])
    return model(
        [oh.make_node("If", ["cond"], ["z"], name="if", then_branch=then_graph, else_branch=else_graph),
         node("Add", ["z", "x"], ["y"])],
        [value("cond", [], TensorProto.BOOL), value("x")], [value("y")])


def loop() -> onnx.ModelProto:
    """y = Loop(3 times, v = x): body a = v + x (outer x), v_out = Relu(a)."""
    body = oh.make_graph(
        [node("Add", ["v_in", "x"], ["a"]), node("Relu", ["a"], ["v_out"]),
         node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [value("i", [], TensorProto.INT64), value("cond_in", [], TensorProto.BOOL), value("v_in")],
        [value("cond_out", [], TensorProto.BOOL), value("v_out")])
    trips = oh.make_tensor("trips", TensorProto.INT64, [], [3])
    return model(
        [oh.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=body)],
        [value("x")], [value("y")], [trips])


def symbolic_mlp() -> onnx.ModelProto:
    """x [batch, 256] @ W1 [256, 512] -> Relu -> @ W2 [512, 128] = y [batch, 128]; weights float32."""
    w1 = oh.make_tensor("W1", TensorProto.FLOAT, [256, 512], [0.0] * (256 * 512))
    w2 = oh.make_tensor("W2", TensorProto.FLOAT, [512, 128], [0.0] * (512 * 128))
    return model(
        [node("MatMul", ["x", "W1"], ["h"]), node("Relu", ["h"], ["r"]), node("MatMul", ["r", "W2"], ["y"])],
        [value("x", ["batch", 256])], [value("y", ["batch", 128])], [w1, w2])


def external_header(name: str, dtype: int, dims: list[int], location: str = "absent.bin") -> onnx.TensorProto:
    """A weight stored as external data: only its header (name, type, dims) is in the model."""
    tensor = onnx.TensorProto(name=name, data_type=dtype, dims=dims)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    return tensor
