"""onnxmem.torch.export_for_training: the train-mode export (BatchNorm and Dropout kept, ATen marks, named dims) that
the training estimate reads without warnings. Skipped where torch is not installed (CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest

import onnxmem
from onnxmem.errors import MissingExtraError
from onnxmem.training.step import TrainingOptions


def test_without_torch_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from onnxmem.torch import export_for_training

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(MissingExtraError, match=r'pip install ".\[torch\]" in a clone of onnxmem'):
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


def test_the_export_says_when_it_starts_and_ends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    from onnxmem.torch import export_for_training

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    heard: list[str] = []
    path = export_for_training(Tiny(), (torch.randn(2, 4),), tmp_path / "a.onnx", progress=heard.append)
    assert len(heard) == 2 and heard[0].startswith("exporting Tiny ")
    assert heard[1].startswith("exported Tiny in ") and heard[1].endswith(f" s: {path}")
    assert capsys.readouterr().err == ""  # a caller's progress replaces the default line on stderr
    export_for_training(Tiny(), (torch.randn(2, 4),), tmp_path / "b.onnx")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 2)[:2] for line in lines] == [["onnxmem:", "exporting"], ["onnxmem:", "exported"]]
    export_for_training(Tiny(), (torch.randn(2, 4),), tmp_path / "c.onnx", progress=None)
    assert capsys.readouterr().err == ""


def test_p0_dropout_in_a_train_mode_export_keeps_nothing(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    from onnxmem.torch import export_for_training

    # nn.Dropout(0.0) in train mode is exported as a copy (aten.clone), like any Dropout of an eval-mode export;
    # F.dropout with p=0 returns its input, so PyTorch keeps no mask
    model = nn.Sequential(nn.Linear(32, 64), nn.Dropout(0.0), nn.GELU(), nn.Linear(64, 10))
    x = torch.randn(4, 32)
    assert nn.functional.dropout(x, 0.0, True) is x
    path = export_for_training(model, (x,), tmp_path / "m.onnx", {"batch": 0})
    report = onnxmem.analyze(path, {"batch": 16}, training=TrainingOptions(optimizer="sgd", device="cpu"))
    assert report.training is not None and report.training.export_mode == "training"
    saved = dict(report.training.saved_by_op_type)
    assert "Dropout" not in saved
    # gelu keeps its input and the last Linear the gelu's output: 16 x 64 floats each, and the loss's log-softmax
    assert report.training.saved_activation_bytes == 2 * 16 * 64 * 4 + 16 * 10 * 4
    assert any("p=0" in note for note in report.training.assumptions)


def test_a_buffer_named_in_the_graph_signature_gets_no_gradient(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    from onnxmem.torch import export_for_training

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(32, 64)
            self.register_buffer("scale", torch.rand(64), persistent=False)  # a buffer: no gradient in PyTorch
            self.head = nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.fc(x) * self.scale)

    path = export_for_training(Scaled(), (torch.randn(2, 32),), tmp_path / "m.onnx", {"batch": 0})
    report = onnxmem.analyze(path, {"batch": 16}, training=TrainingOptions(optimizer="sgd", device="cpu"))
    assert report.training is not None
    assert report.training.trainable_parameters == 32 * 64 + 64 + 64 * 10 + 10
    # mul(h, scale) keeps only scale (h's gradient needs it; scale needs none): h is not kept
    assert report.training.saved_activation_bytes == 16 * 64 * 4 + 16 * 10 * 4


def _head_only_step(model: object, tmp_path: Path) -> tuple[int, int]:
    """Export `model` (32 features in, 10 classes out) for training, train only its `head.` parameters one sgd step
    at batch 64 in PyTorch and in onnxmem: give (measured c10 peak, onnxmem's first-step peak), both above the
    weights and inputs."""
    import torch
    from torch import nn

    from onnxmem.torch import export_for_training

    assert isinstance(model, nn.Module)
    path = export_for_training(model, (torch.randn(2, 32),), tmp_path / "m.onnx", {"batch": 0})
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith("head."))
    x, target = torch.randn(64, 32), torch.randint(0, 10, (64,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        nn.functional.cross_entropy(out, target).backward()
        opt.step()

    from benchmarks.torch_memory import c10_peak

    measured = c10_peak(step)
    # the profiler sees PyTorch's allocator only, not MKL's malloc'd sgemm blocks: leave them out of the estimate
    import dataclasses

    from onnxmem.targets.torch.cpu.tables import CPU_ISAS

    with pytest.MonkeyPatch.context() as patch:
        for isa, rule in list(CPU_ISAS.items()):
            patch.setitem(CPU_ISAS, isa, dataclasses.replace(rule, gemm=dataclasses.replace(
                rule.gemm, first_use=0, block=0, element_bytes=())))
        report = onnxmem.analyze(path, {"batch": 64}, training=TrainingOptions(
            optimizer="sgd", device="cpu", loss="cross_entropy", train=("head.*",)))
    training = report.training
    assert training is not None
    return measured, training.first_step.peak_bytes - training.weights_bytes - training.input_bytes


def test_a_frozen_backbone_holds_module_arguments_until_the_call_returns(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch import nn


    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(x)))  # x, an argument, lives until the block returns

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.block, self.head = nn.Linear(32, 64), Block(), nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.block(self.stem(x)))

    torch.manual_seed(0)
    measured, estimate = _head_only_step(Net(), tmp_path)
    assert abs(estimate - measured) <= 0.01 * measured, (estimate, measured)


def test_a_module_called_twice_holds_each_call_s_argument_only_through_that_call(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch import nn


    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.head = nn.Linear(32, 512), nn.Linear(512, 512), nn.Linear(512, 10)
            self.act = nn.ReLU()  # one module, called twice: one scope in the export

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # a(x) is released when the first call of act returns, not held through the second (no local names:
            # a local of the caller's frame lives until it is reassigned, which the graph does not show)
            return self.head(self.act(self.b(self.act(self.a(x)))))

    torch.manual_seed(0)
    measured, estimate = _head_only_step(Net(), tmp_path)
    # the forward peak: two 64 x 512 tensors at once (the call's argument and its result), never three
    assert measured == 2 * 64 * 512 * 4
    assert abs(estimate - measured) <= 0.01 * measured, (estimate, measured)
