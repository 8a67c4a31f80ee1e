"""Mixed precision on CPU (issue 27 class 6, benchmarks/training_zoo_amp_ops.py): PyTorch's type promotion sizes a
16-bit activation times an fp32 parameter as fp32 (a Linear's bias, added inside its 16-bit addmm, does not
promote; a LayerNorm keeps its input's dtype); on CPU the op first copies the 16-bit input to fp32; an fp32
activation read only by 16-bit ops is named where eager code may hold it longer."""

from __future__ import annotations

import onnx
from onnx import TensorProto

import onnxmem
from onnxmem.ir.graph import build_graph
from onnxmem.shapes.sizing import bind_and_infer
from onnxmem.targets.torch import TorchCpu
from onnxmem.training.model import build_model
from onnxmem.training.step import TrainingOptions

from . import graphs

B, D = 64, 32


def nonorm() -> onnx.ModelProto:
    """x [B,D] -> MatMul W -> Add bias (the Linear) = h -> Mul g = y -> Mul g2 = z (MobileBERT's NoNorm, twice)."""
    return graphs.model(
        [graphs.node("MatMul", ["x", "W"], ["p"]), graphs.node("Add", ["p", "bias"], ["h"]),
         graphs.node("Mul", ["h", "g"], ["y"]), graphs.node("Mul", ["y", "g2"], ["z"])],
        [graphs.value("x", [B, D])], [graphs.value("z", [B, D])],
        [graphs.external_header("W", TensorProto.FLOAT, [D, D]), graphs.external_header("bias", TensorProto.FLOAT, [D]),
         graphs.external_header("g", TensorProto.FLOAT, [D]), graphs.external_header("g2", TensorProto.FLOAT, [D])])


def step_model(model: onnx.ModelProto, precision: str):  # type: ignore[no-untyped-def]
    graph = build_graph(model, bind_and_infer(model, {}).types)
    options = TrainingOptions(optimizer="sgd", precision=precision, device=TorchCpu(threads=1, isa="avx2"))
    return build_model(graph, list(range(len(graph.ops))), options)


def sizes(precision: str) -> dict[str, int]:
    model = step_model(nonorm(), precision)
    return {v.name: v.nbytes for v in model.values}


def test_a_16_bit_activation_times_an_fp32_weight_is_fp32_under_autocast() -> None:
    amp = sizes("amp-bf16")
    assert amp["p"] == B * D * 2  # the product runs in bf16
    assert amp["h"] == B * D * 2  # the Linear's bias is added inside its bf16 addmm
    assert amp["y"] == B * D * 4  # bf16 h * fp32 g promotes
    assert amp["z"] == B * D * 4
    assert sizes("fp32")["y"] == B * D * 4


def test_the_cpu_copies_the_narrower_input_of_a_promoting_op() -> None:
    model = step_model(nonorm(), "amp-bf16")
    names = {node.name: n for n, node in enumerate(model.nodes)}
    # Mul_y reads bf16 h (B x D) with an fp32 g: h is copied to fp32 for the op; Mul_z's inputs are all fp32
    assert model.forward_temporaries.get(names["Mul_y"], 0) == B * D * 4
    assert model.forward_temporaries.get(names["Mul_z"], 0) == 0
    assert names["Mul_y"] not in step_model(nonorm(), "fp32").forward_temporaries


def gathered_weights() -> onnx.ModelProto:
    """Qwen2-MoE's batched_mm experts: ids [N] gather an fp32 copy of the experts' weights E [4,D,D] (N x D x D),
    read only by a MatMul (a 16-bit op under autocast) with x [N,D,1]."""
    n = 256
    return graphs.model(
        [graphs.node("Gather", ["E", "ids"], ["selected"], axis=0), graphs.node("MatMul", ["selected", "x"], ["y"])],
        [graphs.value("ids", [n], TensorProto.INT64), graphs.value("x", [n, D, 1])], [graphs.value("y", [n, D, 1])],
        [graphs.external_header("E", TensorProto.FLOAT, [4, D, D])])


def test_an_fp32_tensor_only_cast_by_autocast_is_named() -> None:
    def codes(precision: str) -> dict[str, str]:
        report = onnxmem.analyze(gathered_weights(), None, training=TrainingOptions(
            optimizer="sgd", precision=precision, device=TorchCpu(threads=1, isa="avx2")))
        return {w.code: w.message for w in report.warnings}

    amp = codes("amp-bf16")
    assert "eager-lifetimes" in amp and "'selected'" in amp["eager-lifetimes"]
    assert "eager-lifetimes" not in codes("fp32")  # in fp32 the MatMul keeps the gathered copy itself
