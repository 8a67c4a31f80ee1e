"""Single-op measurements behind the training rules written from the training zoo (benchmarks/training_zoo.py).

    python benchmarks/training_single_ops.py [--tied] [--dropout] [--gathernd] [--sdpa-heads] [--sdpa-choice]
                                             [--conv-channels-last] [--flash-fp16] [--frozen-lstm]
                                             [--gemm-conv-first-use] [--sdpa-dropout-backward] [--clone]
                                             [--linear-bias] [--elementwise] [--adam-loop]

--tied: a weight tied across two modules (an embedding and the head that reuses it, as GPT-2, Falcon and a
hand-tied model do). What PyTorch's named_parameters lists, what the dynamo exporter names the initializer, and the
gradient bytes one step makes when requires_grad is set by fnmatch patterns over named_parameters (the usual loop,
and benchmarks/training_zoo.py's), by the exported name and by named_parameters' name; the step's c10 peak beside
(PyTorch's allocator, exact, by the profiler). Behind onnxmem/training/model.py tied_weight_name.

--dropout: one Linear + Dropout(0.1) (+ the loss) stepped in train mode and with the Dropout gone (what an eval
export leaves): the c10 peak of each, and whether each export (train mode, optimize=False; eval mode, the default)
has a Dropout node. What an eval export removes, which the export-mode-unknown warning states.

--gathernd: what PyTorch saves for backward of advanced indexing (`w[idx]`, aten.index.Tensor, which the dynamo
exporter writes as GatherND; Qwen2-MoE's batched_mm gathers each token's expert weights so), by saved-tensor hooks:
the indices only, not the gathered tensor nor the indexed one. Behind SAVED_FOR_BACKWARD["GatherND"].

--sdpa-heads: what F.scaled_dot_product_attention saves on CPU (saved-tensor hooks, fp32, batch 4, 4 query heads,
32 tokens, head dim 32) where k and v have fewer heads than q: broadcast without enable_gqa (Falcon's multi-query
attention) PyTorch runs the math path, keeping q scaled and k and v expanded to q's heads (copies) and the
probabilities; with enable_gqa, flash attention. The loaded graph keeps the ATen op's tensor arguments but not its
keyword arguments; the exporter writes enable_gqa as a repeat of k among the op's own nodes, which
targets/torch/cpu/attention.py reads.

--sdpa-choice: which kernel CPU's F.scaled_dot_product_attention runs (the backward node it records: flash attention
or the math path's) for every combination of q/k heads, enable_gqa, mask, dropout and dtype (fp32; autocast to bf16):
the table behind targets/torch/cpu/attention.py.

--conv-channels-last: what one convolution's forward and backward allocate on CPU besides their results (every heap
byte: the malloc counter; fp32, one thread, the second step of each) with its input contiguous and channels-last
(a permute of an NHWC tensor, as timm's ConvNeXt blocks and PVT's token reshapes give it), against onnxmem's rule
(onnxmem.targets.torch.cpu.convolution.cpu_convolution_scratch, channels_last as targets/torch/cpu/layout.py finds
it): behind tables.py CpuConvolution's channels-last paragraph.

--flash-fp16: the heap (every malloc; a fresh process per row, one thread) of F.scaled_dot_product_attention's
forward and backward on CPU (flash attention, causal) with bf16 and with fp16 inputs, its peak and what stays
allocated after: behind targets/torch/cpu/gemm.py counting fp16's flash-attention GEMM buffers as bf16's.

--frozen-lstm: the heap peak (every malloc: the LD_PRELOAD counter, as benchmarks/accuracy_training.py measures;
each shape in a fresh process after warm_up) of a frozen nn.LSTM's forward on CPU, where nothing needs a gradient
and PyTorch runs oneDNN's inference primitive: behind targets/torch/cpu/tables.py FROZEN_LSTM_FORWARD_HEAP and the
unmodelled-kernel warning.

--gemm-conv-first-use: what the first weight gradient by oneDNN's gemm convolution (x64:gemm:jit: a kernel larger
than the input, as a 3x3 convolution on the 2x2 maps at the end of a CNN over 64x64 images) keeps in a process:
two convolutions in one fresh process (after warm_up; malloc counter, fp32, one thread), each one forward and
backward, and what each backward keeps beyond the gradients it returns; the second convolution's is its own
primitives, so the first's less that (same kind of convolution) is the one-time part. Behind tables.py
OnednnPrimitives.gemm_first_use and gemm_dense_first_use.

--sdpa-dropout-backward: the heap peak of F.scaled_dot_product_attention's backward with dropout on CPU (the math
path; q, k, v split from one fused projection as a transformer does; fp32, and under autocast to bf16) over what was
live before it (malloc counter, one thread, a fresh process per row after warm_up, the first call), against the
rule: the gradients of q, k and v the step makes at that event plus targets/torch/cpu/device.py's
_attention_backward (tables.py CpuKernel.attention_backward).

--clone: what the Linear after a head merge keeps for backward (saved-tensor hooks: the distinct storages, not the
parameters) when its input is `.transpose(1, 2).contiguous()` of another Linear's output (aten.clone: a copy, written
as an Identity by the dynamo exporter), `.reshape()` of it (also a copy), a plain view, or nn.Dropout(p=0) (the
exporter writes a clone; F.dropout returns its input); beside onnxmem's saved bytes at the start of backward
(training/model.py _is_copy). Behind an Identity marked aten.clone being a new storage outside Dropout modules.

--linear-bias: a Linear with a bias on 2-D, 3-D and non-contiguous 3-D input (a transposed view), fp32 and under
autocast to bf16, trained and frozen (its input needs a gradient either way: a learned scale before it), with the
mean as the loss: the heap peak of the forward (and loss) above what was live before it, the new storages autograd
saves (saved-tensor hooks: neither a parameter nor the input batch) and the whole first step's peak (malloc
counter, one thread, a forked child per measurement after warm_up), beside onnxmem's forward-phase peak, saved
bytes at backward start and step peak (less weights and inputs) on the op's recommended export. PyTorch's
aten.linear runs addmm on the flattened view for contiguous input (one output; it saves the input view and the
weight, not the product before the bias) and matmul then add_ in place otherwise; the dynamo exporter writes the
3-D cases as MatMul then Add (training/export.py in_place_tails: that Add writes into the product).

--elementwise: the backward of one elementwise op over a [512, 256] tensor x (fp32 or bf16) and a broadcast [256]
fp32 one s (a learned scale, a bias, an RMSNorm weight), given an fp32 output gradient, with both, x's only or s's
only gradient asked: the heap's peak above what was live before backward (malloc counter, one thread, a forked child
per row), beside onnxmem's rule (training/elementwise.py on CPU: rules.py ELEMENTWISE_GRADIENTS,
CPU's promoted copy). Behind ELEMENTWISE_GRADIENTS.

--adam-loop: one AdamW step (for-loop, PyTorch's default on CPU) over lists of fp32 parameters with gradients set:
the heap's peak above what the step leaves (its temporaries), beside onnxmem's rule (rules.py OPTIMIZERS: 2
parameter-sized temporaries per update, and the previous parameter's `denom`, which the loop's variable keeps until
the next update assigns its own). Behind OptimizerRule.held_by_loop.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.measured_run import in_fork  # noqa: E402
from benchmarks.torch_memory import c10_peak  # noqa: E402
from benchmarks.zoo import quiet  # noqa: E402


class TiedHead(nn.Module):
    def __init__(self, vocab: int = 1000, d: int = 64) -> None:
        super().__init__()
        self.wte, self.proj = nn.Embedding(vocab, d), nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(self.wte(ids)))


def tied() -> None:
    import onnx

    torch.manual_seed(0)
    model = TiedHead()
    ids = torch.randint(0, 1000, (8, 32))
    names = [n for n, _ in model.named_parameters()]
    with tempfile.TemporaryDirectory() as folder, quiet():
        path = Path(folder) / "tied.onnx"
        torch.onnx.export(model, (ids,), str(path), dynamo=True, optimize=False)
        initializers = sorted(i.name for i in onnx.load(str(path)).graph.initializer if "weight" in i.name)
    print(f"named_parameters: {names}; the dynamo export's initializers: {initializers}")
    print()
    print("| trainable by pattern (over named_parameters) | parameters reached | gradient bytes | step c10 peak |")
    print("|---|---|---:|---:|")
    for patterns in (("head.*", "proj.*"), ("wte.*", "proj.*"), ("proj.*",)):
        for name, parameter in model.named_parameters():
            parameter.grad = None
            parameter.requires_grad_(any(fnmatch.fnmatchcase(name, p) for p in patterns))
        reached = [n for n, p in model.named_parameters() if p.requires_grad]
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)

        def step(opt: torch.optim.Optimizer = opt) -> None:
            opt.zero_grad(set_to_none=True)
            out = model(ids)
            F.cross_entropy(out.reshape(-1, 1000), ids.reshape(-1)).backward()
            opt.step()

        peak = c10_peak(step)
        grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
        print(f"| {', '.join(patterns)} | {', '.join(reached)} | {grads:,} | {peak:,} |")


class DropLinear(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.fc, self.drop, self.head = nn.Linear(256, 512), nn.Dropout(p), nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(F.relu(self.fc(x))))


def dropout() -> None:
    import onnx

    x, y = torch.randn(1024, 256), torch.randint(0, 10, (1024,))
    print("| model | Dropout node in the export | step c10 peak |")
    print("|---|---|---:|")
    for label, p, export_train in (("Dropout(0.1), train mode", 0.1, True), ("Dropout removed (eval export)", 0.1,
                                                                              False)):
        torch.manual_seed(0)
        model = DropLinear(p)
        with tempfile.TemporaryDirectory() as folder, quiet():
            path = Path(folder) / "m.onnx"
            if export_train:
                torch.onnx.export(model.train(), (x,), str(path), dynamo=True, optimize=False)
            else:
                torch.onnx.export(model.eval(), (x,), str(path), dynamo=True)
            has = any(n.op_type == "Dropout" for n in onnx.load(str(path)).graph.node)
        model.train() if export_train else model.eval()  # eval: the step PyTorch would make without the Dropout
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step(model: nn.Module = model, opt: torch.optim.Optimizer = opt) -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

        print(f"| {label} | {has} | {c10_peak(step):,} |")
    print(f"\n(the Dropout's output is 1024 x 512 x 4 = {1024 * 512 * 4:,} bytes)")


def gathernd() -> None:
    import onnx

    saved: list[tuple[str, tuple[int, ...]]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append((str(t.dtype), tuple(t.shape)))
        return t

    class Index(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 64, 32))

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.w[idx]

    model, idx = Index(), torch.tensor([0, 2, 2, 1, 3, 0])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(idx)
    with tempfile.TemporaryDirectory() as folder, quiet():
        path = Path(folder) / "index.onnx"
        torch.onnx.export(model, (idx,), str(path), dynamo=True, optimize=False)
        ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    print(f"w [4, 64, 32] fp32 (requires grad), idx [6] int64: w[idx] is {list(out.shape)}; exported as {ops}; "
          f"saved for backward: {saved}")


def sdpa_heads() -> None:
    batch, heads, tokens, width = 4, 4, 32, 32
    print("| k and v heads | mask | enable_gqa | dropout | backward | saved (shape, dtype) |")
    print("|---:|---|---|---:|---|---|")
    for kv_heads, mask, gqa, p in ((4, "causal", False, 0.0), (1, "causal", False, 0.0),
                                   (1, "bool [B,1,T,T]", False, 0.0), (1, "none", False, 0.0),
                                   (1, "causal", True, 0.0), (4, "causal", False, 0.1), (1, "causal", False, 0.1),
                                   (1, "causal", True, 0.1)):
        q = torch.randn(batch, heads, tokens, width, requires_grad=True)
        k, v = (torch.randn(batch, kv_heads, tokens, width, requires_grad=True) for _ in range(2))
        attn_mask = torch.ones(batch, 1, tokens, tokens, dtype=torch.bool).tril() if mask.startswith("bool") else None
        saved: list[str] = []

        def pack(t: torch.Tensor, saved: list[str] = saved) -> torch.Tensor:
            saved.append(f"{list(t.shape)} {str(t.dtype).replace('torch.', '')}")
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=mask == "causal",
                                                 dropout_p=p, enable_gqa=gqa)
        assert out.grad_fn is not None
        print(f"| {kv_heads} | {mask} | {gqa} | {p} | {out.grad_fn.name()} | {'; '.join(saved)} |")


def sdpa_choice() -> None:
    batch, heads, tokens, width = 2, 4, 16, 32
    print("| q heads | k, v heads | enable_gqa | mask | dropout | dtype | kernel (backward node) |")
    print("|---:|---:|---|---|---:|---|---|")
    for kv_heads, gqa in ((4, False), (1, False), (1, True), (2, True)):
        for mask in ("none", "causal", "bool", "float"):
            for p in (0.0, 0.1):
                for dtype in ("fp32", "bf16"):
                    q = torch.randn(batch, heads, tokens, width, requires_grad=True)
                    k, v = (torch.randn(batch, kv_heads, tokens, width, requires_grad=True) for _ in range(2))
                    attn_mask = None
                    if mask == "bool":
                        attn_mask = torch.ones(batch, 1, tokens, tokens, dtype=torch.bool).tril()
                    elif mask == "float":
                        attn_mask = torch.zeros(batch, 1, tokens, tokens)
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=mask == "causal",
                                                             dropout_p=p, enable_gqa=gqa)
                    assert out.grad_fn is not None
                    name = out.grad_fn.name()
                    kernel = "flash" if "FlashAttention" in name else f"math ({name})"
                    print(f"| {heads} | {kv_heads} | {gqa} | {mask} | {p} | {dtype} | {kernel} |")


# (in channels, out channels, kernel, stride, image size, batch, groups)
CHANNELS_LAST_CONVS = ((160, 320, 2, 2, 4, 4, 1), (160, 320, 2, 2, 4, 8, 1), (80, 160, 2, 2, 8, 4, 1),
                       (40, 80, 3, 1, 8, 4, 1), (64, 128, 1, 1, 8, 4, 1), (40, 40, 7, 1, 16, 4, 40),
                       (40, 40, 7, 1, 32, 4, 40), (40, 40, 7, 1, 16, 8, 40), (80, 80, 7, 1, 8, 4, 80),
                       (96, 96, 7, 1, 14, 4, 96), (64, 64, 5, 1, 16, 4, 64), (64, 64, 3, 1, 16, 4, 64),
                       (160, 160, 7, 1, 4, 4, 160), (320, 320, 7, 1, 2, 4, 320))


def conv_channels_last() -> None:
    import ctypes
    import gc

    from onnxmem.targets.torch.cpu.convolution import cpu_convolution_scratch

    counter = ctypes.CDLL(None)
    counter.mc_current.restype = counter.mc_peak.restype = ctypes.c_int64

    def heap(work: Callable[[], torch.Tensor | None]) -> tuple[int, torch.Tensor | None]:
        gc.collect()
        base = counter.mc_current()
        counter.mc_reset_peak()
        made = work()
        return counter.mc_peak() - base, made

    print("| conv | groups | input | batch | layout | forward | rule | backward (weight and input) | rule "
          "| backward (input only) | rule |")
    print("|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for cin, cout, kernel, stride, size, batch, groups in CHANNELS_LAST_CONVS:
        for layout in ("contiguous", "channels-last"):
            row = []
            for weight_grad in (True, False):
                torch.manual_seed(0)
                conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=0 if kernel == stride else kernel // 2,
                                 groups=groups).requires_grad_(weight_grad)
                x = torch.randn(batch, size, size, cin).permute(0, 3, 1, 2) if layout == "channels-last" \
                    else torch.randn(batch, cin, size, size)
                x.requires_grad_(True)
                for _ in range(2):  # the second step: oneDNN's primitives made
                    conv.zero_grad(set_to_none=True)
                    x.grad = None
                    forward, y = heap(lambda conv=conv, x=x: conv(x))
                    assert y is not None
                    backward, _ = heap(lambda y=y: y.backward(torch.ones_like(y)))
                returned = sum(t.numel() * 4 for t in (x.grad, conv.weight.grad, conv.bias.grad) if t is not None)
                shapes = (tuple(x.shape), tuple(conv.weight.shape), tuple(y.shape))
                bias = 4 * cout if weight_grad else 0
                rule = cpu_convolution_scratch(*shapes, 4, bias, True, weight_grad,
                                               channels_last=layout != "contiguous")
                if weight_grad:
                    rule_forward = cpu_convolution_scratch(*shapes, 4, 0, False, False, forward=True,
                                                           channels_last=layout != "contiguous")
                    row += [f"{forward - y.numel() * 4:,}", f"{rule_forward:,}"]
                row += [f"{backward - returned - 4 * y.numel():,}", f"{rule:,}"]
            print(f"| {cin}->{cout} {kernel}x{kernel}/{stride} | {groups} | {size}x{size} | {batch} | {layout} | "
                  f"{' | '.join(row)} |")


FLASH_SHAPES = ((4, 4, 32, 32), (8, 4, 64, 32), (4, 8, 128, 64))  # batch, heads, tokens, head dim


def flash_16bit_one(dtype: str, batch: int, heads: int, tokens: int, width: int) -> None:
    """Print the heap peak of one 16-bit flash attention's forward and backward in this fresh process, and what
    stays allocated after it."""
    import ctypes
    import gc

    counter = ctypes.CDLL(None)
    counter.mc_current.restype = counter.mc_peak.restype = ctypes.c_int64
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, tokens, width, dtype=getattr(torch, dtype), requires_grad=True)
               for _ in range(3))
    gc.collect()
    base = counter.mc_current()
    counter.mc_reset_peak()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(torch.ones_like(out))
    assert out.grad_fn is not None and "FlashAttention" in out.grad_fn.name()
    print(f"@@ {counter.mc_peak() - base} {counter.mc_current() - base}")


def flash_16bit() -> None:
    print("| batch | heads | tokens | head dim | bf16 peak | fp16 peak | bf16 after | fp16 after |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for shape in FLASH_SHAPES:
        found = {}
        for dtype in ("bfloat16", "float16"):
            out = subprocess.run([sys.executable, __file__, "--flash-fp16-one", dtype, *map(str, shape)],
                                 capture_output=True, text=True, check=True).stdout
            line = next(line for line in out.splitlines() if line.startswith("@@"))
            found[dtype] = [int(v) for v in line.split()[1:]]
        bf16, fp16 = found["bfloat16"], found["float16"]
        print(f"| {' | '.join(map(str, shape))} | {bf16[0]:,} | {fp16[0]:,} | {bf16[1]:,} | {fp16[1]:,} |")


LSTM_SHAPES = ((1, 64, 128, 4, 32), (2, 64, 128, 4, 32), (1, 64, 128, 8, 32), (1, 128, 128, 4, 32),
               (1, 64, 256, 4, 32), (1, 64, 128, 4, 64))


def frozen_lstm_one(layers: int, features: int, hidden: int, batch: int, steps: int) -> None:
    """Print the heap peak of a frozen LSTM's forward in this fresh process (under the malloc counter)."""
    from benchmarks.accuracy_training import heap_peak, warm_up

    warm_up()
    torch.manual_seed(0)
    lstm = nn.LSTM(features, hidden, num_layers=layers, batch_first=True).requires_grad_(False)
    x = torch.randn(batch, steps, features)
    outputs: list[torch.Tensor] = []
    peak = heap_peak(lambda: outputs.append(lstm(x)[0]))
    print(f"@@ {peak} {outputs[0].numel() * 4}")


