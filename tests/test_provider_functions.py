"""Float16 operators with an ONNX function body on onnxruntime's CPU provider: without a float16 kernel, onnxruntime
inlines the body (Softmax into ReduceMax, Sub, Exp, ReduceSum, Div; Gelu into Sqrt, Div, Erf, Sum, Mul and CastLikes
of its constants) and then casts around the inlined nodes. The plain CPU report builds the same graph and equals
what onnxruntime allocates; every expected figure here is measured in the test by running onnxruntime."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxmem
from onnxmem.ir.load import load_model
from onnxmem.targets.ort.cpu.float16 import cpu_float16_casts
from onnxmem.targets.ort.cpu.inline import INLINED_NODE_PREFIX, inlined_function_ops
from onnxmem.targets.ort.planner import infer_symbolic

F16 = TensorProto.FLOAT16


def attention(declare_scores: bool) -> onnx.ModelProto:
    """Float16 attention scores: q @ kt + mask, Softmax, @ v. The mask's batch dim is named apart from q's, so
    inference leaves the sum's batch dim empty; `declare_scores` declares the sum's shape in value_info, as exporters
    do, and onnxruntime's planner then compares the inlined Softmax's tensors by those names (its ReduceSum takes
    the ReduceMax's freed buffer, its Div the Sub's)."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node("Add", ["s", "mask"], ["a"], name="mask_add"),
             helper.make_node("Softmax", ["a"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "v"], ["o"], name="pv")]
    inputs = [helper.make_tensor_value_info("q", F16, ["batch", 4, "seq", 16]),
              helper.make_tensor_value_info("kt", F16, ["batch", 4, 16, "seq"]),
              helper.make_tensor_value_info("mask", F16, ["mbatch", 1, "seq", "seq"]),
              helper.make_tensor_value_info("v", F16, ["batch", 4, "seq", 16])]
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("o", F16, ["batch", 4, "seq", 16])])
    if declare_scores:
        graph.value_info.append(helper.make_tensor_value_info("a", F16, ["batch", 4, "seq", "seq"]))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def activation(op_type: str, opset: int, keep_io_types: bool = False) -> onnx.ModelProto:
    """x -> Add (no float16 kernel) -> op_type -> Add x -> y, in float16; with keep_io_types, x and y are float32
    with a Cast to float16 after x and one to float32 before y (as onnxconverter's convert_float_to_float16 does)."""
    outer = TensorProto.FLOAT if keep_io_types else F16
    nodes = [helper.make_node("Add", ["h", "h"], ["a"], name="pre"),
             helper.make_node(op_type, ["a"], ["f"], name="act"),
             helper.make_node("Add", ["f", "h"], ["y16"], name="post")]
    if keep_io_types:
        nodes.insert(0, helper.make_node("Cast", ["x"], ["h"], name="in_cast", to=F16))
        nodes.append(helper.make_node("Cast", ["y16"], ["y"], name="out_cast", to=TensorProto.FLOAT))
    else:
        nodes[0].input[:] = ["x", "x"]
        nodes[2].input[:] = ["f", "x"]
        nodes[2].output[:] = ["y"]
    graph = helper.make_graph(nodes, "act", [helper.make_tensor_value_info("x", outer, ["batch", 64, 32])],
                              [helper.make_tensor_value_info("y", outer, ["batch", 64, 32])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def ort_wiring(model: onnx.ModelProto, folder: Path) -> Counter[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """Give the nodes of the graph onnxruntime's CPU provider runs (opt level disable) as (op, inputs, outputs)."""
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(folder / "ran.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return wiring(onnx.load(str(folder / "ran.onnx")))


def wiring(model: onnx.ModelProto) -> Counter[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    return Counter((n.op_type, tuple(n.input), tuple(n.output)) for n in model.graph.node if n.op_type != "Constant")


def on_cpu(model: onnx.ModelProto) -> onnx.ModelProto:
    loaded = load_model(model)
    changed = cpu_float16_casts(loaded, infer_symbolic(loaded.proto, loaded))
    assert changed is not None
    return changed.proto


@pytest.mark.parametrize(("op_type", "opset", "inlined"), [
    ("Softmax", 20, True),  # a context-dependent body: always inlined
    ("Gelu", 20, True),  # its CastLikes of constants inlined into Casts, which the duplicate remover drops
    ("LogSoftmax", 13, True),
    ("Relu", 18, True),  # Relu's body is written for opset 18 (Max of a CastLike'd Constant) ...
    ("Relu", 20, False),  # ... and calls operators newer at opset 20: onnxruntime does not use it there
    ("HardSwish", 18, True),  # HardSigmoid and Mul, then HardSigmoid's own opset-18 body
    ("LeakyRelu", 17, True),
    ("LeakyRelu", 20, False),
])
def test_the_cpu_graph_is_onnxruntimes(op_type: str, opset: int, inlined: bool, tmp_path: Path) -> None:
    model = activation(op_type, opset)
    changed = on_cpu(model)
    assert wiring(changed) == ort_wiring(model, tmp_path)  # the same nodes, reading and making the same tensors
    assert (op_type in inlined_function_ops(changed)) == inlined
    assert any(n.name.startswith(INLINED_NODE_PREFIX) for n in changed.graph.node) == inlined


def test_a_models_cast_round_trip_goes_as_in_onnxruntime(tmp_path: Path) -> None:
    # keep_io_types: the input's Cast to float16 and the inserted Cast back to float32 both go (the Add reads x),
    # and the output's Cast reads the float32 result (the inserted Cast to float16 before it goes)
    model = activation("Gelu", 20, keep_io_types=True)
    changed = on_cpu(model)
    assert wiring(changed) == ort_wiring(model, tmp_path)
    assert not any(n.name == "in_cast" for n in changed.graph.node)


@pytest.mark.parametrize("build", [
    lambda: attention(declare_scores=False),
    lambda: attention(declare_scores=True),
    lambda: activation("Gelu", 20),
    lambda: activation("Softmax", 20, keep_io_types=True),
    lambda: activation("HardSwish", 18),
])
def test_the_cpu_report_equals_onnxruntimes_first_run(build) -> None:  # type: ignore[no-untyped-def]
    # before the bodies were inlined, attention with declared scores came out -8,192 B at batch 1 and -65,536 B at
    # batch 8, in the plain report and in validate alike
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    for batch in (1, 8):
        dims = {"batch": batch, "mbatch": batch, "seq": 32} if build().graph.input[0].name == "q" else {"batch": batch}
        result = validate(build(), dims, opt_level="disable", runs=1)
        measured = result.runs[0].measured.peak_activation_bytes
        assert result.raw_estimate.peak_activation_bytes == measured  # the plain report, provider cpu
        assert result.runs[0].activation_difference_bytes == 0  # the estimate on onnxruntime's own graph


@pytest.mark.parametrize("opt_level", ["basic", "extended", "all"])
def test_validate_is_exact_at_every_level(opt_level: str) -> None:
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    result = validate(attention(declare_scores=True), {"batch": 8, "mbatch": 8, "seq": 32}, opt_level=opt_level)
    assert result.exact


def test_the_warning_names_the_inlined_operators() -> None:
    cpu = onnxmem.analyze(attention(declare_scores=True), {"batch": 1, "mbatch": 1, "seq": 32}, provider="cpu")
    [warning] = [w for w in cpu.warnings if w.code == "cpu-float16-casts"]
    assert "Softmax run as their ONNX function bodies" in warning.message
    assert not onnxmem.analyze(attention(declare_scores=True), {"batch": 1, "mbatch": 1, "seq": 32}).warnings


def test_an_initializer_fed_gelu_keeps_its_constants_float32() -> None:
    # Gelu's constants (0.5, 1, 2) become float32 initializers read directly by the float32 body nodes
    weight = numpy_helper.from_array(np.ones((32, 32), np.float16), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
                               helper.make_node("Gelu", ["m"], ["y"], name="gelu")], "g",
                              [helper.make_tensor_value_info("x", F16, ["batch", 32])],
                              [helper.make_tensor_value_info("y", F16, ["batch", 32])], initializer=[weight])
    changed = on_cpu(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))
    constants = {t.name: t.data_type for t in changed.graph.initializer if t.name.startswith("_inlfunc_Gelu")}
    assert constants == {"_inlfunc_Gelu_Half": TensorProto.FLOAT, "_inlfunc_Gelu_One": TensorProto.FLOAT,
                         "_inlfunc_Gelu_Two": TensorProto.FLOAT}
    assert not [n for n in changed.graph.node if n.op_type in ("CastLike", "Gelu")]
