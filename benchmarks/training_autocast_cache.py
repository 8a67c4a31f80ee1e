"""Autocast's weight cache under a training step on CPU: one bf16 copy per trainable weight, or one per reader?

    python benchmarks/training_autocast_cache.py

Two numbered blocks (`layers.N`, so --checkpoint layers finds them), each a learned scale then Linears on
[4, 128, 256] input (the dynamo exporter writes a 3-D Linear as Transpose(weight) then MatMul) or on [512, 256]
input (2-D: a Gemm reading the weight directly): "one Linear" (two Linears per block, distinct weights), "shared
weight" (one weight read by both Linears of a block, as an RNN's weight is read by two timesteps). Under autocast
to bf16 PyTorch casts a leaf weight that requires grad once and keeps the copy in its cache until the autocast region
exits (the end of the forward and the loss); with torch.utils.checkpoint (use_reentrant=False) around each block
the recompute runs in its own autocast region and casts again. Measured (malloc counter, one thread, SGD, loss
y.mean(), a forked child per row after warm_up; the loop holds the output to the step's end): the heap held at the
end of the forward and the loss, inside the autocast region ("forward end") and once it has exited, and the first
step's peak, above the weights and the input; beside onnxmem's live bytes at its last forward or loss event and its
step peak (recommended export, less weights and inputs; "error" compares onnxmem with the heap inside the region).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.measured_run import in_fork  # noqa: E402
from benchmarks.zoo import quiet  # noqa: E402

FEATURES = 256
CASES = (("3-D", "one Linear"), ("3-D", "shared weight"), ("2-D", "one Linear"), ("2-D", "shared weight"))


class Block(nn.Module):
    """A learned scale, then two Linears with a GELU between (`shared`: both read the first's weight)."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.scale, self.shared = nn.Parameter(torch.ones(FEATURES)), shared
        self.fc1 = nn.Linear(FEATURES, FEATURES)
        self.fc2 = None if shared else nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x * self.scale))
        if self.fc2 is None:
            return F.linear(h, self.fc1.weight)
        return self.fc2(h)  # type: ignore[no-any-return]


class Blocks(nn.Module):
    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(shared) for _ in range(2)])
        self.checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        for block in self.layers:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return x


def _input(kind: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    shape = (4, 128, FEATURES) if kind == "3-D" else (512, FEATURES)
    return torch.randn(*shape, generator=generator)


def _child(kind: str, shared: bool, autocast: bool, checkpointing: bool) -> list[int]:
    import ctypes
    import gc

    from benchmarks.accuracy_training import warm_up

    warm_up()
    torch.manual_seed(0)
    module = Blocks(shared).train()
    module.checkpointing = checkpointing
    x = _input(kind)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    counter = ctypes.CDLL(None)
    counter.mc_current.restype = counter.mc_peak.restype = ctypes.c_int64
    gc.collect()
    base = counter.mc_current()
    counter.mc_reset_peak()
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        y = module(x)  # held until the step ends, as the training zoo's loop and onnxmem do
        loss = y.mean()
        inside = counter.mc_current() - base
    after = counter.mc_current() - base
    loss.backward()
    opt.step()
    del y
    return [int(inside), int(after), int(counter.mc_peak() - base)]


def _forked(*args: object) -> list[int]:
    value = in_fork(_child, *args)
    if not isinstance(value, list):
        raise RuntimeError(f"autocast-cache {args}: {value}")
    return value


def estimate(path: Path, batch: int, autocast: bool, checkpointing: bool) -> tuple[int, int]:
    """Give onnxmem's live bytes at its last forward or loss event and its first step's peak, less weights and
    inputs."""
    import onnxmem
    from onnxmem.targets.torch import TorchCpu
    from onnxmem.training.step import TrainingOptions

    report = onnxmem.analyze(path, {"batch": batch}, training=TrainingOptions(
        optimizer="sgd", device=TorchCpu(threads=1), loss="mean", precision="amp-bf16" if autocast else "fp32",
        checkpoint="layers" if checkpointing else None))
    training = report.training
    assert training is not None and training.timeline is not None
    base = training.weights_bytes + training.input_bytes
    timeline = training.timeline
    last = max(i for i, phase in enumerate(timeline.phases) if phase in ("forward", "loss"))
    return timeline.first_live_bytes[last] - base, training.first_step.peak_bytes - base


def main() -> None:
    from benchmarks.accuracy_training import under_malloc_counter
    from onnxmem.torch import export_for_training

    under_malloc_counter()
    print(f"torch {torch.__version__}, CPU, one thread, SGD, loss y.mean(), 2 blocks of {FEATURES} features; bytes "
          "above the weights and the input\n")
    print("| input | weights | step | checkpoint | forward end | after autocast | onnxmem | error | step peak "
          "| onnxmem | error |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for kind, weights in CASES:
            shared = weights == "shared weight"
            path = Path(folder) / f"blocks_{kind}_{shared}.onnx"
            torch.manual_seed(0)
            x = _input(kind)
            with quiet():
                export_for_training(Blocks(shared).train(), (x[:2],), path, {"batch": 0})
            for autocast, checkpointing in ((False, False), (True, False), (False, True), (True, True)):
                held, after, peak = _forked(kind, shared, autocast, checkpointing)
                held_estimate, peak_estimate = estimate(path, x.shape[0], autocast, checkpointing)
                step = "amp-bf16" if autocast else "fp32"
                print(f"| {kind} | {weights} | {step} | {'layers' if checkpointing else ''} | {held:,} | {after:,} "
                      f"| {held_estimate:,} | {100 * (held_estimate - held) / held:+.1f}% | {peak:,} "
                      f"| {peak_estimate:,} | {100 * (peak_estimate - peak) / peak:+.1f}% |", flush=True)


if __name__ == "__main__":
    main()
