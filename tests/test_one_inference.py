"""One shape inference per report: the sizing rules that replace a second inference (Slice, Resize) give what
ONNX's inference gives, and the data-propagating inference is skipped only where it would find the same model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmem.shapes import sizing
from onnxmem.shapes.infer import _reads_no_shape_value

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _onnx_output_shape(nodes: list[onnx.NodeProto], shape: list[int], initializers: list[onnx.TensorProto],
                       opset: int = 18) -> list[int] | None:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model)
    out = inferred.graph.output[0].type.tensor_type
    if not out.HasField("shape") or not all(d.HasField("dim_value") for d in out.shape.dim):
        return None
    return [d.dim_value for d in out.shape.dim]


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


@pytest.mark.parametrize(("shape", "starts", "ends", "axes", "steps"), [
    ([6, 8, 10], [0], [3], [0], None),
    ([6, 8, 10], [-3], [2**63 - 1], [1], [1]),
    ([6, 8, 10], [1, 2], [-1, 100], [0, -1], [2, 3]),
    ([6, 8, 10], [-1], [-2**63], [2], [-1]),
    ([6, 8, 10], [5], [0], [0], [-2]),
    ([6, 8, 10], [7], [9], [1], [1]),  # starts past the end: empty
    ([6, 8, 10], [4], [2], None, None),  # axes left out: 0.., steps 1
])
def test_slice_rule_sizes_as_onnx_inference_does(shape: list[int], starts: list[int], ends: list[int],
                                                  axes: list[int] | None, steps: list[int] | None) -> None:
    operands: list[list[int] | None] = [starts, ends]
    names, initializers = ["x", "starts", "ends"], [_ints("starts", starts), _ints("ends", ends)]
    if axes is not None or steps is not None:
        operands.append(axes if axes is not None else list(range(len(starts))))
        names.append("axes")
        initializers.append(_ints("axes", operands[-1]))  # type: ignore[arg-type]
    if steps is not None:
        operands.append(steps)
        names.append("steps")
        initializers.append(_ints("steps", steps))
    expected = _onnx_output_shape([helper.make_node("Slice", names, ["y"])], shape, initializers)
    assert expected is not None
    assert sizing._sliced(tuple(shape), operands) == expected


def test_slice_rule_gives_nothing_it_cannot_tell() -> None:
    assert sizing._sliced((6, 8), [[0], None]) == [None, None]  # ends not constant
    assert sizing._sliced((6, 8), [[0, 0], [1, 1], [0, 0]]) == [None, None]  # an axis twice
    assert sizing._sliced((6, 8), [[0], [1], [0], [0]]) == [None, None]  # a step of 0


@pytest.mark.parametrize(("shape", "scales"), [
    ([2, 3, 7, 9], [1.0, 1.0, 2.0, 2.0]),
    ([2, 3, 7, 9], [1.0, 1.0, 1.5, 0.3333333]),
    ([1, 5, 13, 11], [1.0, 1.0, 0.7, 2.9]),
])
def test_resize_rule_sizes_scales_as_onnx_inference_does(shape: list[int], scales: list[float]) -> None:
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    expected = _onnx_output_shape([node], shape, [numpy_helper.from_array(np.array(scales, np.float32), "scales")])
    assert expected is not None
    assert sizing._resized(tuple(shape), node, [None], [scales], 18) == expected


def test_resize_rule_takes_sizes_and_leaves_axes_to_inference() -> None:
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest")
    expected = _onnx_output_shape([node], [2, 3, 7, 9], [_ints("sizes", [2, 3, 5, 4])])
    assert sizing._resized((2, 3, 7, 9), node, [[2, 3, 5, 4]], [None], 18) == expected == [2, 3, 5, 4]
    with_axes = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest", axes=[2, 3])
    assert sizing._resized((2, 3, 7, 9), with_axes, [[5, 4]], [None], 18) == [None] * 4
    assert sizing._resized((2, 3, 7, 9), node, [[2, 3, 5, 4]], [None], 10) == [None] * 4  # opset 10: not read


def _count_inferences(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from onnx.onnx_cpp2py_export import shape_inference

    count = [0]
    infer = shape_inference.infer_shapes

    def counted(*args: object, **kwargs: object) -> object:
        count[0] += 1
        return infer(*args, **kwargs)

    monkeypatch.setattr(shape_inference, "infer_shapes", counted)
    return count


@pytest.mark.parametrize("name", ["lstm", "unet", "if_subgraph", "transformer_contrib"])
@pytest.mark.parametrize("provider", ["cpu", "cuda"])
def test_sizing_infers_no_more_than_the_planner_did(name: str, provider: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # lstm's Slices and unet's Resize are sized by rules (no bound inference of the part that makes them);
    # if_subgraph reads no shape from a value, so its one inference runs without data propagation only
    from onnxmem.passes.pipeline import analysis

    count = _count_inferences(monkeypatch)
    found = analysis(str(FIXTURES / f"{name}.onnx"), {}, default_dim=3, provider=provider)
    from onnxmem.targets.ort import planner

    # the planner's rounds (unet's Concat dims merged as onnxruntime does, transformer_contrib's contrib
    # operators typed by rules) infer again unless their types are carried node by node (shapes.carry)
    planner_rounds = 0 if hasattr(planner, "carried_types") else {"unet": 1, "transformer_contrib": 4}.get(name, 0)
    assert count[0] == 1 + planner_rounds
    assert all(t.nbytes is not None for t in found.graph.tensors if t.shape is not None)


def _if_model(then_reads_shape: bool) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    then_nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["out"])] \
        if then_reads_shape else [helper.make_node("Identity", ["x"], ["out"])]
    then_branch = helper.make_graph(then_nodes, "then", [], [out])
    else_branch = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["out"], axis=0)], "else", [], [out])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then_branch,
                                                else_branch=else_branch)], "g",
                              [helper.make_tensor_value_info("c", TensorProto.BOOL, []), x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_data_propagation_is_skipped_only_where_no_shape_is_read_from_a_value() -> None:
    plain_model = _if_model(then_reads_shape=False)
    assert _reads_no_shape_value(plain_model)
    without = onnx.shape_inference.infer_shapes(plain_model, data_prop=False)
    with_values = onnx.shape_inference.infer_shapes(plain_model, data_prop=True)
    assert without.SerializeToString() == with_values.SerializeToString()
    assert not _reads_no_shape_value(_if_model(then_reads_shape=True))  # a Reshape to a computed shape


def _round(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict, list[onnx.ValueInfoProto]]:
    """One planner round as planner._planner_rounds makes it: the model inferred, the rules' and Concat merges'
    types learned, and appended to the model's declared values."""
    from onnxmem.ir.tensor_types import TypeDecoder
    from onnxmem.shapes.infer import _collect_types, _inferred, rule_value_infos
    from onnxmem.targets.ort.planner import _merged_dims

    light = onnx.ModelProto()
    light.CopyFrom(model)
    types = _collect_types(_inferred(light, data_prop=False).graph, TypeDecoder())
    learned = rule_value_infos([n for n in light.graph.node if n.domain == "com.microsoft"], types)
    learned += [v for n in light.graph.node if n.op_type == "Concat" if (v := _merged_dims(n, types)) is not None]
    light.graph.value_info.extend(learned)
    return light, types, learned


