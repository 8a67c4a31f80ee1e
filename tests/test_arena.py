"""onnxruntime's BFC arena, simulated (onnxmem/targets/ort/arena.py): regions, best fit, splitting and coalescing
worked out by hand from bfc_arena.cc, and the first run's held bytes of small graphs."""

from __future__ import annotations

import pytest

from onnxmem.passes.pipeline import analysis
from onnxmem.targets.ort.arena import INITIAL_REGION, BFCArena, first_run_events, held_after, rounded

from . import graphs

MiB = 1 << 20


def test_regions_grow_by_powers_of_two_from_one_mib() -> None:
    arena = BFCArena()
    arena.alloc(100)  # a 1 MiB region (then the next region size doubles: 2 MiB)
    assert arena.regions == [INITIAL_REGION]
    arena.alloc(MiB)  # no free chunk of 1 MiB left: a region of 2 MiB (it needed no doubling: next 4 MiB)
    assert arena.regions == [MiB, 2 * MiB]
    arena.alloc(5 * MiB)  # 4 MiB doubles to 8 MiB to hold it (and stays the next size)
    assert arena.regions == [MiB, 2 * MiB, 8 * MiB]
    arena.alloc(8 * MiB)  # held 8 MiB region is split: 3 MiB left in it; a new region of 8 MiB
    assert arena.regions == [MiB, 2 * MiB, 8 * MiB, 8 * MiB]
    assert arena.held_bytes == 19 * MiB


def test_a_freed_chunk_coalesces_and_is_reused_best_fit() -> None:
    arena = BFCArena()
    a = arena.alloc(300 * 1024)
    b = arena.alloc(300 * 1024)
    arena.free(a)
    arena.free(b)  # a, b and the rest of the region coalesce into one 1 MiB chunk
    assert arena.alloc(MiB) == a and arena.regions == [MiB]


def test_best_fit_takes_the_smallest_chunk_that_holds_the_request() -> None:
    arena = BFCArena()
    small, keep, large, keep2 = (arena.alloc(n) for n in (1024, 256, 4096, 256))
    arena.free(large)
    arena.free(small)
    assert arena.alloc(1000) == small  # 1 KiB holds 1000 B (rounded to 1024): not the 4 KiB chunk
    assert rounded(1000) == 1024 and keep != keep2


def test_reserved_bytes_are_held_at_their_exact_size() -> None:
    assert held_after([], reserved=135_208) == 135_208


def test_a_chain_of_4_mib_tensors_holds_what_onnxruntime_holds() -> None:
    # chain: x -> 4 MiB activations one after another (measured: the arena holds 8 MiB after the first run: two
    # 4 MiB regions, as each tensor is freed once the next one is made)
    analysed = analysis(graphs.chain())
    assert held_after(first_run_events(analysed.graph, analysed.timeline)) == 8 * MiB


def test_validate_reports_the_arenas_held_bytes_as_simulated() -> None:
    # the arena's regions and reserved bytes after each run, measured by onnxruntime's profile and simulated
    import pytest

    pytest.importorskip("onnxruntime")
    from pathlib import Path

    from benchmarks.fixture_dims import dims_for
    from onnxmem.measure.validate import validate

    for name, batch in (("mlp", 8), ("transformer_encoder", 32), ("gpt_decoder", 32)):
        path = Path(__file__).resolve().parent.parent / "fixtures" / f"{name}.onnx"
        result = validate(path, dims_for(path, batch), runs=2)
        assert [r.estimated.arena_held_bytes for r in result.runs] == \
            [r.measured.arena_held_bytes for r in result.runs], name


def _weight(name: str, shape: list[int]) -> object:
    import numpy as np
    from onnx import numpy_helper

    return numpy_helper.from_array(np.full(shape, 0.01, np.float32), name)


def _first_run_held(model: object, dims: dict[str, int] | None = None) -> tuple[int, int]:
    """The arena's held bytes after a first run: measured by onnxruntime, and simulated."""
    import pytest

    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    run = validate(model, dims or {}, runs=1).runs[0]  # type: ignore[arg-type]
    return run.measured.arena_held_bytes, run.estimated.arena_held_bytes


def test_lstm_scratch_grows_the_arena() -> None:
    # LSTM, seq 32, batch 32, input 32, hidden 64, with a bias, Y_h and Y_c not output. Reserved: the packed W
    # [1,256,32] and R [1,256,64] (32 KiB + 64 KiB; the 2 KiB bias is used in place). Y [32,1,32,64] (256 KiB)
    # takes the first 1 MiB region; the kernel's scratch (Y_h and Y_c 8 KiB each, hidden0 and the previous cell
    # 256 B each, three [32,64] states 8 KiB each, the gates [32,32,256] 1 MiB, four fused biases, the sequence
    # lengths) does not fit in its rest: a second region of 2 MiB. Without the scratch the arena would hold 1 MiB
    # and the weights.
    import onnx.helper as oh

    weights = [_weight("w", [1, 256, 32]), _weight("r", [1, 256, 64]), _weight("b", [1, 512])]
    node = oh.make_node("LSTM", ["x", "w", "r", "b"], ["y"], name="lstm", hidden_size=64)
    model = graphs.model([node], [graphs.value("x", [32, 32, 32])], [graphs.value("y", [32, 1, 32, 64])], weights)
    reserved = (256 * 32 + 256 * 64) * 4
    assert _first_run_held(model) == (3 * MiB + reserved, 3 * MiB + reserved)


