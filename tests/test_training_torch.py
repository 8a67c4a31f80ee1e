"""onnxmem.torch.export_for_training: the train-mode export (BatchNorm and Dropout kept, ATen marks, named dims) that
the training estimate reads without warnings. Skipped where torch is not installed (CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest

import onnxmem
from onnxmem.errors import MissingExtraError
from onnxmem.training import TrainingOptions


def test_without_torch_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from onnxmem.torch import export_for_training

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(MissingExtraError, match=r'pip install "onnxmem\[torch\]"'):
        export_for_training(object(), (), tmp_path / "m.onnx")


def test_export_for_training_keeps_batchnorm_dropout_and_names_the_batch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    from onnxmem.torch import export_for_training

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Dropout(0.1), nn.Linear(8, 10)).eval()
    path = export_for_training(model, (torch.randn(2, 3, 16, 16),), tmp_path / "m.onnx", {"batch": 0})
    assert not model.training  # put back in its own mode
    proto = onnx.load(str(path))
    assert {"BatchNormalization", "Dropout"} <= {n.op_type for n in proto.graph.node}
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    report = onnxmem.analyze(path, {"batch": 8}, training=TrainingOptions(optimizer="sgd", device="cpu"))
    assert report.training is not None and report.training.export_mode == "training"
    assert not {"folded-normalization", "eval-export"} & {w.code for w in report.warnings}
    saved = dict(report.training.saved_by_op_type)
    activation = 8 * 8 * 16 * 16 * 4
    # BatchNorm keeps its input and 2 x 8 statistics; silu (Sigmoid and Mul, marked aten.silu) only its input
    assert saved["BatchNormalization"] == activation + 64
    assert saved["aten::silu"] == activation
