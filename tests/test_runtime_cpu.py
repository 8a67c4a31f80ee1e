"""onnxmem.measure (ort_cpu, inputs) against the real onnxruntime on tiny graphs whose peak is worked out by hand.

T = one float32 [1,1024,1024] tensor = 4 MiB. Counted: bytes onnxruntime's CPU arena hands out while the graph
runs (activations and graph outputs). Not counted: graph inputs (fed from numpy) and plain initializers.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto, numpy_helper

pytest.importorskip("onnxruntime")

from onnxmem.errors import DimError, RuntimeMeasurementError  # noqa: E402
from onnxmem.measure.inputs import make_feeds  # noqa: E402
from onnxmem.measure.ort_cpu import measure_cpu  # noqa: E402

SHAPE = [1, 1024, 1024]
T = 4 * 1024 * 1024


def _value(name, shape=None, dtype=TensorProto.FLOAT):
    return oh.make_tensor_value_info(name, dtype, SHAPE if shape is None else shape)


def _model(nodes, inputs, outputs, initializers=()):
    graph = oh.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _node(op, inputs, outputs, name, **attrs):
    return oh.make_node(op, inputs, outputs, name=name, **attrs)


def _chain():
    # x -> a=Add -> b=Mul -> c=Sub -> y=Add
    return _model([_node("Add", ["x", "x"], ["a"], "add0"), _node("Mul", ["a", "a"], ["b"], "mul"),
                   _node("Sub", ["b", "b"], ["c"], "sub"), _node("Add", ["c", "c"], ["y"], "add1")],
                  [_value("x")], [_value("y")])


def _fanout():
    # x feeds u0, u1, u2; s1 = u0 + u1; y = s1 + u2
    return _model([_node("Add", ["x", "x"], ["u0"], "u0"), _node("Mul", ["x", "x"], ["u1"], "u1"),
                   _node("Sub", ["x", "x"], ["u2"], "u2"), _node("Add", ["u0", "u1"], ["s1"], "add1"),
                   _node("Add", ["s1", "u2"], ["y"], "add2")],
                  [_value("x")], [_value("y")])


def test_chain_first_run_is_two_tensors_and_pattern_adds_the_output():
    m = _chain()
    r = measure_cpu(m, make_feeds(m, {}), runs=2, mem_pattern=True)
    # Run 1: at Mul a and b are live (x is a graph input, not counted) = 2T; Sub writes c, a dies after Mul;
    # at the last Add c and y = 2T. Peak 2T.
    assert r.runs[0].peak_activation_bytes == 2 * T
    assert r.runs[0].baseline_bytes == 0
    # Run 2 with the memory pattern: one block of the planner's 2T (a/c share, b) is held for the whole run,
    # and the graph output y (T) is allocated on top: 3T.
    assert r.runs[1].peak_activation_bytes == 3 * T
    assert r.runs[1].start_bytes == 2 * T
    assert r.execution_order == ("add0", "mul", "sub", "add1")
    assert r.optimized_model is not None and len(r.optimized_model.graph.node) == 4
    assert r.settings["enable_mem_pattern"] == "True" and r.settings["intra_op_num_threads"] == "1"


def test_fanout_order_and_peaks():
    m = _fanout()
    r = measure_cpu(m, make_feeds(m, {}), runs=2, mem_pattern=False)
    # onnxruntime's default order (reverse DFS from the leaves, inputs by node index) is not the file order.
    assert r.execution_order == ("u1", "u0", "add1", "u2", "add2")
    # u1, u0 live; add1 writes s1 before u0/u1 are released: 3T. Then u2 (2T), y (3T at add2 with s1, u2).
    assert [run.peak_activation_bytes for run in r.runs] == [3 * T, 3 * T]  # no pattern: run 2 = run 1
    assert r.runs[0].peak_node == "add1"


def test_relu_writes_in_place_but_not_into_a_graph_input():
    inplace = _model([_node("Add", ["x", "x"], ["a"], "add0"), _node("Relu", ["a"], ["r"], "relu"),
                      _node("Add", ["r", "r"], ["y"], "add1")], [_value("x")], [_value("y")])
    # a = T; Relu reuses a's buffer (last use, same shape): still T; y on top: 2T.
    assert measure_cpu(inplace, make_feeds(inplace, {}), runs=1).runs[0].peak_activation_bytes == 2 * T
    not_last_use = _model([_node("Add", ["x", "x"], ["a"], "add0"), _node("Relu", ["a"], ["r"], "relu"),
                           _node("Add", ["a", "r"], ["y"], "add1")], [_value("x")], [_value("y")])
    # a is read again by add1, so Relu cannot overwrite it: a, r, y = 3T.
    assert measure_cpu(not_last_use, make_feeds(not_last_use, {}), runs=1).runs[0].peak_activation_bytes == 3 * T


def test_plain_initializers_are_outside_the_baseline():
    w = numpy_helper.from_array(np.ones(SHAPE, np.float32), "w")
    m = _model([_node("Add", ["x", "w"], ["y"], "add")], [_value("x")], [_value("y")], [w])
    r = measure_cpu(m, make_feeds(m, {}), runs=1)
    assert r.runs[0].baseline_bytes == 0 and r.runs[0].peak_activation_bytes == T


def test_broken_model_raises_and_leaves_no_files(tmp_path):
    bad = _model([_node("NoSuchOp", ["x"], ["y"], "n")], [_value("x", [2])], [_value("y", [2])])
    path = tmp_path / "bad.onnx"
    onnx.save_model(bad, str(path))
    with pytest.raises(RuntimeMeasurementError) as info:
        measure_cpu(path, {"x": np.ones([2], np.float32)})
    assert "\n" not in str(info.value) and "NoSuchOp" in str(info.value)

    good = tmp_path / "good.onnx"
    onnx.save_model(_chain(), str(good))
    before = sorted(os.listdir(tmp_path))
    cwd_before = sorted(os.listdir(os.getcwd()))
    r = measure_cpu(good, make_feeds(_chain(), {}), runs=1)
    assert r.runs[0].peak_activation_bytes == 2 * T
    assert sorted(os.listdir(tmp_path)) == before
    assert sorted(os.listdir(os.getcwd())) == cwd_before


def test_run_failure_raises_runtime_measurement_error():
    m = _chain()
    with pytest.raises(RuntimeMeasurementError):
        measure_cpu(m, {"x": np.ones([3, 3], np.float32)})  # wrong shape


def test_unnamed_nodes_get_distinct_names():
    m = _model([oh.make_node("Add", ["x", "x"], ["a"]), oh.make_node("Relu", ["a"], ["y"])],
               [_value("x", [4])], [_value("y", [4])])
    r = measure_cpu(m, make_feeds(m, {}), runs=1)
    assert r.execution_order == ("Add_0", "Relu_1")


def test_make_feeds_shapes_dtypes_and_token_ids():
    table = numpy_helper.from_array(np.zeros([50, 8], np.float32), "emb")
    m = _model([_node("Gather", ["emb", "ids"], ["e"], "g"), _node("Cast", ["mask"], ["mf"], "c", to=1)],
               [_value("ids", ["batch", "seq"], TensorProto.INT64), _value("mask", ["batch", "seq"], TensorProto.INT64),
                _value("flag", [], TensorProto.BOOL), _value("h", ["batch", 3], TensorProto.FLOAT16)],
               [_value("e", ["batch", "seq", 8]), _value("mf", ["batch", "seq"])], [table])
    feeds = make_feeds(m, {"batch": 2, "seq": 7})
    assert set(feeds) == {"ids", "mask", "flag", "h"}
    assert feeds["ids"].shape == (2, 7) and feeds["ids"].dtype == np.int64
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() < 50
    assert feeds["flag"].shape == () and feeds["flag"].dtype == np.bool_
    assert feeds["h"].dtype == np.float16 and feeds["h"].shape == (2, 3)
    with pytest.raises(DimError, match="seq"):
        make_feeds(m, {"batch": 2})