def _carry_model(after_concat: str) -> onnx.ModelProto:
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Concat", ["up", "skip"], ["cat"], axis=1),
             helper.make_node("Relu", ["cat"], ["r"]),
             helper.make_node("SkipLayerNormalization", ["h", "h", "gamma"], ["ln"], domain="com.microsoft"),
             helper.make_node("MatMul", ["ln", "w"], ["z"])]
    if after_concat == "reshape":  # a dim inference cannot name (a Reshape to a value) after a learned type
        nodes.append(helper.make_node("Reshape", ["r", "flat"], ["y"]))
    else:
        nodes.append(helper.make_node("Add", ["r", "r"], ["y"]))
    graph = helper.make_graph(
        nodes, "carry",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8]),
         helper.make_tensor_value_info("skip", TensorProto.FLOAT, ["batch", 4, 16, 16]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", "seq", 16]),
         helper.make_tensor_value_info("flat", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        initializer=[scales, numpy_helper.from_array(np.ones(16, np.float32), "gamma"),
                     numpy_helper.from_array(np.ones((16, 8), np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid("com.microsoft", 1)])


def test_carried_types_are_what_inferring_the_graph_again_gives() -> None:
    from onnxmem.ir.tensor_types import TypeDecoder
    from onnxmem.shapes.carry import carried_types
    from onnxmem.shapes.infer import _collect_types, _inferred

    light, types, learned = _round(_carry_model("add"))
    assert {v.name for v in learned} == {"cat", "ln"}  # a Concat's dims merged, a contrib operator's rule
    assert types["z"][1] is None and types["y"][1][0].startswith("unk__")  # (before: ONNX knew neither)
    again = _collect_types(_inferred(light, data_prop=False).graph, TypeDecoder())
    carried = carried_types(light, types, learned)
    assert carried == again and list(carried) == list(again)  # the same types, in the same order
    assert carried["y"][1] == ("batch", 8, 16, 16) and carried["z"][1] == ("batch", "seq", 8)


def test_carried_types_leave_a_name_only_inference_makes_to_it() -> None:
    from onnxmem.shapes.carry import carried_types

    light, types, learned = _round(_carry_model("reshape"))
    assert carried_types(light, types, learned) is None  # the Reshape to a value: inference names its dims
