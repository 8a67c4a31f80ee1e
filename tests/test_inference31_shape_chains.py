"""Issue 31, TorchScript shape chains: the shape values onnxruntime 1.32's graph resolution does not carry (a
scalar through a Cast, arithmetic with a constant), so its planner leaves the tensors they shape unsized and never
reuses their buffers. BEiT's relative position index (TorchScript export) builds a ConstantOfShape from
Div(Gather(Shape(x), 2), 16) through Cast, Mul and Add: sized, its Slices reused each other's freed buffers across
the layers in our plan and not in onnxruntime's, which kept them live in our timeline (+21% at batch 1)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from onnxmem.targets.ort.planner import infer_symbolic, ort_shape_inputs


def _const(name: str, dims: list[int], values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, dims, values))


def _position_index(patches_per_side: str) -> list[onnx.NodeProto]:
    """Nodes making `side` = Concat(n, n) with n = the image's patches per side as TorchScript writes it:
    Gather(Shape(x), 2) / 16, through `patches_per_side` ("cast": a Cast, "add": + 0 after it)."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), _const("two", [], [2]), _const("patch", [], [16]),
             _const("axes", [1], [0]), _const("zero", [], [0]),
             helper.make_node("Gather", ["shape", "two"], ["height"], axis=0),
             helper.make_node("Div", ["height", "patch"], ["n0"]),
             helper.make_node("Cast", ["n0"], ["n1"], to=TensorProto.INT64)]
    last = "n1"
    if patches_per_side == "add":
        nodes.append(helper.make_node("Add", ["n1", "zero"], ["n2"]))
        last = "n2"
    return [*nodes, helper.make_node("Unsqueeze", [last, "axes"], ["n"]),
            helper.make_node("Concat", ["n", "n"], ["side"], axis=0)]


def _model(patches_per_side: str = "cast") -> onnx.ModelProto:
    """x [batch, 3, 64, 64]. An index table a (float [4, 4] at any batch) shaped by `side`, sliced, the slice read
    only by a Shape; then the large y = x + sum(that shape) and z = Sigmoid(y), and e = Expand(max(z), side), [4, 4]
    too: e may take a's freed buffer only where the planner knows both are [4, 4]. onnxruntime's does not, so a's
    buffer is free while y and z are live; where e took it, it stays allocated across them (+64 B at batch 1)."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    nodes = [*_position_index(patches_per_side),
             helper.make_node("ConstantOfShape", ["side"], ["a"], value=one),
             _const("start", [1], [0]), _const("end", [1], [4]),
             helper.make_node("Slice", ["a", "start", "end"], ["a_rows"]),
             helper.make_node("Shape", ["a_rows"], ["a_shape"]),
             helper.make_node("Cast", ["a_shape"], ["a_shape_float"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["a_shape_float"], ["a_total"], keepdims=0),
             helper.make_node("Add", ["x", "a_total"], ["y"]), helper.make_node("Sigmoid", ["y"], ["z"]),
             helper.make_node("ReduceMax", ["z"], ["top"], keepdims=0),
             helper.make_node("Expand", ["top", "side"], ["e"]),
             helper.make_node("ReduceSum", ["e"], ["e_sum"], keepdims=0)]
    graph = helper.make_graph(nodes, "position_index",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 64, 64])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in ("z", "e_sum")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("patches_per_side", ["cast", "add"])
def test_a_scalar_through_cast_or_constant_arithmetic_reaches_no_shape(patches_per_side: str) -> None:
    model = _model(patches_per_side)
    types = infer_symbolic(model)
    assert ort_shape_inputs(model, types) == {}
    assert types["a"][1] != (4, 4) and types["e"][1] != (4, 4)


def test_a_scalar_through_mul_of_two_propagated_values_is_known() -> None:
    # onnxruntime's own Mul rule: both operands propagated (Gather(Shape(x), 2) squared), no constant read
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), _const("two", [], [2]), _const("axes", [1], [0]),
             helper.make_node("Gather", ["shape", "two"], ["h"], axis=0), helper.make_node("Mul", ["h", "h"], ["hh"]),
             helper.make_node("Unsqueeze", ["hh", "axes"], ["n"]), helper.make_node("ConstantOfShape", ["n"], ["c"]),
             helper.make_node("Cast", ["c"], ["z"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert infer_symbolic(model)["c"][1] == (64,)


@pytest.mark.parametrize("batch", [1, 3])
def test_validate_is_exact_where_the_planner_cannot_size_a_position_index(tmp_path, batch: int) -> None:
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    path = tmp_path / "position_index.onnx"
    onnx.save(_model(), str(path))
    result = validate(path, {"batch": batch}, runs=2)
    assert [run.activation_difference_bytes for run in result.runs] == [0, 0]
