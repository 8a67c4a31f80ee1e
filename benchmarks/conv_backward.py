"""What one convolution's backward allocates on CPU besides its gradients: PyTorch against onnxmem's rule.

For each convolution below (one module, one thread, fp32, contiguous NCHW), PyTorch's backward is run under the
profiler (profile_memory=True: every allocation of the c10 CPU allocator) and its peak above the bytes live before
it is taken, less the gradients it returns (input, weight, bias): the scratch; and again under the LD_PRELOAD
malloc counter (../shared/tools/malloc_counter.c: every heap byte, oneDNN's own mallocs included). onnxmem's rule
(onnxmem.targets.torch.cpu.convolution.cpu_convolution_scratch, from its tables.py CPU_CONVOLUTION) gives it from
the shapes alone.
The path PyTorch took is named from oneDNN's verbose log (ONEDNN_VERBOSE=1, read from this process's stdout by a
child run) or as slow_conv2d where oneDNN ran nothing.

    python benchmarks/conv_backward.py [--threads N]

--primitives: the oneDNN primitives each convolution's first forward and backward create (ONEDNN_VERBOSE=all) and
the heap they keep (oneDNN caches them for the process's life), against
onnxmem.targets.torch.cpu.convolution.cpu_convolution_primitives
(onnxmem/targets/torch/cpu/tables.py OnednnPrimitives).
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
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.torch_memory import c10_peak  # noqa: E402
from onnxmem.targets.torch.cpu.convolution import (  # noqa: E402
    cpu_convolution_primitives,
    cpu_convolution_scratch,
)


@dataclass(frozen=True)
class Conv:
    """One convolution: channels, kernel, stride, groups, input size, batch, and what needs a gradient."""

    name: str
    cin: int
    cout: int
    kernel: int
    size: int
    batch: int
    stride: int = 1
    groups: int = 1
    padding: int | None = None  # None: kernel // 2
    input_grad: bool = True
    weight_grad: bool = True
    bias: bool = True
    dims: int = 2


CONVS = [
    Conv("stem 7x7/2, image input", 3, 64, 7, 64, 8, stride=2, input_grad=False, bias=False),
    Conv("3x3", 64, 64, 3, 16, 8, bias=False),
    Conv("3x3/2", 64, 128, 3, 16, 8, stride=2, bias=False),
    Conv("1x1/2 downsample", 64, 128, 1, 16, 8, stride=2, padding=0, bias=False),
    Conv("1x1, batch 4 (slow_conv2d)", 256, 64, 1, 16, 4, padding=0, bias=False),
    Conv("1x1, batch 16", 64, 64, 1, 8, 16, padding=0, bias=False),
    Conv("3x3 on 2x2 (gemm weight gradient)", 512, 512, 3, 2, 8, bias=False),
    Conv("3x3 on 2x2, batch 2", 256, 256, 3, 2, 2),
    Conv("3x3 on 2x2, 512 -> 384 (gemm packing)", 512, 384, 3, 2, 4, bias=False),
    Conv("3x3 on 3x3", 256, 256, 3, 3, 4, bias=False),
    Conv("channels 24 -> 40", 24, 40, 3, 8, 4),
    Conv("channels 20 -> 36 (padded)", 20, 36, 3, 8, 4),
    Conv("depthwise 3x3", 64, 64, 3, 16, 4, groups=64),
    Conv("depthwise 3x3/2", 64, 64, 3, 16, 4, stride=2, groups=64),
    Conv("depthwise 5x5 (gemm weight gradient)", 96, 96, 5, 8, 4, groups=96),
    Conv("depthwise 7x7 (gemm weight gradient)", 96, 96, 7, 14, 4, groups=96),
    Conv("depthwise 3x3 on 2x2", 96, 96, 3, 2, 4, groups=96),
    Conv("patchify 4x4/4", 3, 40, 4, 64, 4, stride=4, padding=0, input_grad=False),
    Conv("2x2/2 downsample", 40, 80, 2, 16, 4, stride=2, padding=0),
    Conv("3x3, batch 1 (slow_conv2d)", 8, 16, 3, 8, 1),
    Conv("3x3, frozen weight", 64, 64, 3, 16, 4, weight_grad=False, bias=False),
    Conv("1-D k3", 32, 64, 3, 64, 4, dims=1),
    Conv("grouped 3x3, 4 groups", 64, 64, 3, 8, 4, groups=4),
]


def module_and_input(conv: Conv) -> tuple[nn.Module, torch.Tensor]:
    """Give the conv as a PyTorch module (seeded; its weight and bias asking for gradients as the case says) and a
    random input of its shape."""
    torch.manual_seed(0)
    padding = conv.kernel // 2 if conv.padding is None else conv.padding
    cls = nn.Conv2d if conv.dims == 2 else nn.Conv1d
    module = cls(conv.cin, conv.cout, conv.kernel, stride=conv.stride, padding=padding, groups=conv.groups,
                 bias=conv.bias)
    module.weight.requires_grad_(conv.weight_grad)
    if module.bias is not None:
        module.bias.requires_grad_(conv.weight_grad)
    return module, torch.randn((conv.batch, conv.cin) + (conv.size,) * conv.dims, requires_grad=conv.input_grad)


def measure(conv: Conv) -> dict[str, int]:
    """Give the conv's shapes and PyTorch's backward scratch (peak above the start less the gradients)."""
    module, x = module_and_input(conv)
    if not conv.input_grad and not conv.weight_grad:
        raise ValueError(conv.name)
    out = module(x)
    grad = torch.randn_like(out)
    out.backward(grad)  # once before measuring: oneDNN's primitives are made and cached
    module.zero_grad(set_to_none=True)
    x.grad = None
    out = module(x)
    gc.collect()
    peak = c10_peak(lambda: out.backward(grad))
    returned = sum(t.numel() * t.element_size() for t in (x.grad, module.weight.grad,
                                                           None if module.bias is None else module.bias.grad)
                   if t is not None)
    heap = None
    counter = ctypes.CDLL(None)
    if hasattr(counter, "mc_peak"):  # the malloc counter is preloaded: every heap byte of the same backward
        counter.mc_peak.restype = counter.mc_current.restype = ctypes.c_int64
        module.zero_grad(set_to_none=True)
        x.grad = None
        out = module(x)
        gc.collect()
        base = counter.mc_current()
        counter.mc_reset_peak()
        out.backward(grad)
        heap = counter.mc_peak() - base - returned
    return {"x": list(x.shape), "w": list(module.weight.shape), "y": list(out.shape), "peak": peak,
            "scratch": peak - returned, "heap": heap}


def _live_bytes(tensors: list[torch.Tensor | None]) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors if t is not None)


def measure_primitives(conv: Conv, counter: ctypes.CDLL) -> dict[str, int]:
    """Give the heap the conv's first forward and first backward keep (oneDNN's primitives, cached for the
    process's life: the bytes live after each, less the tensors it returns) and what the first pass holds for a
    moment beyond the second (transient)."""
    module, x = module_and_input(conv)
    libc = ctypes.CDLL(None)
    peaks, held = [], {}
    for attempt in range(2):
        gc.collect()
        start = counter.mc_current()
        counter.mc_reset_peak()
        out = module(x)
        forward = counter.mc_current() - start - _live_bytes([out])
        libc.fflush(None)
        print("@@ forward", flush=True)  # oneDNN's log lines of the forward before this one
        grad = torch.ones_like(out)
        before = counter.mc_current()
        out.backward(grad)
        grads = [x.grad, module.weight.grad, None if module.bias is None else module.bias.grad]
        backward = counter.mc_current() - before - _live_bytes(grads)
        peaks.append(counter.mc_peak() - start)
        if attempt == 0:
            held = {"forward": forward, "backward": backward}
        del out, grad, grads
        x.grad = None
        module.zero_grad(set_to_none=True)
    return {**held, "transient": peaks[0] - peaks[1] - held["forward"] - held["backward"]}


def child_primitives() -> None:
    """Measure each conv's primitives in one process, after a convolution of other shapes (the process's first
    one also pays oneDNN's and the autograd engine's one-time set-up)."""
    torch.set_num_threads(1)
    counter = ctypes.CDLL(None)
    counter.mc_peak.restype = counter.mc_current.restype = ctypes.c_int64
    measure_primitives(WARM_UP, counter)
    ctypes.CDLL(None).fflush(None)
    print("@@", json.dumps({}), flush=True)
    for conv in CONVS:
        result = measure_primitives(conv, counter)
        ctypes.CDLL(None).fflush(None)
        print("@@", json.dumps(result), flush=True)


WARM_UP = Conv("warm-up", 5, 24, 3, 7, 3)


def created(log: list[str]) -> list[str]:
    """Give the primitives that oneDNN's log (ONEDNN_VERBOSE=all) says were created, not found in its cache."""
    made = []
    for line in log:
        fields = line.split(",")
        if len(fields) > 7 and fields[2] == "primitive" and fields[3] == "create:cache_miss":
            made.append(fields[6] if fields[5] == "reorder" else f"{fields[7].replace('_training', '')} {fields[6]}")
    return made


