"""Issue 31, the TorchScript exports of torchvision's detection models: their transform sizes the image by float
arithmetic on sizes (floor(size * scale) for the resize, ceil(size / 32.0) * 32 for the padding, cast back to
int64), which sizing now follows as onnxruntime computes it (float32); onnxruntime's own planner does not, so it
knows none of those shapes; and their batched NMS runs in the else branch of an If, whose outputs are now sized at
the larger branch with the NMS at its bound (they were unsized: -81% and -88% on SSDlite and RetinaNet)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxmem
from onnxmem.shapes.sizing import bind_and_infer
from onnxmem.targets.ort.planner import infer_symbolic, sizes_from_float_arithmetic


def const(name: str, value: object, dtype: type = np.int64) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype=dtype)))


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], output: str,
           dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(output, dtype, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def padded_model(h: int, w: int) -> onnx.ModelProto:
    """x [1, 3, h, w] padded at the bottom and right to multiples of 32 as torchvision's batch_images does, in
    float: pad = int64(ceil(float(size) / 32.0)) * 32 - size; then a Relu and a max over everything. The Relu is
    done in place only where the planner knows the padded shape."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), const("f32", 32.0, np.float32), const("i32", 32)]
    pads = []
    for axis, name in ((2, "h"), (3, "w")):
        nodes += [const(f"{name}_axis", axis), helper.make_node("Gather", ["shape", f"{name}_axis"], [name]),
                  helper.make_node("Cast", [name], [f"{name}_f"], to=TensorProto.FLOAT),
                  helper.make_node("Div", [f"{name}_f", "f32"], [f"{name}_q"]),
                  helper.make_node("Ceil", [f"{name}_q"], [f"{name}_c"]),
                  helper.make_node("Cast", [f"{name}_c"], [f"{name}_ci"], to=TensorProto.INT64),
                  helper.make_node("Mul", [f"{name}_ci", "i32"], [f"{name}_p"]),
                  helper.make_node("Sub", [f"{name}_p", name], [f"{name}_pad"]), const(f"{name}_ax", [0]),
                  helper.make_node("Unsqueeze", [f"{name}_pad", f"{name}_ax"], [f"{name}_pad1"])]
        pads.append(f"{name}_pad1")
    nodes += [const("zeros", [0, 0, 0, 0, 0, 0]), helper.make_node("Concat", ["zeros", *pads], ["pads"], axis=0),
              helper.make_node("Pad", ["x", "pads"], ["y"]), helper.make_node("Relu", ["y"], ["z"]),
              helper.make_node("ReduceMax", ["z"], ["out"], keepdims=0)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])], "out")