def frozen_lstm() -> None:
    print("| layers | features | hidden | batch | steps | forward heap peak | of which the output |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for shape in LSTM_SHAPES:
        out = subprocess.run([sys.executable, __file__, "--frozen-lstm-one", *map(str, shape)], capture_output=True,
                             text=True, check=True).stdout
        peak, output = next(line for line in out.splitlines() if line.startswith("@@")).split()[1:]
        print(f"| {' | '.join(map(str, shape))} | {int(peak):,} | {int(output):,} |")


# (in channels, out channels, kernel, image size, batch, groups): the first, then the second, in one process
GEMM_CONV_PAIRS = (((128, 128, 3, 2, 4, 1), (64, 64, 3, 2, 4, 1)), ((64, 64, 3, 2, 4, 1), (128, 128, 3, 2, 4, 1)),
                   ((32, 32, 3, 2, 8, 1), (128, 128, 3, 2, 4, 1)), ((64, 64, 5, 2, 4, 1), (128, 128, 3, 2, 4, 1)),
                   ((64, 64, 7, 4, 4, 64), (32, 32, 7, 4, 4, 32)), ((32, 32, 7, 4, 4, 32), (64, 64, 7, 4, 4, 64)),
                   ((64, 64, 7, 4, 4, 64), (128, 128, 3, 2, 4, 1)), ((128, 128, 3, 2, 4, 1), (64, 64, 7, 4, 4, 64)))


def gemm_conv_first_use_one(specs: list[int]) -> None:
    """Print what each convolution's first backward keeps beyond its gradients, in this fresh process."""
    import ctypes
    import gc

    from benchmarks.accuracy_training import warm_up

    counter = ctypes.CDLL(None)
    counter.mc_current.restype = ctypes.c_int64
    warm_up()
    kept = []
    for at in range(0, len(specs), 6):
        cin, cout, kernel, size, batch, groups = specs[at:at + 6]
        torch.manual_seed(0)
        conv = nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False, groups=groups)
        x = torch.randn(batch, cin, size, size, requires_grad=True)
        y = conv(x)
        gradient = torch.ones_like(y)
        gc.collect()
        base = counter.mc_current()
        y.backward(gradient)
        assert x.grad is not None and conv.weight.grad is not None
        kept.append(counter.mc_current() - base - 4 * (x.grad.numel() + conv.weight.grad.numel()))
    print("@@", *kept)


