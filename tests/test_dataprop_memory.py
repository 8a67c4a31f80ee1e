"""ONNX's data propagation without the values of long vectors that no shape reads (shapes/infer.py _propagated):
the model it gives is byte for byte the one ONNX's whole inference gives, and it holds far less memory."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import onnxmem.shapes.infer as infer
from onnxmem.shapes.dims import input_dims

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not infer._propagation_as_known(),
                                reason="this ONNX propagates values through other operators than onnx 1.23's")


def _whole(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)


def _routing(tokens: int = 32, declared: bool = True) -> onnx.ModelProto:
    """An MoE block's routing, as the --hf export writes it: tokens x 2 expert indices flattened and sorted (a
    TopK whose k is the count), the order through Cast, Mul, Add, Concat and Unsqueeze, rows gathered by it; a
    NonZero before and after (ONNX names their dims 'unk__N'); a Reshape whose target is computed from a Shape and
    one whose target is a Slice of the long order itself (their values are read: those nodes stay)."""
    pairs = tokens * 2
    nodes = [
        helper.make_node("NonZero", ["mask"], ["nz"]),
        helper.make_node("Reshape", ["idx", "flat_shape"], ["flat"]),
        helper.make_node("TopK", ["flat", "k"], ["sorted", "order"], largest=0),
        helper.make_node("Cast", ["order"], ["order_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["order_f", "order_f"], ["squared"]),
        helper.make_node("Cast", ["squared"], ["squared_i"], to=TensorProto.INT64),
        helper.make_node("Add", ["squared_i", "order"], ["summed"]),
        helper.make_node("Concat", ["summed", "order"], ["both"], axis=0),
        helper.make_node("Unsqueeze", ["both", "zero"], ["column"]),
        helper.make_node("Gather", ["rows", "order"], ["gathered"], axis=0),
        helper.make_node("Shape", ["gathered"], ["gathered_shape"]),
        helper.make_node("Slice", ["gathered_shape", "zero", "one"], ["first"]),
        helper.make_node("Concat", ["first", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["gathered", "target"], ["regrouped"]),
        helper.make_node("Slice", ["order", "zero", "two"], ["two_of_order"]),
        helper.make_node("Reshape", ["regrouped", "two_of_order"], ["by_order"]),
        helper.make_node("NonZero", ["column"], ["nz_after"]),
        helper.make_node("Cast", ["nz_after"], ["nz_after_f"], to=TensorProto.FLOAT),
    ]
    initializers = [
        helper.make_tensor("flat_shape", TensorProto.INT64, [1], [-1]),
        helper.make_tensor("k", TensorProto.INT64, [1], [pairs]),
        helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        helper.make_tensor("two", TensorProto.INT64, [1], [2]),
        helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1]),
    ]
    inputs = [helper.make_tensor_value_info("mask", TensorProto.FLOAT, [3, 4]),
              helper.make_tensor_value_info("idx", TensorProto.INT64, [tokens, 2]),
              helper.make_tensor_value_info("rows", TensorProto.FLOAT, [4 * pairs, 8])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
               for name in ("by_order", "nz_after_f")] + [helper.make_tensor_value_info("nz", TensorProto.INT64, None)]
    # the exporter declares some values with its own symbolic sizes ('2*seq': no input dim of this graph)
    value_info = [helper.make_tensor_value_info("order", TensorProto.INT64, ["2*seq"]),
                  helper.make_tensor_value_info("squared", TensorProto.FLOAT, ["2*seq"])] if declared else []
    graph = helper.make_graph(nodes, "routing", inputs, outputs, initializers, value_info=value_info)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


@pytest.fixture
def short_vectors_are_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leave out the values of vectors of more than 8 numbers (the test graphs are small)."""
    monkeypatch.setattr(infer, "LONG_UNREAD_VALUE", 8)
    monkeypatch.setattr(infer, "LONG_UNREAD_NUMBERS", 16)


@pytest.mark.parametrize("declared", [True, False])
def test_the_model_is_the_whole_inferences_byte_for_byte(short_vectors_are_long: None, declared: bool) -> None:
    model = _routing(declared=declared)
    plain = infer._inferred(model, False)
    left_out = [model.graph.node[i].output[0] for i in infer._unread_long_values(model, plain)]
    # the value chain on the order (its values reach no shape; a Shape reads the type of the rows gathered by it)
    # is left out; what feeds a Reshape's target stays
    assert set(left_out) == {"order_f", "squared", "squared_i", "summed", "both", "column", "gathered"}
    assert infer._propagated(model, plain).SerializeToString() == _whole(model).SerializeToString()


