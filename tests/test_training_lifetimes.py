"""Python variables hold tensors past their last reader (training/lifetimes.py): a statement that binds what it made
to a name keeps it until a later statement of the same frame rebinds the name, or the frame returns; read from the
frames the loaded graph's ops carry (benchmarks/training_zoo_single_ops.py --locals)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from onnxmem.training.lifetimes import held_by_locals
from onnxmem.training.values import StepNode, StepValue


def _step(lines: list[str]) -> tuple[Any, list[StepNode], list[StepValue]]:
    """A chain x -> node 0 -> v0 -> node 1 -> v1 -> ..., node i run by source line lines[i] of one forward, under
    a caller's frame; each value read by the next node only."""
    caller = "model.py:3 forward\tout = self.block(x)"
    values = [StepValue("x", (4, 64), 256, 1024, True, "input")]
    nodes = []
    for i, _ in enumerate(lines):
        values.append(StepValue(f"v{i}", (4, 64), 256, 1024, True, "activation", producer=i))
        nodes.append(StepNode("Relu", "", f"n{i}", f": M/block: pkg.Block/relu_{i}: aten.relu.default", (i,),
                              (i + 1,), i))
        values[i].consumers.append(i)
    graph = SimpleNamespace(ops=[SimpleNamespace(frames=(caller, f"block.py:{10 + i} forward\t{line}"))
                                 for i, line in enumerate(lines)])
    return graph, nodes, values


def test_a_variable_holds_its_tensor_until_rebound_or_returned() -> None:
    graph, nodes, values = _step(["h = self.a(x)", "g = self.b(h)", "y = self.c(g)", "return self.d(y)"])
    held = held_by_locals(graph, nodes, values, list(range(len(values))))
    # h, g and y are never rebound: each is held until the block returns (its last node), past its one reader
    assert held == {1: 3, 2: 3, 3: 3}


def test_rebinding_releases_the_old_tensor_when_the_statement_completes() -> None:
    graph, nodes, values = _step(["h = self.a(x)", "h = self.b(h)", "h = self.c(h)", "return self.d(h)"])
    held = held_by_locals(graph, nodes, values, list(range(len(values))))
    # the first h until the second statement has made its result, and so on; the last one until the return
    assert held == {1: 1, 2: 2, 3: 3}


def test_inline_code_and_graphs_without_frames_bind_nothing() -> None:
    graph, nodes, values = _step(["return self.d(self.c(self.b(self.a(x))))"] * 4)
    assert held_by_locals(graph, nodes, values, list(range(len(values)))) == {}
    plain = SimpleNamespace(ops=[SimpleNamespace() for _ in nodes])
    graph, nodes, values = _step(["h = self.a(x)", "g = self.b(h)", "y = self.c(g)", "return self.d(y)"])
    assert held_by_locals(plain, nodes, values, list(range(len(values)))) == {}


def test_the_exporters_stack_traces_are_the_frames_read() -> None:
    import pytest
    from onnx import TensorProto, helper

    from onnxmem.ir.graph import Op, build_graph

    if "frames" not in getattr(Op, "__dataclass_fields__", {}):
        pytest.skip("the loaded graph's ops carry no frames (ir/graph.py reads no stack traces yet)")
    trace = ('File "model.py", line 3, in forward\n    out = self.block(x)\n  File "block.py", line 10, in forward\n'
             '    h = self.a(x)')
    node = helper.make_node("Relu", ["x"], ["h"], name="relu")
    prop = node.metadata_props.add()
    prop.key, prop.value = "pkg.torch.onnx.stack_trace", trace
    f = TensorProto.FLOAT
    model = helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", f, [2])],
                                                [helper.make_tensor_value_info("h", f, [2])]))
    graph = build_graph(model, {})
    assert graph.ops[0].frames == ("model.py:3 forward\tout = self.block(x)", "block.py:10 forward\th = self.a(x)")
