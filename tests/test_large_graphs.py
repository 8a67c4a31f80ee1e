"""The large-graph path: LLM-shaped graphs whose weight data must never be read, analysed in one process."""

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
from onnxmem.ir.graph import build_graph
from onnxmem.shapes import sizing as shapes
from onnxmem.shapes.dims import input_dims
from onnxmem.targets.ort import planner

# The 7B model's layer shapes with grouped-query attention (8 KV heads), two layers of them.
SEVEN_B_TWO_LAYERS = LlamaShape(layers=2, hidden=4096, heads=32, kv_heads=8, ffn=11008, vocab=32000)
# Small layers, many of them (about 5,400 nodes).
MANY_LAYERS = LlamaShape(layers=100, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)
DIMS = {"batch": 2, "seq": 16, "past": 3}
ROOT = Path(__file__).resolve().parent.parent


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


def test_the_callers_model_is_left_untouched() -> None:
    # Inference reads a prepared copy of the model (Constant nodes folded, dims named).
    for model in (onnx.load(str(ROOT / "fixtures" / "gpt_decoder.onnx")), make_llama(MANY_LAYERS)):
        before = model.SerializeToString()
        names = [d.name for d in input_dims(model)]
        onnxmem.analyze(model, {name: 3 for name in names})
        assert model.SerializeToString() == before


@pytest.mark.parametrize("kv_heads", [4, 2])  # 2: grouped-query attention, a Reshape(-1) after the Concat
def test_unnamed_dims_of_a_kv_cache_are_sized_by_rule_without_inference(monkeypatch: pytest.MonkeyPatch,
                                                                        kv_heads: int) -> None:
    # ONNX names the Concat of past and new keys 'unk__N' (it adds no symbols); the rule sums the axis, and the
    # attention scores, softmax and context that carry the name are sized with it: nothing is inferred again.
    from onnxmem.ir.graph import build_graph

    model = make_llama(LlamaShape(layers=3, hidden=64, heads=4, kv_heads=kv_heads, ffn=128, vocab=256))
    symbolic = planner.infer_symbolic(model)
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


def test_a_sequence_left_unknown_infers_nothing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.split exported without the optimizer: a SplitToSequence (a sequence has no tensor type, so no
    # inference ever sizes it) read by SequenceAt; at bound dims it is the only unknown, and the whole graph was
    # inferred again for it at every probe of fit (Mixtral-8x7B's gate and up projections: 6 s each)
    from onnx import TensorProto, helper

    nodes = [helper.make_node("SplitToSequence", ["x"], ["parts"], axis=1, keepdims=1),
             helper.make_node("SequenceAt", ["parts", "zero"], ["first"]),
             helper.make_node("Relu", ["first"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [helper.make_tensor("zero", TensorProto.INT64, [], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    symbolic = planner.infer_symbolic(model)
    assert shapes.evaluate_known(symbolic, {"batch": 3})[1] == {"parts"}
    whole = shapes.bind_and_infer(model, {"batch": 3})

    def no_inference(*args: object) -> None:
        raise AssertionError("inferred again")

    monkeypatch.setattr(shapes, "_infer_rest", no_inference)
    monkeypatch.setattr(shapes, "_infer", no_inference)
    fast = shapes.bind_and_infer(model, {"batch": 3}, symbolic=symbolic, graph=build_graph(model))
    assert fast.types == whole.types and fast.types["first"][2] == 12


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


@pytest.mark.parametrize("extra", [[], ["--training"], ["--format", "html"]])
def test_report_imports_no_runtime_plotting_or_torch(extra: list[str]) -> None:
    # Start-up counts on every graph: report loads only what it needs.
    script = ("import sys, runpy; sys.argv = ['onnxmem', *sys.argv[1:]]\n"
              "try:\n    runpy.run_module('onnxmem.cli.commands', run_name='not_main').get('main')()\n"
              "except SystemExit:\n    pass\n"
              "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('onnxruntime', 'matplotlib', 'torch', "
              "'sympy', 'networkx'))\nprint('HEAVY', heavy, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", script, "report", str(ROOT / "fixtures" / "gpt_decoder.onnx"),
                           "--default-dim", "2", *extra], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "HEAVY []" in done.stderr, done.stderr[-2000:]


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


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    found = list(graph.node)
    for node in graph.node:
        for attr in node.attribute:
            found += [n for g in ([attr.g] if attr.HasField("g") else list(attr.graphs)) for n in _all_nodes(g)]
    return found


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "fixtures").glob("*.onnx")))
def test_node_kinds_told_from_the_bytes_miss_nothing(name: str) -> None:
    # NodeKinds searches the file's bytes: where a kind of node is there, it must say so (it may say so wrongly).
    from onnxmem.ir.load import load_model
    from onnxmem.targets.ort.tables import CONTROL_FLOW, PLANNER_MERGES_DIMS, SHAPE_AS

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


def test_node_kinds_of_a_plain_llama_are_exact(tmp_path: Path) -> None:
    from onnxmem.ir.load import load_model

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


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "fixtures").glob("*.onnx")))
def test_the_inference_with_the_graphs_nodes_equals_the_one_from_the_model(name: str) -> None:
    # The planner rounds find their nodes from the caller's graph where the model needed no preparation: the same
    # types as from a model inferred with nothing else known.
    from onnxmem.ir.load import load_model

    path = ROOT / "fixtures" / name
    loaded = load_model(path)
    expected = planner.infer_symbolic(onnx.load(str(path), load_external_data=False))
    for wiring in (None, build_graph(loaded.proto)):
        assert planner.infer_symbolic(loaded.proto, loaded, input_dims(loaded.proto), wiring) == expected


