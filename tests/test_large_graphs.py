"""The large-graph path: LLM-shaped graphs whose weight data must never be read, and the child process that
runs onnx's shape inference while the graph is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

import onnxmem
from benchmarks.llm_graphs import LlamaShape, make_llama
from onnxmem import child, shapes
from onnxmem.graph import build_graph

# The 7B model's layer shapes with grouped-query attention (8 KV heads), two layers of them.
SEVEN_B_TWO_LAYERS = LlamaShape(layers=2, hidden=4096, heads=32, kv_heads=8, ffn=11008, vocab=32000)
# Small layers, enough of them (about 5,400 nodes) that onnx's inference runs in a child process.
MANY_LAYERS = LlamaShape(layers=100, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)
DIMS = {"batch": 2, "seq": 16, "past": 3}
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def forks_here(monkeypatch: pytest.MonkeyPatch) -> None:
    # Other tests load onnxruntime into this process, where ChildJob then declines to fork (see the test of
    # that below); these tests are about the child itself.
    monkeypatch.setattr(child, "_native_threads", lambda: False)


def parameters(s: LlamaShape) -> int:
    head_dim = s.hidden // s.heads
    kv = s.kv_heads * head_dim
    layer = 2 * s.hidden + 2 * s.hidden * s.hidden + 2 * s.hidden * kv + 3 * s.hidden * s.ffn
    return s.vocab * s.hidden + s.layers * layer + s.hidden + s.hidden * s.vocab + 2  # + eps and scale


def save_without_weights(shape: LlamaShape, folder: Path, weights: str = "absent") -> Path:
    """Save the model; its weight file is absent, or a FIFO that blocks whoever opens it for reading."""
    path = folder / "model.onnx"
    onnx.save(make_llama(shape, data_file="weights.bin"), str(path))
    if weights == "fifo":
        os.mkfifo(folder / "weights.bin")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    # A reader of the FIFO would block forever: the timeout turns that into a failure.
    return subprocess.run([sys.executable, "-m", "onnxmem", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


@pytest.mark.parametrize("weights", ["absent", "fifo"])
def test_seven_b_layers_are_sized_from_headers_without_reading_weights(tmp_path: Path, weights: str) -> None:
    model = save_without_weights(SEVEN_B_TWO_LAYERS, tmp_path, weights)
    dims = [a for k, v in DIMS.items() for a in ("--dim", f"{k}={v}")]
    done = run_cli("report", str(model), *dims, "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["inference"]["weights_by_dtype"]["FLOAT16"] == 2 * parameters(SEVEN_B_TWO_LAYERS)
    assert data["inference"]["unsized_tensors"] == 0
    assert any(w["code"] == "missing-external-data" for w in data["warnings"])


def test_many_layers_through_the_child_process_equal_the_analysis_in_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = save_without_weights(MANY_LAYERS, tmp_path, "fifo")
    assert len(onnx.load(str(model), load_external_data=False).graph.node) >= child.FORK_FROM_NODES
    done = run_cli("report", str(model), *[a for k, v in DIMS.items() for a in ("--dim", f"{k}={v}")],
                   "--format", "json")
    assert done.returncode == 0, done.stderr
    assert model.stat().st_size >= child.FORK_FROM_BYTES  # the inference started before loading forks too
    forked = onnxmem.analyze(model, DIMS)
    monkeypatch.setattr(child, "FORK_FROM_NODES", 10**9)  # the same analysis, inference in this process
    monkeypatch.setattr(child, "FORK_FROM_BYTES", 10**12)
    here = onnxmem.analyze(model, DIMS)
    assert forked.inference == here.inference
    assert forked.inference.weights_by_dtype["FLOAT16"] == 2 * parameters(MANY_LAYERS)
    assert forked.inference.peak_activation_bytes > 0 and forked.inference.unsized_tensors == 0


def test_symbolic_types_from_the_child_equal_those_inferred_here(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_llama(LlamaShape(layers=3, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256))
    monkeypatch.setattr(child, "FORK_FROM_NODES", 0)
    inference = shapes.start_infer_symbolic(model)
    assert inference._job._pid is not None  # a child runs it
    forked = inference.result()
    monkeypatch.setattr(child, "FORK_FROM_NODES", 10**9)
    inference = shapes.start_infer_symbolic(model)
    assert inference._job._pid is None
    assert inference.result() == forked
    assert any(isinstance(d, str) and not d.startswith("unk__") for _, shape, _ in forked.values() if shape
               for d in shape)  # symbolic names survive the trip through the pipe


def test_child_job_gives_the_childs_result() -> None:
    parent = os.getpid()
    job = child.ChildJob(lambda in_child: (os.getpid(), in_child, b"x" * 1_000_000))  # more than a pipe holds
    pid, in_child, data = job.result()
    assert data == b"x" * 1_000_000 and pid != parent and in_child is True


def test_a_failing_child_leaves_the_work_to_the_caller() -> None:
    parent = os.getpid()

    def work(in_child: bool) -> bytes:
        if os.getpid() != parent:
            raise RuntimeError("fails in the child only")
        assert not in_child
        return b"done here"

    assert child.ChildJob(work).result() == b"done here"

    def always_fails(in_child: bool) -> bytes:
        raise ValueError("bad model")

    with pytest.raises(ValueError, match="bad model"):  # the error surfaces in the caller, as without a child
        child.ChildJob(always_fails).result()


def test_a_cancelled_child_is_gone() -> None:
    import time

    job = child.ChildJob(lambda in_child: time.sleep(60) or b"")
    pid = job._pid
    assert pid is not None
    job.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped: no such child any more


def test_no_child_where_the_process_has_threads() -> None:
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        job = child.ChildJob(lambda in_child: b"child" if in_child else b"here")
        assert job._pid is None and job.result() == b"here"
    finally:
        stop.set()
        thread.join()


def test_no_child_where_a_library_with_thread_pools_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # the real check
    monkeypatch.setitem(sys.modules, "onnxruntime", sys)  # loaded (any module object stands for it)
    job = child.ChildJob(lambda in_child: b"child" if in_child else b"here")
    assert job._pid is None and job.result() == b"here"


@pytest.mark.parametrize("fork_from", [0, 10**9])
def test_the_callers_model_is_left_untouched(monkeypatch: pytest.MonkeyPatch, fork_from: int) -> None:
    # Inference reads a prepared model (Constant nodes folded, dims named): a copy, or the child's own.
    monkeypatch.setattr(child, "FORK_FROM_NODES", fork_from)
    for model in (onnx.load(str(ROOT / "fixtures" / "gpt_decoder.onnx")), make_llama(MANY_LAYERS)):
        before = model.SerializeToString()
        names = [d.name for d in shapes.input_dims(model)]
        onnxmem.analyze(model, {name: 3 for name in names})
        assert model.SerializeToString() == before


@pytest.mark.parametrize("kv_heads", [4, 2])  # 2: grouped-query attention, a Reshape(-1) after the Concat
def test_unnamed_dims_of_a_kv_cache_are_sized_by_rule_without_inference(monkeypatch: pytest.MonkeyPatch,
                                                                        kv_heads: int) -> None:
    # ONNX names the Concat of past and new keys 'unk__N' (it adds no symbols); the rule sums the axis, and the
    # attention scores, softmax and context that carry the name are sized with it: nothing is inferred again.
    from onnxmem.graph import build_graph

    model = make_llama(LlamaShape(layers=3, hidden=64, heads=4, kv_heads=kv_heads, ffn=128, vocab=256))
    symbolic = shapes.infer_symbolic(model)
    _, unknown = shapes.evaluate_known(symbolic, DIMS)
    assert len(unknown) >= 3 * 5  # per layer: the two Concats and what carries their dims
    whole = shapes.bind_and_infer(model, DIMS)

    def no_inference(*args: object) -> None:
        raise AssertionError("inferred again")

    monkeypatch.setattr(shapes, "_infer_rest", no_inference)
    fast = shapes.bind_and_infer(model, DIMS, symbolic=symbolic, graph=build_graph(model))
    assert fast.types == {name: t for name, t in whole.types.items() if name in fast.types}
    present = [v.name for v in model.graph.output][1:]  # the KV cache's Concats, after the logits
    assert len(present) == 6 and all(fast.types[name][1][2] == DIMS["past"] + DIMS["seq"] for name in present)


@pytest.mark.parametrize(("rule", "rank", "inputs", "axis", "sizes"), [
    ("concat", 4, [(2, 2, 3, 16), (2, 2, 16, 16)], 2, [2, 2, 19, 16]),
    ("concat", 2, [(2, 3), (2, "unk__1")], 1, [2, None]),  # an input dim not known: no size
    ("broadcast", 4, [(2, 4, 16, 19), (2, 1, 16, 19)], 0, [2, 4, 16, 19]),
    ("broadcast", 3, [(5, 1, 7), (3, 1)], 0, [5, 3, 7]),  # aligned on the last dims
    ("broadcast", 2, [(4, 3), (5, 3)], 0, [None, 3]),  # 4 and 5 do not broadcast
])
def test_dims_by_rule(rule: str, rank: int, inputs: list[tuple[object, ...]], axis: int,
                      sizes: list[int | None]) -> None:
    assert shapes._dims_by_rule(rule, rank, inputs, axis) == sizes  # type: ignore[arg-type]


def test_inference_reads_the_models_own_file_where_it_needs_no_preparation(tmp_path: Path) -> None:
    from onnxmem.load import load_model

    llama = load_model(save_without_weights(MANY_LAYERS, tmp_path))
    as_is = shapes.start_infer_symbolic(llama.proto, llama)
    assert as_is._file == llama.path  # no Constant node, no fused operator, every dim named
    assert as_is.result() == shapes.start_infer_symbolic(llama.proto).result()
    decoder = load_model(ROOT / "fixtures" / "gpt_decoder.onnx")  # Constant nodes: inference reads a prepared copy
    assert decoder.nodes is not None and decoder.nodes.prepared
    assert shapes.start_infer_symbolic(decoder.proto, decoder)._file is None


@pytest.mark.parametrize("extra", [[], ["--training"], ["--format", "html"]])
def test_report_imports_no_runtime_plotting_or_torch(extra: list[str]) -> None:
    # Start-up counts on every graph: report loads only what it needs (and a loaded onnxruntime would also stop
    # the inference child, see ChildJob).
    script = ("import sys, runpy; sys.argv = ['onnxmem', *sys.argv[1:]]\n"
              "try:\n    runpy.run_module('onnxmem.cli', run_name='not_main').get('main')()\n"
              "except SystemExit:\n    pass\n"
              "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('onnxruntime', 'matplotlib', 'torch', "
              "'sympy', 'networkx'))\nprint('HEAVY', heavy, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", script, "report", str(ROOT / "fixtures" / "gpt_decoder.onnx"),
                           "--default-dim", "2", *extra], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "HEAVY []" in done.stderr, done.stderr[-2000:]


def test_a_model_file_gone_or_changed_after_loading_is_inferred_from_memory(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxmem.load import load_model

    path = save_without_weights(MANY_LAYERS, tmp_path)
    llama = load_model(path)
    expected = shapes.start_infer_symbolic(llama.proto).result()
    for fork_from in (10**9, 0):  # here (the file is read at result()) and in a child (which may read it first)
        monkeypatch.setattr(child, "FORK_FROM_NODES", fork_from)
        llama = load_model(path)
        inference = shapes.start_infer_symbolic(llama.proto, llama)
        assert inference._file == path
        path.unlink()  # removed after the inference chose to read it
        assert inference.result() == expected
        onnx.save(llama.proto, str(path))
    assert shapes.start_infer_symbolic(llama.proto, llama)._file is None  # rewritten since it was loaded
    changed = load_model(path)
    path.write_bytes(path.read_bytes() + b"\x00")  # changed after loading, before the inference starts
    assert shapes.start_infer_symbolic(changed.proto, changed)._file is None


@pytest.mark.parametrize(("shape", "target", "allowzero", "dims"), [
    ((2, 2, 2, 19, 16), [0, 4, -1, 16], 0, [2, 4, 19, 16]),  # 0 copies, -1 takes the rest (GQA's repeat)
    ((2, 3), [0, -1], 1, [0, None]),  # allowzero: 0 is a size; 6 elements do not fill a 0-sized dim
    ((2, "unk__1"), [-1], 0, [None]),  # an input dim not known: no size
    ((4, 6), [5, -1], 0, [5, None]),  # 24 is no multiple of 5
])
def test_reshaped(shape: tuple[object, ...], target: list[int], allowzero: int, dims: list[int | None]) -> None:
    assert shapes._reshaped(shape, target, allowzero, len(target)) == dims  # type: ignore[arg-type]



def _with_a_constant_node(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with the first layer's residual Add reading its input plus a Constant zero (values unchanged)."""
    from onnx import helper

    add = next(n for n in model.graph.node if n.op_type == "Add")
    zero = helper.make_node("Constant", [], ["zero_constant"], value=helper.make_tensor("z", onnx.TensorProto.FLOAT16,
                                                                                      [1], [0.0]))
    plus = helper.make_node("Add", [add.output[0], "zero_constant"], ["plus_zero"])
    position = list(model.graph.node).index(add)
    for node in model.graph.node:
        node.input[:] = ["plus_zero" if i == add.output[0] else i for i in node.input]
    model.graph.node.insert(position + 1, zero)
    model.graph.node.insert(position + 2, plus)
    return model


