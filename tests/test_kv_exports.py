"""A decoder layer as onnxruntime-genai's model builder writes it (packed QKV MatMul, com.microsoft
GroupQueryAttention reading past_key_values.0.key/value and writing present.0.key/value, the attention mask's
lengths computed in the graph), built here with onnx.helper: its KV cache found, its shared past/present buffer
(onnxruntime-genai's past_present_share_buffer) sized, the what-if read from genai_config.json, and both the plain
step and the shared-buffer step checked against onnxruntime CPU's allocator statistics."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxmem
from onnxmem.passes.pipeline import after_sizing, sizing
from onnxmem.plan.kv import kv_what_ifs, shared_buffer_length
from onnxmem.shapes.kvcache import cache_tensors, kv_cache_of, kv_heads, resized_cache, shared_buffer_size

HIDDEN, HEADS, KV_HEADS, HEAD = 64, 4, 2, 16
F = TensorProto.FLOAT


def genai_layer(rotary: bool = False, positions: int = 512) -> onnx.ModelProto:
    """One attention layer in the model builder's form (value_info for the attention's output, as it writes);
    `rotary`: the attention rotates Q and K itself (do_rotary, cos and sin tables of `positions` rows)."""
    rng = numpy.random.default_rng(0)
    qkv_width = (HEADS + 2 * KV_HEADS) * HEAD
    weights = [numpy_helper.from_array((rng.standard_normal((HIDDEN, qkv_width)) * 0.05).astype(numpy.float32),
                                       "qkv.weight"),
               numpy_helper.from_array((rng.standard_normal((HIDDEN, HIDDEN)) * 0.05).astype(numpy.float32),
                                       "o.weight"),
               numpy_helper.from_array(numpy.array([1], numpy.int64), "axis1"),
               numpy_helper.from_array(numpy.array(1, numpy.int64), "one")]
    angles = numpy.outer(numpy.arange(positions), 1.0 / 10000 ** (numpy.arange(HEAD // 2) * 2 / HEAD))
    tables = [numpy_helper.from_array(numpy.cos(angles).astype(numpy.float32), "cos_cache"),
              numpy_helper.from_array(numpy.sin(angles).astype(numpy.float32), "sin_cache")] if rotary else []
    cache = ["batch_size", KV_HEADS, "past_sequence_length", "kv_cache_dim"]
    present = ["batch_size", KV_HEADS, "total_sequence_length", "kv_cache_dim"]
    nodes = [
        helper.make_node("MatMul", ["x", "qkv.weight"], ["qkv"], name="qkv_proj"),
        helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["lengths"], name="lengths", keepdims=0),
        helper.make_node("Sub", ["lengths", "one"], ["last"], name="last"),
        helper.make_node("Cast", ["last"], ["seqlens_k"], name="seqlens_k", to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"], name="mask_shape"),
        helper.make_node("Gather", ["mask_shape", "one"], ["total"], name="total", axis=0),
        helper.make_node("Cast", ["total"], ["total_length"], name="total_length", to=TensorProto.INT32),
        helper.make_node("GroupQueryAttention",
                         ["qkv", "", "", "past_key_values.0.key", "past_key_values.0.value", "seqlens_k",
                          "total_length", *(["cos_cache", "sin_cache"] if rotary else [])],
                         ["attention", "present.0.key", "present.0.value"], name="gqa", domain="com.microsoft",
                         num_heads=HEADS, kv_num_heads=KV_HEADS, scale=HEAD ** -0.5, do_rotary=int(rotary)),
        helper.make_node("MatMul", ["attention", "o.weight"], ["logits"], name="o_proj"),
    ]
    graph = helper.make_graph(
        nodes, "genai_layer",
        [helper.make_tensor_value_info("x", F, ["batch_size", "sequence_length", HIDDEN]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
         helper.make_tensor_value_info("past_key_values.0.key", F, cache),
         helper.make_tensor_value_info("past_key_values.0.value", F, cache)],
        [helper.make_tensor_value_info("logits", F, ["batch_size", "sequence_length", HIDDEN]),
         helper.make_tensor_value_info("present.0.key", F, present),
         helper.make_tensor_value_info("present.0.value", F, present)],
        weights + tables,
        value_info=[helper.make_tensor_value_info("attention", F, ["batch_size", "sequence_length", HIDDEN])])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def step(batch: int, past: int, seq: int, total: int | None = None) -> dict[str, int]:
    return {"batch_size": batch, "sequence_length": seq, "past_sequence_length": past,
            "total_sequence_length": past + seq if total is None else total, "kv_cache_dim": HEAD}


def test_the_attention_ops_cache_is_found_with_its_heads_and_updates_in_place() -> None:
    at = sizing(genai_layer(), step(2, 8, 1), provider="cpu")
    found = cache_tensors(at.graph)
    assert found is not None and found.in_place and found.shared
    assert [at.graph.tensors[t].name for t in found.past] == ["past_key_values.0.key", "past_key_values.0.value"]
    assert sorted(at.graph.tensors[t].name for t in found.present) == ["present.0.key", "present.0.value"]
    assert kv_heads(found, at.graph) == KV_HEADS  # (the value's past too: both pair with the one attention op)
    kv = kv_cache_of(at.graph)
    assert kv is not None and (kv.past_bytes, kv.present_bytes) == (2 * 2 * KV_HEADS * 8 * HEAD * 4,
                                                                     2 * 2 * KV_HEADS * 9 * HEAD * 4)


def test_the_shared_buffer_holds_max_length_positions_and_no_present() -> None:
    at = sizing(genai_layer(), step(3, 5, 1), provider="cpu")
    found = cache_tensors(at.graph)
    assert found is not None
    size = shared_buffer_size(found, at.graph, 40)
    assert size is not None
    resized = resized_cache(at.graph, found, size)
    assert resized is not None
    kv = kv_cache_of(resized)
    assert kv is not None and kv.past_bytes == 2 * 3 * KV_HEADS * 40 * HEAD * 4 and kv.present_bytes == 0
    assert shared_buffer_size(found, at.graph, 6) is not None  # (the step's context, 5 + 1, fits 6 positions)
    assert shared_buffer_size(found, at.graph, 5) is None


def test_a_concat_cache_is_not_updated_in_place() -> None:
    from benchmarks.llm_graphs import SHAPES, make_llama

    at = sizing(make_llama(SHAPES["tiny"]), {"batch": 2, "seq": 1, "past": 8}, provider="cpu")
    found = cache_tensors(at.graph)
    assert found is not None and not found.in_place and shared_buffer_size(found, at.graph, 64) is None


def test_the_genai_config_gives_the_buffer_length(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    assert shared_buffer_length(model) is None  # no genai_config.json
    config = tmp_path / "genai_config.json"
    for written, length in (({"search": {"max_length": 48, "past_present_share_buffer": True}}, 48),
                            ({"model": {"context_length": 256}, "search": {}}, 256),
                            ({"search": {"max_length": 48, "past_present_share_buffer": False}}, None),
                            ({"search": {"max_length": "48"}}, None)):
        config.write_text(json.dumps(written))
        assert shared_buffer_length(model) == length
    config.write_text("{not json")
    assert shared_buffer_length(model) is None


def test_the_what_if_appears_beside_a_genai_config(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    onnx.save(genai_layer(), str(model))
    at = sizing(str(model), step(2, 8, 1), provider="cpu")
    assert not [c for c, _, _ in kv_what_ifs(at) if "one buffer" in c]
    (tmp_path / "genai_config.json").write_text(json.dumps({"search": {"max_length": 64}}))
    at = sizing(str(model), step(2, 8, 1), provider="cpu")
    shared = [(c, s) for c, s, _ in kv_what_ifs(at) if "one buffer" in c]
    assert [c for c, _ in shared] == ["KV cache in one buffer of 64 positions (onnxruntime-genai)"]
    kv = kv_cache_of(shared[0][1].graph)
    assert kv is not None and (kv.past_bytes, kv.present_bytes) == (2 * 2 * KV_HEADS * 64 * HEAD * 4, 0)


def _run_shared(path: Path, tmp: Path, batch: int, seq: int, total: int, max_length: int) -> int:
    """Run one step in onnxruntime CPU as onnxruntime-genai does (each present bound to its past's buffer of
    max_length positions, the logits to a buffer of the caller's) and give its arena's activation peak."""
    ort = pytest.importorskip("onnxruntime")
    from onnxmem.measure.ort_cpu import _baseline, _measure_run, _split_runs, session_options

    options, _ = session_options(ort, "disable", False, tmp, tmp / "optimized.onnx")
    options.enable_cpu_mem_arena = True
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    rng = numpy.random.default_rng(1)
    binding = session.io_binding()
    binding.bind_cpu_input("x", rng.standard_normal((batch, seq, HIDDEN)).astype(numpy.float32))
    binding.bind_cpu_input("attention_mask", numpy.ones((batch, total), numpy.int64))
    for kind in ("key", "value"):
        buffer = ort.OrtValue.ortvalue_from_numpy(numpy.zeros((batch, KV_HEADS, max_length, HEAD), numpy.float32))
        binding.bind_ortvalue_input(f"past_key_values.0.{kind}", buffer)
        binding.bind_ortvalue_output(f"present.0.{kind}", buffer)
    binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(
        numpy.zeros((batch, seq, HIDDEN), numpy.float32)))
    session.run_with_iobinding(binding)
    events = json.loads(Path(session.end_profiling()).read_text())
    run = _split_runs(events, 1)[0]
    return _measure_run(0, run, _baseline(run)).peak_activation_bytes


@pytest.mark.parametrize(("batch", "seq", "total"), [(2, 6, 6), (3, 1, 10)])  # a prefill and a decode step
def test_the_shared_buffer_step_is_what_onnxruntime_allocates(tmp_path: Path, batch: int, seq: int,
                                                              total: int) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(genai_layer(), str(path))
    max_length = 24
    measured = _run_shared(path, tmp_path, batch, seq, total, max_length)
    at = sizing(str(path), step(batch, max_length, seq, total), provider="cpu")
    found = cache_tensors(at.graph)
    assert found is not None
    size = shared_buffer_size(found, at.graph, max_length)
    assert size is not None
    outputs = {o for o in at.graph.outputs if o >= 0}
    bound = resized_cache(at.graph, found, lambda t: 0 if t.index in outputs else size(t),
                          (*found.past, *found.present, *outputs))
    assert bound is not None
    estimated = after_sizing(dataclasses.replace(at, graph=bound)).report.inference
    assert estimated is not None and estimated.peak_activation_bytes == measured
    # (the plain step's estimate counts the presents and the logits the shared step does not allocate)
    plain = after_sizing(at).report.inference
    assert plain is not None and plain.peak_activation_bytes > measured


@pytest.mark.parametrize("past", [4, 17])
def test_the_plain_step_validates_exactly(tmp_path: Path, past: int) -> None:
    pytest.importorskip("onnxruntime")
    path = tmp_path / "model.onnx"
    onnx.save(genai_layer(), str(path))
    result = onnxmem.validate(str(path), step(2, past, 1), provider="cpu")
    assert [run.activation_difference_bytes for run in result.runs] == [0, 0]


@pytest.mark.parametrize(("rotary", "batch", "past", "seq", "grows"),
                         [(True, 1, 1, 1024, True), (False, 1, 1, 1024, False), (True, 8, 300, 1, False)])
def test_the_attention_kernels_scratch_grows_the_arena_as_onnxruntime_does(rotary: bool, batch: int, past: int,
                                                                        seq: int, grows: bool) -> None:
    # GroupQueryAttention's CPU kernel allocates the transposed QKV, its rotated copy and the flash path's buffer
    # from the arena while it runs: the arena grows a region for them where the step's own tensors would not
    pytest.importorskip("onnxruntime")
    import onnxmem.targets.ort.cpu.tables as cpu_tables

    model = genai_layer(rotary, positions=2048)
    dims = step(batch, past, seq)
    result = onnxmem.validate(model, dims, provider="cpu")
    assert [run.estimated.arena_held_bytes - run.measured.arena_held_bytes for run in result.runs] == [0, 0]
    rule = cpu_tables.KERNEL_SCRATCH.pop("com.microsoft::GroupQueryAttention")
    try:
        without = onnxmem.validate(model, dims, provider="cpu")
    finally:
        cpu_tables.KERNEL_SCRATCH["com.microsoft::GroupQueryAttention"] = rule
    # (where the rotated copy of QKV is made, the prefill's scratch takes a region of its own; elsewhere it fits)
    assert (without.runs[0].estimated.arena_held_bytes < result.runs[0].measured.arena_held_bytes) == grows


def test_a_float16_skip_norms_weights_are_held_in_float32() -> None:
    # SkipSimplifiedLayerNormalization's kernel converts its float16 gamma to a float32 copy in the arena when the
    # session is made (the model builder's float16 decoders: one per norm)
    pytest.importorskip("onnxruntime")
    width = 96
    gamma = numpy_helper.from_array(numpy.linspace(0.5, 1.5, width).astype(numpy.float16), "gamma")
    h16 = TensorProto.FLOAT16
    graph = helper.make_graph(
        [helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["y"], name="norm",
                          domain="com.microsoft", epsilon=1e-6)],
        "skip_norm",
        [helper.make_tensor_value_info("x", h16, ["batch", 8, width]),
         helper.make_tensor_value_info("skip", h16, ["batch", 8, width])],
        [helper.make_tensor_value_info("y", h16, ["batch", 8, width])], [gamma])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)], ir_version=10)
    result = onnxmem.validate(model, {"batch": 2}, provider="cpu")
    first = result.runs[0]
    assert first.measured.weights_bytes >= width * 4 and first.weights_difference_bytes == 0


def test_the_genai_config_gives_the_head_size_dim(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from onnxmem.cli.commands import main
    from onnxmem.errors import DimError

    model = tmp_path / "model.onnx"
    onnx.save(genai_layer(), model)
    dims = {"batch_size": 2, "sequence_length": 1, "past_sequence_length": 5}
    with pytest.raises(DimError, match="unbound dims: kv_cache_dim"):  # no genai_config.json: the user binds it
        onnxmem.analyze(model, dims, provider="cpu")
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"head_size": HEAD}}}))
    report = onnxmem.analyze(model, dims, provider="cpu")
    assert report.dims["kv_cache_dim"] == HEAD
    (said,) = [w for w in report.warnings if w.code == "genai-config-dim"]
    assert f"kv_cache_dim={HEAD}" in said.message and "genai_config.json" in said.message
    given = onnxmem.analyze(model, {**dims, "kv_cache_dim": HEAD}, provider="cpu")
    assert "genai-config-dim" not in {w.code for w in given.warnings}
    assert given.inference.peak_bytes == report.inference.peak_bytes
    assert report.inference.kv_cache is not None
    assert report.inference.kv_cache.past_bytes == 2 * 2 * KV_HEADS * 5 * HEAD * 4  # batch 2, key and value
    result = CliRunner().invoke(main, ["fit", str(model), "--provider", "cpu", "--dim", "batch_size=2",
                                       "--dim", "sequence_length=1", "--search", "past_sequence_length",
                                       "--memory", "1MiB", "--format", "json"])
    assert result.exit_code == 0, result.output
    fitted = json.loads(result.output)
    assert fitted["dims"]["kv_cache_dim"] == HEAD
    assert [w["code"] for w in fitted["warnings"]].count("genai-config-dim") == 1
    for bad in ({"model": {"decoder": {"head_size": "16"}}}, {"model": {"decoder": {"head_size": 0}}}, [1, 2]):
        (tmp_path / "genai_config.json").write_text(json.dumps(bad))
        with pytest.raises(DimError, match="unbound dims: kv_cache_dim"):
            onnxmem.analyze(model, dims, provider="cpu")