def test_one_process_no_child_is_started(monkeypatch: pytest.MonkeyPatch) -> None:
    # The whole analysis (report, training, fit) runs in the caller's process: a fork or a subprocess fails here.
    import multiprocessing

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process was started")

    monkeypatch.setattr(os, "fork", refused)
    monkeypatch.setattr(subprocess, "Popen", refused)
    monkeypatch.setattr(multiprocessing, "Process", refused)
    model = make_llama(MANY_LAYERS)
    report = onnxmem.analyze(model, DIMS, training=onnxmem.TrainingOptions(optimizer="sgd"))
    assert report.inference.unsized_tensors == 0 and report.training is not None
    fitted = onnxmem.fit(model, memory="64MiB", dims={"seq": 16, "past": 3}, what_if=False)
    assert fitted.max_value > 0


def test_a_model_read_from_a_pipe_is_the_files_model(tmp_path: Path) -> None:
    # `cat m.onnx | onnxmem report /dev/stdin`: the model is read once, from the pipe, and reported as the file is.
    path = save_without_weights(MANY_LAYERS, tmp_path)
    dims = [a for k, v in DIMS.items() for a in ("--dim", f"{k}={v}")]
    from_file = run_cli("report", str(path), *dims, "--format", "json")
    piped = subprocess.run(f"cat '{path}' | '{sys.executable}' -m onnxmem report /dev/stdin "
                           + " ".join(dims) + " --format json", shell=True, capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
    assert from_file.returncode == 0 and piped.returncode == 0, piped.stderr
    expected, got = json.loads(from_file.stdout), json.loads(piped.stdout)
    assert got["inference"]["input_bytes"] > 0 and got["inference"]["peak_activation_bytes"] > 0
    expected["model"] = got["model"]
    # the weight file is next to the model, not next to /dev/stdin: its warning names another folder
    assert {k: v for k, v in got.items() if k != "warnings"} == {k: v for k, v in expected.items() if k != "warnings"}


@pytest.mark.parametrize("name", ["gpt_decoder", "transformer_encoder", "unet", "lstm", "transformer_contrib"])
def test_declared_types_read_from_inference_bytes_equal_the_parsed_model(name: str) -> None:
    # The planner types' fast path reads inference's answer without parsing its nodes back: the same types, in the
    # same order, as the parsed model's graph gives (its initializers and subgraphs apart).
    from onnxmem.ir.tensor_types import TypeDecoder
    from onnxmem.shapes.infer import _collect_types, _inferred, inferred_declared_types

    data = (ROOT / "fixtures" / f"{name}.onnx").read_bytes()
    parsed = _collect_types(_inferred(data, data_prop=False).graph, TypeDecoder(), subgraphs=False,
                            initializers=False)
    fast = inferred_declared_types(data, TypeDecoder())
    assert list(fast.items()) == list(parsed.items())
    assert any(t[2] is None for t in fast.values()) or any(t[2] for t in fast.values())  # (types were decoded)


def test_planner_types_fast_path_equals_the_full_rounds(tmp_path: Path) -> None:
    # A model that takes the fast path (no node holds a graph, no operator needs onnxruntime's inference) gets the
    # planner types the rounds give on the parsed inference.
    from onnxmem.ir.load import load_model

    path = tmp_path / "m.onnx"
    onnx.save(make_llama(MANY_LAYERS, data_file="weights.bin"), str(path))
    loaded = load_model(path)
    free = input_dims(loaded.proto)
    graph = build_graph(loaded.proto, metadata=loaded.nodes is None or loaded.nodes.metadata)
    fast = planner.infer_symbolic(loaded.proto, loaded, free, graph)
    slow = planner.infer_symbolic(loaded.proto, None, free, None)  # (no NodeKinds: the parsed inference)
    assert fast == slow and len(fast) > len(graph.ops)
