"""aten.clone is a copy: the dynamo exporter writes `.contiguous()` of a transposed tensor (an attention's merged
heads), `.clone()` and `.reshape()` of a strided one as an Identity node marked aten.clone, and PyTorch makes a new
storage for it, which the next Linear keeps beside the tensor it was copied from (training/model.py _is_copy;
benchmarks/training_single_ops.py --clone). In a Dropout module the clone stands for F.dropout(p=0), which returns
its input: a view."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

import onnxmem
from onnxmem.targets.torch import TorchCpu
from onnxmem.training.rules import EXPORT_MODE_PROPERTY
from onnxmem.training.step import TrainingOptions

BATCH, TOKENS, WIDTH = 8, 32, 64


def _model(scope: str) -> onnx.ModelProto:
    """x @ W1 -> Tanh (keeps its output) -> Transpose -> Identity (aten.clone, in module `scope`) -> @ W2."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="a"),
        helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
        helper.make_node("Transpose", ["t"], ["tt"], name="transpose", perm=[0, 2, 1]),
        helper.make_node("Identity", ["tt"], ["c"], name="clone"),
        helper.make_node("MatMul", ["c", "w2"], ["y"], name="b"),
    ]
    for key, value in (("namespace", f": M/{scope}/clone: aten.clone.default"),
                       ("pkg.torch.onnx.fx_node", "%clone : [num_users=1] = call_function[target=torch.ops.aten."
                                                  "clone.default](args = (%transpose,), kwargs = {})")):
        prop = nodes[3].metadata_props.add()
        prop.key, prop.value = key, value
    graph = helper.make_graph(nodes, "clone", [helper.make_tensor_value_info("x", f, [BATCH, TOKENS, WIDTH])],
                              [helper.make_tensor_value_info("y", f, [BATCH, WIDTH, 16])], [
        helper.make_tensor("w1", f, [WIDTH, WIDTH], [0.0] * WIDTH * WIDTH),
        helper.make_tensor("w2", f, [TOKENS, 16], [0.0] * TOKENS * 16),
    ])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, {EXPORT_MODE_PROPERTY: "training"})  # (a train-mode export: no eval Dropout)
    return model


def _saved(scope: str) -> int:
    report = onnxmem.analyze(_model(scope), training=TrainingOptions(
        optimizer="sgd", device=TorchCpu(threads=1, isa="avx2"), loss="mean"))
    assert report.training is not None
    return report.training.saved_activation_bytes


def test_a_clone_is_a_new_storage_kept_beside_its_source() -> None:
    activation = 4 * BATCH * TOKENS * WIDTH
    copied = _saved("attn: pkg.Attention")
    dropped = _saved("drop: torch.nn.modules.dropout.Dropout")
    # Tanh keeps its output; the second MatMul keeps the clone: a copy of it, or (F.dropout(p=0)) the output itself
    assert copied - dropped == activation
    assert dropped >= activation
