"""The backward of elementwise ops over a broadcast operand (a learned scale, a bias, a norm's weight): each input's
gradient made at the output's size and dtype, then summed to its shape and cast to its dtype (training/elementwise.py,
rules.py ELEMENTWISE_GRADIENTS; the measured rows: benchmarks/training_single_ops.py --elementwise)."""

from __future__ import annotations

import onnx.helper as oh
import pytest
from onnx import TensorProto

import onnxmem
from onnxmem.training.elementwise import elementwise_backward
from onnxmem.training.step import TrainingOptions
from onnxmem.training.values import StepNode, StepValue

from . import graphs

R, C = 512, 256
FULL32, FULL16, SCALE = R * C * 4, R * C * 2, C * 4


def _peak(op: str, width: int, x_grad: bool, s_grad: bool, scale_first: bool = False,
          promotes_by_copy: bool = True) -> int:
    x = StepValue("x", (R, C), R * C, R * C * width, True, "activation")
    s = StepValue("s", (C,), C, SCALE, True, "weight")
    y = StepValue("y", (R, C), R * C, FULL32, True, "activation")
    node = StepNode(op, "", "op", "", (1, 0) if scale_first else (0, 1), (2,), 0)
    return elementwise_backward(node, [x, s, y], [x_grad, s_grad, False], promotes_by_copy)


@pytest.mark.parametrize(("op", "width", "x_grad", "s_grad", "scale_first", "measured"), [
    # (the measured peaks less the engine's ~4.5 KB of its own, benchmarks/training_single_ops.py --elementwise)
    ("Mul", 4, True, True, False, FULL32 + FULL32 + SCALE),  # x's gradient and s's product, summed
    ("Mul", 4, False, True, False, FULL32 + SCALE),  # the product only
    ("Mul", 2, True, True, False, FULL32 + FULL32 + FULL16),  # s's first (x copied, freed), x's, then its cast
    ("Mul", 2, True, True, True, FULL32 + FULL32 + FULL32),  # s * x: x's first, then x copied for s's product
    ("Mul", 2, False, True, False, FULL32 + FULL32),  # x copied to fp32 for the product
    ("Mul", 2, True, False, False, FULL32 + FULL16),  # x's fp32 gradient and its cast
    ("Sub", 2, True, True, False, FULL32 + FULL16 + SCALE),  # -grad for s, x's cast, s's sum
    ("Sub", 4, True, False, False, 0),  # x's gradient is the output's
    ("Add", 2, True, True, False, FULL16 + SCALE),  # x's cast and s's sum
    ("Add", 4, False, True, False, SCALE),  # s's sum, no full-size tensor
])
def test_the_measured_single_ops(op: str, width: int, x_grad: bool, s_grad: bool, scale_first: bool,
                                 measured: int) -> None:
    assert _peak(op, width, x_grad, s_grad, scale_first) == measured


def test_where_the_device_casts_as_it_reads_nothing_is_copied() -> None:
    # CUDA: no copy of the 16-bit operand; the peak is x's fp32 gradient, s's product and x's cast
    assert _peak("Mul", 2, True, True, promotes_by_copy=False) == FULL32 + FULL32 + FULL16
    # s * x: s's product is summed (input 0) before x's cast
    assert _peak("Mul", 2, True, True, True, promotes_by_copy=False) == FULL32 + FULL32 + SCALE
    assert _peak("Mul", 2, False, True, promotes_by_copy=False) == FULL32 + SCALE


def test_other_ops_and_unknown_sizes_hold_nothing_here() -> None:
    assert _peak("Div", 4, True, True) == 0
    x = StepValue("x", None, None, 0, True, "activation")
    s = StepValue("s", (C,), C, SCALE, True, "weight")
    y = StepValue("y", None, None, 0, True, "activation")
    assert elementwise_backward(StepNode("Mul", "", "op", "", (0, 1), (2,), 0), [x, s, y], [True, True, False],
                                True) == 0


def _scaled(freeze: bool) -> onnxmem.Report:
    """x [R, C] times a trained weight W [C, C], times a learned scale s [C] (trained or frozen)."""
    model = graphs.model(
        [oh.make_node("MatMul", ["x", "W"], ["h"], name="fc"), oh.make_node("Mul", ["h", "s"], ["y"], name="scale")],
        [graphs.value("x", [R, C])], [graphs.value("y", [R, C])],
        [graphs.external_header("W", TensorProto.FLOAT, [C, C]), graphs.external_header("s", TensorProto.FLOAT, [C])])
    return onnxmem.analyze(model, training=TrainingOptions(optimizer="sgd", device="cuda", loss="mean",
                                                           freeze=("s",) if freeze else ()))


def test_a_trained_scale_holds_its_product_in_the_mul_backward() -> None:
    trained, frozen = (_scaled(f).training for f in (False, True))
    assert trained is not None and frozen is not None

    def at_mul(training: object) -> int:
        timeline = training.timeline  # type: ignore[attr-defined]
        return timeline.first_live_bytes[timeline.events.index("backward of Mul scale")]

    # h, kept for s's gradient; the product y's gradient times h, [R, C] fp32, before its sum to s's gradient; and
    # s's gradient itself (CUDA: no autograd graph in the device's memory)
    assert at_mul(trained) - at_mul(frozen) == FULL32 + FULL32 + SCALE
