"""Golden tests: tiny graphs whose peak is worked out by hand (T = 4 MiB, one [1,1024,1024] float32)."""

from __future__ import annotations

import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

import onnxmem
from onnxmem.ir.graph import build_graph
from onnxmem.passes.liveness import liveness
from onnxmem.passes.schedule import model_order
from onnxmem.shapes.sizing import bind_and_infer
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES, NO_REUSE_RULES, InferenceRules

from . import graphs
from .graphs import T


def test_chain_peak_is_one_input_plus_one_output() -> None:
    # a, b, c, y are each T. While Mul runs, a (its input) and b (its output) are live: 2T.
    # x is a graph input: counted in input_bytes, never in activations.
    inf = onnxmem.analyze(graphs.chain()).inference
    assert inf.peak_activation_bytes == 2 * T
    assert inf.peak_node == "Add_a" or inf.peak_node == "Mul_b"
    assert inf.input_bytes == T
    assert inf.peak_bytes == 3 * T
    assert inf.sum_activation_bytes == 4 * T


def test_fanout_peak_holds_all_branches() -> None:
    # In the file's order u0, u1, u2 are all live when s1 = u0 + u1 runs, and s1 is new: 4T at s1.
    inf = onnxmem.analyze(graphs.fanout(), order="model").inference
    assert inf.peak_activation_bytes == 4 * T
    assert inf.peak_node == "Add_s1"
    assert {t.name for t in inf.live_at_peak} == {"u0", "u1", "u2", "s1"}


def test_fanout_in_onnxruntimes_order_is_the_default() -> None:
    # onnxruntime walks back from the output y = s1 + u2, its highest-index input first: s1's inputs u1 then u0
    # (again the highest index first, so Mul_u1 runs first), then s1, then u2: u0, u1 and s1 are live at s1 (3T);
    # u2 is made once u0 and u1 are gone (s1, u2 and y: 3T again; the first step to reach it is the peak).
    inf = onnxmem.analyze(graphs.fanout()).inference
    assert inf.timeline is not None and inf.timeline.nodes == ("Mul_u1", "Add_u0", "Add_s1", "Sub_u2", "Add_y")
    assert inf.peak_activation_bytes == 3 * T
    assert inf.peak_node == "Add_s1"
    assert onnxmem.analyze(graphs.fanout(), order="ort") == onnxmem.analyze(graphs.fanout())


def test_skip_connection_keeps_its_source_alive() -> None:
    # a lives until y: while c = b * b runs, a, b and c are live: 3T.
    inf = onnxmem.analyze(graphs.skip()).inference
    assert inf.peak_activation_bytes == 3 * T
    assert inf.peak_node == "Mul_c"


def buffers(model: onnx.ModelProto, rules: InferenceRules = DEFAULT_INFERENCE_RULES) -> list[int]:
    """Give the bytes of each distinct activation buffer the liveness pass allocates (model order)."""
    graph = build_graph(model, bind_and_infer(model, {}).types)
    timeline = liveness(graph, model_order(graph), rules)
    return [graph.tensors[t].nbytes or 0 for t, first in enumerate(timeline.first_step) if first >= 0]


def test_in_place_activations_reuse_their_dying_input() -> None:
    # Relu writes b over a and Sigmoid writes c over it too: one buffer for a, b, c, and y's own: 2 buffers.
    # At y = c + c: that buffer and y: 2T. Without reuse every tensor has a buffer: 4.
    assert onnxmem.analyze(graphs.inplace()).inference.peak_activation_bytes == 2 * T
    assert buffers(graphs.inplace()) == [T, T]
    assert buffers(graphs.inplace(), NO_REUSE_RULES) == [T, T, T, T]


def test_a_freed_buffer_waits_for_the_output_that_reuses_it() -> None:
    # a (T) dies at b = Concat(a, a) (2T); c = ReduceMax(b) is [1,1,1024] (4 KiB); d = Expand(c) is T again and
    # takes a's freed buffer, which onnxruntime keeps allocated from a's death until d: while c is computed,
    # b + c + a's held buffer = 3T + 4 KiB (measured so on onnxruntime 1.32). Without reuse the peak is 3T.
    shape = oh.make_tensor("shape", TensorProto.INT64, [3], [1, 1024, 1024])
    axes = oh.make_tensor("axes", TensorProto.INT64, [1], [1])
    model = graphs.model(
        [graphs.node("Add", ["x", "x"], ["a"]), graphs.node("Concat", ["a", "a"], ["b"], axis=1),
         graphs.node("ReduceMax", ["b", "axes"], ["c"], keepdims=1), graphs.node("Expand", ["c", "shape"], ["d"]),
         graphs.node("Add", ["d", "d"], ["y"])],
        [graphs.value("x")], [graphs.value("y")], [shape, axes])
    assert onnxmem.analyze(model).inference.peak_activation_bytes == 3 * T + 4096
    assert onnxmem.analyze(model, rules=NO_REUSE_RULES).inference.peak_activation_bytes == 3 * T


