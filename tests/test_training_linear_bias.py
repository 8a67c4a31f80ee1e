"""A Linear with a bias on 3-D input: PyTorch runs one addmm on the flattened view (one output, keeping the input and
the weight), while the dynamo exporter writes MatMul then Add; the step model's Add writes into the product
(training/rules.py ATEN_IN_PLACE_TAIL; measured: benchmarks/training_single_ops.py --linear-bias)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

ROWS, FEATURES, OUT = 64, 32, 256


class ScaledLinear(torch.nn.Module):
    """A learned scale (the Linear's input needs a gradient, as inside a model), then a Linear with a bias."""

    def __init__(self) -> None:
        super().__init__()
        self.scale, self.linear = torch.nn.Parameter(torch.ones(FEATURES)), torch.nn.Linear(FEATURES, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * self.scale)


def _input(rank: int) -> torch.Tensor:
    return torch.randn(ROWS, FEATURES) if rank == 2 else torch.randn(4, ROWS // 4, FEATURES)


def _pytorch_saved_bytes(rank: int) -> int:
    """The new storages PyTorch's autograd keeps for one forward (neither a parameter nor the input)."""
    torch.manual_seed(0)
    model, x = ScaledLinear().train(), _input(rank)
    known = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in known:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).mean()
    return sum(saved.values())


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    from onnxmem.torch import export_for_training

    folder = tmp_path_factory.mktemp("linear_bias")
    made = {}
    for rank in (2, 3):
        torch.manual_seed(0)
        made[rank] = export_for_training(ScaledLinear().train(), (_input(rank)[:2],), folder / f"linear{rank}.onnx",
                                         {"batch": 0}, progress=None)
    return made


def _training(path: Path, rank: int, **options: object):  # type: ignore[no-untyped-def]
    import onnxmem
    from onnxmem.targets.torch import TorchCpu
    from onnxmem.training.step import TrainingOptions

    report = onnxmem.analyze(path, {"batch": ROWS if rank == 2 else 4}, training=TrainingOptions(
        optimizer="sgd", device=TorchCpu(threads=1), loss="mean", **options))  # type: ignore[arg-type]
    assert report.training is not None
    return report.training


def _forward_peak(training) -> int:  # type: ignore[no-untyped-def]
    return max(p.peak_bytes for p in training.first_step.phases if p.phase in ("forward", "loss"))


def test_the_export_writes_matmul_then_add_and_pytorch_runs_one_addmm(exports: dict[int, Path]) -> None:
    import onnx

    ops = [n.op_type for n in onnx.load(str(exports[3]), load_external_data=False).graph.node]
    assert "MatMul" in ops and "Add" in ops and "Gemm" not in ops
    x = _input(3)
    y = ScaledLinear()(x)
    names = []
    todo = [y.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None:
            names.append(fn.name())
            todo.extend(f for f, _ in fn.next_functions)
    assert "AddmmBackward0" in names and "AddBackward0" not in names


@pytest.mark.parametrize("rank", [2, 3])
def test_saved_bytes_are_pytorchs(exports: dict[int, Path], rank: int) -> None:
    training = _training(exports[rank], rank)
    assert training.saved_activation_bytes == _pytorch_saved_bytes(rank) == ROWS * FEATURES * 4


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_three_d_holds_one_product_like_two_d(exports: dict[int, Path], precision: str) -> None:
    flat, three_d = (_training(exports[rank], rank, precision=precision) for rank in (2, 3))
    product = ROWS * OUT * (4 if precision == "fp32" else 2)
    # the same kernel in PyTorch: only the autograd node of the export's weight transpose differs (2,400 B), far
    # under the second product the Add made before
    assert abs(_forward_peak(three_d) - _forward_peak(flat)) < product // 4
    assert flat.saved_activation_bytes <= three_d.saved_activation_bytes


def test_a_frozen_linear_keeps_nothing_new(exports: dict[int, Path]) -> None:
    training = _training(exports[3], 3, freeze=("linear.*",))
    assert training.saved_activation_bytes == 0


def test_under_autocast_three_d_steps_like_two_d(exports: dict[int, Path]) -> None:
    # the weight reaches the 3-D product through the export's transpose: its backward still makes the 16-bit weight
    # gradient before the cast to the fp32 one, as the 2-D Gemm's does
    flat, three_d = (_training(exports[rank], rank, precision="amp-bf16") for rank in (2, 3))
    assert abs(three_d.first_step.peak_bytes - flat.first_step.peak_bytes) < OUT * FEATURES * 2 // 4
