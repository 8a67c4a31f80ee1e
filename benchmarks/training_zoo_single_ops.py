"""Single-op measurements behind the training zoo's frozen-backbone misses (benchmarks/training_zoo.py, issue 27).

    python benchmarks/training_zoo_single_ops.py [--locals]

The heap peak (every malloc: ../shared/tools/malloc_counter.c under LD_PRELOAD, one
thread) of transformers' batched_mm experts forward (Qwen2-MoE's `gate_up_proj[expert_ids]`, a bmm, the gate,
`down_proj[expert_ids]`, a bmm) as written, where the first gathered copy of the expert weights stays in the local
`selected_weights` until the second is made, and with `del` after its last use (what the ONNX graph shows: freed
after its last reader), without autograd (a frozen backbone) and under autocast to bf16 with the input requiring a
gradient. Behind training/step.py's eager-lifetimes warning.

--locals: the same frozen computation written with its intermediates bound to Python variables (`h = self.a(x)`,
held until the forward returns) and inline (`self.c(self.b(self.a(x)) * 2)`, each freed after its reader), with a
trained head after it: the first training step's heap peak (malloc counter, a forked child per row after warm_up)
and onnxmem's estimate of each one's recommended export, which reads the variables from the exporter's stack traces
(training/lifetimes.py; ir/graph.py Op.frames carries them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.accuracy_training import heap_peak, under_malloc_counter  # noqa: E402

TOKENS, HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 128, 128, 64, 4, 2  # Qwen2-MoE of the zoo at batch 4 x 32 tokens


def rebinding() -> None:
    torch.manual_seed(0)
    gate_up, down = torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN), torch.randn(EXPERTS, HIDDEN, INTERMEDIATE)
    pairs = TOKENS * TOP_K
    expert_ids = torch.randint(0, EXPERTS, (pairs,))

    def experts(x: torch.Tensor, free_first: bool) -> torch.Tensor:
        selected_weights = gate_up[expert_ids]
        out = torch.bmm(selected_weights, x.unsqueeze(-1)).squeeze(-1)
        if free_first:
            del selected_weights
        out = torch.nn.functional.silu(out[:, :INTERMEDIATE]) * out[:, INTERMEDIATE:]
        selected_weights = down[expert_ids]
        return torch.bmm(selected_weights, out.unsqueeze(-1)).squeeze(-1)

    first, second = pairs * 2 * INTERMEDIATE * HIDDEN * 4, pairs * HIDDEN * INTERMEDIATE * 4
    print(f"gathered copies: gate_up {first:,} B, down {second:,} B (fp32)\n")
    print("| step | as written (rebound) | del after last use | difference |")
    print("|---|---:|---:|---:|")
    x = torch.randn(pairs, HIDDEN)
    for label, grad, dtype in (("no autograd (frozen)", False, None), ("autocast bf16, input needs grad", True,
                                                                       torch.bfloat16)):
        inputs = x.clone().requires_grad_(grad)
        peaks = []
        for free_first in (False, True):
            def work(free_first: bool = free_first, inputs: torch.Tensor = inputs,
                     dtype: torch.dtype | None = dtype) -> object:
                with torch.autocast("cpu", dtype or torch.bfloat16, enabled=dtype is not None):
                    return experts(inputs, free_first)
            work()  # (the first call's one-time buffers)
            peaks.append(heap_peak(work))
        print(f"| {label} | {peaks[0]:,} | {peaks[1]:,} | {peaks[0] - peaks[1]:+,} |")


class Written(torch.nn.Module):
    """Three frozen Linears (no biases) and a trained head, with the intermediates bound to variables or inline."""

    def __init__(self, bound: bool) -> None:
        super().__init__()
        # (no biases: the exporter writes a 3-D Linear with a bias as MatMul and Add, two outputs where PyTorch's
        # addmm makes one, which the step counts apart from what is measured here)
        self.a, self.b = torch.nn.Linear(128, 512, bias=False), torch.nn.Linear(512, 128, bias=False)
        self.c, self.head = torch.nn.Linear(128, 512, bias=False), torch.nn.Linear(512, 10)
        self.bound = bound

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bound:
            wide = self.a(x)
            narrow = self.b(wide)
            doubled = narrow * 2.0
            out = self.c(doubled)
            return self.head(out)
        return self.head(self.c(self.b(self.a(x)) * 2.0))


def _locals_heap(bound: bool, state: dict[str, torch.Tensor], x: torch.Tensor) -> int:
    """Give the first step's heap peak (only the head trains), in a forked child that has made no step."""
    import json
    import os

    from benchmarks.accuracy_training import warm_up

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        warm_up()
        model = Written(bound)
        model.load_state_dict(state)
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name.startswith("head."))
        opt = torch.optim.SGD(model.head.parameters(), lr=0.01)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            model(x).mean().backward()
            opt.step()

        os.write(write, json.dumps(heap_peak(step)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as stream:
        answer = int(json.loads(stream.read()))
    os.waitpid(pid, 0)
    return answer


def written_locals() -> None:
    import contextlib
    import io
    import tempfile

    import onnxmem
    from onnxmem.targets.torch import TorchCpu
    from onnxmem.torch import export_for_training
    from onnxmem.training.step import TrainingOptions

    torch.manual_seed(0)
    state = Written(True).state_dict()
    x = torch.randn(4, 64, 128)
    print("| written | heap peak (truth) | estimate | error |")
    print("|---|---:|---:|---:|")
    for bound in (True, False):
        model = Written(bound)
        model.load_state_dict(state)
        with tempfile.TemporaryDirectory() as folder:
            path = f"{folder}/written.onnx"
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                export_for_training(model, (x[:2],), path, {"batch": 0})
            report = onnxmem.analyze(path, {"batch": 4}, training=TrainingOptions(
                optimizer="sgd", device=TorchCpu(threads=1), loss="mean", train=("head.*",)))
        assert report.training is not None
        estimate = report.training.first_step.peak_bytes - report.training.weights_bytes \
            - report.training.input_bytes
        truth = _locals_heap(bound, state, x)
        print(f"| {'variables' if bound else 'inline'} | {truth:,} | {estimate:,} | "
              f"{100 * (estimate - truth) / truth:+.1f}% |")


def main() -> None:
    under_malloc_counter()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU, one thread; heap peak above what was live before (every malloc)\n")
    if "--locals" in sys.argv:
        written_locals()
        return
    rebinding()


if __name__ == "__main__":
    main()