def main_primitives() -> None:
    """Print, per convolution, the oneDNN primitives its first forward and backward create and the heap they keep,
    against the rule (cpu_convolution_primitives: the primitives not made by an earlier convolution here)."""
    environment = {**os.environ, "ONEDNN_VERBOSE": "all", "OMP_NUM_THREADS": "1"}
    _preload_counter(environment)
    lines = subprocess.run([sys.executable, __file__, "--child-primitives"], env=environment, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    print(f"torch {torch.__version__}, CPU ({torch.backends.cpu.get_cpu_capability()}), one thread, fp32; kept = "
          "heap bytes live after the convolution's first forward and first backward, less the tensors they return "
          "(oneDNN's cache keeps every primitive it creates); transient = what the first pass held beyond the "
          "second at its peak, less what it kept; rule = cpu_convolution_primitives' primitives not made earlier "
          "in this process")
    print()
    print("| convolution | created (forward) | created (backward) | kept | transient | rule | rule - kept |")
    print("|---|---|---|---:|---:|---:|---:|")
    seen: set[tuple[object, ...]] = set()
    log: list[str] = []
    logs: list[list[str]] = []
    results = iter([WARM_UP, *CONVS])
    gaps, kept_total, rule_total = [], 0, 0
    for line in lines:
        if line == "@@ forward":
            logs.append(log)
            log = []
            continue
        if not line.startswith("@@"):
            log.append(line)
            continue
        conv, measured = next(results), json.loads(line[3:])
        forward_log, backward_log = logs[0], logs[1] + log  # the first pass's forward; its backward and the second
        logs, log = [], []
        padding = conv.kernel // 2 if conv.padding is None else conv.padding
        out = (conv.size + 2 * padding - conv.kernel) // conv.stride + 1
        x = (conv.batch, conv.cin) + (conv.size,) * conv.dims
        w = (conv.cout, conv.cin // conv.groups) + (conv.kernel,) * conv.dims
        y = (conv.batch, conv.cout) + (out,) * conv.dims
        new = [(key, size) for key, size, _ in cpu_convolution_primitives(x, w, y, 4, conv.input_grad,
                                                                           conv.weight_grad, 1)
               if key not in seen]
        seen.update(key for key, _ in new)
        rule = sum(size for _, size in dict(new).items())
        if conv is WARM_UP:
            continue
        kept = measured["forward"] + measured["backward"]
        gaps.append(rule - kept)
        kept_total += kept
        rule_total += rule

        def summary(made: list[str]) -> str:
            convolutions = [m for m in made if " " in m]
            reorders = len(made) - len(convolutions)
            return ", ".join(convolutions + ([f"{reorders} reorders"] if reorders else [])) or "-"

        print(f"| {conv.name} | {summary(created(forward_log))} | {summary(created(backward_log))} | {kept:,} "
              f"| {measured['transient']:+,} | {rule:,} | {rule - kept:+,} |")
    print()
    gaps.sort()
    print(f"rule - kept: median {gaps[len(gaps) // 2]:+,} B, from {gaps[0]:+,} to {gaps[-1]:+,} B; in all "
          f"{rule_total:,} B by the rule, {kept_total:,} B kept ({100 * (rule_total - kept_total) / kept_total:+.1f}%)")


def _preload_counter(environment: dict[str, str]) -> None:
    """Preload the malloc counter into a child's environment (built from ../shared/tools or $ONNXMEM_TOOLS), unless
    it is there."""
    counter_source = Path(os.environ.get("ONNXMEM_TOOLS", ROOT.parent / "shared" / "tools")) / "malloc_counter.c"
    if "malloc_counter" not in environment.get("LD_PRELOAD", "") and counter_source.exists():
        library = Path(tempfile.mkdtemp()) / "libmalloc_counter.so"
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(counter_source)], check=True)
        environment["LD_PRELOAD"] = str(library)


