"""Ops carry typed facts (ir.graph: Op.provenance, Op.placement) that the provider transform which made them set:
no pass outside targets/ort learns them from a node's name or metadata; and the shape inference runs of a report."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import onnx
import pytest

from onnxmem.ir.graph import HOST, MODEL_NODE, Origin, Placement
from onnxmem.passes.pipeline import analysis
from tests.test_cuda_provider import no_cuda_kernel, shape_subgraph
from tests.test_provider import half_mlp
from tests.test_qdq import shared_dq_model

PACKAGE = Path(__file__).resolve().parent.parent / "onnxmem"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# The names and marks the provider transforms give the nodes they make: theirs alone to read.
TRANSFORM_MARKS = {"INSERTED_CAST_PREFIX", "INLINED_NODE_PREFIX", "INLINED_TENSOR_PREFIX", "inlined_node_rank",
                   "inlined_function_ops", "inserted_cast_count", "MEMCPY_PREFIX", "DUPLICATED_SUFFIX", "HOST_KEY",
                   "HOST_VALUE", "HOST_OUTPUT", "_PLACED_KEY", "already_placed"}
MARK_STRINGS = ("InsertedPrecisionFreeCast", "InlinedFunctionNode_", "onnxmem_Memcpy_", "/duplicated",
                "onnxmem.device")


def test_no_module_outside_targets_ort_reads_the_transforms_names_or_marks() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("targets/ort/"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = {alias.name for alias in node.names} & TRANSFORM_MARKS
            elif isinstance(node, ast.Name | ast.Attribute):
                found = node.id if isinstance(node, ast.Name) else node.attr
                names = {found} & TRANSFORM_MARKS
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = {mark for mark in MARK_STRINGS if mark in node.value}
            else:
                continue
            offenders.extend(f"{relative}:{node.lineno}: {name}" for name in names)  # type: ignore[attr-defined]
    assert not offenders, offenders


def test_schedule_imports_no_provider_transform() -> None:
    tree = ast.parse((PACKAGE / "passes" / "schedule.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(module and module.startswith("onnxmem.targets") for module in imported)


def test_the_cpu_providers_casts_are_inserted_ops() -> None:
    graph = analysis(half_mlp(), {"batch": 2}, provider="cpu").graph
    casts = [op for op in graph.ops if op.op_type == "Cast"]
    # x, w1, w2 cast to float32, and y cast back (test_provider: where onnxruntime puts them)
    assert len(casts) == 4 and all(op.provenance.origin is Origin.INSERTED for op in casts)
    assert all(op.provenance is MODEL_NODE for op in graph.ops if op.op_type != "Cast")
    assert all(op.placement is Placement.DEVICE for op in graph.ops)  # (the CPU provider's device: the CPU)


def test_the_cuda_providers_host_ops_and_copies_carry_their_placement() -> None:
    graph = analysis(no_cuda_kernel(), {"batch": 4}).graph
    by_type = {op.op_type: op for op in graph.ops}
    assert by_type["Celu"].placement is Placement.HOST and by_type["Celu"].provenance is MODEL_NODE
    assert by_type["MemcpyToHost"].placement is Placement.HOST_OUTPUTS
    assert by_type["MemcpyFromHost"].placement is Placement.DEVICE
    assert {by_type[k].provenance.origin for k in ("MemcpyToHost", "MemcpyFromHost")} == {Origin.INSERTED}
    # the outputs of an op off the device are host tensors, whatever the op is called
    for op in graph.ops:
        kinds = {graph.tensors[t].kind == HOST for t in op.outputs if t >= 0}
        assert kinds == {op.placement is not Placement.DEVICE}
    # Shape runs on the device and writes host memory; the shape subgraph after it runs on the host
    shaped = analysis(shape_subgraph(), {"batch": 4}).graph
    placement = {op.name: op.placement for op in shaped.ops}
    assert placement["shape"] is Placement.HOST_OUTPUTS
    assert [placement[n] for n in ("gather", "unsqueeze", "concat")] == [Placement.HOST] * 3
    assert placement["relu"] is placement["reshape"] is Placement.DEVICE


def test_dequantize_duplicates_are_duplicated_ops() -> None:
    graph = analysis(shared_dq_model(), {"batch": 2}, provider="cpu").graph
    duplicated = [op for op in graph.ops if op.provenance.origin is Origin.DUPLICATED]
    assert duplicated and all(op.op_type == "DequantizeLinear" for op in duplicated)
    assert sorted(op.provenance.rank for op in duplicated) == list(range(len(duplicated)))


def test_a_name_alone_makes_no_op_inserted() -> None:
    # a model's own Cast named as onnxruntime names the ones it inserts is the model's
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    node = onnx.helper.make_node("Cast", ["x"], ["y"], name="InsertedPrecisionFreeCast_x", to=1)
    model = onnx.helper.make_model(onnx.helper.make_graph([node], "g", [x], [y]),
                                   opset_imports=[onnx.helper.make_opsetid("", 17)])
    assert analysis(model, {}).graph.ops[0].provenance is MODEL_NODE


def _count_inference(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Count ONNX's shape inference runs (every path reaches its C++ entry point) and onnxruntime's symbolic one."""
    from onnx.onnx_cpp2py_export import shape_inference

    counts: collections.Counter[str] = collections.Counter()
    infer = shape_inference.infer_shapes

    def counted(*args: object, **kwargs: object) -> bytes:
        counts["onnx"] += 1
        return infer(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shape_inference, "infer_shapes", counted)
    return counts


