"""Patterns (--train/--freeze) on a weight tied across modules: the export names it by one owner, PyTorch's
named_parameters by the module that registered it first (the embedding, which the forward reads first); the pattern
is matched by named_parameters' name and a pattern that reaches it only by the export's name is warned about."""

from __future__ import annotations

import onnx
import onnx.helper as oh
from onnx import TensorProto

import onnxmem
from onnxmem.training.model import tied_weight_name
from onnxmem.training.step import TrainingOptions

from . import graphs

VOCAB, D = 100, 16


def tied_head() -> onnx.ModelProto:
    """ids [2,8] -> Gather(head.weight) in module wte -> MatMul(proj.weight) -> MatMul(head.weight^T) in module head:
    a GPT-like head tied to its embedding, exported (as the dynamo exporter does) under the head's name."""
    return graphs.model(
        [oh.make_node("Gather", ["head.weight", "ids"], ["e"], name="/wte/Gather"),
         oh.make_node("MatMul", ["e", "proj.weight"], ["h"], name="/proj/MatMul"),
         oh.make_node("Transpose", ["head.weight"], ["wt"], name="/head/Transpose", perm=[1, 0]),
         oh.make_node("MatMul", ["h", "wt"], ["y"], name="/head/MatMul")],
        [graphs.value("ids", [2, 8], TensorProto.INT64)], [graphs.value("y", [2, 8, VOCAB])],
        [graphs.external_header("head.weight", TensorProto.FLOAT, [VOCAB, D]),
         graphs.external_header("proj.weight", TensorProto.FLOAT, [D, D])])


def train(**options: object) -> onnxmem.Report:
    return onnxmem.analyze(tied_head(), None, training=TrainingOptions(optimizer="sgd", device="cpu",
                                                                       **options))  # type: ignore[arg-type]


def test_a_tied_weight_takes_the_name_of_its_first_reader() -> None:
    assert tied_weight_name("head.weight", ["wte", "head"]) == "wte.weight"
    assert tied_weight_name("model.lm_head.weight", ["model.transformer.word_embeddings", "model.lm_head"]) \
        == "model.transformer.word_embeddings.weight"
    assert tied_weight_name("wte.weight", ["wte", "head"]) == "wte.weight"
    assert tied_weight_name("fc.weight", ["fc", "fc"]) == "fc.weight"


def test_a_pattern_on_the_exported_name_of_a_tied_weight_does_not_train_it_and_is_warned() -> None:
    # PyTorch: [n for n, _ in model.named_parameters()] == ['wte.weight', 'proj.weight']: 'head.*' matches nothing
    # there, so a loop setting requires_grad by pattern leaves the tied weight frozen (benchmarks/
    # training_single_ops.py --tied measures it): only proj's gradient, 16 x 16 x 4 bytes.
    report = train(train=("head.*", "proj.*"))
    assert report.training is not None
    assert report.training.gradient_bytes == D * D * 4
    assert "tied-weight-pattern" in {w.code for w in report.warnings}


def test_a_pattern_on_named_parameters_name_trains_the_tied_weight_without_a_warning() -> None:
    report = train(train=("wte.*", "proj.*"))
    assert report.training is not None
    assert report.training.gradient_bytes == (VOCAB * D + D * D) * 4
    assert "tied-weight-pattern" not in {w.code for w in report.warnings}


def test_the_graph_signature_confirms_or_refutes_the_tie() -> None:
    # the dynamo export's graph signature lists a tied weight under each owner's name (Falcon's: both
    # 'model.transformer.word_embeddings.weight' and 'model.lm_head.weight'): the first reader's is one of them
    assert tied_weight_name("head.weight", ["wte", "head"], {"wte.weight", "head.weight"}) == "wte.weight"
    # a first reader's name the signature does not list is no parameter's name: the weight keeps its own
    assert tied_weight_name("head.weight", ["wte", "head"], {"head.weight", "proj.weight"}) == "head.weight"
