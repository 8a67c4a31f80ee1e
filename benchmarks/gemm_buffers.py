"""MKL's sgemm packing buffers: what one GEMM leaves on the heap, measured, against rules.training.MklGemmBuffers.

PyTorch 2.13's CPU wheel runs fp32 matrix products (mm, addmm, bmm, slow_conv2d's GEMMs) in MKL's sgemm, which
takes its packing buffers through malloc (outside PyTorch's allocator: the profiler does not see them) and keeps
them in its own pool for the process's life. Each case runs in a fresh process under the LD_PRELOAD malloc counter
(../shared/tools/malloc_counter.c, or $ONNXMEM_TOOLS), one thread unless --threads: operands made first, then the
heap the GEMMs leave (what is live after them less what was live before them, the output preallocated; for a
layer's training step, its gradients and graph freed). Three tables:
- single GEMMs (torch.mm of M x K by K x N into M x N) over M, N, K and transposes, against mkl_gemm_block;
- GEMMs in sequence in one process (MKL's pool: a larger GEMM adds a block, a smaller one reuses), against
  mkl_gemm_held;
- a layer's forward and backward (Linear, bmm, a slow_conv2d 1x1 convolution at batch 4), the GEMMs from
  matmul_gemms / slow_conv2d_gemms, against mkl_gemm_held (the difference includes autograd's own first-time work).

--gelu: the exact GELU's oneDNN eltwise primitives (rules.training.OnednnPrimitives.eltwise_gelu_*): in one process
(after a GELU of one shape, autograd's first-time work), per new shape, the heap its forward and its backward (dense
output gradient) leave, less what a GELU of a shape already seen leaves.

Run: python benchmarks/gemm_buffers.py [--threads N] [--gelu]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onnxmem.rules.training import CPU_ISAS  # noqa: E402
from onnxmem.training import matmul_gemms, mkl_gemm_block, mkl_gemm_held, slow_conv2d_gemms  # noqa: E402

ISA = CPU_ISAS["avx2"]  # the measured CPU

# (M, N, K, transpose A, transpose B)
SINGLE = [(m, n, k, 0, 0) for n in (64, 256, 1024, 4096, 16384) for k in (256, 1024, 4096) for m in (64, 4096)] + [
    (64, 1024, k, 0, 0) for k in (2, 16, 100, 160, 192, 200, 320, 384, 500, 768)] + [
    (m, 64, 1024, 0, 0) for m in (1, 16, 128, 256, 512, 768)] + [
    (64, n, 1024, 0, 0) for n in (6144, 6400, 8192)] + [
    (4096, 64, 1024, 1, 0), (4096, 64, 1024, 0, 1), (4096, 4096, 256, 1, 1)]
SEQUENCES = [
    [(64, 64, 1024), (64, 4096, 1024)],
    [(64, 4096, 1024), (4096, 64, 1024), (4096, 4096, 1024), (64, 16384, 4096), (64, 64, 64)],
    [(4096, 4096, 256), (256, 256, 256), (4096, 4096, 256)],
]
GELU_SHAPES = [(2, 3), (6,), (16, 1000), (4, 160, 4, 4), (1000, 16), (8, 65, 768)]


def _preload_counter(environment: dict[str, str]) -> None:
    source = Path(os.environ.get("ONNXMEM_TOOLS", ROOT.parent / "shared" / "tools")) / "malloc_counter.c"
    if "malloc_counter" not in environment.get("LD_PRELOAD", ""):
        library = Path(tempfile.mkdtemp()) / "libmalloc_counter.so"
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
        environment["LD_PRELOAD"] = str(library)


def _in_child(kind: str, spec: object, threads: int) -> int:
    environment = dict(os.environ)
    _preload_counter(environment)
    environment["OMP_NUM_THREADS"] = str(threads)
    lines = subprocess.run([sys.executable, __file__, "--child", kind, json.dumps(spec), str(threads)],
                           env=environment, capture_output=True, text=True, check=True).stdout.splitlines()
    return int(next(line for line in lines if line.startswith("@@")).split()[1])


def child(kind: str, spec: list, threads: int) -> None:  # type: ignore[type-arg]
    import torch
    from torch import nn

    torch.set_num_threads(threads)
    counter = ctypes.CDLL(None)
    counter.mc_current.restype = ctypes.c_int64
    if kind == "gelu":
        import torch.nn.functional as F  # noqa: N812

        def once(shape: tuple[int, ...]) -> tuple[int, int]:
            x = torch.randn(*shape, requires_grad=True)
            grad = torch.randn(*shape)
            gc.collect()
            base = counter.mc_current()
            y = F.gelu(x)
            forward = counter.mc_current() - base - y.numel() * 4
            y.backward(grad)
            del y
            x.grad = None
            gc.collect()
            return forward, counter.mc_current() - base

        once((5,))
        for shape in spec:
            (forward, kept), (forward_again, kept_again) = once(tuple(shape)), once(tuple(shape))
            print("@@", forward - forward_again, kept - kept_again, flush=True)
        return
    if kind == "gemms":
        operands = []
        for m, n, k, *trans in spec:
            a = torch.randn(k, m).t() if trans and trans[0] else torch.randn(m, k)
            b = torch.randn(n, k).t() if trans and trans[1] else torch.randn(k, n)
            operands.append((a, b, torch.empty(m, n)))
        gc.collect()
        base = counter.mc_current()
        for a, b, c in operands:
            torch.mm(a, b, out=c)
        print("@@", counter.mc_current() - base, flush=True)
        return
    torch.manual_seed(0)
    layer: nn.Module | None = None
    if kind.startswith("linear"):
        batch, width, out = spec
        layer = nn.Linear(width, out)
        x = torch.randn(batch, width, requires_grad=True)
        run = lambda: layer(x).sum().backward()  # noqa: E731
    elif kind.startswith("bmm"):
        heads, length, dim = spec
        q = torch.randn(heads, length, dim, requires_grad=True)
        k = torch.randn(heads, dim, length, requires_grad=True)
        run = lambda: torch.bmm(q, k).sum().backward()  # noqa: E731
    else:
        batch, channels, size, out = spec
        layer = nn.Conv2d(channels, out, 1, bias=False)
        x = torch.randn(batch, channels, size, size, requires_grad=True)
        run = lambda: layer(x).sum().backward()  # noqa: E731
    gc.collect()
    base = counter.mc_current()
    run()
    for tensor in [*(layer.parameters() if layer is not None else ()), *(t for t in locals().values()
                                                                          if isinstance(t, torch.Tensor))]:
        tensor.grad = None
    gc.collect()
    print("@@", counter.mc_current() - base, flush=True)


def _layer_gemms(kind: str, spec: list) -> list[tuple[int, int, int]]:  # type: ignore[type-arg]
    if kind.startswith("linear"):
        batch, width, out = spec
        gemms = matmul_gemms((batch, width), (out, width), (batch, out), True, True, b_transposed=True)
    elif kind.startswith("bmm"):
        heads, length, dim = spec
        gemms = matmul_gemms((heads, length, dim), (heads, dim, length), (heads, length, length), True, True)
    else:
        batch, channels, size, out = spec
        # one GEMM per sample: the held blocks are those of one sample's GEMMs
        gemms = slow_conv2d_gemms((batch, channels, size, size), (out, channels, 1, 1), (batch, out, size, size),
                                  True, True)
    return [(m, n, k) for m, n, k, _ in gemms]


LAYER_SPECS = {"linear 256x1024->4096": [256, 1024, 4096], "linear 64x4096->256": [64, 4096, 256],
               "bmm 12x197x64": [12, 197, 64], "conv1x1 4x256x28x28->1024": [4, 256, 28, 1024]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gelu", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "SPEC", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], json.loads(args.child[1]), int(args.child[2]))
        return
    threads = args.threads
    if args.gelu:
        environment = dict(os.environ)
        _preload_counter(environment)
        environment["OMP_NUM_THREADS"] = str(threads)
        lines = subprocess.run([sys.executable, __file__, "--child", "gelu", json.dumps(GELU_SHAPES), str(threads)],
                               env=environment, capture_output=True, text=True, check=True).stdout.splitlines()
        sizes = ISA.primitives
        print(f"exact GELU, fp32, {threads} thread(s): heap a new shape's primitives keep (malloc counter)\n")
        print("| shape | forward | forward + backward | rule | rule - measured |")
        print("|---|---:|---:|---:|---:|")
        rule = sizes.eltwise_gelu_forward + sizes.eltwise_gelu_backward
        for shape, line in zip(GELU_SHAPES, (x for x in lines if x.startswith("@@")), strict=True):
            forward, kept = map(int, line.split()[1:])
            print(f"| {'x'.join(map(str, shape))} | {forward:,} | {kept:,} | {rule:,} | {rule - kept:+,} |")
        return
    first = ISA.gemm.first_use
    print(f"MKL sgemm packing buffers, torch fp32 on CPU, {threads} thread(s); heap left by the GEMMs "
          f"(malloc counter), fresh process per row; rule = mkl_gemm_block + first_use ({first:,} B)\n")
    print("| M | N | K | transposes | measured | rule | rule - measured |")
    print("|---:|---:|---:|---|---:|---:|---:|")
    gaps = []
    for m, n, k, ta, tb in SINGLE:
        measured = _in_child("gemms", [[m, n, k, ta, tb]], threads)
        block = mkl_gemm_block(m, n, k, 4, ISA)
        rule = block + first if block else 0
        gaps.append(rule - measured)
        print(f"| {m} | {n} | {k} | {('A' if ta else '') + ('B' if tb else '') or 'none'} "
              f"| {measured:,} | {rule:,} | {rule - measured:+,} |")
    gaps.sort()
    print(f"\nrule - measured: from {gaps[0]:+,} to {gaps[-1]:+,} B\n")
    print("| GEMMs in one process (M x N x K) | measured | rule (mkl_gemm_held) | rule - measured |")
    print("|---|---:|---:|---:|")
    for sequence in SEQUENCES:
        measured = _in_child("gemms", [[*g, 0, 0] for g in sequence], threads)
        rule = sum(nbytes for _, nbytes in mkl_gemm_held(sequence, 4, ISA))
        print(f"| {', '.join('x'.join(map(str, g)) for g in sequence)} | {measured:,} | {rule:,} "
              f"| {rule - measured:+,} |")
    print("\n| layer, forward and backward | GEMMs | measured | rule (mkl_gemm_held) | rule - measured |")
    print("|---|---|---:|---:|---:|")
    for name, spec in LAYER_SPECS.items():
        measured = _in_child(name, spec, threads)
        gemms = _layer_gemms(name, spec)
        rule = sum(nbytes for _, nbytes in mkl_gemm_held(gemms, 4, ISA))
        print(f"| {name} | {', '.join('x'.join(map(str, g)) for g in gemms)} | {measured:,} | {rule:,} "
              f"| {rule - measured:+,} |")


if __name__ == "__main__":
    main()
