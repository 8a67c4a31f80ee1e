"""MKL's sgemm packing buffers: what one GEMM leaves on the heap, measured, against MklGemmBuffers
(onnxmem/targets/torch/cpu/tables.py).

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

--direct: MKL's sgemm and gemm_bf16bf16f32 called directly (through ctypes, from libtorch_cpu), as PyTorch calls
them (column-major, MKL_VERBOSE's transa, transb, m, n, k), over odd sizes: single calls per fresh process and
sequences of both kinds in one process, against mkl_gemm_held (bf16 operands are converted to fp32 copies that
share MKL's pool); then F.scaled_dot_product_attention's forward and backward (PyTorch's CPU flash attention) per
fresh process, fp32 and bf16, against mkl_gemm_held of flash_attention_gemms.

--lstm: oneDNN's LSTM primitives (onnxmem/targets/torch/cpu/tables.py OnednnPrimitives.lstm_*): one training step
of nn.LSTM per fresh process (after autograd's first-time work), the heap it leaves, over layers, directions and
sizes, against the rule: the first use, one per (input features, hidden, direction), one weight reorder per input
width other than the hidden size.

--gelu: the exact GELU's oneDNN eltwise primitives (onnxmem/targets/torch/cpu/tables.py
OnednnPrimitives.eltwise_gelu_*): in one process
(after autograd's first-time work, then a first GELU whose extra over a later shape is the first use), per new
shape, the heap its forward and its backward (dense output gradient) leave, less what a GELU of a shape already seen
leaves.

Run: python benchmarks/gemm_buffers.py [--threads N] [--gelu | --direct | --lstm]
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

from onnxmem.targets.torch.cpu.gemm import (  # noqa: E402
    Gemm,
    flash_attention_gemms,
    matmul_gemms,
    mkl_call_gemm,
    mkl_gemm_block,
    mkl_gemm_held,
    slow_conv2d_gemms,
)
from onnxmem.targets.torch.cpu.primitives import lstm_primitives  # noqa: E402
from onnxmem.targets.torch.cpu.tables import CPU_ISAS  # noqa: E402

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


def _child_line(kind: str, spec: object, threads: int) -> str:
    environment = dict(os.environ)
    _preload_counter(environment)
    environment["OMP_NUM_THREADS"] = str(threads)
    lines = subprocess.run([sys.executable, __file__, "--child", kind, json.dumps(spec), str(threads)],
                           env=environment, capture_output=True, text=True, check=True).stdout.splitlines()
    return next(line for line in lines if line.startswith("@@"))[2:].strip()


def _in_child(kind: str, spec: object, threads: int) -> int:
    """Run a case in a fresh process under the malloc counter; give the heap it printed (the last, for a list)."""
    value = json.loads(_child_line(kind, spec, threads))
    return int(value[-1] if isinstance(value, list) else value)


def _in_child_list(kind: str, spec: object, threads: int) -> list[int]:
    return [int(x) for x in json.loads(_child_line(kind, spec, threads))]


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

        warm = torch.randn(4, 4, requires_grad=True)
        (warm * 2).backward(torch.ones(4, 4))  # autograd's first-time work (a non-scalar root: 12 MB once)
        print("@@", *once((3, 7)), flush=True)  # the process's first GELU
        for shape in spec:
            (forward, kept), (forward_again, kept_again) = once(tuple(shape)), once(tuple(shape))
            print("@@", forward - forward_again, kept - kept_again, flush=True)
        return
    if kind == "direct":
        _direct_child(spec, counter)
        return
    if kind == "lstm":
        batch, steps, features, hidden, layers, directions = spec
        (torch.ones(2, requires_grad=True) * 2).sum().backward()  # autograd's first-time work
        torch.manual_seed(0)
        lstm = nn.LSTM(features, hidden, num_layers=layers, bidirectional=directions == 2)
        x = torch.randn(steps, batch, features, requires_grad=True)
        gc.collect()
        base = counter.mc_current()
        lstm(x)[0].sum().backward()
        for parameter in lstm.parameters():
            parameter.grad = None
        x.grad = None
        gc.collect()
        print("@@", counter.mc_current() - base, flush=True)
        return
    if kind == "sdpa":
        import torch.nn.functional as F  # noqa: N812

        (b, h, length, e, keys), low = spec
        dtype = torch.bfloat16 if low else torch.float32
        (torch.ones(2, requires_grad=True) * 2).sum().backward()  # autograd's first-time work, not the op's
        q = torch.randn(b, h, length, e, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(b, h, keys, e, dtype=dtype, requires_grad=True) for _ in range(2))
        gc.collect()
        base = counter.mc_current()
        F.scaled_dot_product_attention(q, k, v).float().sum().backward()
        q.grad = k.grad = v.grad = None
        gc.collect()
        print("@@", counter.mc_current() - base, flush=True)
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


def _direct_child(calls: list, counter: ctypes.CDLL) -> None:  # type: ignore[type-arg]
    """Call MKL's GEMMs as PyTorch does (Fortran interface, column-major): each call (kind, transa, transb, m, n,
    k), operands made first; print the heap after each."""
    import torch

    mkl = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    made = []
    for kind, transa, transb, m, n, k in calls:
        dtype = torch.bfloat16 if kind == "bf16" else torch.float32
        lda, ldb = (k if transa == "T" else m), (n if transb == "T" else k)
        made.append((kind, transa, transb, m, n, k, torch.randn(m * k, dtype=dtype), lda,
                     torch.randn(k * n, dtype=dtype), ldb, torch.zeros(m * n)))
    gc.collect()
    base = counter.mc_current()
    after = []
    for kind, transa, transb, m, n, k, a, lda, b, ldb, c in made:
        def ref(value: int) -> object:
            return ctypes.byref(ctypes.c_int(value))
        args = [ctypes.c_char_p(transa.encode()), ctypes.c_char_p(transb.encode()), ref(m), ref(n), ref(k),
                ctypes.byref(ctypes.c_float(1.0)), ctypes.c_void_p(a.data_ptr()), ref(lda),
                ctypes.c_void_p(b.data_ptr()), ref(ldb), ctypes.byref(ctypes.c_float(0.0)),
                ctypes.c_void_p(c.data_ptr()), ref(m)]
        (mkl.gemm_bf16bf16f32_ if kind == "bf16" else mkl.sgemm_)(*args)
        after.append(counter.mc_current() - base)
    print("@@", json.dumps(after), flush=True)


def _row_major(kind: str, transa: str, transb: str, m: int, n: int, k: int) -> Gemm:
    return mkl_call_gemm(transa, transb, m, n, k, kind == "bf16")


DIRECT_SINGLE = [(t, n) for t in (("T", "N", 65, 32, 32), ("N", "N", 32, 32, 65), ("N", "T", 32, 65, 32),
                                   ("T", "N", 128, 64, 64), ("N", "N", 64, 64, 128), ("T", "N", 300, 64, 64),
                                   ("N", "N", 64, 64, 300), ("T", "N", 512, 256, 64), ("N", "N", 64, 256, 512),
                                   ("N", "N", 256, 256, 256), ("N", "N", 1024, 1024, 1024), ("T", "N", 65, 32, 16),
                                   ("T", "N", 65, 32, 200), ("T", "N", 65, 32, 400), ("N", "N", 2000, 64, 64),
                                   ("N", "N", 64, 2000, 64), ("N", "N", 65, 32, 32), ("N", "N", 64, 64, 197),
                                   ("N", "N", 64, 64, 383), ("N", "N", 17, 64, 64), ("N", "N", 64, 33, 64),
                                   ("N", "N", 4, 64, 64), ("N", "N", 11, 64, 64), ("N", "N", 12, 4, 64),
                                   ("N", "N", 64, 3, 64), ("T", "T", 12, 4, 300))
                 for n in ("f32", "bf16")]
DIRECT_SEQUENCES = [
    [("bf16", "T", "N", 65, 32, 32), ("bf16", "N", "N", 32, 32, 65), ("bf16", "N", "T", 32, 65, 32)],
    [("bf16", "N", "N", 32, 32, 65), ("bf16", "T", "N", 65, 32, 32), ("bf16", "N", "T", 32, 65, 32)],
    [("bf16", "N", "N", 64, 64, 64), ("bf16", "N", "N", 512, 512, 512)],
    [("bf16", "N", "N", 512, 512, 512), ("bf16", "N", "N", 64, 64, 64), ("bf16", "T", "T", 300, 200, 100)],
    [("f32", "N", "N", 256, 256, 256), ("bf16", "T", "N", 65, 32, 32), ("bf16", "N", "N", 32, 32, 65)],
    [("bf16", "T", "N", 65, 32, 32), ("f32", "N", "N", 256, 256, 256), ("f32", "N", "N", 32, 32, 65)],
    [("bf16", "T", "N", 197, 64, 64), ("bf16", "N", "N", 64, 64, 197), ("bf16", "T", "N", 197, 64, 64)],
    [("bf16", "T", "N", 300, 64, 64), ("bf16", "N", "N", 64, 64, 300), ("bf16", "T", "N", 300, 64, 64)],
]
SDPA = [((8, 4, 65, 32, 65), False), ((8, 4, 65, 32, 65), True), ((2, 2, 300, 64, 300), False),
        ((2, 2, 300, 64, 300), True), ((1, 1, 70, 64, 600), True), ((1, 2, 800, 64, 800), False),
        ((4, 12, 197, 64, 197), True)]


def _direct(threads: int) -> None:
    """Print the --direct tables."""
    print(f"MKL called directly as PyTorch calls it, {threads} thread(s); heap left (malloc counter), fresh process "
          "per row; rule = mkl_gemm_held (an sgemm called directly takes no torch.mm first use)\n")
    print("| call (transa, transb, m, n, k) | kind | measured | rule | rule - measured |")
    print("|---|---|---:|---:|---:|")
    gaps = []
    for call, kind in DIRECT_SINGLE:
        measured = _in_child("direct", [[kind, *call]], threads)
        held = sum(nbytes for _, nbytes in mkl_gemm_held([_row_major(kind, *call)], ISA))
        rule = held - (ISA.gemm.first_use if held and kind == "f32" else 0)
        gaps.append(rule - measured)
        print(f"| {', '.join(map(str, call))} | {kind} | {measured:,} | {rule:,} | {rule - measured:+,} |")
    gaps.sort()
    print(f"\nrule - measured: from {gaps[0]:+,} to {gaps[-1]:+,} B\n")
    print("| calls in one process | heap after each, measured | rule | last: rule - measured |")
    print("|---|---|---|---:|")
    for sequence in DIRECT_SEQUENCES:
        measured_each = _in_child_list("direct", [list(c) for c in sequence], threads)
        gemms = [_row_major(*c) for c in sequence]
        held = dict(mkl_gemm_held(gemms, ISA))
        fp32_first = next((i for i, g in enumerate(gemms) if not g.low_precision and i in held), None)
        rule = [sum(held.get(j, 0) for j in range(i + 1)) - (ISA.gemm.first_use if fp32_first is not None
                                                               and fp32_first <= i else 0)
                for i in range(len(gemms))]
        print(f"| {'; '.join(' '.join(map(str, c)) for c in sequence)} | {', '.join(f'{x:,}' for x in measured_each)} "
              f"| {', '.join(f'{x:,}' for x in rule)} | {rule[-1] - measured_each[-1]:+,} |")
    print("\nF.scaled_dot_product_attention (flash attention), forward and backward, fresh process per row: heap left "
          "against mkl_gemm_held of flash_attention_gemms (first uses included)\n")
    print("| batch, heads, query length, head dim, key length | dtype | GEMMs | measured | rule | rule - measured |")
    print("|---|---|---:|---:|---:|---:|")
    for (b, h, length, e, keys), low in SDPA:
        measured = _in_child("sdpa", [[b, h, length, e, keys], low], threads)
        gemms = flash_attention_gemms((b, h, length, e), (b, h, keys, e), (b, h, keys, e), True, 2 if low else 4,
                                      ISA)
        rule = sum(nbytes for _, nbytes in mkl_gemm_held(gemms, ISA))
        print(f"| {b}, {h}, {length}, {e}, {keys} | {'bf16' if low else 'fp32'} | {len(gemms)} | {measured:,} "
              f"| {rule:,} | {rule - measured:+,} |")


# (batch, steps, input features, hidden, layers, directions)
LSTMS = [(8, 16, 32, 64, 1, 1), (4, 16, 32, 64, 1, 1), (8, 32, 32, 64, 1, 1), (8, 16, 64, 64, 1, 1),
         (8, 16, 32, 32, 1, 1), (8, 16, 32, 128, 1, 1), (8, 16, 48, 96, 1, 1), (8, 16, 100, 200, 1, 1),
         (8, 16, 24, 40, 1, 1), (2, 4, 8, 16, 1, 1), (8, 16, 32, 64, 2, 1), (8, 16, 64, 64, 2, 1),
         (8, 16, 32, 64, 3, 1), (8, 16, 100, 200, 2, 1), (8, 16, 32, 64, 1, 2), (8, 16, 64, 64, 1, 2),
         (8, 16, 32, 64, 2, 2)]


def _lstm(threads: int) -> None:
    """Print the --lstm table."""
    print(f"nn.LSTM, fp32, {threads} thread(s): the heap one training step leaves in a fresh process (malloc "
          "counter)\n")
    print("| batch | steps | features | hidden | layers | directions | measured | rule | rule - measured |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    gaps = []
    for batch, steps, features, hidden, layers, directions in LSTMS:
        measured = _in_child("lstm", [batch, steps, features, hidden, layers, directions], threads)
        # every layer's primitives, once per key (oneDNN's cache): the rule the training estimate applies
        widths = [features] + [directions * hidden] * (layers - 1)
        rule = sum(dict(p for width in widths for p in lstm_primitives(width, hidden, directions, ISA)).values())
        gaps.append(rule - measured)
        print(f"| {batch} | {steps} | {features} | {hidden} | {layers} | {directions} | {measured:,} | {rule:,} "
              f"| {rule - measured:+,} |")
    gaps.sort()
    print(f"\nrule - measured: from {gaps[0]:+,} to {gaps[-1]:+,} B")


def _layer_gemms(kind: str, spec: list) -> list[Gemm]:  # type: ignore[type-arg]
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
    return list(gemms)


LAYER_SPECS = {"linear 256x1024->4096": [256, 1024, 4096], "linear 64x4096->256": [64, 4096, 256],
               "bmm 12x197x64": [12, 197, 64], "conv1x1 4x256x28x28->1024": [4, 256, 28, 1024]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gelu", action="store_true")
    parser.add_argument("--direct", action="store_true", help="MKL called directly over odd sizes; flash attention")
    parser.add_argument("--lstm", action="store_true", help="oneDNN's LSTM primitives")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "SPEC", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], json.loads(args.child[1]), int(args.child[2]))
        return
    threads = args.threads
    if args.direct:
        _direct(threads)
        return
    if args.lstm:
        _lstm(threads)
        return
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
        found = [line for line in lines if line.startswith("@@")]
        kept_each = []
        for shape, line in zip(GELU_SHAPES, found[1:], strict=True):
            forward, kept = map(int, line.split()[1:])
            kept_each.append(kept)
            print(f"| {'x'.join(map(str, shape))} | {forward:,} | {kept:,} | {rule:,} | {rule - kept:+,} |")
        first_forward, first_kept = map(int, found[0].split()[1:])
        extra = first_kept - sorted(kept_each)[len(kept_each) // 2]
        print(f"\nthe process's first GELU (3x7): forward {first_forward:,} B, forward + backward {first_kept:,} B: "
              f"{extra:,} B over the median new shape; rule (eltwise_gelu_first_use): "
              f"{sizes.eltwise_gelu_first_use:,} B ({sizes.eltwise_gelu_first_use - extra:+,})")
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
        rule = sum(nbytes for _, nbytes in mkl_gemm_held([Gemm(*g) for g in sequence], ISA))
        print(f"| {', '.join('x'.join(map(str, g)) for g in sequence)} | {measured:,} | {rule:,} "
              f"| {rule - measured:+,} |")
    print("\n| layer, forward and backward | GEMMs | measured | rule (mkl_gemm_held) | rule - measured |")
    print("|---|---|---:|---:|---:|")
    for name, spec in LAYER_SPECS.items():
        measured = _in_child(name, spec, threads)
        gemms = _layer_gemms(name, spec)
        rule = sum(nbytes for _, nbytes in mkl_gemm_held(gemms, ISA))
        print(f"| {name} | {', '.join('x'.join(map(str, g[:3])) for g in gemms)} | {measured:,} | {rule:,} "
              f"| {rule - measured:+,} |")


if __name__ == "__main__":
    main()
