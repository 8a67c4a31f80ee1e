"""validate on models whose operators onnxruntime's CPU provider runs as their function body (HardSwish): the
expanded nodes are unnamed in the graph it saves and named by its own node indices in its profile."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from onnxmem.measure.validate import validate

pytest.importorskip("onnxruntime")


def branches_model(layers: int) -> onnx.ModelProto:
    """Two branches of `layers` HardSwish nodes and an Identity each, listed in the file second branch first,
    joined by an Add: onnxruntime numbers the expanded nodes after the file's nodes, in file order, runs the first
    branch's first, and saves them unnamed, where a saved position's generated name ('HardSigmoid_9') is also
    the profile's name of another expanded node."""
    nodes = []
    for branch, start in (("b", "Neg"), ("a", "Relu")):
        nodes.append(helper.make_node(start, ["x"], [f"{branch}0"], name=f"{branch}_start"))
        for i in range(layers):
            nodes.append(helper.make_node("HardSwish", [f"{branch}{i}"], [f"{branch}{i + 1}"], name=f"{branch}_hs{i}"))
        nodes.append(helper.make_node("Identity", [f"{branch}{layers}"], [f"{branch}_out"], name=f"{branch}_id"))
    nodes.append(helper.make_node("Add", ["a_out", "b_out"], ["y"], name="join"))
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("level", ["disable", "basic"])
@pytest.mark.parametrize("layers", [2, 3])
def test_expanded_hardswish_is_paired_and_exact(level: str, layers: int) -> None:
    result = validate(branches_model(layers), {"batch": 8}, opt_level=level, runs=2)
    assert result.nodes_run >= 2 * layers * 2  # each HardSwish ran as HardSigmoid + Mul
    assert [run.activation_difference_bytes for run in result.runs] == [0, 0]
