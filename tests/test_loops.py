"""A Loop's run on onnxruntime's CPU provider (onnxmem/passes/loops.py): what its body allocates on every iteration, in
the peak and in the arena's held bytes, worked out by hand from loop.cc and checked against onnxruntime."""

from __future__ import annotations

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from onnxmem.ir.graph import build_graph
from onnxmem.passes.loops import ITERATIONS_BEFORE_REPEAT, loop_run, loop_trip_counts, loop_warnings, replayed
from onnxmem.passes.pipeline import analysis
from onnxmem.shapes.sizing import bind_and_infer
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES

MiB = 1 << 20
SCALARS = 8 + 1  # the Loop's iteration number (int64) and condition (bool)


def _loop_model(n: int, trips: int | None, steps: int = 1, scan: bool = False, computed_condition: bool = False,
                passed_scan: bool = False) -> onnx.ModelProto:
    """y = Loop(M, "", x): the carried value a goes through `steps` Adds with the outer x, then a Relu (the next
    a); with `scan`, a Sigmoid of the last Add is a scan output too (with `passed_scan`, an Identity of the carried
    value that came in). Every tensor is [1, n] float32. `trips`: M as an initializer, or None: M a graph input."""
    body_nodes = []
    previous = "a_in"
    for k in range(steps):
        body_nodes.append(helper.make_node("Add", [previous, "x"], [f"s{k}"]))
        previous = f"s{k}"
    body_nodes.append(helper.make_node("Relu", [previous], ["a_out"]))
    body_nodes.append(helper.make_node("Less", ["i", "limit"], ["c_out"]) if computed_condition else
                      helper.make_node("Identity", ["c_in"], ["c_out"]))
    outputs = [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
               helper.make_tensor_value_info("a_out", TensorProto.FLOAT, [1, n])]
    if scan:
        body_nodes.append(helper.make_node("Identity", ["a_in"], ["scan_out"]) if passed_scan else
                          helper.make_node("Sigmoid", [previous], ["scan_out"]))
        outputs.append(helper.make_tensor_value_info("scan_out", TensorProto.FLOAT, [1, n]))
    body = helper.make_graph(body_nodes, "body", [
        helper.make_tensor_value_info("i", TensorProto.INT64, []),
        helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
        helper.make_tensor_value_info("a_in", TensorProto.FLOAT, [1, n])], outputs)
    loop_outputs = ["y", "ys"] if scan else ["y"]
    initializers = [helper.make_tensor("limit", TensorProto.INT64, [], [max((trips or 1) - 1, 0)])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])]
    if trips is None:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    else:
        initializers.append(helper.make_tensor("M", TensorProto.INT64, [], [trips]))
    graph_outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])]
    if scan:
        graph_outputs.append(helper.make_tensor_value_info("ys", TensorProto.FLOAT, [trips or 1, 1, n]))
    graph = helper.make_graph([helper.make_node("Loop", ["M", "", "x"], loop_outputs, body=body)], "loop",
                              inputs, graph_outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, trips: int, traced: set[tuple[object, ...]],  # noqa: ANN202 - a test helper
         mem_pattern: bool = True, replay_up_to: int | None = None):
    graph = build_graph(model, bind_and_infer(model, {}).types)
    return loop_run(graph, graph.ops[0], trips, DEFAULT_INFERENCE_RULES, traced, mem_pattern,
                    replay_up_to=replay_up_to)


def _most_live_after_iterating(events: tuple[tuple[str, int, int], ...]) -> int:
    """Give the most bytes live from the last sample of a Loop's run on (its outputs made, its values released)."""
    live: dict[int, int] = {}
    last_sample = max((k for k, event in enumerate(events) if event[0] == "sample"), default=-1)
    most = 0
    for position, (kind, buffer, size) in enumerate(events):
        if kind == "alloc":
            live[buffer] = size
        elif kind == "free":
            live.pop(buffer, None)
        if position > last_sample:
            most = max(most, sum(live.values()))
    return most


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 300), trips=st.integers(0, 40), steps=st.integers(1, 3), scan=st.booleans(),
       passed_scan=st.booleans(), computed=st.booleans(), mem_pattern=st.booleans(), second_run=st.booleans())