def gemm_conv_first_use() -> None:
    from onnxmem.targets.torch.cpu.isa import detect_cpu_isa
    from onnxmem.targets.torch.cpu.tables import CPU_ISAS

    sizes = CPU_ISAS[detect_cpu_isa()].primitives

    def name(spec: tuple[int, ...]) -> str:
        cin, cout, kernel, size, batch, groups = spec
        return f"{cin}->{cout} {kernel}x{kernel} on {size}x{size}, batch {batch}{', depthwise' if groups > 1 else ''}"

    print("| first | second | first keeps | second keeps | difference | rule (first use) |")
    print("|---|---|---:|---:|---:|---:|")
    for first, second in GEMM_CONV_PAIRS:
        out = subprocess.run([sys.executable, __file__, "--gemm-conv-first-use-one", *map(str, first + second)],
                             capture_output=True, text=True, check=True).stdout
        a, b = (int(v) for v in next(line for line in out.splitlines() if line.startswith("@@")).split()[1:])
        rule = sizes.gemm_first_use + (sizes.gemm_dense_first_use if first[5] == 1 else 0)
        print(f"| {name(first)} | {name(second)} | {a:,} | {b:,} | {a - b:+,} | {rule:,} |")


SDPA_DROPOUT_SHAPES = ((4, 4, 199, 16), (4, 4, 64, 32), (2, 8, 128, 64), (8, 2, 100, 8), (4, 4, 32, 32))