@pytest.mark.parametrize("variant", ["as it is", "a Constant node", "an unnamed input dim"])
@pytest.mark.parametrize("fork_from", [0, 10**12])
def test_inference_started_before_loading_equals_the_one_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               variant: str, fork_from: int) -> None:
    # start_infer_file reads the file before the caller parses it: as it is where it needs no preparation (no
    # Constant, no fused operator: told from its bytes; its dims named: told from the inferred inputs), else
    # loaded the caller's way. Either way, in a child or here, the types are those of the loaded model's.
    from onnxmem.load import load_model

    monkeypatch.setattr(child, "FORK_FROM_BYTES", fork_from)
    model = make_llama(LlamaShape(layers=3, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256))
    if variant == "a Constant node":
        model = _with_a_constant_node(model)
    elif variant == "an unnamed input dim":
        model.graph.input[0].type.tensor_type.shape.dim[0].ClearField("dim_param")
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    for wiring in (False, True):  # the nodes the planner rounds read: from the model, or from its graph
        with shapes.start_infer_file(path) as started:
            assert (started._job._pid is not None) == (fork_from == 0)
            loaded = load_model(path)
            free = shapes.input_dims(loaded.proto)
            early = started.for_model(loaded, free).result(build_graph(loaded.proto) if wiring else None)
        assert early == shapes.start_infer_symbolic(loaded.proto, loaded, free).result()
    assert early == shapes.start_infer_symbolic(onnx.load(str(path), load_external_data=False)).result()  # no file
    if variant == "a Constant node":  # folded into an initializer for inference, as onnxruntime does
        residual = next(n for n in model.graph.node if n.output[0] == "plus_zero").input[0]
        assert early["zero_constant"][1] == (1,) and early["plus_zero"] == early[residual]