def test_the_peak_of_a_loop_by_arithmetic_is_the_peak_iteration_by_iteration(
        n: int, trips: int, steps: int, scan: bool, passed_scan: bool, computed: bool, mem_pattern: bool,
        second_run: bool) -> None:
    # Past its first iterations every iteration allocates as the one before and keeps its scan outputs besides:
    # replaying ITERATIONS_BEFORE_REPEAT iterations and working out the rest gives the peak that replaying every
    # one gives, and the same bytes live once it has iterated (the other iterations' scan outputs as one block).
    model = _loop_model(n, trips, steps, scan, computed, passed_scan)
    traced: list[set[tuple[object, ...]]] = [set(), set()]
    if second_run:  # a later run: the session traced the body's patterns in the first
        for seen in traced:
            _run(model, trips, seen, mem_pattern, replay_up_to=trips)
    iterated = _run(model, trips, traced[0], mem_pattern, replay_up_to=trips)
    worked_out = _run(model, trips, traced[1], mem_pattern, replay_up_to=ITERATIONS_BEFORE_REPEAT)
    assert worked_out.sampled_peak == iterated.sampled_peak
    assert _most_live_after_iterating(worked_out.events) == _most_live_after_iterating(iterated.events)
    assert traced[0] == traced[1]


@pytest.mark.parametrize("trips", [10**9, 2**62, 2**63 - 1])
def test_a_trip_count_too_large_to_iterate_is_worked_out(trips: int) -> None:
    # One scan output of 1 KiB a iteration: iterating would never end; by arithmetic the last iteration holds
    # the scan outputs of all iterations before it besides what the fourth held.
    n = 256
    few = _run(_loop_model(n, 4, scan=True), 4, set(), replay_up_to=4)
    run = _run(_loop_model(n, 4, scan=True), trips, set(), replay_up_to=4)
    assert run.sampled_peak == few.sampled_peak + (trips - 4) * 4 * n
    model = _loop_model(n, trips)  # the CLI's path: every stage, a named warning for the iterations summarized
    codes = [w.code for w in analysis(model, {}).report.warnings]
    assert "loop-iterations-summarized" in codes


def test_the_trip_count_is_read_from_a_constant_and_unknown_from_a_graph_input() -> None:
    known, unknown = _loop_model(256, 5), _loop_model(256, None)
    assert loop_trip_counts(build_graph(known, bind_and_infer(known, {}).types), known) == {0: 5}
    graph = build_graph(unknown, bind_and_infer(unknown, {}).types)
    assert loop_trip_counts(graph, unknown) == {}
    assert [w.code for w in loop_warnings(graph, {})] == ["loop-iterations-unknown"]


def test_a_computed_condition_is_named_an_upper_bound() -> None:
    model = _loop_model(256, 4, computed_condition=True)
    graph = build_graph(model, bind_and_infer(model, {}).types)
    assert [w.code for w in loop_warnings(graph, loop_trip_counts(graph, model))] == ["loop-may-stop-early"]


def test_one_iteration_holds_the_body_and_its_output_then_the_loop_output() -> None:
    # Iteration 0 traces the body's pattern: s (4 MiB) and a_out (4 MiB) in the arena besides the scalars; s dies
    # after the Relu. Then the Loop allocates y (4 MiB, its own output, apart from the sampled figure).
    run = _run(_loop_model(MiB, 1), 1, set())
    assert run.sampled_peak == 8 * MiB + SCALARS
    assert [e for e in replayed(run.events) if e[0] == "alloc"][-1] == ("alloc", 3, 4 * MiB)  # y: tensor 3


def test_later_iterations_use_the_pattern_block_and_hold_two_carried_values() -> None:
    # Two Adds then a Relu. Iteration 0 traces: s0 and s1 (4 MiB each) live together at the second Add, s1 and
    # a_out at the Relu: 8 MiB. Iteration 1 on: the pattern's block (s0 and s1 side by side: 8 MiB) is allocated
    # when the frame is made; at the Relu the feed a_in (the last iteration's a_out) and the new a_out are live
    # besides: 16 MiB and the scalars.
    traced: set[tuple[object, ...]] = set()
    first = _run(_loop_model(MiB, 3, steps=2), 3, traced)
    assert first.sampled_peak == 16 * MiB + SCALARS
    # a second run: every iteration uses the block from the start (iteration 0: the block and a_out, 12 MiB)
    later = _run(_loop_model(MiB, 1, steps=2), 1, traced)
    blocks = [size for kind, _, size in later.events if kind == "alloc" and size == 8 * MiB]
    assert len(blocks) == 1 and later.sampled_peak == 12 * MiB + SCALARS


