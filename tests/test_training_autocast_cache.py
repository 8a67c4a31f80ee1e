"""Autocast's weight cache: under autocast PyTorch casts a trainable fp32 weight to 16 bits once per forward (one
cached copy per leaf that requires grad, freed when the autocast region exits), however many Linears read it and
whether the export reads it directly (a 2-D Gemm) or through a transpose (a 3-D Linear: Transpose then MatMul); a
checkpointed block's recompute casts again (training/model.py _kept_for_backward, simulate.py _kept_extras; measured:
benchmarks/training_autocast_cache.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

ROWS, FEATURES = 96, 128
COPY = FEATURES * FEATURES * 2  # one weight's bf16 copy


class Block(torch.nn.Module):
    """A learned scale, then two Linears with a GELU between (`shared`: both read the first's weight)."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(FEATURES))
        self.fc1 = torch.nn.Linear(FEATURES, FEATURES, bias=False)
        self.fc2 = None if shared else torch.nn.Linear(FEATURES, FEATURES, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.fc1(x * self.scale))
        return torch.nn.functional.linear(h, self.fc1.weight) if self.fc2 is None else self.fc2(h)


class Blocks(torch.nn.Module):
    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(shared) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = block(x)
        return x


def _input(rank: int) -> torch.Tensor:
    return torch.randn(ROWS, FEATURES) if rank == 2 else torch.randn(4, ROWS // 4, FEATURES)


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, bool], Path]:
    from onnxmem.torch import export_for_training

    folder = tmp_path_factory.mktemp("autocast_cache")
    made = {}
    for rank in (2, 3):
        for shared in (False, True):
            torch.manual_seed(0)
            made[rank, shared] = export_for_training(Blocks(shared).train(), (_input(rank)[:2],),
                                                     folder / f"blocks{rank}{shared}.onnx", {"batch": 0}, progress=None)
    return made


def _forward_end(path: Path, rank: int, **options: object) -> int:
    """onnxmem's live bytes at its last forward or loss event (amp-bf16, SGD, loss mean), less weights and inputs."""
    import onnxmem
    from onnxmem.targets.torch import TorchCpu
    from onnxmem.training.step import TrainingOptions

    report = onnxmem.analyze(path, {"batch": ROWS if rank == 2 else 4}, training=TrainingOptions(
        optimizer="sgd", device=TorchCpu(threads=1), loss="mean", precision="amp-bf16",
        **options))  # type: ignore[arg-type]
    training = report.training
    assert training is not None and training.timeline is not None
    last = max(i for i, phase in enumerate(training.timeline.phases) if phase in ("forward", "loss"))
    return training.timeline.first_live_bytes[last] - training.weights_bytes - training.input_bytes


def _pytorch_weight_copies(shared: bool, frozen: bool) -> int:
    """The distinct bf16 storages of a weight's size autograd keeps over one forward under autocast."""
    torch.manual_seed(0)
    model = Blocks(shared).train()
    for block in model.layers:
        block.fc1.requires_grad_(not frozen)
    copies: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == torch.bfloat16 and t.numel() == FEATURES * FEATURES:
            copies.add(t.untyped_storage().data_ptr())
        return t

    with torch.autocast("cpu", torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(_input(3)).mean()
    return len(copies)


def test_pytorch_casts_a_trainable_weight_once_and_a_frozen_one_per_reader() -> None:
    assert _pytorch_weight_copies(shared=True, frozen=False) == 2  # one per block's weight, read twice
    assert _pytorch_weight_copies(shared=True, frozen=True) == 4  # cast again by each reader


@pytest.mark.parametrize("shared", [False, True])
def test_three_d_holds_the_copies_two_d_holds(exports: dict[tuple[int, bool], Path], shared: bool) -> None:
    flat, three_d = (_forward_end(exports[rank, shared], rank) for rank in (2, 3))
    assert abs(three_d - flat) < COPY // 2  # the transposes' autograd nodes


@pytest.mark.parametrize("shared", [False, True])
def test_a_checkpointed_forward_holds_its_copies_to_its_end(exports: dict[tuple[int, bool], Path],
                                                            shared: bool) -> None:
    # the forward's cached copies stay until the autocast region exits, although the checkpoint keeps none of them
    flat, three_d = (_forward_end(exports[rank, shared], rank, checkpoint="layers") for rank in (2, 3))
    assert abs(three_d - flat) < COPY // 2  # the transposes' autograd nodes
    weights = 2 if shared else 4
    assert three_d >= weights * COPY


def test_a_frozen_weight_read_through_transposes_is_cast_per_reader(exports: dict[tuple[int, bool], Path]) -> None:
    # trained, a block's shared weight is one copy where two weights are two; frozen (no cache), each reader casts
    shared, separate = (_forward_end(exports[3, s], 3) for s in (True, False))
    assert separate - shared >= 2 * COPY - COPY // 4
    shared, separate = (_forward_end(exports[3, s], 3, freeze=("layers.*.fc*",)) for s in (True, False))
    assert abs(separate - shared) < COPY // 4
