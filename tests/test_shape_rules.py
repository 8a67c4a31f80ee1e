"""The shape rules of onnxruntime's operators (rules/shapes.py): each on a one-node graph, its output types worked
out from the operator's schema; every rule of the table has a case here."""

from __future__ import annotations

from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

import onnxmem
from onnxmem.shapes.rules import NCHWC_BLOCK, SHAPE_RULES, broadcast, matmul
from onnxmem.shapes.sizing import bind_and_infer
from onnxmem.targets.ort.planner import infer_symbolic

F, U8, I8, I32, I64, F16 = (TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32,
                            TensorProto.INT64, TensorProto.FLOAT16)
MS, NCHWC = "com.microsoft", "com.microsoft.nchwc"
Spec = tuple[str, int, list[Any]]  # an input: name ("" for an omitted one), elem type, shape


def one_node(op: str, domain: str, inputs: list[Spec], outputs: int, **attrs: Any) -> onnx.ModelProto:
    """Give a model of one node whose inputs are graph inputs (symbolic dim names allowed)."""
    node = helper.make_node(op, [name for name, _, _ in inputs], [f"y{i}" for i in range(outputs)], domain=domain,
                            **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs if n],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.UNDEFINED, None)
                               for i in range(outputs)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1), helper.make_opsetid(NCHWC, 1)]
    return helper.make_model(graph, opset_imports=opsets)


