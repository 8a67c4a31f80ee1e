"""QLoRA / LLM.int8 in the training step: the frozen Linear weights stored as bitsandbytes stores them
(TrainingOptions.base_precision, --base-precision), the model's output layer left as it is, and each quantized
Linear dequantizing its weight while it runs."""

from __future__ import annotations

import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

import onnxmem
from onnxmem.errors import TrainingOptionError
from onnxmem.training.options import BASE_PRECISIONS
from onnxmem.training.step import TrainingOptions

from . import graphs

B, D, H, C = 4, 256, 128, 10


def mlp() -> onnx.ModelProto:
    """x [B, D] -> MatMul(W1 [D, H]) -> Relu -> MatMul(W2 [H, C]) = y (W2 makes the output: the head)."""
    return graphs.model(
        [oh.make_node("MatMul", ["x", "W1"], ["h"], name="/fc1/MatMul"), oh.make_node("Relu", ["h"], ["r"], name="/r"),
         oh.make_node("MatMul", ["r", "W2"], ["y"], name="/fc2/MatMul")],
        [graphs.value("x", [B, D])], [graphs.value("y", [B, C])],
        [graphs.external_header("W1", TensorProto.FLOAT, [D, H]),
         graphs.external_header("W2", TensorProto.FLOAT, [H, C])])


def training(**options: object) -> onnxmem.Report:
    return onnxmem.analyze(mlp(), None, training=TrainingOptions(optimizer="sgd", device="cpu", loss="mean",
                                                                 **options))  # type: ignore[arg-type]


def nf4_bytes(numel: int) -> int:
    # QLoRA's layout, computed here from its definition: 4 bits a weight, one uint8 absmax per block of 64, the
    # absmax quantized in blocks of 256 with an fp32 scale each, and one fp32 offset
    blocks = -(-numel // 64)
    return numel // 2 + blocks + -(-blocks // 256) * 4 + 4


def test_the_frozen_linear_weights_take_bitsandbytes_layout_and_the_head_stays() -> None:
    plain = training(freeze=("W1",))
    nf4 = training(freeze=("W1",), base_precision="nf4")
    assert plain.training is not None and nf4.training is not None
    assert plain.training.weights_bytes == (D * H + H * C) * 4
    assert nf4.training.weights_bytes == nf4_bytes(D * H) + H * C * 4
    frozen = training(freeze=("W1", "W2"), base_precision="nf4")  # the head (W2 makes the output) stays fp32
    assert frozen.training is not None and frozen.training.weights_bytes == nf4.training.weights_bytes
    int8 = training(freeze=("W1",), base_precision="int8")  # one fp32 scale per output row (SCB)
    assert int8.training is not None and int8.training.weights_bytes == D * H + H * 4 + H * C * 4
    assert BASE_PRECISIONS["nf4"].nbytes(D * H, H) == nf4_bytes(D * H)


def test_a_quantized_linear_dequantizes_its_weight_while_it_runs() -> None:
    nf4 = training(freeze=("W1",), base_precision="nf4")
    assert nf4.training is not None
    # the fp32 weight made from the 4-bit one is live in fc1's forward, on top of the step's other bytes
    assert nf4.training.first_step.peak_bytes >= nf4.training.weights_bytes + D * H * 4


def test_an_unknown_base_precision_is_refused_by_name() -> None:
    with pytest.raises(TrainingOptionError, match="unknown base precision 'nf3'.*nf4"):
        training(freeze=("W1",), base_precision="nf3")
