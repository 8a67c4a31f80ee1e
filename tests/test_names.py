"""PyTorch's names on the recommended export (onnxmem.torch.export_for_training): a --freeze or --train pattern
written from model.named_parameters() or named_modules() reaches what PyTorch's own loop over those names reaches,
on models of benchmarks/training_zoo.py's development half and on a torchvision-like nest (layer4.0.conv2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import onnxmem  # noqa: E402
from onnxmem.training.step import TrainingOptions  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: Any) -> Any:
        return x + self.conv2(torch.relu(self.bn1(self.conv1(x))))


class Nested(torch.nn.Module):
    """A ResNet-like nest: the dynamo exporter's scopes name layer4.0.conv2 as 'layer4/layer4.0/layer4.0.conv2'."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.layer4 = torch.nn.Sequential(Block(), Block())
        self.fc = torch.nn.Linear(4, 10)

    def forward(self, x: Any) -> Any:
        return self.fc(self.layer4(self.stem(x)).mean(dim=(2, 3)))


def _hand_llama() -> Any:
    from benchmarks.training_zoo import HandLlama

    return HandLlama(vocab=100, d=32, layers=2, heads=4, kv_heads=2, hidden=64, seq=16)


MODELS = {
    "nested": (Nested, lambda: (torch.randn(2, 3, 8, 8),)),
    "hand_llama": (_hand_llama, lambda: (torch.randint(0, 100, (2, 16)),)),
}


@pytest.fixture(scope="module", params=list(MODELS))
def exported(request: Any, tmp_path_factory: Any) -> tuple[Any, Path]:
    from onnxmem.torch import export_for_training

    build, inputs = MODELS[request.param]
    torch.manual_seed(0)
    model = build()
    path = tmp_path_factory.mktemp("names") / f"{request.param}.onnx"
    export_for_training(model, inputs(), path, {"batch": 0})
    return model, path


def _train(path: Path, **options: Any) -> onnxmem.Report:
    return onnxmem.analyze(path, {"batch": 2}, training=TrainingOptions(optimizer="sgd", device="cpu", **options))


def _unmatched(report: onnxmem.Report) -> list[str]:
    return [w.message for w in report.warnings if w.code == "unmatched-pattern"]


def test_every_parameter_pattern_from_named_parameters_freezes_that_parameter(exported: tuple[Any, Path]) -> None:
    model, path = exported
    total = sum(p.numel() for p in model.parameters())
    for name, parameter in model.named_parameters():
        report = _train(path, freeze=(name,))
        assert report.training is not None
        assert not _unmatched(report), name
        assert report.training.trainable_parameters == total - parameter.numel(), name


def test_a_train_pattern_from_named_parameters_trains_that_parameter_alone(exported: tuple[Any, Path]) -> None:
    model, path = exported
    name, parameter = list(model.named_parameters())[-1]
    report = _train(path, train=(name,))
    assert report.training is not None
    assert not _unmatched(report)
    assert report.training.trainable_parameters == parameter.numel()


def test_a_module_pattern_from_named_modules_freezes_that_module(exported: tuple[Any, Path]) -> None:
    # `--freeze layer4.0.conv2` (a module's name, as named_modules gives it) freezes what a loop over
    # model.get_submodule('layer4.0.conv2').parameters() freezes
    model, path = exported
    total = sum(p.numel() for p in model.parameters())
    for name, module in model.named_modules():
        if not name or "." not in name or not list(module.parameters(recurse=False)):
            continue
        report = _train(path, freeze=(name,))
        assert report.training is not None
        assert report.training.trainable_parameters == total - sum(p.numel() for p in module.parameters()), name


def test_the_layers_view_names_modules_as_named_modules_does(exported: tuple[Any, Path]) -> None:
    model, path = exported
    modules = {name for name, _ in model.named_modules()}
    report = onnxmem.analyze(path, {"batch": 2})
    assert {row.layer for row in report.inference.by_layer} - {"(top level)"} <= modules
