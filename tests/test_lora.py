"""LoRA and QLoRA: --lora trains PEFT's adapters (parameters named *.lora_*) with the base frozen, without a pattern
written by hand; a QLoRA base weight's bytes are bitsandbytes' layout (4-bit data, absmax per 64 weights, the
absmax double-quantized in blocks of 256)."""

from __future__ import annotations

from fractions import Fraction

import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

import onnxmem
from onnxmem.training.options import BASE_PRECISIONS
from onnxmem.training.step import TrainingOptions

from . import graphs

D, R = 16, 4


def lora_linear(adapters: bool = True) -> onnx.ModelProto:
    """x [2, D] -> the base Linear (frozen by LoRA) plus, where `adapters`, PEFT's lora_B(lora_A(x)), as PEFT names
    them in q_proj: base_layer.weight, lora_A.default.weight, lora_B.default.weight."""
    nodes = [oh.make_node("MatMul", ["x", "q_proj.base_layer.weight"], ["base"], name="/q_proj/base_layer/MatMul")]
    weights = [graphs.external_header("q_proj.base_layer.weight", TensorProto.FLOAT, [D, D])]
    if adapters:
        nodes += [oh.make_node("MatMul", ["x", "q_proj.lora_A.default.weight"], ["a"], name="/q_proj/lora_A/MatMul"),
                  oh.make_node("MatMul", ["a", "q_proj.lora_B.default.weight"], ["b"], name="/q_proj/lora_B/MatMul"),
                  oh.make_node("Add", ["base", "b"], ["y"], name="/q_proj/Add")]
        weights += [graphs.external_header("q_proj.lora_A.default.weight", TensorProto.FLOAT, [D, R]),
                    graphs.external_header("q_proj.lora_B.default.weight", TensorProto.FLOAT, [R, D])]
    else:
        nodes += [oh.make_node("Relu", ["base"], ["y"], name="/act/Relu")]
    return graphs.model(nodes, [graphs.value("x", [2, D])], [graphs.value("y", [2, D])], weights)


def test_lora_trains_the_adapters_and_freezes_the_base() -> None:
    report = onnxmem.analyze(lora_linear(), None, training=TrainingOptions(optimizer="sgd", device="cpu", lora=True))
    assert report.training is not None
    assert report.training.parameters == D * D + D * R + R * D
    assert report.training.trainable_parameters == D * R + R * D
    assert report.training.gradient_bytes == (D * R + R * D) * 4
    assert "unmatched-pattern" not in {w.code for w in report.warnings}


def test_lora_keeps_the_patterns_given_beside_it() -> None:
    options = TrainingOptions(lora=True, train=("head.*",))
    assert set(options.train) == {"head.*", "*.lora_*"}
    assert TrainingOptions(lora=True).train == ("*.lora_*",)


def test_lora_on_a_model_without_adapters_says_nothing_matched() -> None:
    report = onnxmem.analyze(lora_linear(adapters=False), None,
                             training=TrainingOptions(optimizer="sgd", device="cpu", lora=True))
    assert report.training is not None
    assert report.training.trainable_parameters == 0
    assert "unmatched-pattern" in {w.code for w in report.warnings}


def bitsandbytes_4bit_bytes(out_features: int, in_features: int, double_quant: bool) -> int:
    """bitsandbytes.functional.quantize_4bit, from its documented layout: the weight packed two to a byte (uint8,
    shape [n/2, 1]); absmax, one per blocksize=64 weights, fp32, or with compress_statistics (double quantization)
    quantize_blockwise(absmax - offset, blocksize=256): uint8 absmax, an fp32 absmax per 256 of them (state2) and
    the fp32 offset (absmax.mean())."""
    n = out_features * in_features
    packed = (n + 1) // 2
    blocks = (n + 63) // 64
    if not double_quant:
        return packed + blocks * 4
    return packed + blocks * 1 + ((blocks + 255) // 256) * 4 + 4


@pytest.mark.parametrize("shape", [(4096, 4096), (14336, 4096), (8192, 28672), (1000, 64), (3, 5)])
def test_qlora_base_weight_bytes_are_bitsandbytes_layout(shape: tuple[int, int]) -> None:
    rows, columns = shape
    assert BASE_PRECISIONS["nf4"].nbytes(rows * columns, rows) == bitsandbytes_4bit_bytes(rows, columns, True)
    assert BASE_PRECISIONS["nf4-no-double-quant"].nbytes(rows * columns, rows) == \
        bitsandbytes_4bit_bytes(rows, columns, False)
    # LLM.int8 (Linear8bitLt): int8 data and one fp32 scale per output row (SCB)
    assert BASE_PRECISIONS["int8"].nbytes(rows * columns, rows) == rows * columns + rows * 4


def test_qlora_costs_the_papers_bits_per_parameter() -> None:
    # QLoRA (Dettmers et al. 2023, section 3): double quantization lowers the constants' cost from 32/64 = 0.5 to
    # 8/64 + 32/(64 x 256) = 0.127 bits per parameter, on top of the 4 bits
    n = 64 * 256 * 1024
    nbytes = BASE_PRECISIONS["nf4"].nbytes(n, 1024)
    assert Fraction((nbytes - 4) * 8, n) == 4 + Fraction(8, 64) + Fraction(32, 64 * 256)
