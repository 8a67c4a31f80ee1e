"""Single-op measurements behind the training zoo's amp rows (benchmarks/training_zoo.py, issue 27 class 6).

    python benchmarks/training_zoo_amp_ops.py [--ops a,b] [--out DIR]

Each op is a tiny module (the layers the zoo's amp misses run: a Linear, a Linear into LayerNorm, MobileBERT's
bottleneck and NoNorm, Qwen2-MoE's batched_mm experts, a Conv1d feature encoder, an attention block), trained one
step with SGD on a cross-entropy of its output, in fp32 and under torch.autocast('cpu', bfloat16) and float16.
Truth: the first step's heap peak above what was live before it (every malloc: ../shared/tools/malloc_counter.c
under LD_PRELOAD, one thread, each row in a forked child that has made no step: benchmarks/accuracy_training.py's
warm_up, heap_peak, check_measurement). Estimate: onnxmem on the op's recommended export
(onnxmem.torch.export_for_training), the same step at the same precision (TorchCpu, one thread), less weights and
inputs. error = (estimate - truth) / truth.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.accuracy_training import (  # noqa: E402
    OPTIMIZERS,
    check_measurement,
    heap_peak,
    under_malloc_counter,
    variant_step,
    warm_up,
)
from benchmarks.measured_run import in_fork  # noqa: E402

BATCH, TOKENS, HIDDEN = 4, 32, 128
DTYPES = {"fp32": None, "amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}


def _tokens_loss(out: torch.Tensor, batch: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(batch)
    target = torch.randint(0, out.shape[-1], out.shape[:-1], generator=generator)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


class LinearOp(nn.Module):
    """One Linear on a float input that needs no gradient (the first layer of a model)."""

    def __init__(self, features: int = HIDDEN, out: int = 4 * HIDDEN) -> None:
        super().__init__()
        self.linear = nn.Linear(features, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class LinearChain(nn.Module):
    """Three Linears: the middle one's input needs a gradient, as inside a model."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(F.gelu(self.b(self.a(x))))


class LinearLayerNorm(nn.Module):
    """Linear, residual add, LayerNorm, Linear (a transformer's output sub-block)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.norm, self.b = nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.norm(x + self.a(x)))


class NoNormBottleneck(nn.Module):
    """MobileBERT's bottleneck: Linear down, NoNorm (x * weight + bias), Linear up, residual, NoNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.down, self.up, self.head = nn.Linear(HIDDEN, 64), nn.Linear(64, HIDDEN), nn.Linear(HIDDEN, 64)
        self.w1, self.b1 = nn.Parameter(torch.ones(64)), nn.Parameter(torch.zeros(64))
        self.w2, self.b2 = nn.Parameter(torch.ones(HIDDEN)), nn.Parameter(torch.zeros(HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(x) * self.w1 + self.b1
        h = (self.up(h) + x) * self.w2 + self.b2
        return self.head(h)


class Experts(nn.Module):
    """Qwen2-MoE's batched_mm experts (transformers' `gate_up_proj[expert_ids]`, a bmm, the gate, `down_proj[...]`,
    a bmm) between two Linears."""

    def __init__(self, experts: int = 4, intermediate: int = 64) -> None:
        super().__init__()
        self.inter = intermediate
        self.proj, self.head = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, 64)
        self.gate_up = nn.Parameter(torch.randn(experts, 2 * intermediate, HIDDEN) * 0.02)
        self.down = nn.Parameter(torch.randn(experts, HIDDEN, intermediate) * 0.02)
        self.register_buffer("ids", torch.arange(BATCH * TOKENS * 2) % experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x).reshape(-1, HIDDEN).repeat_interleave(2, dim=0)
        ids = self.ids[: h.shape[0]]
        selected = self.gate_up[ids]
        out = torch.bmm(selected, h.unsqueeze(-1)).squeeze(-1)
        out = F.silu(out[:, : self.inter]) * out[:, self.inter:]
        selected = self.down[ids]
        out = torch.bmm(selected, out.unsqueeze(-1)).squeeze(-1)
        out = out.reshape(x.shape[0], x.shape[1], 2, HIDDEN).sum(2)
        return self.head(out)


class ConvEncoder(nn.Module):
    """A feature encoder over raw audio (Data2Vec-Audio's): Conv1d layers, each with LayerNorm over channels and
    GELU, then a Linear."""

    def __init__(self, channels: int = 64) -> None:
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv1d(1, channels, 10, 5), nn.Conv1d(channels, channels, 3, 2),
                                    nn.Conv1d(channels, channels, 2, 2)])
        self.norms = nn.ModuleList([nn.LayerNorm(channels) for _ in self.convs])
        self.head = nn.Linear(channels, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.unsqueeze(1)
        for conv, norm in zip(self.convs, self.norms, strict=True):
            h = F.gelu(norm(conv(h).transpose(1, 2)).transpose(1, 2))
        return self.head(h.transpose(1, 2))


class Attention(nn.Module):
    """Fused qkv Linear, scaled_dot_product_attention (causal, no dropout), output Linear."""

    def __init__(self, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, HIDDEN))


