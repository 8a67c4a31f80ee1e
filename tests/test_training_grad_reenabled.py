"""A module whose forward makes its input require a gradient in train mode (transformers' speech feature encoders:
`hidden_states.requires_grad = True` unless freeze_feature_encoder()) keeps its frozen ops' activations for
backward; onnxmem reads the module's class from the export's scopes and says so (grad-reenabled)."""

from __future__ import annotations

import onnx
import onnx.helper as oh
from onnx import TensorProto

import onnxmem
from onnxmem.training.step import TrainingOptions

from . import graphs

B, C, L = 2, 8, 64
ENCODER = "transformers.models.wav2vec2.modeling_wav2vec2.Wav2Vec2FeatureEncoder"


def speech(encoder_class: str) -> onnx.ModelProto:
    """x [B, 1, L] -> Conv(W, k=1) [B, C, L] -> Relu (both in the feature encoder's scope) -> Transpose ->
    MatMul(P) [B, L, C] (the head)."""
    nodes = [oh.make_node("Conv", ["x", "W"], ["c"], name="/fe/conv/Conv", kernel_shape=[1]),
             oh.make_node("Relu", ["c"], ["r"], name="/fe/Relu"),
             oh.make_node("Transpose", ["r"], ["t"], name="/head/Transpose", perm=[0, 2, 1]),
             oh.make_node("MatMul", ["t", "P"], ["y"], name="/head/MatMul")]
    scopes = [f": pkg.M/feature_extractor: {encoder_class}/conv: torch.nn.modules.conv.Conv1d/conv1d: aten.conv1d",
              f": pkg.M/feature_extractor: {encoder_class}/relu: aten.relu",
              ": pkg.M/head: torch.nn.modules.linear.Linear/t: aten.t",
              ": pkg.M/head: torch.nn.modules.linear.Linear/mm: aten.mm"]
    for node, scope in zip(nodes, scopes, strict=True):
        node.metadata_props.add(key="namespace", value=scope)
    return graphs.model(nodes, [graphs.value("x", [B, 1, L])], [graphs.value("y", [B, L, C])],
                        [graphs.external_header("W", TensorProto.FLOAT, [C, 1, 1]),
                         graphs.external_header("P", TensorProto.FLOAT, [C, C])])


def frozen_encoder(encoder_class: str) -> onnxmem.TrainingReport:
    report = onnxmem.analyze(speech(encoder_class), None, training=TrainingOptions(
        optimizer="sgd", device="cpu", loss="mean", freeze=("feature_extractor.*", "W")))
    assert report.training is not None
    return report


def test_a_feature_encoder_keeps_its_frozen_activations_and_says_why() -> None:
    report = frozen_encoder(ENCODER)
    kept = dict(report.training.saved_by_op_type)  # type: ignore[union-attr]
    assert kept.get("Relu") == B * C * L * 4  # the frozen ReLU keeps its output: its backward now runs
    assert "grad-reenabled" in {w.code for w in report.warnings}


def test_the_same_graph_without_such_a_module_keeps_nothing_in_the_frozen_part() -> None:
    report = frozen_encoder("torch.nn.modules.container.Sequential")
    kept = dict(report.training.saved_by_op_type)  # type: ignore[union-attr]
    assert "Conv" not in kept and "Relu" not in kept
    assert "grad-reenabled" not in {w.code for w in report.warnings}
