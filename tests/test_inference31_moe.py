"""Issue 31, MoE routing: transformers' batched_mm experts repeat each token top-k times (repeat_interleave), which
the TorchScript exporter writes as Tile(tokens, Reshape(OneHot([1], 3, [1, k]))): the shape values carry through
OneHot and Tile, so the Tile's output is sized from the bound dims (it was unsized and warned unknown-shape)."""

from __future__ import annotations

import numpy
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxmem
from onnxmem.shapes.values import SHAPE_VALUE_OPS

HIDDEN, EXPERTS, TOP_K = 8, 4, 2


def _const(name: str, values: list[int], dims: list[int] | None = None) -> onnx.NodeProto:
    dims = [len(values)] if dims is None else dims
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, dims, values))


def _routed_model() -> onnx.ModelProto:
    """x [batch, seq, 8] -> tokens [batch*seq, 8] -> router logits over 4 experts -> top-2 -> each token repeated
    k times by Tile(tokens[:, None], OneHot([1], 3, [1, k])) -> [batch*seq*k, 8] -> summed."""
    router = numpy_helper.from_array(numpy.random.default_rng(0).standard_normal((HIDDEN, EXPERTS))
                                     .astype(numpy.float32), "router")
    nodes = [_const("flat_shape", [-1, HIDDEN]), _const("k", [TOP_K]), _const("last", [-1]), _const("end", [2**62]),
             _const("one", [1]), _const("depth", [3], []), _const("minus_one", [-1]), _const("axis1", [1]),
             helper.make_node("Reshape", ["x", "flat_shape"], ["tokens"]),
             helper.make_node("MatMul", ["tokens", "router"], ["logits"]),
             helper.make_node("TopK", ["logits", "k"], ["weights", "experts"], axis=-1),
             helper.make_node("Shape", ["experts"], ["experts_shape"]),
             helper.make_node("Slice", ["experts_shape", "last", "end"], ["top_k"]),
             helper.make_node("Concat", ["one", "top_k"], ["on_off"], axis=0),
             helper.make_node("OneHot", ["one", "depth", "on_off"], ["hot"]),
             helper.make_node("Reshape", ["hot", "minus_one"], ["repeats"]),
             helper.make_node("Unsqueeze", ["tokens", "axis1"], ["tokens3"]),
             helper.make_node("Tile", ["tokens3", "repeats"], ["repeated"]),
             helper.make_node("Reshape", ["repeated", "flat_shape"], ["selected"]),
             helper.make_node("Relu", ["selected"], ["activated"]),
             helper.make_node("ReduceSum", ["activated"], ["total"], keepdims=0)]
    graph = helper.make_graph(nodes, "routed", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               ["batch", "seq", HIDDEN])],
                              [helper.make_tensor_value_info("total", TensorProto.FLOAT, None)], initializer=[router])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_one_hot_and_tile_compute_the_repeats() -> None:
    one_hot, tile = SHAPE_VALUE_OPS["OneHot"], SHAPE_VALUE_OPS["Tile"]
    assert one_hot is not None and tile is not None
    hot = one_hot([numpy.array([1]), numpy.array(3), numpy.array([1, 2])], {})
    assert hot is not None and hot.tolist() == [[1, 2, 1]]
    assert one_hot([numpy.array([-1, 0]), numpy.array(3), numpy.array([0, 5])], {"axis": 0}).tolist() == \
        [[0, 5], [0, 0], [5, 0]]  # type: ignore[union-attr]
    assert one_hot([None, numpy.array(3), numpy.array([0, 1])], {}) is None  # routed indices: data, unknown
    assert tile([numpy.array([2, 3]), numpy.array([2])], {}).tolist() == [2, 3, 2, 3]  # type: ignore[union-attr]


@pytest.mark.parametrize(("batch", "seq"), [(1, 5), (3, 7)])
def test_repeated_tokens_are_sized_from_the_bound_dims(tmp_path, batch: int, seq: int) -> None:
    path = tmp_path / "routed.onnx"
    onnx.save(_routed_model(), str(path))
    analysis = onnxmem.analysis(path, {"batch": batch, "seq": seq}, provider="cpu")
    assert not [w for w in analysis.report.warnings if w.code == "unknown-shape"]
    repeated = next(t for t in analysis.graph.tensors if t.name == "repeated")
    assert repeated.shape == (batch * seq, TOP_K, HIDDEN)
    assert repeated.nbytes == batch * seq * TOP_K * HIDDEN * 4


def test_validate_is_exact_on_the_routed_tokens(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    path = tmp_path / "routed.onnx"
    onnx.save(_routed_model(), str(path))
    result = validate(path, {"batch": 2, "seq": 6}, runs=2)
    assert [run.activation_difference_bytes for run in result.runs] == [0, 0]
    report = onnxmem.analyze(path, {"batch": 2, "seq": 6}, provider="cpu")
    assert report.inference.peak_activation_bytes == result.runs[0].measured.peak_activation_bytes
