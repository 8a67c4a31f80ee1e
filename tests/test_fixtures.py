"""Every exported fixture end to end: the three formats, the documented JSON keys, no warnings, sane numbers."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

import onnxmem
from onnxmem.cli.commands import main
from onnxmem.ir.graph import build_graph
from onnxmem.shapes.dims import input_dims

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODELS = sorted(FIXTURES.glob("*.onnx"))
DIMS = {"batch": 4, "seq": 24}


def dim_args(path: Path) -> list[str]:
    names = {d.name for d in input_dims(onnxmem.ir.load.load_model(path).proto)}
    return [a for name in sorted(names) for a in ("--dim", f"{name}={DIMS[name]}")]


def test_fixtures_exist() -> None:
    names = {p.stem for p in MODELS}
    assert {"mlp", "cnn_bn_residual", "dw_separable", "unet", "transformer_encoder", "gpt_decoder", "lstm",
            "embedding_model", "mlp_external", "transformer_contrib"} <= names


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_report_in_every_format(path: Path) -> None:
    args = ["report", str(path), *dim_args(path)]
    table = CliRunner().invoke(main, args)
    assert table.exit_code == 0, table.stderr
    assert "peak activations" in table.stdout
    markdown = CliRunner().invoke(main, [*args, "--format", "markdown"])
    assert markdown.exit_code == 0 and markdown.stdout.startswith("# onnxmem report")
    document = json.loads(CliRunner().invoke(main, [*args, "--format", "json"]).stdout)
    inference = document["inference"]
    assert document["schema"] == "onnxmem.report/1"
    for key in ("weights_bytes", "input_bytes", "peak_activation_bytes", "peak_bytes", "peak_node"):
        assert key in inference
    assert inference["peak_bytes"] == inference["weights_bytes"] + inference["input_bytes"] + \
        inference["peak_activation_bytes"]
    # Every tensor of the fixtures is sized: no unknown-shape warning, and the peak holds the largest tensor (the
    # default provider, cuda, notes the shape subgraphs it keeps in host memory and the convolutions whose cuDNN
    # workspace is not measured).
    codes = [w["code"] for w in document["warnings"] if w["code"] not in ("cuda-host-nodes", "cuda-conv-workspace")]
    assert codes in ([], ["missing-external-data"])
    assert inference["unsized_tensors"] == 0
    largest = max((t["bytes"] or 0) for t in inference["live_at_peak"])
    assert inference["peak_activation_bytes"] >= largest > 0


def test_external_data_weights_equal_embedded_weights() -> None:
    embedded = onnxmem.analyze(FIXTURES / "mlp.onnx", {"batch": 4}).inference
    external = onnxmem.analyze(FIXTURES / "mlp_external.onnx", {"batch": 4}).inference
    assert external.weights_bytes == embedded.weights_bytes
    assert external.peak_activation_bytes == embedded.peak_activation_bytes


def test_contrib_operators_are_sized_through_onnxruntime() -> None:
    pytest.importorskip("onnxruntime")
    report = onnxmem.analyze(FIXTURES / "transformer_contrib.onnx", {"batch": 2, "seq": 16})
    assert report.inference.unsized_tensors == 0
    assert any(r.op_type in ("Attention", "SkipLayerNormalization") for r in report.inference.by_op_type)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_symbolic_types_evaluated_at_the_dims_equal_inference_at_the_dims(path: Path) -> None:
    # analyze() infers once on the symbolic model, evaluates the dims where every dim is named and infers only
    # the part that makes the rest (shape_inference._infer_rest); that must give exactly what inference of the
    # whole graph with the dims bound gives.
    from onnxmem.shapes import sizing as shapes
    from onnxmem.shapes.dims import input_dims
    from onnxmem.targets.ort import planner

    model = onnxmem.ir.load.load_model(path).proto
    names = {d.name for d in input_dims(model)}
    dims = {name: DIMS[name] for name in names}
    whole = shapes.bind_and_infer(model, dims)
    symbolic = planner.infer_symbolic(model)
    sized = {name: t for name, t in whole.types.items() if t[2] is not None}
    for graph in (None, build_graph(model)):  # with the graph, the sizing rules run first (_size_from_inputs)
        fast = shapes.bind_and_infer(model, dims, symbolic=symbolic, graph=graph)
        assert {name: fast.types.get(name) for name in sized} == sized
    known, unknown = shapes.evaluate_known(symbolic, whole.dims)
    if unknown and not any(n.op_type in ("If", "Loop") for n in model.graph.node):
        rest = shapes._infer_rest(model, known, unknown, whole.dims, None)
        assert rest is not None and set(rest) == unknown  # the part served: the whole graph was not inferred again


def _merge_model() -> onnx.ModelProto:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest"),
         helper.make_node("Concat", ["up", "skip"], ["cat"], axis=1)], "merge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8]),
         helper.make_tensor_value_info("skip", TensorProto.FLOAT, ["batch", 4, 16, 16])],
        [helper.make_tensor_value_info("cat", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_planner_merges_concat_dims_as_onnxruntime_does() -> None:
    # Resize loses the batch dim (its scale on it is 1, but inference computes no symbolic product); the Concat
    # with a skip connection takes 'batch' from the skip for onnxruntime's planner, where ONNX's 'unk__N' name
    # for the lost dim would win the merge (measured on fixtures/unet.onnx, see rules.inference.PLANNER_MERGES_DIMS).
    from onnxmem.targets.ort.planner import infer_symbolic, runtime_view

    model = _merge_model()
    types = infer_symbolic(model)
    assert runtime_view(types["up"][1]) == (None, 4, 16, 16)
    assert runtime_view(types["cat"][1]) == ("batch", 8, 16, 16)
    sized = onnxmem.shapes.sizing.bind_and_infer(model, {"batch": 3}, symbolic=types)
    assert sized.types["cat"][1] == (3, 8, 16, 16)


def test_planner_merges_alike_from_a_file_and_its_graph(tmp_path: Path) -> None:
    # The same merge where the model comes from a file and the merging nodes are found from the caller's graph
    # (a merge learned means a second inference).
    from onnxmem.ir.graph import build_graph
    from onnxmem.ir.load import load_model
    from onnxmem.shapes.dims import input_dims
    from onnxmem.targets.ort import planner

    onnx.save(_merge_model(), str(tmp_path / "merge.onnx"))
    loaded = load_model(tmp_path / "merge.onnx")
    types = planner.infer_symbolic(loaded.proto, loaded, input_dims(loaded.proto), build_graph(loaded.proto))
    assert planner.runtime_view(types["cat"][1]) == ("batch", 8, 16, 16)
    assert types == planner.infer_symbolic(_merge_model())


def _shape_arithmetic_model() -> onnx.ModelProto:
    """What the dynamo exporter writes for a GRU's weights and dynamic sizes: a Slice bounded by a Shape, and a
    symbolic size turned into a shape piece with Reshape(size, [-1]); ONNX's data propagation stops at both."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Shape", ["state"], ["hidden"], start=2, end=3),  # [64]
        helper.make_node("Constant", [], ["zero"], value_ints=[0]),
        helper.make_node("Slice", ["w", "zero", "hidden", "zero"], ["w_part"]),  # [64, 24]
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "index0"], ["batch_size"], axis=0),  # scalar
        helper.make_node("Reshape", ["batch_size", "minus_one"], ["batch_1d"]),  # [batch]
        helper.make_node("Concat", ["batch_1d", "hidden"], ["expand_to"], axis=0),
        helper.make_node("Expand", ["one", "expand_to"], ["ones"]),  # [batch, 64]
    ]
    graph = helper.make_graph(
        nodes, "shape_arithmetic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 24]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 64])],
        [helper.make_tensor_value_info("w_part", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("ones", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.zeros((192, 24), np.float32), "w"),
                     numpy_helper.from_array(np.array(0, np.int64), "index0"),
                     numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
                     numpy_helper.from_array(np.array([1.0], np.float32), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_shape_values_data_propagation_misses_are_computed() -> None:
    from onnxmem.shapes import sizing as shapes
    from onnxmem.targets.ort import planner

    model = _shape_arithmetic_model()
    for symbolic in (None, planner.infer_symbolic(model)):  # the whole graph, and only the part left unknown
        types = shapes.bind_and_infer(model, {"batch": 3}, symbolic=symbolic).types
        assert types["w_part"][1:] == ((64, 24), 64 * 24 * 4)
        assert types["ones"][1:] == ((3, 64), 3 * 64 * 4)


def test_shape_values_stay_small() -> None:
    # An Expand of a constant to an activation's shape is no shape value: it is neither computed nor built.
    import numpy as np

    from onnxmem.shapes.values import SHAPE_VALUE_OPS

    expand = SHAPE_VALUE_OPS["Expand"]
    assert expand is not None
    assert expand([np.array(3), np.array([8, 2048, 2048])], {}) is None
    assert expand([np.array([2]), np.array([3])], {}).tolist() == [2, 2, 2]
    divide = SHAPE_VALUE_OPS["Div"]
    assert divide is not None and divide([np.array([-7]), np.array([2])], {}).tolist() == [-3]  # truncates