def test_unk_names_fall_as_in_the_whole_inference(short_vectors_are_long: None) -> None:
    whole = _whole(_routing())
    names = {v.name: [d.dim_param for d in v.type.tensor_type.shape.dim if d.dim_param]
             for v in (*whole.graph.value_info, *whole.graph.output)}
    assert names["nz"] and names["nz_after"]  # (ONNX named them: the check below is of something)
    mine = infer._propagated(_routing(), infer._inferred(_routing(), False))
    assert {v.name: [d.dim_param for d in v.type.tensor_type.shape.dim if d.dim_param]
            for v in (*mine.graph.value_info, *mine.graph.output)} == names


def test_types_that_are_not_the_inferences_fall_back_to_the_whole(short_vectors_are_long: None) -> None:
    model = _routing()
    wrong = infer._inferred(model, False)
    for value in wrong.graph.value_info:
        if value.name == "squared":  # a size no inference gives it
            value.type.tensor_type.shape.dim[0].dim_value = 7
    assert infer._unread_long_values(model, wrong)
    assert infer._propagated(model, wrong).SerializeToString() == _whole(model).SerializeToString()


def test_a_graph_beyond_onnxs_own_inference_is_inferred_whole(short_vectors_are_long: None) -> None:
    model = _routing()
    model.graph.node.append(helper.make_node("FusedThing", ["order"], ["fused"], domain="com.example"))
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    assert infer._unread_long_values(model, infer._inferred(model, False)) == []


def test_short_vectors_take_the_whole_inference() -> None:
    model = _routing()  # 64 numbers: far below LONG_UNREAD_VALUE
    assert infer._unread_long_values(model, infer._inferred(model, False)) == []


def test_sizing_finds_the_same_types_with_and_without_leaving_values_out(
        short_vectors_are_long: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # the count of pairs comes from the tokens a user binds: a TopK whose k is computed, known in the rounds of
    # shape values (the case of the Mixtral export)
    model = _routing()
    graph = model.graph
    graph.input[1].type.tensor_type.shape.dim[0].dim_param = "tokens"
    k_nodes = [helper.make_node("Shape", ["flat"], ["flat_size"]),
               helper.make_node("Gather", ["flat_size", "zero_scalar"], ["count"], axis=0),
               helper.make_node("Reshape", ["count", "flat_shape"], ["k_computed"]),
               helper.make_node("Identity", ["k_computed"], ["k_copied"])]
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend([nodes[0], nodes[1], *k_nodes, *nodes[2:]])
    graph.node[6].input[1] = "k_copied"
    graph.initializer.append(helper.make_tensor("zero_scalar", TensorProto.INT64, [], [0]))
    free = input_dims(model)
    left_out: list[int] = []
    unread = infer._unread_long_values

    def counted(light: onnx.ModelProto, known: onnx.ModelProto) -> list[int]:
        found = unread(light, known)
        left_out.extend(found)
        return found

    monkeypatch.setattr(infer, "_unread_long_values", counted)
    found = infer._infer(model, free, {"tokens": 32}, [])
    assert left_out, "the long values were never left out: the test checks nothing"
    monkeypatch.setattr(infer, "_unread_long_values", lambda light, known: [])
    assert found == infer._infer(model, free, {"tokens": 32}, [])
    assert found["summed"][1] == (64,) and found["by_order"][1] is not None


MEASURE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import onnx
    from onnx import TensorProto, helper
    import onnxmem.shapes.infer as infer

    def peak_kib():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])

    pairs, chain = 65536, 80
    nodes = [helper.make_node("TopK", ["flat", "k"], ["sorted", "v0"], largest=0)]
    for i in range(chain):
        nodes.append(helper.make_node("Cast", ["v%d" % i], ["v%d" % (i + 1)], to=TensorProto.INT64))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("flat", TensorProto.INT64, [pairs])],
                              [helper.make_tensor_value_info("v%d" % chain, TensorProto.INT64, None)],
                              [helper.make_tensor("k", TensorProto.INT64, [1], [pairs])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    plain = infer._inferred(model, False)
    before = peak_kib()
    if sys.argv[1] == "whole":
        onnx.shape_inference.infer_shapes(model, False, False, True)
    else:
        assert infer._unread_long_values(model, plain)
        infer._propagated(model, plain)
    print(peak_kib() - before)
""")


def test_the_long_values_are_not_held() -> None:
    """80 Casts of 65,536 routing indices: ONNX's whole inference holds 80 values of 65,536 unknown numbers."""
    code = MEASURE.format(root=str(ROOT))
    grown = {how: int(subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True,
                                     check=True).stdout.split()[-1]) for how in ("whole", "left out")}
    assert grown["whole"] > 200 * 1024, grown  # (else the measure shows nothing)
    assert grown["left out"] < grown["whole"] / 8, grown