def test_the_file_read_before_loading_is_not_used_where_it_changed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The child read the file as it was before it was replaced: its size and time differ from the loaded one's.
    from onnxmem.load import load_model

    monkeypatch.setattr(child, "FORK_FROM_BYTES", 0)
    before, path = tmp_path / "before.onnx", tmp_path / "model.onnx"
    onnx.save(make_llama(LlamaShape(layers=1, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)), str(before))
    larger = make_llama(LlamaShape(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256))
    onnx.save(larger, str(path))
    read_before = shapes._file_inferred
    monkeypatch.setattr(shapes, "_file_inferred", lambda _: read_before(before))
    with shapes.start_infer_file(path) as started:
        assert started._job._pid is not None
        loaded = load_model(path)
        types = started.for_model(loaded, shapes.input_dims(loaded.proto)).result()
    assert types == shapes.start_infer_symbolic(larger).result()
    assert any(name.startswith("/layers.1/") for name in types)


def test_an_inference_started_for_a_model_without_symbolic_dims_is_stopped(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from onnx import helper

    monkeypatch.setattr(child, "FORK_FROM_BYTES", 0)
    started: list[shapes.FileInference] = []
    original = shapes.start_infer_file

    def recording(path: str) -> shapes.FileInference:
        started.append(original(path))
        assert started[-1]._job._pid is not None
        return started[-1]

    monkeypatch.setattr(importlib.import_module("onnxmem.analyze"), "start_infer_file", recording)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 8])
    static = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["h"]),
                                                  helper.make_node("Relu", ["h"], ["y"])], "static", [x], [y]))
    onnx.save(static, str(tmp_path / "static.onnx"))
    report = onnxmem.analyze(tmp_path / "static.onnx")
    assert report.inference.peak_activation_bytes == 2 * 4 * 8 * 4  # h and y live while the second Relu runs
    assert len(started) == 1 and started[0]._job._pid is None  # its child was stopped and reaped


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    found = list(graph.node)
    for node in graph.node:
        for attr in node.attribute:
            found += [n for g in ([attr.g] if attr.HasField("g") else list(attr.graphs)) for n in _all_nodes(g)]
    return found


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "fixtures").glob("*.onnx")))
def test_node_kinds_told_from_the_bytes_miss_nothing(name: str) -> None:
    # NodeKinds searches the file's bytes: where a kind of node is there, it must say so (it may say so wrongly).
    from onnxmem.load import load_model
    from onnxmem.rules.inference import CONTROL_FLOW, PLANNER_MERGES_DIMS, SHAPE_AS

    loaded = load_model(ROOT / "fixtures" / name)
    assert loaded.nodes is not None
    nodes = _all_nodes(loaded.proto.graph)
    kinds = {(n.domain, n.op_type) for n in nodes}
    other = any(d not in ("", "ai.onnx") for d, _ in kinds)
    assert loaded.nodes.prepared >= any(op == "Constant" or f"{d}::{op}" in SHAPE_AS for d, op in kinds)
    assert loaded.nodes.graphs >= (other or any(op in CONTROL_FLOW for _, op in kinds))
    assert loaded.nodes.merges >= (other or any(op in PLANNER_MERGES_DIMS for _, op in kinds))
    assert loaded.nodes.metadata >= any(p.key.startswith("pkg.torch.onnx") or p.key == "namespace"
                                        for n in nodes for p in n.metadata_props)


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "fixtures").glob("*.onnx")))
def test_the_early_inference_of_every_fixture_equals_the_one_from_the_model(name: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Every path the file's inference takes (read as it is, the rounds left to the caller and their nodes found
    # from its graph or from the model; loaded and prepared: Constant nodes, subgraphs; contrib operators: the
    # rounds in the child) gives the types the model gives, inferred in this process with no file.
    from onnxmem.load import load_model

    monkeypatch.setattr(child, "FORK_FROM_BYTES", 0)
    path = ROOT / "fixtures" / name
    loaded = load_model(path)
    expected = shapes.infer_symbolic(onnx.load(str(path), load_external_data=False))
    for wiring in (None, build_graph(loaded.proto)):
        with shapes.start_infer_file(path) as started:
            types = started.for_model(loaded, shapes.input_dims(loaded.proto)).result(wiring)
        assert types == expected


def test_node_kinds_of_a_plain_llama_are_exact(tmp_path: Path) -> None:
    from onnxmem.load import load_model

    nodes = load_model(save_without_weights(MANY_LAYERS, tmp_path)).nodes
    assert nodes is not None and (nodes.prepared, nodes.graphs, nodes.merges, nodes.metadata) == \
        (False, False, True, False)  # Concat: the KV cache


def test_layers_named_by_node_metadata_in_a_file(tmp_path: Path) -> None:
    # The file's bytes show the metadata, so the graph reads it: layers come from the exporter's name scopes.
    from onnx import helper

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 8])
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu_a"), helper.make_node("Relu", ["h"], ["y"], name="b")]
    for node, scope in zip(nodes, ["encoder.block0", "encoder.block1"], strict=True):
        entry = node.metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.name_scopes", scope
    onnx.save(helper.make_model(helper.make_graph(nodes, "scoped", [x], [y])), str(tmp_path / "scoped.onnx"))
    report = onnxmem.analyze(tmp_path / "scoped.onnx", {"batch": 2})
    assert [row.layer for row in report.inference.by_layer] == ["encoder.block0", "encoder.block1"]