def child(threads: int) -> None:
    """Measure each conv (the parent reads oneDNN's log between the lines)."""
    torch.set_num_threads(threads)
    libc = ctypes.CDLL(None)
    for conv in CONVS:
        result = measure(conv)
        libc.fflush(None)  # oneDNN's log lines of this conv before its result
        print("@@", json.dumps(result), flush=True)


def paths(log: list[str]) -> str:
    """Give the oneDNN implementations of one conv's backward from its verbose lines (slow_conv2d: none)."""
    kinds = {}
    for line in log:
        fields = line.split(",")
        if len(fields) > 7 and fields[3] == "exec" and fields[5] == "convolution" \
                and fields[7] != "forward_training":
            kinds[fields[7].replace("backward_", "")] = fields[6]
    return ", ".join(f"{k}: {v}" for k, v in kinds.items()) or "slow_conv2d"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="PyTorch's intra-op threads")
    parser.add_argument("--primitives", action="store_true",
                        help="oneDNN's primitives each convolution creates and the heap they keep, against the rule")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-primitives", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.threads)
        return
    if args.child_primitives:
        child_primitives()
        return
    if args.primitives:
        main_primitives()
        return
    environment = {**os.environ, "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": str(args.threads)}
    _preload_counter(environment)
    lines = subprocess.run([sys.executable, __file__, "--child", "--threads", str(args.threads)], env=environment,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    print(f"torch {torch.__version__}, CPU ({torch.backends.cpu.get_cpu_capability()}), {args.threads} thread(s), "
          "fp32; "
          "scratch = backward's peak above its start less the gradients it returns: c10 (the profiler: PyTorch's "
          "allocator) and heap (the malloc counter: every heap byte); error = (rule - heap) / the backward's peak "
          "(its gradients and the heap scratch)")
    print()
    print("| convolution | x | w | path (oneDNN backward kernels) | c10 scratch | heap scratch | rule | rule - heap "
          "| error |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    log: list[str] = []
    errors: list[float] = []
    gaps: list[int] = []
    heap = None
    results = iter(CONVS)
    for line in lines:
        if not line.startswith("@@"):
            log.append(line)
            continue
        conv, measured = next(results), json.loads(line[3:])
        rule = cpu_convolution_scratch(tuple(measured["x"]), tuple(measured["w"]), tuple(measured["y"]), 4,
                                       4 * conv.cout if conv.bias else 0, conv.input_grad, conv.weight_grad,
                                       args.threads)
        assert rule is not None, asdict(conv)
        scratch, heap = measured["scratch"], measured["heap"]
        truth = heap if heap is not None else scratch
        error = (rule - truth) / max(measured["peak"] - scratch + truth, 1)
        errors.append(error)
        gaps.append(rule - truth)
        heap_text = f"{heap:,}" if heap is not None else "-"
        print(f"| {conv.name} | {'x'.join(map(str, measured['x']))} | {'x'.join(map(str, measured['w']))} "
              f"| {paths(log)} | {scratch:,} | {heap_text} | {rule:,} | {rule - truth:+,} | {100 * error:+.1f}% |")
        log = []
    print()
    gaps.sort()
    truth_name = "heap" if heap is not None else "c10 allocator"
    print(f"against the {truth_name}: rule - measured median {gaps[len(gaps) // 2]:+,} B, from {gaps[0]:+,} to "
          f"{gaps[-1]:+,} B; relative to the backward's peak: mean |error| "
          f"{100 * sum(map(abs, errors)) / len(errors):.2f}%, max |error| {100 * max(map(abs, errors)):.2f}%, "
          f"{sum(e < 0 for e in errors)} of {len(errors)} under")


if __name__ == "__main__":
    main()