def test_contrib_attention_scratch_grows_the_arena() -> None:
    # com.microsoft Attention, batch 32, seq 32, hidden 64, 4 heads. Reserved: the packed [64,192] weight (48 KiB;
    # the 768 B bias is used in place). The output (256 KiB) and the Q, K, V projections (768 KiB) fill the first
    # 1 MiB region; the probabilities [32,4,32,32] (512 KiB) take a second region of 2 MiB, which the per-head
    # output (256 KiB) fits in: 3 MiB.
    import onnx.helper as oh

    weights = [_weight("w", [64, 192]), _weight("b", [192])]
    node = oh.make_node("Attention", ["x", "w", "b"], ["y"], name="attention", domain="com.microsoft", num_heads=4)
    model = graphs.model([node], [graphs.value("x", [32, 32, 64])], [graphs.value("y", [32, 32, 64])], weights)
    model.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    reserved = 64 * 192 * 4
    assert _first_run_held(model) == (3 * MiB + reserved, 3 * MiB + reserved)


def test_bias_gelu_temporary_grows_the_arena() -> None:
    # com.microsoft BiasGelu on [3,256,256] (768 KiB): the output takes the first 1 MiB region, the kernel's
    # temporary of the input's size a second one of 2 MiB. The [256] bias (1 KiB) is used in place.
    import onnx.helper as oh

    node = oh.make_node("BiasGelu", ["x", "b"], ["y"], name="gelu", domain="com.microsoft")
    model = graphs.model([node], [graphs.value("x", [3, 256, 256])], [graphs.value("y", [3, 256, 256])],
                         [_weight("b", [256])])
    model.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    assert _first_run_held(model) == (3 * MiB, 3 * MiB)


def test_where_temporaries_grow_the_arena() -> None:
    # Where(x < 0, 0, x) on [100000] float32 (400,000 B): the kernel selects into two temporaries of the output's
    # size (condition ? X : 0 and !condition ? Y : 0, where_op.cc) before it allocates the output, and frees them
    # when it returns. The bool condition (100,000 B) and the two temporaries (800,000 B) take the first 1 MiB
    # region; the output does not fit in its rest: a second region of 2 MiB. Without the temporaries the
    # condition and the output would fit in the first region (1 MiB held). The 4-byte scalar zero is copied into
    # the arena (reserved at its size).
    import onnx.helper as oh

    nodes = [oh.make_node("Less", ["x", "zero"], ["negative"], name="less"),
             oh.make_node("Where", ["negative", "zero", "x"], ["y"], name="where")]
    model = graphs.model(nodes, [graphs.value("x", [100000])], [graphs.value("y", [100000])], [_weight("zero", [])])
    assert _first_run_held(model) == (3 * MiB + 4, 3 * MiB + 4)


def test_conv_transpose_weight_is_packed_inside_a_region() -> None:
    # ConvTranspose packs its [64,64,3,3] weight (144 KiB) with a plain allocation, in the arena's first region
    # (1 MiB), where MatMul reserves its packed weight outside the regions: the arena holds 1 MiB, not 1 MiB + 144 KiB.
    import onnx.helper as oh

    node = oh.make_node("ConvTranspose", ["x", "w"], ["y"], name="up")
    model = graphs.model([node], [graphs.value("x", [1, 64, 4, 4])], [graphs.value("y", [1, 64, 6, 6])],
                         [_weight("w", [64, 64, 3, 3])])
    assert _first_run_held(model) == (MiB, MiB)


def test_external_initializers_stay_out_of_the_arena() -> None:
    # mlp_external keeps every initializer in a data file: onnxruntime loads them outside the arena, even the
    # 40-byte fc4.bias that it would copy into the arena from inside the model (its saved optimized graph, on which
    # the estimate is made, no longer marks them external).
    import pytest

    pytest.importorskip("onnxruntime")
    from pathlib import Path

    from onnxmem.measure.validate import validate

    path = Path(__file__).resolve().parent.parent / "fixtures" / "mlp_external.onnx"
    run = validate(path, {"batch": 1}, runs=1).runs[0]
    assert run.estimated.weights_bytes == run.measured.weights_bytes
    assert run.estimated.arena_held_bytes == run.measured.arena_held_bytes


@pytest.mark.parametrize("weight_type", ["int8", "uint8"])
def test_qlinear_conv_scratch_grows_the_arena(weight_type: str) -> None:
    # QLinearConv on a [1,64,64,64] uint8 image, 64 [3,3] filters, pads 1 (output 256 KiB). int8 weights of zero
    # zero point take MLAS's symmetric conv: the input and output transposed to channels last (256 KiB each) and an
    # indirection buffer of 9 x 4,096 pointers (288 KiB); uint8 weights take the gemm path: an int32 result
    # (1 MiB), the transposes and an im2col buffer [576, 4096] (2.25 MiB). Either way the first 1 MiB region
    # cannot hold it all and the arena grows; the simulation grows it as onnxruntime does.
    import numpy as np
    import onnx.helper as oh
    from onnx import TensorProto, numpy_helper

    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    dtype = np.int8 if weight_type == "int8" else np.uint8
    weights = [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
               numpy_helper.from_array(np.array(128, np.uint8), "z"),
               numpy_helper.from_array(np.array(0, dtype), "wz"),
               numpy_helper.from_array(np.ones((64, 64, 3, 3), dtype), "w")]
    node = oh.make_node("QLinearConv", ["x", "s", "z", "w", "s", "wz", "s", "z"], ["y"], name="conv", pads=[1] * 4)
    model = graphs.model([node], [graphs.value("x", [1, 64, 64, 64], TensorProto.UINT8)],
                         [graphs.value("y", [1, 64, 64, 64], TensorProto.UINT8)], weights)
    run = validate(model, {}, runs=2).runs
    assert [r.estimated.arena_held_bytes for r in run] == [r.measured.arena_held_bytes for r in run]
    assert run[0].measured.arena_held_bytes > MiB + run[0].measured.weights_bytes
