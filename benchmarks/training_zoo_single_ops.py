"""Single-op measurements behind the training zoo's frozen-backbone misses (benchmarks/training_zoo.py, issue 27).

    python benchmarks/training_zoo_single_ops.py

The heap peak (every malloc: ../shared/tools/malloc_counter.c under LD_PRELOAD, one
thread) of transformers' batched_mm experts forward (Qwen2-MoE's `gate_up_proj[expert_ids]`, a bmm, the gate,
`down_proj[expert_ids]`, a bmm) as written, where the first gathered copy of the expert weights stays in the local
`selected_weights` until the second is made, and with `del` after its last use (what the ONNX graph shows: freed
after its last reader), without autograd (a frozen backbone) and under autocast to bf16 with the input requiring a
gradient. Behind training/step.py's eager-lifetimes warning.
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


def main() -> None:
    under_malloc_counter()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU, one thread; heap peak above what was live before (every malloc)\n")
    rebinding()


if __name__ == "__main__":
    main()