def _tokens_input(b: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(b, TOKENS, HIDDEN, generator=torch.Generator().manual_seed(b)),)


def _audio_input(b: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(b, 4000, generator=torch.Generator().manual_seed(b)),)


@dataclass
class Op:
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]] = _tokens_input


OPS = [
    Op("linear", LinearOp),
    Op("linear_chain", LinearChain),
    Op("linear_layernorm", LinearLayerNorm),
    Op("nonorm_bottleneck", NoNormBottleneck),
    Op("experts_bmm", Experts),
    Op("conv1d_encoder", ConvEncoder, _audio_input),
    Op("attention", Attention),
]


def _measure_child(op: Op, state: dict[str, torch.Tensor], variant: str, optimizer: str) -> int:
    warm_up()
    torch.manual_seed(0)
    module = op.build()
    module.load_state_dict(state)
    module.train()
    opt = OPTIMIZERS[optimizer](list(module.parameters()))
    step = variant_step(module, op.inputs(BATCH), BATCH, _tokens_loss, opt, 1, DTYPES[variant])
    heap = heap_peak(step)
    check_measurement()
    return heap


def measure(op: Op, state: dict[str, torch.Tensor], variant: str, optimizer: str) -> int:
    """Give the heap peak of the op's first step, in a forked child that has made no step."""
    value = in_fork(_measure_child, op, state, variant, optimizer)
    if not isinstance(value, int):
        raise RuntimeError(f"{op.name} {variant}: {value}")
    return value


def estimate(path: Path, variant: str, optimizer: str) -> tuple[int, str]:
    import onnxmem
    from onnxmem.targets.torch import TorchCpu
    from onnxmem.training.step import TrainingOptions

    report = onnxmem.analyze(path, {"batch": BATCH}, training=TrainingOptions(
        optimizer=optimizer, device=TorchCpu(threads=1), loss="cross_entropy", precision=variant))
    training = report.training
    assert training is not None
    codes = sorted({w.code for w in report.warnings if not w.code.startswith("cuda-")})
    return training.first_step.peak_bytes - training.weights_bytes - training.input_bytes, ",".join(codes) or "-"


def export(op: Op, folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    from onnxmem.torch import export_for_training

    torch.manual_seed(0)
    module = op.build()
    state = {k: v.clone() for k, v in module.state_dict().items()}
    path = folder / f"{op.name}.onnx"
    if not path.exists():
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            export_for_training(module, op.inputs(2), path, {"batch": 0})
    return path, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(op.name for op in OPS))
    parser.add_argument("--variants", default=",".join(DTYPES))
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "onnxmem-amp-ops"))
    args = parser.parse_args()
    under_malloc_counter()
    torch.set_num_threads(1)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, CPU, one thread, {args.optimizer}, batch {BATCH}; heap peak of the first "
          "step above what was live before it (every malloc)\n")
    print("| op | variant | truth (B) | estimate (B) | error | truth - estimate (B) | warned |")
    print("|---|---|---:|---:|---:|---:|---|")
    names = args.ops.split(",")
    for op in (o for o in OPS if o.name in names):
        path, state = export(op, folder)
        for variant in args.variants.split(","):
            truth = measure(op, state, variant, args.optimizer)
            value, warned = estimate(path, variant, args.optimizer)
            print(f"| {op.name} | {variant} | {truth:,} | {value:,} | {100 * (value - truth) / truth:+.1f}% | "
                  f"{truth - value:+,} | {warned} |", flush=True)


if __name__ == "__main__":
    main()
