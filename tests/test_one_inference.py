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


@pytest.mark.parametrize("name", ["lstm", "unet", "if_subgraph"])
@pytest.mark.parametrize("provider", ["cpu", "cuda"])
def test_sizing_infers_no_more_than_the_planner_did(name: str, provider: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # lstm's Slices and unet's Resize are sized by rules (no bound inference of the part that makes them);
    # if_subgraph reads no shape from a value, so its one inference runs without data propagation only
    from onnxmem.passes.pipeline import analysis

    count = _count_inferences(monkeypatch)
    found = analysis(str(FIXTURES / f"{name}.onnx"), {}, default_dim=3, provider=provider)
    planner_rounds = 1 if name == "unet" else 0  # (its Concat's dims merged as onnxruntime does: one round)
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