def test_in_place_never_overwrites_a_tensor_read_later() -> None:
    # a = x + x; b = Relu(a); y = a + b: a is read after Relu, so Relu cannot write over it.
    model = graphs.model(
        [graphs.node("Add", ["x", "x"], ["a"]), graphs.node("Relu", ["a"], ["b"]),
         graphs.node("Add", ["a", "b"], ["y"])],
        [graphs.value("x")], [graphs.value("y")])
    inf = onnxmem.analyze(model).inference
    assert inf.peak_activation_bytes == 3 * T  # a, b and y while the last Add runs
    assert inf.sum_activation_bytes == 3 * T


def test_in_place_never_overwrites_a_graph_input() -> None:
    # Relu(x) where x is a graph input: the output needs its own buffer.
    model = graphs.model([graphs.node("Relu", ["x"], ["y"])], [graphs.value("x")], [graphs.value("y")])
    assert onnxmem.analyze(model).inference.peak_activation_bytes == T


def test_graph_outputs_get_their_own_buffer() -> None:
    # a = x + x; y = Relu(a) as a graph output: onnxruntime gives outputs their own buffer, so a and y: 2T.
    relu = graphs.model([graphs.node("Add", ["x", "x"], ["a"]), graphs.node("Relu", ["a"], ["y"])],
                        [graphs.value("x")], [graphs.value("y")])
    assert onnxmem.analyze(relu).inference.peak_activation_bytes == 2 * T
    # y = Reshape(a) as a graph output is a copy, not a view: 2T again.
    shape = oh.make_tensor("shape", TensorProto.INT64, [2], [1024, 1024])
    reshape = graphs.model([graphs.node("Add", ["x", "x"], ["a"]), graphs.node("Reshape", ["a", "shape"], ["y"])],
                           [graphs.value("x")], [graphs.value("y", [1024, 1024])], [shape])
    assert onnxmem.analyze(reshape).inference.peak_activation_bytes == 2 * T


def test_views_of_inputs_and_weights_cost_nothing() -> None:
    # r = Reshape(x) is a view of the graph input; y = r + r: only y is allocated, T.
    shape = oh.make_tensor("shape", TensorProto.INT64, [2], [1024, 1024])
    model = graphs.model([graphs.node("Reshape", ["x", "shape"], ["r"]), graphs.node("Add", ["r", "r"], ["y"])],
                         [graphs.value("x")], [graphs.value("y", [1024, 1024])], [shape])
    assert onnxmem.analyze(model).inference.peak_activation_bytes == T