def resized_model(h: int, w: int, target: float) -> onnx.ModelProto:
    """x [1, 3, h, w] resized as torchvision's _resize_image_and_masks does with a traced size: scale =
    target * 1 / min(h, w) (ReduceMin of the size list, Reciprocal), each size floor(float(size) * scale), cast
    to int64 and given to Resize as its sizes."""
    nodes = [const("sizes", [h, w]), helper.make_node("ReduceMin", ["sizes"], ["smallest"], keepdims=0),
             helper.make_node("Cast", ["smallest"], ["smallest_f"], to=TensorProto.FLOAT),
             helper.make_node("Reciprocal", ["smallest_f"], ["inverse"]), const("target", target, np.float32),
             helper.make_node("Mul", ["inverse", "target"], ["scale"]),
             helper.make_node("Shape", ["x"], ["shape"]), const("hw", [2, 3]),
             helper.make_node("Gather", ["shape", "hw"], ["dims"]),
             helper.make_node("Cast", ["dims"], ["dims_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["dims_f", "scale"], ["scaled"]), helper.make_node("Floor", ["scaled"], ["low"]),
             helper.make_node("Cast", ["low"], ["new_hw"], to=TensorProto.INT64), const("nc", [1, 3]),
             helper.make_node("Concat", ["nc", "new_hw"], ["new_size"], axis=0),
             helper.make_node("Resize", ["x", "", "", "new_size"], ["y"], mode="linear"),
             helper.make_node("Relu", ["y"], ["out"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])], "out")


@pytest.mark.parametrize(("h", "w"), [(100, 90), (128, 64), (33, 200)])
def test_float_padding_is_sized_as_the_arithmetic_gives(h: int, w: int) -> None:
    sized = bind_and_infer(padded_model(h, w), {})
    assert sized.types["y"][1] == (1, 3, math.ceil(h / 32) * 32, math.ceil(w / 32) * 32)
    report = onnxmem.analyze(padded_model(h, w), provider="cpu")
    assert report.inference.unsized_tensors == 0


def test_float_resize_sizes_are_computed_in_float32() -> None:
    # 90 * float32(64 / 90): float32 arithmetic decides whether the floor is 63 or 64; the size is numpy's float32
    # result, what onnxruntime's float kernels give (checked against a run below where onnxruntime is installed)
    h, w, target = 90, 70, 64.0
    scale = np.float32(1) / np.float32(min(h, w)) * np.float32(target)
    expected = tuple(int(np.floor(np.float32(d) * scale)) for d in (h, w))
    assert bind_and_infer(resized_model(h, w, target), {}).types["y"][1] == (1, 3, *expected)


@pytest.mark.parametrize(("h", "w", "target"), [(90, 70, 64.0), (100, 30, 45.0), (37, 53, 29.0)])
def test_float_sizes_equal_onnxruntime_s(h: int, w: int, target: float) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = resized_model(h, w, target)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ran = session.run(None, {"x": np.ones((1, 3, h, w), np.float32)})[0].shape
    assert bind_and_infer(model, {}).types["out"][1] == tuple(ran)


def test_float_values_stop_where_no_integer_follows() -> None:
    # a Range of float values is no shape value (left to inference: a float arange's length), and a Ceil of
    # activations is no size
    nodes = [const("start", 0.0, np.float32), const("limit", 5.5, np.float32), const("delta", 1.5, np.float32),
             helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
             helper.make_node("Ceil", ["x"], ["c"]), helper.make_node("Mul", ["c", "r"], ["out"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], "out")
    assert not sizes_from_float_arithmetic(model)
    assert sizes_from_float_arithmetic(padded_model(100, 90)) and sizes_from_float_arithmetic(
        resized_model(90, 70, 64.0))


def test_onnxruntime_s_planner_knows_no_float_size() -> None:
    # the planner's types (infer_symbolic: onnxruntime's graph resolution) leave the padded tensor's dims unknown,
    # where sizing knows them: a Relu on it is not done in place there
    types = infer_symbolic(padded_model(100, 90))
    shape = types["y"][1]
    assert shape is None or not all(isinstance(d, int) for d in shape[2:])


def test_validate_is_exact_on_the_float_padding(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    path = tmp_path / "padded.onnx"
    onnx.save(padded_model(100, 90), str(path))
    result = validate(path, runs=2)
    assert [run.activation_difference_bytes for run in result.runs] == [0, 0]


def test_the_plain_report_is_exact_on_the_float_padding(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    path = tmp_path / "padded.onnx"
    onnx.save(padded_model(100, 90), str(path))
    result = validate(path, runs=1)
    assert result.raw_estimate.peak_activation_bytes == result.runs[0].measured.peak_activation_bytes


def if_nms_model() -> onnx.ModelProto:
    """torchvision's batched_nms as TorchScript exports it: `if boxes.numel() == 0: keep = empty else: keep =
    nms(...)[:, 2]`, then keep[:5] gathers the kept boxes. boxes [10, 4], scores [10], one class, every box kept
    at most (max_output_boxes_per_class int64 max, a constant of the branch)."""
    empty = helper.make_graph([const("nothing", np.zeros([0], np.int64))], "then", [],
                              [helper.make_tensor_value_info("nothing", TensorProto.INT64, [0])])
    nms = helper.make_graph(
        [const("b_axes", [0]), helper.make_node("Unsqueeze", ["boxes", "b_axes"], ["boxes3"]),
         const("s_axes", [0, 1]), helper.make_node("Unsqueeze", ["scores", "s_axes"], ["scores3"]),
         const("per_class", [2**63 - 1]), const("iou", [0.5], np.float32),
         helper.make_node("NonMaxSuppression", ["boxes3", "scores3", "per_class", "iou"], ["selected"]),
         const("column", [2]), helper.make_node("Gather", ["selected", "column"], ["picked"], axis=1),
         const("one", [1]), helper.make_node("Squeeze", ["picked", "one"], ["keep"])],
        "else", [], [helper.make_tensor_value_info("keep", TensorProto.INT64, ["keep_n"])])
    nodes = [helper.make_node("Size", ["boxes"], ["count"]), const("zero", 0),
             helper.make_node("Equal", ["count", "zero"], ["none"]),
             helper.make_node("If", ["none"], ["kept"], then_branch=empty, else_branch=nms),
             const("start", [0]), const("end", [5]), helper.make_node("Slice", ["kept", "start", "end"], ["first"]),
             helper.make_node("Gather", ["boxes", "first"], ["out"], axis=0)]
    return _model(nodes, [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [10, 4]),
                          helper.make_tensor_value_info("scores", TensorProto.FLOAT, [10])], "out")


def _shape(analysis: onnxmem.Analysis, name: str) -> tuple[int, ...] | None:
    return next(t.shape for t in analysis.graph.tensors if t.name == name)


def test_nms_in_a_branch_is_bounded_and_warned() -> None:
    analysis = onnxmem.analysis(if_nms_model(), provider="cpu")
    assert _shape(analysis, "kept") == (10,) and _shape(analysis, "first") == (5,) and _shape(analysis, "out") == (5, 4)
    assert analysis.report.inference.unsized_tensors == 0
    said = [w.message for w in analysis.report.warnings if w.code == "data-dependent-shape"]
    assert len(said) == 1 and "nms_boxes=10" in said[0] and "If node" in said[0]
    given = onnxmem.analysis(if_nms_model(), {"nms_boxes": 3}, provider="cpu")
    assert _shape(given, "kept") == (3,) and _shape(given, "out") == (3, 4)
    assert "nms_boxes=3 as given" in next(w.message for w in given.report.warnings if w.code == "data-dependent-shape")


def test_the_branch_bound_holds_against_onnxruntime(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    path = tmp_path / "if_nms.onnx"
    onnx.save(if_nms_model(), str(path))
    result = validate(path, runs=1)  # (the first run: what the plain report answers)
    first = result.runs[0]
    assert first.measured.peak_activation_bytes <= result.raw_estimate.peak_activation_bytes
    assert first.activation_difference_bytes >= 0
