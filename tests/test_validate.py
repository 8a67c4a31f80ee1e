"""validate: onnxruntime's real CPU allocations against the estimate, on graphs worked out by hand."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from onnxmem.cli.commands import main

from . import graphs
from .graphs import T

pytest.importorskip("onnxruntime")

from onnxmem.measure.validate import validate  # noqa: E402


@pytest.mark.parametrize(
    ("build", "first", "steady"),
    [
        # chain: a+b while Mul runs (2T); from run 2 the pattern block holds the intermediates' peak (2T) and
        # the output y (T) comes on top: 3T.
        (graphs.chain, 2 * T, 3 * T),
        # fan-out in onnxruntime's order (u1 u0 s1 u2 y): u1, u0, s1 live at s1 = 3T; block 3T + y = 4T.
        (graphs.fanout, 3 * T, 4 * T),
        # skip: a, b, c at c = b * b: 3T; block 3T + y = 4T.
        (graphs.skip, 3 * T, 4 * T),
        # Relu and Sigmoid in place: one buffer for a, b, c, plus y: 2T both runs (the block is T).
        (graphs.inplace, 2 * T, 2 * T),
        # Reshape and Unsqueeze are views of a: a and y, 2T.
        (graphs.alias, 2 * T, 2 * T),
        # Loop body: a and v_out (own buffer) + y + the counter (8 B) and condition (1 B) = 3T + 9.
        (graphs.loop, 3 * T + 9, 3 * T + 9),
    ],
)
def test_estimate_equals_onnxruntime_to_the_byte(build, first: int, steady: int) -> None:  # type: ignore[no-untyped-def]
    result = validate(build(), runs=2)
    assert [r.measured.peak_activation_bytes for r in result.runs] == [first, steady]
    assert [r.estimated.peak_activation_bytes for r in result.runs] == [first, steady]
    assert result.exact
    assert all(r.weights_difference_bytes == 0 for r in result.runs)


def test_prepacked_weights_are_the_arena_baseline() -> None:
    # W1 [256,512] and W2 [512,128] float32 are prepacked by MatMul: 512 and 128 columns are multiples of 16,
    # so their bytes are exactly what the arena holds before the first node.
    result = validate(graphs.symbolic_mlp(), {"batch": 5}, runs=1)
    run = result.runs[0]
    assert run.measured.weights_bytes == (256 * 512 + 512 * 128) * 4
    assert run.estimated.weights_bytes == run.measured.weights_bytes
    assert run.activation_difference_bytes == 0


def test_if_counts_the_branch_that_ran() -> None:
    # The run takes the then branch (cond is True): z + t1 = 2T. The profile names the then branch's nodes, so
    # the estimate counts that branch, not the larger else branch that `onnxmem report` counts.
    result = validate(graphs.if_branches(), runs=1)
    assert result.runs[0].measured.peak_activation_bytes == 2 * T
    assert result.runs[0].estimated.peak_activation_bytes == 2 * T
    assert result.raw_estimate.peak_activation_bytes > 2 * T
    assert any("branch onnxruntime ran" in note for note in result.notes)


def test_cli_json_has_measured_and_estimated_per_run(tmp_path: Path) -> None:
    path = tmp_path / "chain.onnx"
    onnx.save(graphs.chain(), str(path))
    result = CliRunner().invoke(main, ["validate", str(path), "--format", "json", "--runs", "2"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "onnxmem.validate/1"
    assert [run["measured"]["peak_activation_bytes"] for run in document["runs"]] == [2 * T, 3 * T]
    assert [run["estimated"]["peak_activation_bytes"] for run in document["runs"]] == [2 * T, 3 * T]
    assert {"weights_bytes"} <= set(document["runs"][0]["measured"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.onnx"]  # nothing left beside the model


def test_model_onnxruntime_cannot_run_is_a_one_line_error(tmp_path: Path) -> None:
    model = graphs.model([onnx.helper.make_node("Frobnicate", ["x"], ["y"], domain="example.custom")],
                         [graphs.value("x")], [graphs.value("y")])
    model.opset_import.append(onnx.helper.make_opsetid("example.custom", 1))
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxmem: error: onnxruntime cannot load the model")
    assert "Traceback" not in result.stderr


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.mark.parametrize(("name", "dims"), [
    ("gpt_decoder", {"batch": 2, "seq": 16}),
    ("transformer_encoder", {"batch": 2, "seq": 16}),
    ("transformer_contrib", {"batch": 2, "seq": 16}),
])
def test_extended_level_first_run_is_exact(name: str, dims: dict[str, int]) -> None:
    # At the extended level onnxruntime fuses into contrib operators (FusedMatMul, BiasGelu, ...). Its planner
    # knows their outputs only where it knows their inputs, and after a computed Reshape it knows nothing: the
    # planner shapes must not come from onnxruntime's symbolic (value-propagating) inference.
    model = FIXTURES / f"{name}.onnx"
    names = {d.dim_param for v in onnx.load(str(model), load_external_data=False).graph.input
             for d in v.type.tensor_type.shape.dim if d.dim_param}
    result = validate(model, {k: v for k, v in dims.items() if k in names}, opt_level="extended", runs=1)
    assert result.runs[0].activation_difference_bytes == 0


def _unread_topk_indices() -> onnx.ModelProto:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    n = 256
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="a"),
             helper.make_node("TopK", ["a", "k"], ["values", "indices"], name="topk"),  # indices: read by nobody
             helper.make_node("Add", ["values", "values"], ["c"], name="c"),
             helper.make_node("Add", ["c", "c"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "topk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.array([n], np.int64), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def _stacked_lstm() -> onnx.ModelProto:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    seq, batch, features, hidden = 16, 4, 32, 64
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.random(shape, dtype=np.float32), name) for name, shape in
               (("W0", (1, 4 * hidden, features)), ("R0", (1, 4 * hidden, hidden)),
                ("W1", (1, 4 * hidden, hidden)), ("R1", (1, 4 * hidden, hidden)))]
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="a"),
             helper.make_node("LSTM", ["a", "W0", "R0"], ["Y0", "h0", "c0"], name="l0", hidden_size=hidden),
             helper.make_node("Squeeze", ["Y0", "axis"], ["q0"], name="q0"),
             helper.make_node("LSTM", ["q0", "W1", "R1"], ["Y1", "h1", "c1"], name="l1", hidden_size=hidden),
             helper.make_node("Add", ["Y1", "Y1"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                            [seq, batch, features])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[*weights, numpy_helper.from_array(np.array([1], np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("build", [_unread_topk_indices, _stacked_lstm])
def test_unread_outputs_stay_allocated_and_recurrent_states_take_no_freed_buffer(build) -> None:  # type: ignore[no-untyped-def]
    # TopK's unread indices and LSTM's unread states have no release action in onnxruntime: they stay allocated
    # to the end of the run; the second LSTM's states get buffers of their own although the first's are free.
    result = validate(build(), runs=1)
    assert result.runs[0].activation_difference_bytes == 0, result.runs[0]


@pytest.mark.parametrize(("name", "dims"), [
    ("gpt_decoder", {"batch": 2, "seq": 16}),
    ("transformer_encoder", {"batch": 2, "seq": 16}),
    ("lstm", {"batch": 2, "seq": 16}),
    # the decoder's Concat takes 'batch' from its skip connection after a Resize lost it (PLANNER_MERGES_DIMS)
    ("unet", {"batch": 2}),
])
def test_both_runs_exact_with_small_shape_tensors(name: str, dims: dict[str, int]) -> None:
    # The memory pattern rounds every planned buffer to onnxruntime's kAllocAlignment (256 bytes): the shape
    # tensors (8 to 32 bytes) of these models take 256 each in the block of run 2.
    model = FIXTURES / f"{name}.onnx"
    names = {d.dim_param for v in onnx.load(str(model), load_external_data=False).graph.input
             for d in v.type.tensor_type.shape.dim if d.dim_param}
    result = validate(model, {k: v for k, v in dims.items() if k in names}, runs=2)
    assert [r.activation_difference_bytes for r in result.runs] == [0, 0]


def _declared_unknown_dims() -> onnx.ModelProto:
    """x [batch,16] -> Reshape(x, Shape(x)) -> a=MatMul [.,16] -> b [.,64] -> c [.,32] -> d [.,16] -> y [.,4], saved
    after ONNX's shape inference (as quantize_dynamic and the float16 converter save a model): its value_info
    names the batch dim after the Reshape 'unk__0', which onnxruntime reads as a name like any other."""
    import numpy as np
    from onnx import numpy_helper

    def weight(name: str, rows: int, columns: int) -> onnx.TensorProto:
        return numpy_helper.from_array(np.ones((rows, columns), np.float32), name)

    nodes = [graphs.node("Shape", ["x"], ["s"]), graphs.node("Reshape", ["x", "s"], ["r"]),
             graphs.node("MatMul", ["r", "w1"], ["a"]), graphs.node("MatMul", ["a", "w2"], ["b"]),
             graphs.node("MatMul", ["b", "w3"], ["c"]), graphs.node("MatMul", ["c", "w4"], ["d"]),
             graphs.node("MatMul", ["d", "w5"], ["y"])]
    model = graphs.model(nodes, [graphs.value("x", ["batch", 16])], [graphs.value("y", None)],
                         [weight("w1", 16, 16), weight("w2", 16, 64), weight("w3", 64, 32), weight("w4", 32, 16),
                          weight("w5", 16, 4)])
    model.graph.output[0].type.tensor_type.ClearField("shape")
    return onnx.shape_inference.infer_shapes(model)


def test_unknown_dim_names_the_file_declares_are_names_to_the_planner() -> None:
    # a's buffer is freed at b; d [unk__0,16] has a's declared shape, so onnxruntime's planner gives d a's buffer,
    # which stays allocated from a to d. At c: b (64 columns) + c (32) + a's buffer (16) = 112 columns of batch 8
    # floats, where a planner that took 'unk__0' for an empty dim would hold 96.
    model = _declared_unknown_dims()
    declared = {d.dim_param for v in model.graph.value_info for d in v.type.tensor_type.shape.dim}
    assert "unk__0" in declared
    result = validate(model, {"batch": 8}, runs=1)
    assert result.runs[0].measured.peak_activation_bytes == 112 * 8 * 4
    assert result.runs[0].estimated.peak_activation_bytes == 112 * 8 * 4
    assert result.raw_estimate.peak_activation_bytes == 112 * 8 * 4  # the plain report, on the file as given


def _initializer(name: str, values: object, dtype: object) -> onnx.TensorProto:
    import numpy as np
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def _small_initializer_bytes(model: onnx.ModelProto, packed: set[str]) -> int:
    """The initializers under 128 bytes the arena copies (see test_prepacked_weights_are_the_arena_baseline)."""
    import numpy as np

    sizes = {t.name: int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
             for t in model.graph.initializer if t.name not in packed}
    return sum(size for size in sizes.values() if size < 128)


def test_quantized_matmul_weight_is_packed_into_the_arena() -> None:
    # MatMulInteger packs its int8 [K=37, N=21] weight as MLAS's QGEMM does: 21 columns -> 32, 37 rows -> 40
    # (a multiple of PackedK 4): 32 int32 column sums + 32 x 40 bytes = 128 + 1,280 = 1,408 B (a multiple of 64).
    import numpy as np

    nodes = [graphs.node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             graphs.node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
             graphs.node("Cast", ["acc"], ["y"], to=onnx.TensorProto.FLOAT)]
    weights = [_initializer("w", np.ones((37, 21)), np.int8), _initializer("wz", 0, np.int8)]
    model = graphs.model(nodes, [graphs.value("x", ["batch", 37])], [graphs.value("y", ["batch", 21])], weights)
    run = validate(model, {"batch": 4}, runs=1).runs[0]
    assert run.measured.weights_bytes == 1408 + _small_initializer_bytes(model, {"w"})
    assert run.estimated.weights_bytes == run.measured.weights_bytes


def test_quantized_conv_weights_are_packed_into_the_arena() -> None:
    # QLinearConv, uint8 activations, int8 weights of zero zero point, on MLAS's AVX2 kernels:
    # a: [32,3,3,3], 3 input channels (not a multiple of 4): the gemm pack of [K=27, N=32]: 32 x 4 + 32 x 28 = 1,024
    # b: [32,32,3,3]: the symmetric conv pack, round_up(32, 16) x 32 x 9 = 9,216
    # c: [32,1,3,3], 32 groups (a multiple of 16): depthwise symmetric pack, 32 x 9 = 288
    # d: [24,32,1,1]: symmetric (24 >= 16, a multiple of 8): round_up(24, 16) x 32 x 1 = 1,024
    # e: [24,1,3,3], 24 groups (not a multiple of 16): the reordered weight at its own size, 216
    import numpy as np

    specs = [("a", [32, 3, 3, 3], 1, 1), ("b", [32, 32, 3, 3], 1, 1), ("c", [32, 1, 3, 3], 32, 1),
             ("d", [24, 32, 1, 1], 1, 0), ("e", [24, 1, 3, 3], 24, 1)]
    weights = [_initializer("s", 0.5, np.float32), _initializer("z", 128, np.uint8),
               _initializer("wz", 0, np.int8)]
    nodes = []
    previous = "x"
    for name, shape, groups, pad in specs:
        weights.append(_initializer(f"w{name}", np.ones(shape), np.int8))
        nodes.append(graphs.node("QLinearConv", [previous, "s", "z", f"w{name}", "s", "wz", "s", "z"], [name],
                                 group=groups, pads=[pad] * 4))
        previous = name
    model = graphs.model(nodes, [graphs.value("x", [1, 3, 8, 8], onnx.TensorProto.UINT8)],
                         [graphs.value("e", [1, 24, 8, 8], onnx.TensorProto.UINT8)], weights)
    run = validate(model, {}, runs=1).runs[0]
    packed = 1024 + 9216 + 288 + 1024 + 216
    assert run.measured.weights_bytes == packed + _small_initializer_bytes(model, {f"w{s[0]}" for s in specs})
    assert run.estimated.weights_bytes == run.measured.weights_bytes


@pytest.mark.parametrize(("k", "n", "block", "bits", "level", "packed"), [
    # float compute (levels 0-3): the blocks as they are, N x ceil(K / block) x block x bits / 8
    (64, 1000, 32, 4, 0, 1000 * 2 * 16),
    (100, 70, 32, 4, 1, 70 * 4 * 16),
    # int8 compute (level 4): + a float scale per block and column, float block sums in columns padded to 16, 126 B
    (100, 70, 32, 4, 4, 70 * 4 * 16 + 70 * 4 * 4 + 80 * 4 * 4 + 126),
    (64, 64, 32, 8, 4, 64 * 2 * 32 + 64 * 2 * 4 + 64 * 2 * 4 + 126),
    (64, 64, 32, 8, 0, 0),  # 8-bit at float compute: not packed
])
def test_matmul_nbits_weight_is_packed_into_the_arena(k: int, n: int, block: int, bits: int, level: int,
                                                      packed: int) -> None:
    import numpy as np

    blocks = -(-k // block)
    weights = [_initializer("w", np.ones((n, blocks, block * bits // 8)), np.uint8),
               _initializer("scales", np.ones(n * blocks), np.float32)]
    nodes = [graphs.node("MatMulNBits", ["x", "w", "scales"], ["y"], domain="com.microsoft", K=k, N=n,
                         block_size=block, bits=bits, accuracy_level=level)]
    model = graphs.model(nodes, [graphs.value("x", ["batch", k])], [graphs.value("y", ["batch", n])], weights)
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    run = validate(model, {"batch": 4}, runs=1).runs[0]
    assert run.measured.weights_bytes == packed + _small_initializer_bytes(model, set())
    assert run.estimated.weights_bytes == run.measured.weights_bytes


@pytest.mark.parametrize(("nodes", "x_shape", "y_shape", "weights"), [
    # Gemm + Relu becomes com.microsoft FusedGemm: its [N=24, K=20] (transB) weight, 24 columns padded to 32
    ([graphs.node("Gemm", ["x", "w", "bias"], ["g"], transB=1), graphs.node("Relu", ["g"], ["y"])], ["batch", 20],
     ["batch", 24], {"w": (24, 20), "bias": (24,)}),
    # a MatMul reading a Transpose of its activation's last two dims becomes FusedMatMul (transA): its [K=20, N=24]
    # weight, 24 columns padded to 32
    ([graphs.node("Transpose", ["x"], ["t"], perm=[0, 2, 1]), graphs.node("MatMul", ["t", "w"], ["y"])],
     ["batch", 20, 8], ["batch", 8, 24], {"w": (20, 24)}),
], ids=["FusedGemm", "FusedMatMul"])
def test_a_fused_operator_packs_its_weight_as_its_kernel_does(nodes: list[onnx.NodeProto], x_shape: list[object],
                                                              y_shape: list[object],
                                                              weights: dict[str, tuple[int, ...]]) -> None:
    # At level extended the fusion runs the same kernel, whose PrePack pads the weight's columns: 20 x 32 x 4 B
    import numpy as np

    model = graphs.model(nodes, [graphs.value("x", x_shape)], [graphs.value("y", y_shape)],
                         [_initializer(name, np.ones(shape), np.float32) for name, shape in weights.items()])
    run = validate(model, {"batch": 4}, runs=1, opt_level="extended").runs[0]
    assert run.measured.weights_bytes == 20 * 32 * 4 + _small_initializer_bytes(model, {"w"})
    assert run.estimated.weights_bytes == run.measured.weights_bytes


def _conv_weights(channels: int) -> Callable[..., onnx.TensorProto]:
    """Give a maker of [channels, channels, k, k] float32 conv weights (random, seeded), by name and kernel k."""
    import numpy as np
    from onnx import numpy_helper

    rng = np.random.default_rng(0)

    def weight(name: str, kernel: int = 1) -> onnx.TensorProto:
        array = rng.standard_normal((channels, channels, kernel, kernel)).astype(np.float32) * 0.1
        return numpy_helper.from_array(array, name)

    return weight


def test_nchwc_conv_writes_into_its_fused_sum_input(tmp_path: Path) -> None:
    """At level all, onnxruntime turns y = Relu(Conv_a(s) + Conv_b(s)) into NCHWc Convs, the Add fused as Conv_a's
    Sum input (Conv_b's output); the NCHWc Conv declares MayInplace(3, 0), so Conv_a writes into Conv_b's dying
    buffer. Without that rule the estimate has one 65,536-byte buffer too many (batch 2, 32 x 16 x 16 float32)."""
    from onnx import TensorProto, helper

    channels = 32
    weight = _conv_weights(channels)

    nodes = [helper.make_node("Conv", ["x", "w0"], ["stem"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["stem"], ["s"]),
             helper.make_node("Conv", ["s", "w1"], ["a"]),
             helper.make_node("Conv", ["s", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]),
             helper.make_node("Relu", ["c"], ["d"]),
             helper.make_node("Conv", ["d", "w3"], ["y"])]
    graph = helper.make_graph(
        nodes, "sum_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", channels, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[weight("w0", 3), weight("w1"), weight("w2"), weight("w3")])
    path = tmp_path / "sum_conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    result = validate(path, {"batch": 2}, opt_level="all", runs=2)
    for run in result.runs:
        assert run.activation_difference_bytes == 0, run


def test_nchwc_upsample_output_has_no_batch_name_so_it_takes_no_freed_buffer(tmp_path: Path) -> None:
    """At level all, onnxruntime turns a nearest Resize into an NCHWc Upsample, whose schema (nchwc_schema_defs.cc)
    sets an output dim only where the input dim has a value: the symbolic batch comes out unknown, and so does the
    batch of every tensor computed from it. onnxruntime's planner reuses no freed buffer for those (SameShape
    needs equal values or equal names), so the Conv after the Upsample allocates its own buffer instead of taking
    the stem's, freed two steps before. Keeping the name 'batch' there, the estimate held the stem's 65,536 bytes
    (batch 2, 32 x 16 x 16 float32) from its last read until that Conv, and its peak came out 16,384 bytes high."""
    from onnx import TensorProto, helper

    channels = 32
    weight = _conv_weights(channels)

    nodes = [helper.make_node("Conv", ["x", "w0"], ["stem"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["stem", "w1"], ["a"]),
             helper.make_node("Conv", ["a", "w2"], ["p"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Resize", ["p", "", "scales"], ["u"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Conv", ["u", "w3"], ["c"]),
             helper.make_node("Conv", ["c", "w4"], ["y"])]
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1.0, 1.0, 2.0, 2.0])
    graph = helper.make_graph(
        nodes, "upsample", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", channels, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[weight("w0", 3), weight("w1"), weight("w2", 3), weight("w3"), weight("w4"), scales])
    path = tmp_path / "upsample.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    result = validate(path, {"batch": 2}, opt_level="all", runs=2)
    for run in result.runs:
        assert run.activation_difference_bytes == 0, run