def test_in_place_needs_the_same_shape_not_just_the_same_bytes() -> None:
    # a = x + x is [1,1024,1024]; Cast to int32 keeps the shape and the element size: in place (1 buffer).
    # Cast to float16 halves the element size: a new buffer.
    def cast(to: int) -> list[int]:
        model = graphs.model(
            [graphs.node("Add", ["x", "x"], ["a"]), graphs.node("Cast", ["a"], ["c"], to=to),
             graphs.node("Add", ["c", "c"], ["y"])],
            [graphs.value("x")], [graphs.value("y", None, to)])
        return buffers(model)

    assert cast(TensorProto.INT32) == [T, T]  # a (shared by c) and y
    assert cast(TensorProto.FLOAT16) == [T, T // 2, T // 2]  # a, c and y


def test_reshape_and_unsqueeze_are_views() -> None:
    # r and u share a's buffer: at y = u + u, live are a (as u) and y: 2T; only 2 buffers exist.
    inf = onnxmem.analyze(graphs.alias()).inference
    assert inf.peak_activation_bytes == 2 * T
    assert inf.sum_activation_bytes == 2 * T
    assert buffers(graphs.alias(), NO_REUSE_RULES) == [T, T, T, T]


def test_if_counts_the_larger_branch_while_it_runs() -> None:
    # then: t1 (T) live at Mul, its output is the If's output: 1T of its own.
    # else: Concat makes e1 (2T); Split holds e1 + s0 + s1 = 4T; Add holds s0, s1: 2T. Its peak is 4T.
    # The If step: its output z (T) + the larger branch's 4T = 5T. Then y = z + x: 2T.
    inf = onnxmem.analyze(graphs.if_branches()).inference
    assert inf.peak_activation_bytes == 5 * T
    assert inf.peak_node == "if"


def test_loop_body_is_live_while_the_loop_runs() -> None:
    # body: a = v_in + x (T), v_out = Relu(a) (T: a body output is a buffer of its own, so not in place),
    # cond_out = Identity(cond_in) (1 byte, an output: no view). Body peak while Relu runs: a + v_out = 2T.
    # Loop step: y (T) + body 2T + the iteration counter and condition it feeds the body (8 + 1 bytes).
    # x is read inside the body, so it is an implicit input of the Loop.
    report = onnxmem.analyze(graphs.loop())
    assert report.inference.peak_activation_bytes == 3 * T + 9


def test_weights_and_symbolic_batch() -> None:
    # W1 = 256*512*4 B, W2 = 512*128*4 B. At batch 8: x = 8*256*4, h = r = 8*512*4 (Relu in place),
    # y = 8*128*4. Peak while Relu or MatMul 2 runs: h (in place r) + y at the last MatMul = 8*(512+128)*4.
    report = onnxmem.analyze(graphs.symbolic_mlp(), {"batch": 8})
    inf = report.inference
    assert inf.weights_bytes == 256 * 512 * 4 + 512 * 128 * 4
    assert inf.weights_by_dtype == {"FLOAT": inf.weights_bytes}
    assert inf.input_bytes == 8 * 256 * 4
    assert inf.peak_activation_bytes == 8 * (512 + 128) * 4
    assert inf.peak_bytes == inf.weights_bytes + inf.input_bytes + inf.peak_activation_bytes
    assert report.dims == {"batch": 8}


def test_activations_scale_with_batch_and_weights_do_not() -> None:
    small = onnxmem.analyze(graphs.symbolic_mlp(), {"batch": 2}).inference
    large = onnxmem.analyze(graphs.symbolic_mlp(), {"batch": 2000}).inference
    assert large.weights_bytes == small.weights_bytes
    assert large.peak_activation_bytes == 1000 * small.peak_activation_bytes


def test_huge_batch_sizes_are_exact_integers() -> None:
    # 2**40 rows of 640 float32 values: far past int32 and exact in Python's int.
    inf = onnxmem.analyze(graphs.symbolic_mlp(), {"batch": 2**40}).inference
    assert inf.peak_activation_bytes == 2**40 * (512 + 128) * 4


def test_constant_nodes_count_as_weights() -> None:
    value = oh.make_tensor("c", TensorProto.FLOAT, [1024], [1.0] * 1024)
    model = graphs.model(
        [oh.make_node("Constant", [], ["c"], value=value, name="const"),
         graphs.node("Add", ["x", "c"], ["y"])],
        [graphs.value("x", [4, 1024])], [graphs.value("y", [4, 1024])])
    inf = onnxmem.analyze(model).inference
    assert inf.weights_bytes == 4096
    assert inf.peak_activation_bytes == 4 * 1024 * 4


@pytest.mark.parametrize(
    ("dtype", "dims", "expected"),
    [
        (TensorProto.FLOAT16, [3, 5], 30),
        (TensorProto.BFLOAT16, [7], 14),
        (TensorProto.INT4, [3, 5], 8),  # 15 four-bit values pack into 8 bytes
        (TensorProto.UINT4, [4], 2),
        (TensorProto.FLOAT4E2M1, [5], 3),
        (TensorProto.FLOAT8E4M3FN, [3, 5], 15),
        (TensorProto.FLOAT8E5M2, [2], 2),
        (TensorProto.DOUBLE, [2], 16),
        (TensorProto.INT64, [3], 24),
        (TensorProto.BOOL, [9], 9),
        (TensorProto.COMPLEX128, [1], 16),
    ],
)
def test_weights_of_every_element_type(dtype: int, dims: list[int], expected: int) -> None:
    weight = oh.make_tensor_value_info("w", dtype, dims)
    init = graphs.external_header("w", dtype, dims)
    model = graphs.model([graphs.node("Identity", ["w"], ["y"])], [], [weight], [init])
    model.graph.output[0].name = "y"
    assert onnxmem.analyze(model).inference.weights_bytes == expected