@pytest.mark.parametrize("provider", ["cuda", "cpu"])
@pytest.mark.parametrize("fixture", ["mlp", "cnn_bn_residual", "embedding_model", "swish_mlp", "alias_reshape",
                                     "chain_add", "fanout", "skip", "weights_mlp", "loop_subgraph"])
def test_a_report_runs_shape_inference_once(monkeypatch: pytest.MonkeyPatch, fixture: str, provider: str) -> None:
    # the planner's symbolic types, evaluated at the bound dims, size every tensor: one inference; a model of
    # static shapes (no planner types) is inferred once without data propagation, which finds every size there
    from onnxmem.shapes.dims import input_dims

    path = str(FIXTURES / f"{fixture}.onnx")
    counts = _count_inference(monkeypatch)
    analysis(path, {"batch": 8} if input_dims(onnx.load(path)) else {}, default_dim=16, provider=provider)
    assert counts["onnx"] == 1


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("fixture", ["gpt_decoder", "transformer_encoder"])
def test_a_placed_report_runs_shape_inference_once(monkeypatch: pytest.MonkeyPatch, fixture: str,
                                                   training: bool) -> None:
    # the CUDA placement types the model as given; the placed model (the given one and its Memcpy copies) is typed
    # from that inference (planner.placed_types); the dims the symbolic types leave unnamed (a Reshape to a
    # computed shape, the MatMuls after it) follow from the sizes by the sizing rules; the training step (on the
    # model as given) is sized from the same types
    from onnxmem.training.step import TrainingOptions

    counts = _count_inference(monkeypatch)
    graph = analysis(str(FIXTURES / f"{fixture}.onnx"), {"batch": 8}, default_dim=16,
                     training=TrainingOptions() if training else None).graph
    assert counts["onnx"] == 1
    assert any(op.placement is not Placement.DEVICE for op in graph.ops)  # (placed: some ops on the host)


def _renamed(types: dict[str, tuple[object, ...]]) -> dict[str, tuple[object, ...]]:
    """The types with each 'unk__N' dim renamed by its first appearance (in name order): equal classes of unknown
    dims, whatever numbers ONNX's inference gave them."""
    names: dict[str, str] = {}
    out = {}
    for name in sorted(types):
        dtype, shape, nbytes = types[name]
        if shape is not None:
            shape = tuple(names.setdefault(d, f"u{len(names)}") if isinstance(d, str) and d.startswith("unk__")
                          else d for d in shape)  # type: ignore[attr-defined]
        out[name] = (dtype, shape, nbytes)
    return out


@pytest.mark.parametrize("source", ["no_cuda_kernel", "lstm"])
def test_the_placed_models_types_are_its_inferences(source: str) -> None:
    # the placed model typed from the given model's inference (the transform's) is typed as inferring it would
    from onnxmem.ir.load import load_model
    from onnxmem.targets.ort import execution_provider
    from onnxmem.targets.ort.planner import infer_symbolic, one_inference, placed_types
    from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES

    given = load_model(no_cuda_kernel() if source == "no_cuda_kernel" else str(FIXTURES / "lstm.onnx"))
    with one_inference():
        placed, _ = execution_provider("cuda").runtime_model(given, DEFAULT_INFERENCE_RULES)
        derived = placed_types(given, placed)
    assert placed is not given and placed.facts is not None
    inserted = [origin for origin in placed.facts.provenance.values() if origin.origin is Origin.INSERTED]
    assert bool(inserted) is (source == "no_cuda_kernel")  # (the LSTM's shape nodes on the host: no copy)
    assert derived is not None
    assert _renamed(derived) == _renamed(infer_symbolic(placed.proto))  # type: ignore[arg-type]
    assert placed_types(given, placed) is None  # (outside the scope of one run: nothing kept)


def test_the_training_step_of_a_changed_model_is_sized_from_the_transforms_inference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the CPU provider's float16 Casts make another model (inferred for the report); the training step reads the
    # model as given, sized from the types the transform inferred of it (Sizing.given_types): no more inference
    from onnxmem.training.step import TrainingOptions

    counts = _count_inference(monkeypatch)
    analysis(half_mlp(), {"batch": 2}, provider="cpu")
    report = counts["onnx"]
    trained = analysis(half_mlp(), {"batch": 2}, provider="cpu", training=TrainingOptions())
    assert counts["onnx"] == 2 * report
    assert trained.sizing.given is not None and trained.report.training is not None