# (rule key, op, domain, inputs, attributes, expected output types at batch = 2: (elem type, shape) or None)
def cases() -> list[tuple[str, str, str, list[Spec], dict[str, Any], list[tuple[int, tuple[int, ...]] | None]]]:
    x = [("x", F, ["batch", 8, 16])]
    found: list[tuple[str, str, str, list[Spec], dict[str, Any], list[tuple[int, tuple[int, ...]] | None]]] = []
    for op in ("BiasGelu", "FastGelu", "Gelu", "QuickGelu", "BiasAdd", "BiasSoftmax", "BiasDropout",
               "RotaryEmbedding", "QLinearLeakyRelu", "QLinearSigmoid", "QLinearSoftmax", "Affine", "ScaledTanh",
               "ThresholdedRelu", "FusedGelu"):
        found.append((f"{MS}::{op}", op, MS, x, {}, [(F, (2, 8, 16))]))
    for op in ("MemcpyFromHost", "MemcpyToHost"):  # the CUDA provider's copies (cuda_placement): a copy's type
        found.append((f"::{op}", op, "", x, {}, [(F, (2, 8, 16))]))
    skip = [("x", F, ["batch", 8, 16]), ("skip", F, ["batch", 8, 16]), ("gamma", F, [16])]
    for op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
        found.append((f"{MS}::{op}", op, MS, skip, {},
                      [(F, (2, 8, 16)), (F, (2, 8, 1)), (F, (2, 8, 1)), (F, (2, 8, 16))]))
    norm = [("x", F, ["batch", 8, 16]), ("gamma", F, [16])]
    found.append(("::SimplifiedLayerNormalization", "SimplifiedLayerNormalization", "", norm, {"axis": -1},
                  [(F, (2, 8, 16)), (F, (2, 8, 1))]))
    found.append((f"{MS}::SimplifiedLayerNormalization", "SimplifiedLayerNormalization", MS, norm, {"axis": 1},
                  [(F, (2, 8, 16)), (F, (2, 1, 1))]))
    found.append((f"{MS}::FusedMatMul", "FusedMatMul", MS, [("a", F, ["batch", 16, 8]), ("b", F, [32, 8])],
                  {"transB": 1, "alpha": 0.5}, [(F, (2, 16, 32))]))
    found.append((f"{MS}::MatMulIntegerToFloat", "MatMulIntegerToFloat", MS,
                  [("a", U8, ["batch", 8, 16]), ("b", I8, [16, 32]), ("sa", F, []), ("sb", F, [32])], {},
                  [(F, (2, 8, 32))]))
    found.append((f"{MS}::DynamicQuantizeMatMul", "DynamicQuantizeMatMul", MS,
                  [("a", F, ["batch", 8, 16]), ("b", I8, [16, 32]), ("sb", F, [32])], {}, [(F, (2, 8, 32))]))
    found.append((f"{MS}::MatMulNBits", "MatMulNBits", MS,
                  [("a", F, ["batch", 8, 64]), ("b", U8, [48, 2, 16]), ("s", F, [96])],
                  {"K": 64, "N": 48, "bits": 4, "block_size": 32}, [(F, (2, 8, 48))]))
    found.append((f"{MS}::QGemm", "QGemm", MS,
                  [("a", U8, ["batch", 16]), ("sa", F, []), ("za", U8, []), ("b", I8, [32, 16]), ("sb", F, []),
                   ("zb", I8, []), ("", F, []), ("sy", F, []), ("zy", U8, [])], {"transB": 1}, [(U8, (2, 32))]))
    qbinary = [("a", U8, ["batch", 8, 16]), ("sa", F, []), ("za", U8, []), ("b", U8, [16]), ("sb", F, []),
               ("zb", U8, []), ("sc", F, []), ("zc", U8, [])]
    for op in ("QLinearAdd", "QLinearMul"):
        found.append((f"{MS}::{op}", op, MS, qbinary, {}, [(U8, (2, 8, 16))]))
    qpool = [("x", U8, ["batch", 8, 6, 6]), ("sx", F, []), ("zx", U8, []), ("sy", F, []), ("zy", U8, [])]
    found.append((f"{MS}::QLinearGlobalAveragePool", "QLinearGlobalAveragePool", MS, qpool, {"channels_last": 0},
                  [(U8, (2, 8, 1, 1))]))
    found.append((f"{MS}::QLinearConv", "QLinearConv", MS,
                  [("x", U8, ["batch", 10, 10, 3]), ("sx", F, []), ("zx", U8, []), ("w", I8, [16, 3, 3, 3]),
                   ("sw", F, []), ("zw", I8, []), ("sy", F, []), ("zy", U8, [])],
                  {"channels_last": 1, "kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                  [(U8, (2, 5, 5, 16))]))
    # QLinearConcat(Y_scale, Y_zp, then (X, X_scale, X_zp) per input) along axis 1: 8 + 4 channels
    found.append((f"{MS}::QLinearConcat", "QLinearConcat", MS,
                  [("sy", F, []), ("zy", U8, []), ("a", U8, ["batch", 8, 6, 6]), ("sa", F, []), ("za", U8, []),
                   ("b", U8, ["batch", 4, 6, 6]), ("sb", F, []), ("zb", U8, [])], {"axis": 1},
                  [(U8, (2, 12, 6, 6))]))
    found.append((f"{MS}::QLinearAveragePool", "QLinearAveragePool", MS,
                  [("x", U8, ["batch", 8, 9, 9]), ("sx", F, []), ("zx", U8, []), ("sy", F, []), ("zy", U8, [])],
                  {"kernel_shape": [3, 3], "strides": [2, 2], "channels_last": 0}, [(U8, (2, 8, 4, 4))]))
    found.append((f"{MS}::NhwcMaxPool", "NhwcMaxPool", MS, [("x", U8, ["batch", 9, 9, 4])],
                  {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 0, 0]}, [(U8, (2, 4, 4, 4))]))
    found.append((f"{MS}::FusedConv", "FusedConv", MS, [("x", F, ["batch", 3, 8, 8]), ("w", F, [4, 3, 3, 3])],
                  {"pads": [1, 1, 1, 1], "activation": "Relu"}, [(F, (2, 4, 8, 8))]))
    found.append((f"{MS}::Attention", "Attention", MS,
                  [("x", F, ["batch", 8, 16]), ("w", F, [16, 48]), ("bias", F, [48])], {"num_heads": 2},
                  [(F, (2, 8, 16))]))
    found.append((f"{MS}::MultiHeadAttention", "MultiHeadAttention", MS,
                  [("q", F, ["batch", 8, 16]), ("k", F, ["batch", 12, 16]), ("v", F, ["batch", 12, 24])],
                  {"num_heads": 2}, [(F, (2, 8, 24))]))
    found.append((f"{MS}::EmbedLayerNormalization", "EmbedLayerNormalization", MS,
                  [("ids", I32, ["batch", 8]), ("seg", I32, ["batch", 8]), ("words", F, [100, 16]),
                   ("pos", F, [32, 16]), ("segs", F, [2, 16]), ("gamma", F, [16]), ("beta", F, [16])], {},
                  [(F, (2, 8, 16)), (I32, (2,)), (F, (2, 8, 16))]))
    found.append((f"{MS}::DynamicQuantizeLinear", "DynamicQuantizeLinear", MS, x, {},
                  [(U8, (2, 8, 16)), (F, ()), (U8, ())]))
    blocked = -(-20 // NCHWC_BLOCK) * NCHWC_BLOCK
    found.append((f"{NCHWC}::ReorderInput", "ReorderInput", NCHWC, [("x", F, ["batch", 20, 8, 8])], {},
                  [(F, (2, blocked, 8, 8))]))
    found.append((f"{NCHWC}::ReorderOutput", "ReorderOutput", NCHWC, [("x", F, ["batch", 32, 8, 8])],
                  {"channels": 20}, [(F, (2, 20, 8, 8))]))
    found.append((f"{NCHWC}::Conv", "Conv", NCHWC, [("x", F, ["batch", 16, 9, 9]), ("w", F, [32, 16, 3, 3])],
                  {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, [(F, (2, 32, 5, 5))]))
    for op, attrs, spatial in (("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, (4, 4)),
                               ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2]}, (4, 4))):
        found.append((f"{NCHWC}::{op}", op, NCHWC, [("x", F, ["batch", 16, 9, 9])], attrs, [(F, (2, 16, *spatial))]))
    for op in ("GlobalAveragePool", "GlobalMaxPool"):
        found.append((f"{NCHWC}::{op}", op, NCHWC, [("x", F, ["batch", 16, 9, 9])], {}, [(F, (2, 16, 1, 1))]))
    found.append((f"{NCHWC}::Upsample", "Upsample", NCHWC, [("x", F, ["batch", 16, 4, 4])],
                  {"scales": [1, 1, 2, 2]}, [(F, (2, 16, 8, 8))]))
    return found


CASES = cases()


def test_every_rule_has_a_case() -> None:
    assert {case[0] for case in CASES} == set(SHAPE_RULES)


@pytest.mark.parametrize(("key", "op", "domain", "inputs", "attrs", "expected"), CASES, ids=[c[0] for c in CASES])
def test_rule_types_the_outputs(key: str, op: str, domain: str, inputs: list[Spec], attrs: dict[str, Any],
                                expected: list[tuple[int, tuple[int, ...]] | None]) -> None:
    model = one_node(op, domain, inputs, len(expected), **attrs)
    # bound: the rule runs in the inference at the bound dims; symbolic: in the planner rounds, evaluated at batch 2
    bound = bind_and_infer(model, {"batch": 2}).types
    report = onnxmem.analyze(model, {"batch": 2})
    for i, want in enumerate(expected):
        assert bound[f"y{i}"][:2] == want, f"output {i}"
    assert report.inference.unsized_tensors == 0
    assert not any(w.code in ("contrib-shapes", "unknown-shape", "unknown-operator") for w in report.warnings)


def test_a_chain_of_fused_operators_is_typed_in_one_pass() -> None:
    # ReorderInput -> nchwc Conv -> nchwc MaxPool -> ReorderOutput -> Relu (a standard op after them)
    nodes = [helper.make_node("ReorderInput", ["x"], ["r"], domain=NCHWC),
             helper.make_node("Conv", ["r", "w"], ["c"], domain=NCHWC, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["p"], domain=NCHWC, kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("ReorderOutput", ["p"], ["o"], domain=NCHWC, channels=16),
             helper.make_node("Relu", ["o"], ["y"])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", F, ["batch", 16, 8, 8])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [helper.make_tensor("w", F, [16, 16, 3, 3], [0.0] * (16 * 16 * 9))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NCHWC, 1)])
    types = bind_and_infer(model, {"batch": 4}).types
    assert types["y"][:2] == (F, (4, 16, 4, 4)) and types["p"][1] == (4, 16, 4, 4)
    report = onnxmem.analyze(model, {"batch": 4})
    assert report.inference.unsized_tensors == 0


@pytest.mark.parametrize(("a", "b", "expected"), [
    ((2, 3, 4), (4, 5), (2, 3, 5)),
    ((4,), (4, 5), (5,)),
    (("batch", 1, 3, 4), (7, 4, 6), ("batch", 7, 3, 6)),
    ((3, 4), (4,), (3,)),
])
def test_matmul_shapes(a: tuple[Any, ...], b: tuple[Any, ...], expected: tuple[Any, ...]) -> None:
    assert matmul(a, b) == expected


def test_broadcast_keeps_a_symbolic_dim_against_one() -> None:
    assert broadcast(("batch", 1, 8), (4, 8)) == ("batch", 4, 8)
    assert broadcast(("a",), ("b",)) == (None,)  # two names: unknown until bound
    assert broadcast((3,), (1,)) == (3,) and broadcast((2,), (3,)) == (None,)


def test_fp16_input_keeps_its_type() -> None:
    model = one_node("FastGelu", MS, [("x", F16, ["batch", 4])], 1)
    assert bind_and_infer(model, {"batch": 3}).types["y0"][:2] == (F16, (3, 4))


def test_a_rule_gives_numbers_for_the_names_a_declared_output_made_up() -> None:
    # A TorchScript export names the output dims it was not told are dynamic ('Convlogits_dim_2'), and an optimized
    # graph ends in a fused operator: its rule's numbers take the place of those names (as ONNX's own inference
    # merges a dim), where 'batch' stays the input's; the output is sized, and counted.
    nodes = [helper.make_node("ReorderInput", ["x"], ["r"], domain=NCHWC),
             helper.make_node("ReorderOutput", ["r"], ["logits"], domain=NCHWC, channels=4)]
    graph = helper.make_graph(nodes, "declared", [helper.make_tensor_value_info("x", F, ["batch", 4, 16, 16])],
                              [helper.make_tensor_value_info("logits", F, ["batch", 4, "Convlogits_dim_2",
                                                                           "Convlogits_dim_3"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NCHWC, 1)])
    assert bind_and_infer(model, {"batch": 3}).types["logits"][:2] == (F, (3, 4, 16, 16))
    report = onnxmem.analyze(model, {"batch": 3}, order="model")
    assert report.inference.unsized_tensors == 0
    assert report.inference.output_bytes == 3 * 4 * 16 * 16 * 4


def test_nchwc_upsample_leaves_a_symbolic_dim_unknown_to_the_planner() -> None:
    # nchwc_schema_defs.cc sets an Upsample output dim only where the input dim has a value: the planner's type
    # of the output has no batch name (not even at scale 1), while the bound dims still size it.
    model = one_node("Upsample", NCHWC, [("x", F, ["batch", 16, 4, 4])], 1, scales=[1, 1, 2, 2])
    planner = infer_symbolic(model)["y0"][1]
    assert planner is not None and planner[1:] == (16, 8, 8)
    assert planner[0] is None or (isinstance(planner[0], str) and planner[0].startswith("unk__"))
    assert bind_and_infer(model, {"batch": 3}).types["y0"][:2] == (F, (3, 16, 8, 8))