def test_a_concat_of_an_initializer_is_merged_alike_from_the_file(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The child leaves the model's initializers to the caller (LoadedModel.weights) but for those a Concat reads:
    # the planner's merge of its dims reads their types.
    from onnx import helper

    from onnxmem.load import load_model

    monkeypatch.setattr(child, "FORK_FROM_BYTES", 0)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "width"])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    table = helper.make_tensor("table", onnx.TensorProto.FLOAT, [3, 8], [0.0] * 24)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]),
                               helper.make_node("Concat", ["table", "h"], ["y"], axis=0)], "cat", [x], [y], [table])
    onnx.save(helper.make_model(graph), str(tmp_path / "cat.onnx"))
    for wiring in (False, True):
        with shapes.start_infer_file(tmp_path / "cat.onnx") as started:
            loaded = load_model(tmp_path / "cat.onnx")
            free = shapes.input_dims(loaded.proto)
            early = started.for_model(loaded, free).result(build_graph(loaded.proto) if wiring else None)
        assert early == shapes.start_infer_symbolic(loaded.proto).result()
        assert early["table"] == (onnx.TensorProto.FLOAT, (3, 8), 96)


def test_a_file_too_large_to_read_whole_is_inferred_once_loaded(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Embedded weights: a child started before loading would parse the file a second time, so none is started
    # then; the inference starts from the loaded model (in a child of its own where the graph is large).
    from onnxmem.load import load_model

    monkeypatch.setattr(child, "FORK_FROM_BYTES", 0)
    monkeypatch.setattr(shapes, "_EMBEDDED_BYTES_TO_COPY", 1000)
    path = save_without_weights(LlamaShape(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256), tmp_path)
    with shapes.start_infer_file(path) as started:
        assert started._job is None
        loaded = load_model(path)
        free = shapes.input_dims(loaded.proto)
        types = started.for_model(loaded, free).result()
    assert types == shapes.start_infer_symbolic(loaded.proto, loaded, free).result()


def test_fit_starts_the_inference_before_loading_and_stops_it(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    path = save_without_weights(MANY_LAYERS, tmp_path)
    started: list[shapes.FileInference] = []
    original = shapes.start_infer_file

    def recording(model: str) -> shapes.FileInference:
        started.append(original(model))
        return started[-1]

    monkeypatch.setattr(importlib.import_module("onnxmem.analyze"), "start_infer_file", recording)
    forked = onnxmem.fit(path, memory="80GiB", dims={"seq": 16, "past": 3})
    assert len(started) == 1 and started[0]._job is not None and started[0]._job._pid is None  # taken, reaped
    monkeypatch.setattr(child, "FORK_FROM_NODES", 10**9)  # the same search, inference in this process
    monkeypatch.setattr(child, "FORK_FROM_BYTES", 10**12)
    here = onnxmem.fit(path, memory="80GiB", dims={"seq": 16, "past": 3})
    assert forked == here and forked.max_value > 0


def test_a_childs_result_keeps_its_types() -> None:
    # Builtins travel by marshal (fast), anything else by pickle: a subclass of a builtin must not come back as
    # its base class.
    point = shapes.InputDim("batch", "x", 0)  # a NamedTuple
    for value in ({"t": (1, ("batch", 3), None)}, point, {"dims": [point]}, child.ChildJob):
        result = child.ChildJob(lambda in_child, v=value: (v, in_child)).result()
        assert result == (value, True)
        assert type(result[0]) is type(value)
    assert type(child.ChildJob(lambda _: {"dims": [point]}).result()["dims"][0]) is shapes.InputDim


def test_a_large_graph_in_a_small_file_is_inferred_in_a_child_once_loaded(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # No child before loading (the file is under FORK_FROM_BYTES); the graph has FORK_FROM_NODES nodes or more, so
    # the inference from the loaded model still runs in a child.
    from onnxmem.load import load_model

    monkeypatch.setattr(child, "FORK_FROM_BYTES", 10**12)
    path = save_without_weights(MANY_LAYERS, tmp_path)
    with shapes.start_infer_file(path) as started:
        assert started._job is not None and not started._job.forked
        loaded = load_model(path)
        free = shapes.input_dims(loaded.proto)
        started.for_model(loaded, free)
        assert started._late is not None and started._late._job.forked
        types = started.result()
    assert types == shapes.start_infer_symbolic(loaded.proto, loaded, free).result()
