"""Large tensors embedded in the file are read as headers: the parsed model holds their dims and type, and says
where in the file their data lies (ir.embedded), so memory is the file once, whatever its weights."""

from __future__ import annotations

from pathlib import Path

import numpy
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxmem
from onnxmem.errors import ModelFileError
from onnxmem.ir.embedded import ELIDED_BYTES, headers_only
from onnxmem.ir.load import load_model

_ROWS, _COLUMNS = 64, 1024  # 256 KiB of float32: over ELIDED_BYTES
_VALUES = numpy.arange(_ROWS * _COLUMNS, dtype=numpy.float32).reshape(_ROWS, _COLUMNS)


def _value(name: str, dims: list[int] | None = None, dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, [_ROWS, _COLUMNS] if dims is None else dims)


def _model(where: str, weight: TensorProto) -> onnx.ModelProto:
    """A model adding `weight` to its input, the weight an initializer, a Constant, or a Constant in an If branch."""
    add = helper.make_node("Add", ["x", weight.name], ["y"])
    if where == "initializer":
        graph = helper.make_graph([add], "g", [_value("x")], [_value("y")], [weight])
    elif where == "constant":
        graph = helper.make_graph([helper.make_node("Constant", [], [weight.name], value=weight), add], "g",
                                  [_value("x")], [_value("y")])
    else:
        then = helper.make_graph([helper.make_node("Constant", [], ["w_then"], value=weight)], "then", [],
                                 [_value("w_then")])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["w_else"])], "else", [], [_value("w_else")])
        branch = helper.make_node("If", ["c"], [weight.name], then_branch=then, else_branch=other)
        graph = helper.make_graph([branch, add], "g", [_value("x"), _value("c", [], TensorProto.BOOL)],
                                  [_value("y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weights(proto: onnx.ModelProto) -> list[TensorProto]:
    graphs = [proto.graph, *(a.g for n in proto.graph.node for a in n.attribute if a.type == a.GRAPH)]
    return [*(t for g in graphs for t in g.initializer),
            *(a.t for g in graphs for n in g.node if n.op_type == "Constant" for a in n.attribute)]


@pytest.mark.parametrize("where", ["initializer", "constant", "if-branch"])
def test_a_large_embedded_tensor_is_parsed_as_a_header_pointing_into_the_file(tmp_path: Path, where: str) -> None:
    model = _model(where, numpy_helper.from_array(_VALUES, "w"))
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    loaded = load_model(path)
    (large,) = [t for t in _weights(loaded.proto) if t.dims[:] == [_ROWS, _COLUMNS]]
    assert large.data_location == TensorProto.EXTERNAL and not large.HasField("raw_data")
    assert {e.key: e.value for e in large.external_data}["location"] == "model.onnx"
    assert loaded.proto.ByteSize() < ELIDED_BYTES
    # the values onnx reads back from where the header says are the model's own
    assert numpy.array_equal(numpy_helper.to_array(large, base_dir=str(tmp_path)), _VALUES)
    assert not loaded.warnings or all(w.code != "missing-external-data" for w in loaded.warnings)
    # the figures are those of the model given whole, in memory (no header there)
    from_file, from_proto = onnxmem.analyze(path), onnxmem.analyze(model)
    assert from_file.inference.weights_bytes == from_proto.inference.weights_bytes == _VALUES.nbytes
    assert from_file.inference.peak_bytes == from_proto.inference.peak_bytes


def test_an_integer_constant_is_a_header_too_and_answers_as_the_model_given_whole(tmp_path: Path) -> None:
    # a large INT64 Constant is no shape value (shapes.values decodes one of at most 4096 values): its data stays in
    # the file, as a float one's does; a small one beside it (a Reshape's target) is parsed whole and still read
    values = numpy.arange(_ROWS * _COLUMNS, dtype=numpy.int64).reshape(_ROWS, _COLUMNS)
    target = numpy_helper.from_array(numpy.array([_COLUMNS, _ROWS], numpy.int64), "target")
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(values, "w")),
             helper.make_node("Add", ["x", "w"], ["sum"]),
             helper.make_node("Constant", [], ["target"], value=target),
             helper.make_node("Reshape", ["sum", "target"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_value("x", dtype=TensorProto.INT64)],
                              [_value("y", [], TensorProto.INT64)])
    graph.output[0].type.tensor_type.ClearField("shape")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    loaded = load_model(path)
    large, small = (n.attribute[0].t for n in loaded.proto.graph.node if n.op_type == "Constant")
    assert large.data_location == TensorProto.EXTERNAL and not large.HasField("raw_data")
    assert numpy.array_equal(numpy_helper.to_array(large, base_dir=str(tmp_path)), values)
    assert small.data_location == TensorProto.DEFAULT and small.dims[:] == [2]
    from_file, from_proto = onnxmem.analyze(path), onnxmem.analyze(model)
    assert from_file.inference.weights_bytes == from_proto.inference.weights_bytes == values.nbytes + 16
    assert from_file.inference.peak_bytes == from_proto.inference.peak_bytes
    assert from_file.inference.unsized_tensors == from_proto.inference.unsized_tensors == 0  # y: [1024, 64]


@pytest.mark.parametrize("problem", ["short", "negative-dim"])
def test_a_tensor_whose_data_does_not_fit_its_dims_is_still_refused(tmp_path: Path, problem: str) -> None:
    weight = numpy_helper.from_array(_VALUES, "w")
    if problem == "short":
        weight.raw_data = weight.raw_data[:-4]
    else:
        weight.dims[0] = -_ROWS
    path = tmp_path / "model.onnx"
    path.write_bytes(_model("initializer", weight).SerializeToString())
    with pytest.raises(ModelFileError, match="holds 262140 bytes|negative dim"):
        load_model(path)


def test_the_rewrite_leaves_every_other_byte_as_the_parse_reads_it() -> None:
    model = _model("if-branch", numpy_helper.from_array(_VALUES, "w"))
    model.graph.doc_string = "kept"
    model.graph.node[0].attribute[0].g.initializer.append(numpy_helper.from_array(_VALUES[:1], "small"))
    rewritten = onnx.ModelProto.FromString(headers_only(model.SerializeToString(), "m.onnx"))
    (large,) = [t for t in _weights(rewritten) if t.dims[:] == [_ROWS, _COLUMNS]]
    original = [t for t in _weights(model) if t.dims[:] == [_ROWS, _COLUMNS]][0]
    large.ClearField("external_data")
    large.ClearField("data_location")
    large.raw_data = original.raw_data
    assert rewritten == model


@pytest.mark.parametrize("name", ["c:model.onnx", "new\nline.onnx"])
def test_a_file_name_that_cannot_be_a_location_keeps_its_tensors_whole(tmp_path: Path, name: str) -> None:
    path = tmp_path / name  # (the checks refuse 'c:...' as an absolute location, and a control character)
    onnx.save(_model("constant", numpy_helper.from_array(_VALUES, "w")), str(path))
    loaded = load_model(path)
    (large,) = [t for t in _weights(loaded.proto) if t.dims[:] == [_ROWS, _COLUMNS]]
    assert large.data_location == TensorProto.DEFAULT and len(large.raw_data) == _VALUES.nbytes
