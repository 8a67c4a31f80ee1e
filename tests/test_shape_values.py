"""Shape values through the chains exporters write (Shape -> Gather -> Unsqueeze -> Concat -> Reshape -> Equal /
Where / ConstantOfShape -> Expand, Range, Size): sized exactly at the bound dims, on graphs built here."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxmem
from onnxmem.shapes.sizing import bind_and_infer

I64, F = TensorProto.INT64, TensorProto.FLOAT


def const(name: str, value: object, dtype: type = np.int64) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype=dtype)))


def mask_chain_model() -> onnx.ModelProto:
    """What the TorchScript exporter writes to expand a [1, 1] buffer to input_ids' [batch, seq] with -1 kept as
    'this dim as it is': R = [batch, seq]; shape = Where(R == -1, ones(len(R)), R); y = Expand(buffer, shape)."""
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"]),
        const("zero", 0), const("one", 1), const("axes", [0]), const("flat", [-1]), const("minus", -1),
        helper.make_node("Gather", ["shape", "zero"], ["b"], axis=0),
        helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
        helper.make_node("Unsqueeze", ["s", "axes"], ["s1"]),
        helper.make_node("Concat", ["b1", "s1"], ["cat"], axis=0),
        helper.make_node("Reshape", ["cat", "flat"], ["r"]),
        helper.make_node("Shape", ["r"], ["r_shape"]),
        helper.make_node("ConstantOfShape", ["r_shape"], ["ones"], value=numpy_helper.from_array(
            np.array([1], dtype=np.int64))),
        helper.make_node("Mul", ["ones", "minus"], ["minus_ones"]),
        helper.make_node("Equal", ["r", "minus_ones"], ["is_minus"]),
        helper.make_node("Where", ["is_minus", "ones", "r"], ["target"]),
        const("buffer", [[0.0]], np.float32),
        helper.make_node("Expand", ["buffer", "target"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "mask", [helper.make_tensor_value_info("ids", I64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_mask_chain_is_sized_at_the_bound_dims() -> None:
    model = mask_chain_model()
    assert bind_and_infer(model, {"batch": 3, "seq": 7}).types["y"][1] == (3, 7)
    report = onnxmem.analyze(model, {"batch": 3, "seq": 7})
    assert report.inference.unsized_tensors == 0
    assert report.inference.output_bytes == 3 * 7 * 4  # y: float32 [3, 7]


def test_range_and_size_give_shape_values() -> None:
    # y = ConstantOfShape([Size(x)]) via Range's length: Range(0, Size(x), 2) has ceil(Size(x) / 2) elements
    nodes = [helper.make_node("Size", ["x"], ["n"]), const("start", 0), const("step", 2),
             helper.make_node("Range", ["start", "n", "step"], ["idx"]),
             helper.make_node("Shape", ["idx"], ["len"]),
             helper.make_node("ConstantOfShape", ["len"], ["y"], value=numpy_helper.from_array(
                 np.array([1.0], dtype=np.float32)))]
    graph = helper.make_graph(nodes, "range", [helper.make_tensor_value_info("x", F, ["batch", 5])],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    types = bind_and_infer(model, {"batch": 3}).types
    assert types["idx"][1] == (8,)  # 15 elements, every second one
    assert types["y"][1] == (8,)


def test_a_declared_huge_constant_of_shape_is_never_built() -> None:
    # ConstantOfShape of [2^40]: not a shape value, so not materialised (the output stays as inference types it)
    fill = numpy_helper.from_array(np.array([1], dtype=np.int64))
    nodes = [const("shape", [2**40]), helper.make_node("ConstantOfShape", ["shape"], ["y"], value=fill),
             helper.make_node("Shape", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "huge", [], [helper.make_tensor_value_info("z", I64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    types = bind_and_infer(model, {}).types
    assert types["y"][1] == (2**40,)  # sized (8 TiB), not built


def test_an_ir3_initializer_missing_from_the_inputs_is_a_known_tensor() -> None:
    # Below IR 4 ONNX's inference ignores an initializer the graph does not list as an input (onnxruntime's
    # optimizers add such initializers to IR 3 models); onnxruntime treats it as a known tensor, and so do we.
    weight = numpy_helper.from_array(np.zeros((16, 32), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                              "ir3", [helper.make_tensor_value_info("x", F, ["batch", 16])],
                              [helper.make_tensor_value_info("y", F, None)], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)], ir_version=3)
    report = onnxmem.analyze(model, {"batch": 4})
    assert report.inference.unsized_tensors == 0
    assert report.inference.output_bytes == 4 * 32 * 4
    assert report.inference.weights_bytes == 16 * 32 * 4


def test_a_split_shape_value_sizes_a_reshape() -> None:
    # onnxruntime's transpose optimizer writes Shape -> Split -> Squeeze -> Unsqueeze -> Concat for a Reshape's
    # target: y = Reshape(x, [s0 * s1, s2]) from x's own dims.
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Split", ["shape"], ["s0", "s1", "s2"], axis=0, num_outputs=3),
             helper.make_node("Mul", ["s0", "s1"], ["rows"]),
             helper.make_node("Concat", ["rows", "s2"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "split", [helper.make_tensor_value_info("x", F, ["batch", "seq", 16])],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert bind_and_infer(model, {"batch": 3, "seq": 5}).types["y"][1] == (15, 16)
    assert onnxmem.analyze(model, {"batch": 3, "seq": 5}).inference.unsized_tensors == 0


def test_a_range_of_a_huge_length_is_not_propagated() -> None:
    # Range(0, 2^40): its output's type says 2^40 values, which ONNX's data propagation would build (and run out
    # of memory); the inference runs without it, says so, and still sizes what does not depend on the values.
    nodes = [const("zero", 0), const("limit", 2**40), const("step", 1),
             helper.make_node("Range", ["zero", "limit", "step"], ["positions"]),
             helper.make_node("Unsqueeze", ["positions", "zero_axis"], ["rows"]),
             helper.make_node("Relu", ["x"], ["y"]), const("zero_axis", [0])]
    nodes = [nodes[0], nodes[1], nodes[2], nodes[6], nodes[3], nodes[4], nodes[5]]
    graph = helper.make_graph(nodes, "range", [helper.make_tensor_value_info("x", F, ["batch", 4])],
                              [helper.make_tensor_value_info("y", F, None),
                               helper.make_tensor_value_info("rows", I64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sized = bind_and_infer(model, {"batch": 2})
    assert sized.types["y"][1] == (2, 4) and sized.types["positions"][1] == (2**40,)
    assert any(w.code == "long-shape-value" for w in sized.warnings)


def channel_shuffles_model(blocks: int) -> onnx.ModelProto:
    """`blocks` channel shuffles in a row, as the TorchScript exporter writes ShuffleNetV2's: each block's Reshape
    target is [batch, 2, C / 2, H, W] computed from Shape of the previous block's output (Gather, Div, Cast twice,
    Unsqueeze, Concat), and ONNX's data propagation stops at the Div; the block's output is Reshape(.., [batch, -1,
    H, W]), so each block's size waits on the previous block's shape value."""
    nodes = [const("two", 2), const("axes", [0]), const("groups", [2])]
    x = "x"
    for k in range(blocks):
        p = f"b{k}_"
        nodes += [helper.make_node("Shape", [x], [p + "shape"])]
        parts = []
        for axis in range(4):
            nodes += [const(p + f"i{axis}", axis),
                      helper.make_node("Gather", [p + "shape", p + f"i{axis}"], [p + f"d{axis}"], axis=0)]
        nodes += [helper.make_node("Div", [p + "d1", "two"], [p + "half"]),
                  helper.make_node("Cast", [p + "half"], [p + "cast"], to=I64),
                  helper.make_node("Cast", [p + "cast"], [p + "cast2"], to=I64)]
        for name in ("d0", "cast2", "d2", "d3"):
            nodes.append(helper.make_node("Unsqueeze", [p + name, "axes"], [p + name + "_1"]))
            parts.append(p + name + "_1")
        nodes += [helper.make_node("Concat", [parts[0], "groups", *parts[1:]], [p + "target"], axis=0),
                  helper.make_node("Reshape", [x, p + "target"], [p + "grouped"]),
                  helper.make_node("Transpose", [p + "grouped"], [p + "shuffled"], perm=[0, 2, 1, 3, 4]),
                  const(p + "minus", [-1]),
                  helper.make_node("Concat", [parts[0], p + "minus", *parts[2:]], [p + "flat"], axis=0),
                  helper.make_node("Reshape", [p + "shuffled", p + "flat"], [p + "out"])]
        x = p + "out"
    graph = helper.make_graph(nodes, "shuffles", [helper.make_tensor_value_info("x", F, ["batch", 8, 4, 4])],
                              [helper.make_tensor_value_info(x, F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_long_chain_of_dependent_shape_values_is_sized_to_its_end() -> None:
    # 20 blocks, each a shape value read from the previous block's size: more rounds than a fixed handful
    model = channel_shuffles_model(20)
    types = bind_and_infer(model, {"batch": 3}).types
    assert types["b19_grouped"][1] == (3, 2, 4, 4, 4)
    assert types["b19_shuffled"][1] == (3, 4, 2, 4, 4)
    report = onnxmem.analyze(model, {"batch": 3})
    assert report.inference.unsized_tensors == 0
    assert report.inference.output_bytes == 3 * 8 * 4 * 4 * 4


def torchscript_pad_model() -> onnx.ModelProto:
    """F.pad(x, (0, 0, 0, pad_w, 0, pad_h)) as the TorchScript exporter writes it (Swin's window padding): the
    torch-order pad list, computed from x's dims (pad = (4 - W % 4) % 4), is Concat'ed with zeros, reshaped to
    [-1, 2], reversed (Slice with step -1 to -2^63 + 1), transposed and flattened into ONNX's order."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), const("four", 4), const("axes", [0]),
             const("zeros2", [0, 0])]
    for axis, name in ((1, "h"), (2, "w")):
        nodes += [const(f"i_{name}", axis), helper.make_node("Gather", ["shape", f"i_{name}"], [name], axis=0),
                  helper.make_node("Mod", [name, "four"], [f"{name}_mod"]),
                  helper.make_node("Sub", ["four", f"{name}_mod"], [f"{name}_left"]),
                  helper.make_node("Mod", [f"{name}_left", "four"], [f"pad_{name}"]),
                  helper.make_node("Unsqueeze", [f"pad_{name}", "axes"], [f"pad_{name}_1"])]
    nodes += [
        const("zero1", [0]),
        helper.make_node("Concat", ["zero1", "zero1", "zero1", "pad_w_1", "zero1", "pad_h_1"], ["torch_pads"],
                         axis=0),
        helper.make_node("Concat", ["torch_pads", "zeros2"], ["all_pads"], axis=0),
        const("pairs", [-1, 2]), helper.make_node("Reshape", ["all_pads", "pairs"], ["paired"]),
        const("start", [-1]), const("end", [-(2 ** 63) + 1]), const("axis0", [0]), const("back", [-1]),
        helper.make_node("Slice", ["paired", "start", "end", "axis0", "back"], ["reversed"]),
        helper.make_node("Transpose", ["reversed"], ["by_side"], perm=[1, 0]),
        const("flat", [-1]), helper.make_node("Reshape", ["by_side", "flat"], ["pads"]),
        helper.make_node("Pad", ["x", "pads"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "pad", [helper.make_tensor_value_info("x", F, ["batch", "h", "w", 8])],
                              [helper.make_tensor_value_info("y", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_torchscript_pad_list_is_reversed_and_transposed_into_onnx_order() -> None:
    model = torchscript_pad_model()
    # h 6 pads to 8 and w 5 to 8 (pad = (4 - d % 4) % 4 at the end of each); the channel dim (8) is not padded
    assert bind_and_infer(model, {"batch": 2, "h": 6, "w": 5}).types["y"][1] == (2, 8, 8, 8)
    assert bind_and_infer(model, {"batch": 2, "h": 8, "w": 4}).types["y"][1] == (2, 8, 4, 8)
    report = onnxmem.analyze(model, {"batch": 2, "h": 6, "w": 5})
    assert report.inference.unsized_tensors == 0
    assert report.inference.output_bytes == 2 * 8 * 8 * 8 * 4


def test_a_2d_slice_and_transpose_of_shape_values() -> None:
    from onnxmem.shapes.values import SHAPE_VALUE_OPS

    paired = np.array([[0, 1], [2, 3], [4, 5]], dtype=np.int64)
    reverse = SHAPE_VALUE_OPS["Slice"]
    assert reverse is not None
    got = reverse([paired, np.array([-1]), np.array([-(2 ** 63) + 1]), np.array([0]), np.array([-1])], {})
    assert got is not None and got.tolist() == [[4, 5], [2, 3], [0, 1]]
    transpose = SHAPE_VALUE_OPS["Transpose"]
    assert transpose is not None
    got = transpose([paired], {"perm": [1, 0]})
    assert got is not None and got.tolist() == [[0, 2, 4], [1, 3, 5]]