def test_scan_outputs_are_kept_until_the_loop_ends() -> None:
    # Each iteration's scan output (4 MiB) is kept to be concatenated: after 3 iterations 3 of them, with the
    # block (4 MiB) and the carried a_out of two iterations.
    run = _run(_loop_model(MiB, 3, scan=True), 3, set())
    assert run.sampled_peak == (1 + 2 + 3) * 4 * MiB + SCALARS


@pytest.mark.parametrize(("n", "trips", "steps", "scan"), [
    (MiB // 4, 1, 1, False), (MiB, 2, 1, False), (MiB, 5, 3, False), (3 * MiB // 2, 3, 1, False),
    (MiB, 3, 1, True), (1000, 7, 2, True)])
def test_validate_is_exact_on_loops_peak_and_arena(tmp_path, n: int, trips: int, steps: int, scan: bool) -> None:
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    path = tmp_path / f"loop_{n}_{trips}_{steps}_{scan}.onnx"
    onnx.save(_loop_model(n, trips, steps, scan), str(path))
    result = validate(path, {}, runs=2)
    for run in result.runs:
        assert run.activation_difference_bytes == 0, run
        assert run.estimated.arena_held_bytes == run.measured.arena_held_bytes, run
    # the plain report is onnxruntime's first run
    assert analysis(str(path), {}).report.inference.peak_activation_bytes == \
        result.runs[0].measured.peak_activation_bytes


def _if_model(n: int, steps: int) -> onnx.ModelProto:
    """y = If(c) over x = Relu(x0): each branch applies `steps` unary ops to the outer x, then a Neg (its output is
    the If's output). Every tensor is [1, n] float32."""
    def branch(name: str, op_type: str) -> onnx.GraphProto:
        nodes, previous = [], "x"
        for k in range(steps):
            nodes.append(helper.make_node(op_type, [previous], [f"{name}{k}"]))
            previous = f"{name}{k}"
        nodes.append(helper.make_node("Neg", [previous], [f"{name}_out"]))
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT,
                                                                                 [1, n])])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x0"], ["x"]),
         helper.make_node("If", ["c"], ["y"], then_branch=branch("t", "Sigmoid"), else_branch=branch("e", "Tanh"))],
        "if", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1, n]),
               helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("steps", [1, 3])
def test_an_if_branch_allocates_in_the_arena(tmp_path, steps: int) -> None:
    # x (4 MiB: a 4 MiB region), the branch's first intermediate (4 MiB: a second 4 MiB region), then the If's
    # output: the next region is 8 MiB. 16 MiB held, where the If's output alone would leave 8 MiB.
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    path = tmp_path / f"if_{steps}.onnx"
    onnx.save(_if_model(MiB, steps), str(path))
    result = validate(path, {}, runs=2)
    for run in result.runs:
        assert run.measured.arena_held_bytes == 16 * MiB
        assert run.estimated.arena_held_bytes == run.measured.arena_held_bytes
        assert run.activation_difference_bytes == 0


def test_a_scan_is_named_not_simulated() -> None:
    body = helper.make_graph(
        [helper.make_node("Add", ["state_in", "x_i"], ["sum"]), helper.make_node("Relu", ["sum"], ["state_out"]),
         helper.make_node("Sigmoid", ["sum"], ["y_i"])], "body",
        [helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [1, 256]),
         helper.make_tensor_value_info("x_i", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [1, 256]),
         helper.make_tensor_value_info("y_i", TensorProto.FLOAT, [1, 256])])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1)], "scan",
        [helper.make_tensor_value_info("s0", TensorProto.FLOAT, [1, 256]),
         helper.make_tensor_value_info("xs", TensorProto.FLOAT, [3, 1, 256])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 256]),
         helper.make_tensor_value_info("ys", TensorProto.FLOAT, [3, 1, 256])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    codes = [w.code for w in analysis(model, {}).report.warnings]
    assert "scan-not-simulated" in codes


def test_a_body_of_unknown_sizes_is_named_a_lower_bound() -> None:
    # the loop-carried value grows by a Concat each iteration: its body tensors have no static size
    body = helper.make_graph(
        [helper.make_node("Concat", ["a_in", "x"], ["a_out"], axis=1),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("a_in", TensorProto.FLOAT, [1, "k"])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("a_out", TensorProto.FLOAT, [1, "k2"])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)], "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None])],
        initializer=[helper.make_tensor("M", TensorProto.INT64, [], [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    codes = [w.code for w in analysis(model, {}).report.warnings]
    assert "loop-body-unsized" in codes