def sdpa_dropout_backward_one(batch: int, heads: int, tokens: int, width: int, autocast: int) -> None:
    """Print the backward's heap peak above what was live before it, and the gradient bytes of the fused q/k/v input,
    in this fresh process."""
    import ctypes
    import gc

    from benchmarks.accuracy_training import warm_up

    counter = ctypes.CDLL(None)
    counter.mc_current.restype = counter.mc_peak.restype = ctypes.c_int64
    warm_up()
    torch.manual_seed(0)
    x = torch.randn(batch, tokens, 3 * heads * width, requires_grad=True)
    with torch.autocast("cpu", torch.bfloat16, enabled=bool(autocast)):
        fused = x.to(torch.bfloat16) if autocast else x * 1.0
        q, k, v = fused.view(batch, tokens, 3, heads, width).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    assert y.grad_fn is not None and "Flash" not in y.grad_fn.name()
    gradient = torch.ones_like(y)
    gc.collect()
    base = counter.mc_current()
    counter.mc_reset_peak()
    torch.autograd.backward(y, gradient, inputs=[fused])
    assert fused.grad is not None
    print(f"@@ {counter.mc_peak() - base} {fused.grad.numel() * fused.grad.element_size()}")


def sdpa_dropout_backward() -> None:
    from onnxmem.targets.torch.cpu.tables import CPU_KERNELS

    kernel = CPU_KERNELS["aten::scaled_dot_product_attention(dropout)"]
    print("| batch | heads | tokens | head dim | step | backward peak | q, k, v gradients | rule | rule - peak |")
    print("|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for shape in SDPA_DROPOUT_SHAPES:
        for autocast in (0, 1):
            out = subprocess.run([sys.executable, __file__, "--sdpa-dropout-backward-one", *map(str, shape),
                                  str(autocast)], capture_output=True, text=True, check=True).stdout
            peak, grads = (int(v) for v in next(line for line in out.splitlines() if line.startswith("@@")).split()[1:])
            batch, heads, tokens, width = shape
            query = 4 * batch * heads * tokens * width
            probabilities, queries = kernel.attention_backward_autocast if autocast else kernel.attention_backward
            rule = max(grads, probabilities * query // width * tokens + queries * query)
            print(f"| {' | '.join(map(str, shape))} | {'autocast bf16' if autocast else 'fp32'} | {peak:,} "
                  f"| {grads:,} | {rule:,} | {rule - peak:+,} |")


class HeadMerge(nn.Module):
    """Linear -> tanh (which keeps its output) -> split heads -> transpose -> (how) -> merge heads -> Linear, as an
    attention's output is merged for its output projection."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.a, self.b, self.how, self.drop = nn.Linear(64, 64), nn.Linear(64, 64), how, nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        base = torch.tanh(self.a(x))
        if self.how == "contiguous":
            h = base.view(b, t, 4, 16).transpose(1, 2).contiguous().view(b, t, 64)
        elif self.how == "reshape":
            h = base.view(b, t, 4, 16).transpose(1, 2).reshape(b, t, 64)
        elif self.how == "dropout p=0":
            h = self.drop(base)
        else:  # a view
            h = base.view(b, t, 4, 16).view(b, t, 64)
        return self.b(h)


def clone() -> None:
    import onnx

    import onnxmem
    from onnxmem.targets.torch import TorchCpu
    from onnxmem.torch import export_for_training
    from onnxmem.training.step import TrainingOptions

    print("| input of the second Linear | export writes | PyTorch saves, the input batch too (B) "
          "| onnxmem saved at backward start (B) |")
    print("|---|---|---:|---:|")
    x = torch.randn(8, 32, 64)
    for how in ("contiguous", "reshape", "view", "dropout p=0"):
        torch.manual_seed(0)
        model = HeadMerge(how).train()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor, storages: dict[int, int] = storages, params: set[int] = params) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in params:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x)
        with tempfile.TemporaryDirectory() as folder, quiet():
            path = Path(folder) / "merge.onnx"
            export_for_training(model, (x[:2],), path, {"batch": 0})
            ops = sorted({n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node
                          if n.op_type in ("Identity", "Transpose", "Reshape", "Dropout")})
            report = onnxmem.analyze(path, {"batch": 8}, training=TrainingOptions(
                optimizer="sgd", device=TorchCpu(threads=1), loss="mean"))
        assert report.training is not None
        print(f"| {how} | {', '.join(ops)} | {sum(storages.values()):,} | {report.training.saved_activation_bytes:,} |")


class ScaledLinear(nn.Module):
    """A learned scale (so the Linear's input needs a gradient, as inside a model), then a Linear with a bias; with
    `transposed`, the Linear reads a transposed view of the scaled [tokens, batch, features] input."""

    def __init__(self, features: int, out: int, transposed: bool) -> None:
        super().__init__()
        self.scale, self.linear, self.transposed = nn.Parameter(torch.ones(features)), nn.Linear(features, out), \
            transposed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.scale
        return self.linear(h.transpose(0, 1) if self.transposed else h)


# (input kind, rows of the product, in features, out features); 3-D inputs are [4, rows / 4, in] (transposed: the
# batch and token axes swapped by a view)
LINEAR_BIAS_SHAPES = (("2-D", 512, 64, 512), ("2-D", 256, 256, 1024), ("3-D", 512, 64, 512),
                      ("3-D", 256, 256, 1024), ("3-D transposed", 512, 64, 512), ("3-D transposed", 256, 256, 1024))


def _linear_bias_input(kind: str, rows: int, features: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rows)
    if kind == "2-D":
        return torch.randn(rows, features, generator=generator)
    if kind == "3-D":
        return torch.randn(4, rows // 4, features, generator=generator)
    return torch.randn(rows // 4, 4, features, generator=generator)


def _linear_bias_child(kind: str, rows: int, features: int, out: int, autocast: bool, frozen: bool,
                       what: str) -> list[int]:
    from benchmarks.accuracy_training import heap_peak, warm_up

    warm_up()
    torch.manual_seed(0)
    module = ScaledLinear(features, out, kind.endswith("transposed")).train()
    module.linear.requires_grad_(not frozen)
    x = _linear_bias_input(kind, rows, features)
    opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.01)
    context = torch.autocast("cpu", torch.bfloat16, enabled=autocast)
    if what == "forward":
        parameters = {p.untyped_storage().data_ptr() for p in module.parameters()} | {x.untyped_storage().data_ptr()}
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in parameters:
                saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        kept: list[torch.Tensor] = []

        def forward() -> None:
            with context, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                kept.append(module(x).mean())

        return [heap_peak(forward), sum(saved.values())]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with context:
            y = module(x)
            loss = y.mean()
        loss.backward()
        opt.step()

    return [heap_peak(step)]


def _linear_bias_forked(*args: object) -> list[int]:
    value = in_fork(_linear_bias_child, *args)
    if not isinstance(value, list):
        raise RuntimeError(f"linear-bias {args}: {value}")
    return value


def linear_bias() -> None:
    import onnxmem
    from onnxmem.targets.torch import TorchCpu
    from onnxmem.torch import export_for_training
    from onnxmem.training.step import TrainingOptions

    print(f"torch {torch.__version__}, CPU, one thread, SGD, loss y.mean(); bytes above what was live before "
          "(weights and the input); estimate: onnxmem on the recommended export, less weights and inputs\n")
    print("| input | rows x in -> out | step | Linear | forward peak | onnxmem | saved (new) | onnxmem "
          "| step peak | onnxmem | error |")  # forward: the forward and the loss
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for kind, rows, features, out in LINEAR_BIAS_SHAPES:
            torch.manual_seed(0)
            path = Path(folder) / f"linear_{len(list(Path(folder).iterdir()))}.onnx"
            x = _linear_bias_input(kind, rows, features)
            with quiet():
                export_for_training(ScaledLinear(features, out, kind.endswith("transposed")).train(),
                                    (x[:, :2] if kind.endswith("transposed") else x[:2],), path,
                                    {"batch": 1 if kind.endswith("transposed") else 0})
            batch = x.shape[1] if kind.endswith("transposed") else x.shape[0]
            for autocast in (False, True):
                for frozen in (False, True):
                    forward, saved = _linear_bias_forked(kind, rows, features, out, autocast, frozen, "forward")
                    (step,) = _linear_bias_forked(kind, rows, features, out, autocast, frozen, "step")
                    report = onnxmem.analyze(path, {"batch": batch}, training=TrainingOptions(
                        optimizer="sgd", device=TorchCpu(threads=1), loss="mean",
                        precision="amp-bf16" if autocast else "fp32", freeze=("linear.*",) if frozen else ()))
                    training = report.training
                    assert training is not None
                    base = training.weights_bytes + training.input_bytes
                    forward_peak = max(p.peak_bytes for p in training.first_step.phases
                                       if p.phase in ("forward", "loss"))
                    estimate = training.first_step.peak_bytes - base
                    print(f"| {kind} | {rows} x {features} -> {out} | {'amp-bf16' if autocast else 'fp32'} "
                          f"| {'frozen' if frozen else 'trained'} | {forward:,} | {forward_peak - base:,} "
                          f"| {saved:,} | {training.saved_activation_bytes:,} | {step:,} | {estimate:,} "
                          f"| {100 * (estimate - step) / step:+.1f}% |", flush=True)


ELEMENTWISE_CASES = (("x * s", "Mul", False), ("s * x", "Mul", True), ("x - s", "Sub", False),
                     ("x + s", "Add", False))


def _elementwise_child(expression: str, dtype: str, x_grad: bool, s_grad: bool) -> list[int]:
    from benchmarks.accuracy_training import heap_peak, warm_up

    warm_up()
    generator = torch.Generator().manual_seed(0)
    leaf = torch.randn(512, 256, generator=generator).to(getattr(torch, dtype)).requires_grad_(x_grad)
    # (x an activation, as in a network: a leaf's AccumulateGrad would copy a gradient the caller still holds)
    x = leaf.view(512, 256) if x_grad else leaf
    s = torch.randn(256, generator=generator).requires_grad_(s_grad)
    y = {"x * s": lambda: x * s, "s * x": lambda: s * x, "x - s": lambda: x - s, "x + s": lambda: x + s}[expression]()
    gradient = torch.randn(512, 256, generator=generator)
    return [heap_peak(lambda: y.backward(gradient))]


def elementwise() -> None:
    from onnxmem.training.elementwise import elementwise_backward
    from onnxmem.training.values import StepNode, StepValue

    print(f"torch {torch.__version__}, CPU, one thread; y = op(x [512, 256], s [256] fp32), y.backward(fp32 gradient):"
          " the heap's peak above what was live before (the output gradient included there)\n")
    print("| op | x | gradients | truth | onnxmem rule | difference |")
    print("|---|---|---|---:|---:|---:|")
    for expression, op_type, scale_first in ELEMENTWISE_CASES:
        for dtype in ("float32", "bfloat16"):
            for x_grad, s_grad in ((True, True), (True, False), (False, True)):
                value = in_fork(_elementwise_child, expression, dtype, x_grad, s_grad)
                if not isinstance(value, list):
                    raise RuntimeError(f"elementwise {expression} {dtype}: {value}")
                width = 2 if dtype == "bfloat16" else 4
                x = StepValue("x", (512, 256), 512 * 256, 512 * 256 * width, True, "activation")
                s = StepValue("s", (256,), 256, 256 * 4, True, "weight")
                y = StepValue("y", (512, 256), 512 * 256, 512 * 256 * 4, True, "activation")
                node = StepNode(op_type, "", "op", "", (1, 0) if scale_first else (0, 1), (2,), 0)
                rule = elementwise_backward(node, [x, s, y], [x_grad, s_grad, False], True)
                asked = " and ".join(n for n, g in (("x", x_grad), ("s", s_grad)) if g)
                print(f"| {expression} | {dtype} | {asked} | {value[0]:,} | {rule:,} | {rule - value[0]:+,} |",
                      flush=True)


ADAM_LOOP_CASES = (("one [256, 256]", ((256, 256),)), ("eight [256, 64]", ((256, 64),) * 8),
                   ("[256, 256] then [64, 64]", ((256, 256), (64, 64))),
                   ("[64, 64] then [256, 256]", ((64, 64), (256, 256))),
                   ("[256, 256], [256], [256, 256]", ((256, 256), (256,), (256, 256))))


def _adam_loop_child(shapes: tuple[tuple[int, ...], ...]) -> list[int]:
    import ctypes
    import gc

    from benchmarks.accuracy_training import warm_up

    warm_up()
    generator = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*shape, generator=generator)) for shape in shapes]
    for p in params:
        p.grad = torch.randn(*p.shape, generator=generator)
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    counter = ctypes.CDLL(None)
    counter.mc_current.restype = counter.mc_peak.restype = ctypes.c_int64
    gc.collect()
    counter.mc_reset_peak()
    optimizer.step()
    return [int(counter.mc_peak() - counter.mc_current())]


def adam_loop() -> None:
    from onnxmem.training.rules import OPTIMIZERS

    rule = OPTIMIZERS["adamw"]
    print(f"torch {torch.__version__}, CPU, one thread; torch.optim.AdamW (for-loop), first step: the heap's peak "
          "above what the step leaves (its states made)\n")
    print("| parameters | truth | onnxmem rule | difference |")
    print("|---|---:|---:|---:|")
    for label, shapes in ADAM_LOOP_CASES:
        value = in_fork(_adam_loop_child, shapes)
        if not isinstance(value, list):
            raise RuntimeError(f"adam-loop {label}: {value}")
        sizes = [4 * math.prod(shape) for shape in shapes]
        rule_bytes = max(rule.transient_for_loop * size + (rule.held_by_loop * sizes[i - 1] if i else 0)
                         for i, size in enumerate(sizes))
        print(f"| {label} | {value[0]:,} | {rule_bytes:,} | {rule_bytes - value[0]:+,} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tied", action="store_true")
    parser.add_argument("--dropout", action="store_true")
    parser.add_argument("--gathernd", action="store_true")
    parser.add_argument("--sdpa-heads", action="store_true")
    parser.add_argument("--sdpa-choice", action="store_true")
    parser.add_argument("--conv-channels-last", action="store_true")
    parser.add_argument("--flash-fp16", action="store_true")
    parser.add_argument("--flash-fp16-one", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--frozen-lstm", action="store_true")
    parser.add_argument("--frozen-lstm-one", nargs=5, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--gemm-conv-first-use", action="store_true")
    parser.add_argument("--clone", action="store_true")
    parser.add_argument("--linear-bias", action="store_true")
    parser.add_argument("--elementwise", action="store_true")
    parser.add_argument("--adam-loop", action="store_true")
    parser.add_argument("--sdpa-dropout-backward", action="store_true")
    parser.add_argument("--sdpa-dropout-backward-one", nargs=5, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--gemm-conv-first-use-one", nargs="+", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.frozen_lstm_one:
        frozen_lstm_one(*args.frozen_lstm_one)
        return
    if args.flash_fp16_one:
        flash_16bit_one(args.flash_fp16_one[0], *map(int, args.flash_fp16_one[1:]))
        return
    if args.flash_fp16:
        from benchmarks.accuracy_training import under_malloc_counter

        under_malloc_counter()
        flash_16bit()
        return
    if args.conv_channels_last:
        from benchmarks.accuracy_training import under_malloc_counter

        under_malloc_counter()
        conv_channels_last()
        return
    if args.clone:
        clone()
        return
    if args.adam_loop:
        from benchmarks.accuracy_training import under_malloc_counter

        under_malloc_counter()
        adam_loop()
        return
    if args.elementwise:
        from benchmarks.accuracy_training import under_malloc_counter

        under_malloc_counter()
        elementwise()
        return
    if args.linear_bias:
        from benchmarks.accuracy_training import under_malloc_counter

        under_malloc_counter()
        linear_bias()
        return
    if args.sdpa_dropout_backward_one:
        sdpa_dropout_backward_one(*args.sdpa_dropout_backward_one)
        return
    if args.sdpa_dropout_backward:
        from benchmarks.accuracy_training import under_malloc_counter

        under_malloc_counter()
        sdpa_dropout_backward()
        return
    if args.gemm_conv_first_use_one:
        gemm_conv_first_use_one(args.gemm_conv_first_use_one)
        return
    if args.gemm_conv_first_use:
        from benchmarks.accuracy_training import under_malloc_counter

        under_malloc_counter()
        gemm_conv_first_use()
        return
    if args.frozen_lstm:
        from benchmarks.accuracy_training import under_malloc_counter

        under_malloc_counter()
        frozen_lstm()
        return
    if args.gathernd:
        gathernd()
        return
    if args.sdpa_heads:
        sdpa_heads()
        return
    if args.sdpa_choice:
        sdpa_choice()
        return
    everything = not (args.tied or args.dropout)
    if args.tied or everything:
        tied()
        print()
    if args.dropout or everything:
        dropout()


if __name__ == "__main__":
    main()
