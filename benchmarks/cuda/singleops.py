"""The campaign's single-op part: one operator at a time on the device, so that CUDA rules can be written from what
each one allocates, keeps and frees (whole-model rows cannot tell which op a miss comes from).

Each group is one case of the campaign (a fresh process; rows written as they are made) and stops starting
configurations after its own seconds (the rest get `budget` rows and a later window measures them). A run of an op:

    inputs made, cache emptied -> base (allocated, reserved, requested) -> peaks reset -> forward (saved tensors
    listed by saved_tensors_hooks) -> forward phase -> grad outputs made -> peaks reset -> backward -> backward phase

every figure of a phase is bytes above its base (`peak_allocated_above`: torch.cuda.max_memory_allocated minus the
allocated bytes before the op; `end_allocated_above`: what is still allocated after it), and `held_after_above` is
what stays allocated once the outputs and gradients are gone (a library's workspace kept by its handle).

Groups, in the order of value (the campaign's budget drops the last first): sdpa (backends x dtypes x head dims x
sequence x batch), allocator (scripted allocation sequences against onnxmem's replay of the caching allocator),
sdpa-variants (causal, dropout, float and bool masks, GQA with enable_gqa and with repeated key/value), lm (norms,
GELU, softmax, cross-entropy on a 50257-word vocabulary, embedding backward, dropout), conv (cuDNN with
benchmark off), linear (cuBLAS / cuBLASLt first use, in a fresh process), adamw (foreach, fused and for-loop steps
on 100M parameters), conv-bench (cuDNN with benchmark on). On the CPU (--dry-run --device cpu) each group runs a few
configurations at tiny sizes: the same code, rows of the same form, memory figures None.

    python benchmarks/cuda/singleops.py    prints the plan: configurations, runs and seconds per group
"""

from __future__ import annotations

import contextlib
import random
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Group:
    """A case of the part: its name, its own seconds on an H100 (configurations are not started after them), and
    whether it runs where no library was used yet (no warm-up: first-use growth is what it measures)."""

    name: str
    seconds: float
    fresh: bool = False


# ordered by value; the seconds add up to 250 s of measuring plus about 5 s of process start each: under 6 minutes
GROUPS = (Group("sdpa", 45), Group("allocator", 10, fresh=True), Group("sdpa-variants", 50), Group("lm", 25),
          Group("conv", 40), Group("linear", 15, fresh=True), Group("adamw", 15), Group("conv-bench", 50),
          Group("conv-more", 30))
GROUP_NAMES = tuple(g.name for g in GROUPS)
START_S = 5.0  # a case's process start on the GPU machine (torch import and CUDA context: the context rows)
BACKENDS = ("default", "flash", "efficient", "cudnn", "math")
VOCAB = 50257
CONV_FLOP_LIMIT = 2e12  # forward FLOPs above this are left out (a step of seconds; no model of ours has one)


# ---------------------------------------------------------------------------------------------------------------
# the configurations of each group (plain data, no torch: the driver plans keys from them)


def _sdpa(dtype: str, batch: int, seq: int, head_dim: int, variant: str) -> dict[str, Any]:
    return {"op": "sdpa", "dtype": dtype, "batch": batch, "heads": 8, "kv_heads": 2 if "gqa" in variant else 8,
            "seq": seq, "head_dim": head_dim, "variant": variant, "dropout_p": 0.1 if "dropout" in variant else 0.0,
            "is_causal": "causal" in variant, "mask": variant[5:] if variant.startswith("mask-") else None,
            "gqa": "repeat" if variant == "gqa-repeat" else "enable" if "gqa" in variant else None}


SDPA_VARIANTS = ("causal", "mask-float", "mask-bool", "gqa", "gqa-repeat", "dropout", "causal-dropout", "gqa-causal")
CONV_SHAPES = ((64, 64, 56), (256, 256, 14), (3, 64, 224), (64, 64, 224), (256, 256, 56), (64, 64, 14),
               (3, 64, 56), (256, 256, 224), (3, 64, 14))  # (in channels, out channels, side)
CONV_KERNELS = ("k3", "k1", "k7", "dw7")
# what the conv group leaves out and real CNNs run (the first window's rules cover stride 1 and depthwise only):
# strided stems and downsamples, grouped 3x3 (ResNeXt), wide 1x1 on small maps (ResNet-50's bottlenecks), a small
# strided 3x3 (tiny_cnn's); (in, out, side, kernel, stride, groups)
CONV_MORE = ((3, 64, 224, "k7", 2, 1), (64, 128, 56, "k3", 2, 1), (64, 128, 56, "k1", 2, 1), (128, 256, 28, "k3", 2, 1),
             (256, 512, 14, "k1", 2, 1), (512, 2048, 7, "k1", 1, 1), (1024, 256, 14, "k1", 1, 1),
             (2048, 512, 7, "k1", 1, 1), (128, 128, 28, "k3", 1, 32), (256, 256, 14, "k3", 1, 32),
             (16, 32, 32, "k3", 2, 1), (3, 16, 64, "k3", 1, 1))
ALLOCATOR_SEQUENCES = ("boundaries", "small-many", "mid", "large", "fragment", "random", "random-round4",
                       "random-split64")
# allocator settings applied (torch.cuda.memory._set_allocator_settings) before a sequence, in this order; the
# replay takes the same (roundup_power2_divisions 1 is off)
ALLOCATOR_SETTINGS = {"random-round4": "roundup_power2_divisions:4",
                      "random-split64": "roundup_power2_divisions:1,max_split_size_mb:64"}
LM_OPS: tuple[dict[str, Any], ...] = (
    {"op": "cross_entropy", "dtype": "fp32", "rows": 4096},
    {"op": "cross_entropy", "dtype": "autocast-bf16", "rows": 4096},  # bf16 logits in, autocast's fp32 copy
    {"op": "linear_cross_entropy", "dtype": "autocast-bf16", "rows": 4096, "hidden": 768},
    {"op": "linear_cross_entropy", "dtype": "fp32", "rows": 4096, "hidden": 768},
    {"op": "softmax", "dtype": "fp32", "rows": 4096},
    {"op": "cross_entropy", "dtype": "fp32", "rows": 1000},
    {"op": "layer_norm", "dtype": "fp32", "rows": 4096, "width": 1024},
    {"op": "layer_norm", "dtype": "autocast-bf16", "rows": 4096, "width": 1024},
    {"op": "layer_norm", "dtype": "bf16", "rows": 4096, "width": 1024},
    {"op": "rms_norm", "dtype": "fp32", "rows": 4096, "width": 1024},
    {"op": "rms_norm", "dtype": "autocast-bf16", "rows": 4096, "width": 1024},
    {"op": "rms_norm", "dtype": "bf16", "rows": 4096, "width": 1024},
    {"op": "gelu", "dtype": "fp32", "rows": 4096, "width": 4096, "approximate": "none"},
    {"op": "gelu", "dtype": "bf16", "rows": 4096, "width": 4096, "approximate": "none"},
    {"op": "gelu", "dtype": "fp32", "rows": 4096, "width": 4096, "approximate": "tanh"},
    {"op": "embedding", "dtype": "fp32", "rows": 4096, "hidden": 768},
    {"op": "embedding", "dtype": "bf16", "rows": 4096, "hidden": 768},
    {"op": "dropout", "dtype": "fp32", "rows": 4096, "width": 4096, "p": 0.1},
    {"op": "dropout", "dtype": "bf16", "rows": 4096, "width": 4096, "p": 0.1},
    # an elementwise op over a broadcast fp32 scale (an RMSNorm's weight, a layer scale): each input's gradient at
    # the output's size and dtype, then summed and cast (onnxmem/training/elementwise.py; CPU copies a bf16 x for
    # the product, CUDA is taken to cast as it reads: these rows say); s * x makes x's gradient first
    {"op": "mul_broadcast", "dtype": "fp32", "rows": 4096, "width": 4096, "order": "xs"},
    {"op": "mul_broadcast", "dtype": "bf16", "rows": 4096, "width": 4096, "order": "xs"},
    {"op": "mul_broadcast", "dtype": "bf16", "rows": 4096, "width": 4096, "order": "sx"},
    {"op": "sub_broadcast", "dtype": "bf16", "rows": 4096, "width": 4096, "order": "xs"},
    # attention's output as transformers writes it: SDPA, transpose(1, 2).contiguous() (aten.clone in the export:
    # a copy or not, targets/torch/cuda/device.py clone_makes_storage), view, the output projection
    {"op": "attention_out", "dtype": "bf16", "rows": 4096, "batch": 8, "heads": 16, "seq": 512, "head_dim": 64},
    {"op": "attention_out", "dtype": "fp32", "rows": 4096, "batch": 8, "heads": 16, "seq": 512, "head_dim": 64},
)
LINEAR_OPS = tuple({"op": "linear", "dtype": d, "bias": b, "rows": 4096, "in": 1024, "out": 4096}
                   for d, b in (("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True), ("fp16", True),
                                ("autocast-bf16", True), ("autocast-fp16", False)))
ADAMW_IMPLS = ("foreach", "fused", "forloop")


def _conv_flops(batch: int, cin: int, cout: int, side: int, kernel: str) -> float:
    size = 1 if kernel == "k1" else 3 if kernel == "k3" else 7
    per_output = size * size * (1 if kernel == "dw7" else cin)
    return 2.0 * batch * cout * side * side * per_output


def configs(group: str, small: bool = False) -> list[dict[str, Any]]:
    """Give the configurations of a group in the order they run (the dry run's few: `small`)."""
    if group == "sdpa":
        dtypes, dims, seqs, batches = (("bf16", "fp32"), (80,), (128,), (1,)) if small else \
            (("bf16", "fp16", "fp32"), (64, 128, 80, 256), (2048, 512, 128), (8, 1))
        return [_sdpa(t, b, s, d, "plain") for t in dtypes for d in dims for s in seqs for b in batches]
    if group == "sdpa-variants":
        dtypes, seqs, dims = (("bf16",), (512,), (64,)) if small else (("bf16", "fp32", "fp16"), (2048, 512), (128, 64))
        return [_sdpa(t, 8, s, d, v) for v in SDPA_VARIANTS for t in dtypes for s in seqs for d in dims]
    if group in ("conv", "conv-bench"):
        shapes = CONV_SHAPES[:3] if small else CONV_SHAPES
        found = []
        for batch in ((32,) if small else (32, 1, 64)):
            for dtype in ("fp32", "autocast-bf16"):
                for cin, cout, side in shapes:
                    for kernel in CONV_KERNELS:
                        if kernel == "dw7" and cin != cout or _conv_flops(batch, cin, cout, side, kernel) > \
                                CONV_FLOP_LIMIT:
                            continue
                        found.append({"op": "conv2d", "dtype": dtype, "batch": batch, "in": cin, "out": cout,
                                      "side": side, "kernel": kernel, "benchmark": group == "conv-bench"})
        return found
    if group == "conv-more":
        return [{"op": "conv2d", "dtype": dtype, "batch": batch, "in": cin, "out": cout, "side": side,
                 "kernel": kernel, "benchmark": False, "stride": stride, "groups": groups}
                for batch in ((32,) if small else (32, 64)) for dtype in ("fp32", "autocast-bf16")
                for cin, cout, side, kernel, stride, groups in (CONV_MORE[:3] if small else CONV_MORE)]
    if group == "lm":
        return [dict(c) for c in LM_OPS]
    if group == "linear":
        return [dict(c) for c in LINEAR_OPS]
    if group == "adamw":
        return [{"op": "adamw", "impl": impl, "tensors": 24, "side": 2048} for impl in ADAMW_IMPLS]
    if group == "allocator":
        names = ALLOCATOR_SEQUENCES[:2] + ALLOCATOR_SEQUENCES[-2:] if small else ALLOCATOR_SEQUENCES
        return [{"op": "allocator", "sequence": n, "settings": ALLOCATOR_SETTINGS.get(n)} for n in names]
    raise KeyError(group)


def key_of(group: str, config: dict[str, Any]) -> str:
    """Give the row key of a configuration (its nominal GPU sizes, in the dry run too)."""
    c = config
    if c["op"] == "sdpa":
        tail = f"{c['dtype']}-b{c['batch']}-q{c['seq']}-d{c['head_dim']}-{c['variant']}"
    elif c["op"] == "conv2d":
        tail = f"{c['kernel']}-{c['in']}x{c['out']}-s{c['side']}-b{c['batch']}-{c['dtype']}"
        tail += f"-st{c['stride']}" if c.get("stride", 1) != 1 else ""
        tail += f"-g{c['groups']}" if c.get("groups", 1) != 1 else ""
    elif c["op"] == "adamw":
        tail = c["impl"]
    elif c["op"] == "allocator":
        tail = c["sequence"]
    elif c["op"] == "linear":
        tail = f"{c['dtype']}-{'bias' if c['bias'] else 'nobias'}"
    else:
        extra = f"-{c['approximate']}" if "approximate" in c else f"-{c['order']}" if "order" in c else ""
        tail = f"{c['op']}-{c['dtype']}-n{c['rows']}{extra}"
    return f"singleop/{group}/{tail}"


def keys(group: str, small: bool = False) -> tuple[str, ...]:
    """Give the row keys of a group."""
    return tuple(key_of(group, c) for c in configs(group, small))


def budget_s() -> float:
    """Give the part's planned GPU seconds (its groups' seconds and process starts)."""
    return sum(g.seconds + START_S for g in GROUPS)


# ---------------------------------------------------------------------------------------------------------------
# the measuring


def _trim(message: str) -> str:
    return message.split(" (Triggered internally")[0].strip()[:200]


# errors after which the CUDA context is unusable (a kernel's fault is sticky): the process stops measuring
STICKY_ERRORS = ("CUDA error", "illegal memory access", "unspecified launch failure", "CUDNN_STATUS_EXECUTION_FAILED",
                 "CUBLAS_STATUS_EXECUTION_FAILED", "device-side assert")


class DeviceBroken(RuntimeError):
    """A kernel failed in a way that leaves the CUDA context unusable: what this process measures next is void."""


def _check_sticky(error: BaseException) -> None:
    """Raise DeviceBroken for an error that breaks the CUDA context."""
    if any(text in str(error) for text in STICKY_ERRORS):
        raise DeviceBroken(f"{type(error).__name__}: {_trim(str(error))}") from error


class Probe:
    """The device, its allocator's statistics (None on the CPU), and one measured run of an op."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.cuda = device == "cuda"
        self.device = torch.device(device)

    def sync(self) -> None:
        """Wait for the device's queued work."""
        if self.cuda:
            self.torch.cuda.synchronize()

    def release(self) -> None:
        """Give the cached blocks back to the device (no gc: nothing here makes cycles)."""
        if self.cuda:
            self.sync()
            self.torch.cuda.empty_cache()

    def base(self) -> dict[str, int] | None:
        """Give what is allocated, reserved and requested now, and start new peaks there."""
        if not self.cuda:
            return None
        self.sync()
        self.torch.cuda.reset_peak_memory_stats()
        s = self.torch.cuda.memory_stats()
        return {"allocated": s.get("allocated_bytes.all.current", 0),
                "reserved": s.get("reserved_bytes.all.current", 0),
                "requested": s.get("requested_bytes.all.current", 0), "segments": s.get("segment.all.current", 0)}

    def phase(self, base: dict[str, int] | None) -> dict[str, Any] | None:
        """Give the peaks since `base` and what is held now, each above the base."""
        if base is None:
            return None
        self.sync()
        s = self.torch.cuda.memory_stats()
        return {"base_allocated": base["allocated"], "base_reserved": base["reserved"],
                "peak_allocated_above": s.get("allocated_bytes.all.peak", 0) - base["allocated"],
                "end_allocated_above": s.get("allocated_bytes.all.current", 0) - base["allocated"],
                "peak_reserved_above": s.get("reserved_bytes.all.peak", 0) - base["reserved"],
                "end_reserved_above": s.get("reserved_bytes.all.current", 0) - base["reserved"],
                "peak_requested_above": s.get("requested_bytes.all.peak", 0) - base["requested"],
                "segments": s.get("segment.all.current", 0), "alloc_retries": s.get("num_alloc_retries", 0)}

    def held_above(self, base: dict[str, int] | None) -> int | None:
        """Give the bytes allocated now above the base (after the op's tensors are gone and the cache emptied)."""
        if base is None:
            return None
        self.release()
        return int(self.torch.cuda.memory_allocated()) - base["allocated"]

    def autocast(self, dtype: str) -> contextlib.AbstractContextManager[Any]:
        """Give autocast for 'autocast-bf16' / 'autocast-fp16', else a null context."""
        if not dtype.startswith("autocast-"):
            return contextlib.nullcontext()
        return self.torch.autocast(self.device.type, dtype=self.dtype(dtype))

    def dtype(self, name: str) -> Any:
        """Give the torch dtype of a name (autocast-X: X)."""
        torch = self.torch
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name.split("-")[-1]]

    def storage_bytes(self, tensors: Any) -> int:
        """Give the bytes of the distinct storages of the tensors."""
        seen: dict[int, int] = {}
        for t in tensors:
            if isinstance(t, self.torch.Tensor):
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def run(self, inputs: dict[str, Any], forward: Callable[[dict[str, Any]], Any],
            context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
            backward: bool = True) -> dict[str, Any]:
        """Give one measured forward (and backward) of `forward` on the inputs: each phase's figures, the output,
        saved and gradient bytes, the tensors autograd saved, and whether it ran (`allowed`)."""
        torch = self.torch
        for tensor in inputs.values():
            if isinstance(tensor, torch.Tensor):
                tensor.grad = None
        self.release()
        roles = {t.untyped_storage().data_ptr(): name for name, t in inputs.items() if isinstance(t, torch.Tensor)}
        saved: list[dict[str, Any]] = []

        def pack(tensor: Any) -> Any:
            storage = tensor.untyped_storage()
            saved.append({"shape": list(tensor.shape), "dtype": str(tensor.dtype).replace("torch.", ""),
                          "bytes": int(storage.nbytes()), "ptr": storage.data_ptr()})
            return tensor

        started = time.perf_counter()
        base = self.base()
        result: dict[str, Any] = {"allowed": True}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with context(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    output = forward(inputs)
            except RuntimeError as error:
                _check_sticky(error)
                reasons = sorted({_trim(str(w.message)) for w in caught})[:4]
                text = str(error)
                no_kernel = "No available kernel" in text or "No viable backend" in text
                return {"allowed": False, "reason": _trim(text), "warnings": reasons,
                        **({} if no_kernel else {"error": f"{type(error).__name__}: {_trim(text)}"})}
        forward_phase = self.phase(base)
        outputs = output if isinstance(output, tuple) else (output,)
        roles.update({o.untyped_storage().data_ptr(): "output" for o in outputs})
        distinct: dict[int, int] = {}
        for entry in saved:
            entry["role"] = roles.get(entry["ptr"], "new")
            if entry["role"] == "new":
                distinct[entry["ptr"]] = entry["bytes"]
        result.update(forward=forward_phase, output_bytes=self.storage_bytes(outputs),
                      saved=[{k: v for k, v in e.items() if k != "ptr"} for e in saved[:12]],
                      saved_count=len(saved), saved_new_bytes=sum(distinct.values()),
                      grad_fn=type(outputs[0].grad_fn).__name__ if outputs[0].grad_fn is not None else None)
        if backward and outputs[0].requires_grad:
            grads = [torch.ones_like(o) for o in outputs]
            backward_base = self.base()
            try:
                torch.autograd.backward(list(outputs), grads)
                result["backward"] = self.phase(backward_base)
                result["grad_bytes"] = self.storage_bytes(t.grad for t in inputs.values()
                                                          if isinstance(t, torch.Tensor) and t.grad is not None)
            except RuntimeError as error:  # a backend whose forward ran and whose backward refuses: say so
                _check_sticky(error)
                result.update(backward=None, error=f"backward: {type(error).__name__}: {_trim(str(error))}")
            del grads
        del output, outputs
        for tensor in inputs.values():
            if isinstance(tensor, torch.Tensor):
                tensor.grad = None
        result["held_after_above"] = self.held_above(base)
        result["seconds"] = round(time.perf_counter() - started, 4)
        return result


# ---------------------------------------------------------------------------------------------------------------
# the groups' measurements


def _small(value: int, divisor: int, least: int = 1) -> int:
    return max(least, value // divisor)


def measure_sdpa(probe: Probe, config: dict[str, Any], small: bool) -> dict[str, Any]:
    """Give one attention configuration's runs: the default choice, then each backend alone."""
    torch = probe.torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    c = config
    batch, seq, dim = (min(c["batch"], 2), _small(c["seq"], 64, 4), c["head_dim"] // 8) if small else \
        (c["batch"], c["seq"], c["head_dim"])
    heads, kv_heads = c["heads"], c["kv_heads"]
    dtype = probe.dtype(c["dtype"])
    generator = torch.Generator(device=probe.device).manual_seed(0)

    def leaf(h: int) -> Any:
        return torch.randn(batch, h, seq, dim, device=probe.device, dtype=dtype, generator=generator,
                           requires_grad=True)

    inputs: dict[str, Any] = {"q": leaf(heads), "k": leaf(kv_heads), "v": leaf(kv_heads)}
    if c["mask"] is not None:
        allowed = torch.ones(seq, seq, device=probe.device, dtype=torch.bool).tril().expand(batch, 1, seq, seq)
        inputs["mask"] = allowed.contiguous() if c["mask"] == "bool" else \
            torch.zeros(batch, 1, seq, seq, device=probe.device, dtype=dtype).masked_fill(~allowed, float("-inf"))
    choice: list[str] = []

    def forward(t: dict[str, Any]) -> Any:
        k, v = t["k"], t["v"]
        if c["gqa"] == "repeat":  # transformers' repeat_kv: expand, then a copy in q's heads
            k = k[:, :, None].expand(batch, kv_heads, heads // kv_heads, seq, dim).reshape(batch, heads, seq, dim)
            v = v[:, :, None].expand(batch, kv_heads, heads // kv_heads, seq, dim).reshape(batch, heads, seq, dim)
        arguments = {"attn_mask": t.get("mask"), "dropout_p": c["dropout_p"], "is_causal": c["is_causal"],
                     "enable_gqa": c["gqa"] == "enable"}
        with contextlib.suppress(Exception):
            choice.append(SDPBackend(torch._fused_sdp_choice(t["q"], k, v, **arguments)).name)
        return torch.nn.functional.scaled_dot_product_attention(t["q"], k, v, **arguments)

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    runs: dict[str, Any] = {}
    for name in BACKENDS:
        context: Callable[[], Any] = contextlib.nullcontext if name == "default" else \
            (lambda b=backends[name]: sdpa_kernel([b]))  # type: ignore[misc]
        choice.clear()
        runs[name] = probe.run(inputs, forward, context)
        runs[name]["fused_choice"] = choice[0] if choice else None
    flags = {name: bool(getattr(torch.backends.cuda, f"{name}_sdp_enabled")())
             for name in ("flash", "mem_efficient", "cudnn", "math")}  # the default's allowed set
    return {"sizes": {"batch": batch, "heads": heads, "kv_heads": kv_heads, "seq": seq, "head_dim": dim},
            "input_bytes": probe.storage_bytes(inputs.values()), "default_backend": _backend_of(runs["default"]),
            "sdp_enabled": flags, "runs": runs}


def _backend_of(run: dict[str, Any]) -> str | None:
    """Give the backend a run took, from its output's autograd node (math: any other node)."""
    name = run.get("grad_fn") or ""
    for backend in ("Flash", "Efficient", "Cudnn", "Overrideable"):
        if backend in name:
            return backend.lower()
    return "math" if run.get("allowed") else None


def measure_conv(probe: Probe, config: dict[str, Any], small: bool) -> dict[str, Any]:
    """Give one convolution's first and second run (cuDNN's algorithm search, then its cached choice)."""
    torch = probe.torch
    c = config
    declared = c.get("groups", 1)
    batch, cin, cout, side = (min(c["batch"], 2), _tiny_channels(c["in"], declared),
                              _tiny_channels(c["out"], declared), _small(c["side"], 14, 4)) \
        if small else (c["batch"], c["in"], c["out"], c["side"])
    size = {"k1": 1, "k3": 3, "k7": 7, "dw7": 7}[c["kernel"]]
    groups = cin if c["kernel"] == "dw7" else min(declared, cin)
    stride = c.get("stride", 1)
    torch.backends.cudnn.benchmark = bool(c["benchmark"])
    generator = torch.Generator(device=probe.device).manual_seed(0)
    inputs = {"x": torch.randn(batch, cin, side, side, device=probe.device, generator=generator,
                               requires_grad=cin != 3),  # a stem's image needs no gradient
              "weight": torch.randn(cout, cin // groups, size, size, device=probe.device, generator=generator,
                                    requires_grad=True)}

    def forward(t: dict[str, Any]) -> Any:
        return torch.nn.functional.conv2d(t["x"], t["weight"], stride=stride, padding=size // 2, groups=groups)

    runs = {label: probe.run(inputs, forward, lambda: probe.autocast(c["dtype"])) for label in ("first", "second")}
    return {"sizes": {"batch": batch, "in": cin, "out": cout, "side": side, "size": size, "groups": groups,
                      "stride": stride},
            "input_bytes": probe.storage_bytes(inputs.values()), "flops": _conv_flops(batch, cin, cout, side,
                                                                                       c["kernel"]),
            "cudnn": torch.backends.cudnn.version() if probe.cuda else None, "runs": runs}


def _tiny_channels(channels: int, groups: int) -> int:
    """Give the dry run's channel count for a nominal one: 3 stays 3, the others a small multiple of the groups."""
    return 3 if channels == 3 else max(8, groups) if groups > 1 else min(channels, 16) if channels > 64 else 8


def measure_lm(probe: Probe, config: dict[str, Any], small: bool) -> dict[str, Any]:
    """Give one of the language model's other ops: norms, GELU, softmax, cross-entropy, embedding, dropout."""
    torch = probe.torch
    F = torch.nn.functional  # noqa: N806 - PyTorch's own alias
    c = config
    rows = _small(c["rows"], 256, 4) if small else c["rows"]
    width = _small(c.get("width", 0), 128, 8) if small else c.get("width", 0)
    hidden = _small(c.get("hidden", 0), 32, 8) if small else c.get("hidden", 0)
    vocab = 101 if small else VOCAB
    dtype = probe.dtype(c["dtype"])
    # under autocast an op's input is what the matmul before it gave (bf16), except the LM head's own Linear
    leaf_dtype = torch.float32 if c["op"] == "linear_cross_entropy" else dtype
    generator = torch.Generator(device=probe.device).manual_seed(0)

    def randn(*shape: int, grad: bool = True, kind: Any = None) -> Any:
        return torch.randn(*shape, device=probe.device, dtype=kind or leaf_dtype, generator=generator,
                           requires_grad=grad)

    targets = torch.randint(0, vocab, (rows,), device=probe.device, generator=generator)
    op = c["op"]
    inputs: dict[str, Any]
    forward: Callable[[dict[str, Any]], Any]
    if op in ("cross_entropy", "softmax"):
        inputs = {"logits": randn(rows, vocab), **({"targets": targets} if op == "cross_entropy" else {})}
        forward = (lambda t: F.cross_entropy(t["logits"], t["targets"])) if op == "cross_entropy" else \
            (lambda t: F.softmax(t["logits"], dim=-1))
    elif op == "linear_cross_entropy":
        inputs = {"hidden": randn(rows, hidden), "weight": randn(vocab, hidden), "targets": targets}
        forward = lambda t: F.cross_entropy(F.linear(t["hidden"], t["weight"]), t["targets"])  # noqa: E731
    elif op in ("layer_norm", "rms_norm"):
        inputs = {"x": randn(rows, width), "weight": randn(width), **({"bias": randn(width)} if op == "layer_norm"
                                                                     else {})}
        forward = (lambda t: F.layer_norm(t["x"], (width,), t["weight"], t["bias"])) if op == "layer_norm" else \
            (lambda t: F.rms_norm(t["x"], (width,), t["weight"]))
    elif op == "gelu":
        inputs = {"x": randn(rows, width)}
        forward = lambda t: F.gelu(t["x"], approximate=c["approximate"])  # noqa: E731
    elif op == "embedding":
        inputs = {"weight": randn(vocab, hidden), "ids": targets}
        forward = lambda t: F.embedding(t["ids"], t["weight"])  # noqa: E731
    elif op == "dropout":
        inputs = {"x": randn(rows, width)}
        forward = lambda t: F.dropout(t["x"], p=c["p"], training=True)  # noqa: E731
    elif op in ("mul_broadcast", "sub_broadcast"):
        inputs = {"x": randn(rows, width), "scale": randn(width, kind=torch.float32)}
        forward = {("mul_broadcast", "xs"): lambda t: t["x"] * t["scale"],
                   ("mul_broadcast", "sx"): lambda t: t["scale"] * t["x"],
                   ("sub_broadcast", "xs"): lambda t: t["x"] - t["scale"]}[(op, c["order"])]
    elif op == "attention_out":
        batch, heads, seq, head = (1, 2, 8, 4) if small else (c["batch"], c["heads"], c["seq"], c["head_dim"])
        inputs = {"q": randn(batch, heads, seq, head), "k": randn(batch, heads, seq, head),
                  "v": randn(batch, heads, seq, head), "weight": randn(heads * head, heads * head)}
        forward = lambda t: F.linear(F.scaled_dot_product_attention(  # noqa: E731
            t["q"], t["k"], t["v"]).transpose(1, 2).contiguous().view(batch, seq, heads * head), t["weight"])
    else:
        raise KeyError(op)
    run = probe.run(inputs, forward, lambda: probe.autocast(c["dtype"]))
    return {"sizes": {"rows": rows, "width": width, "hidden": hidden, "vocab": vocab},
            "input_bytes": probe.storage_bytes(inputs.values()), "runs": {"first": run}}


def measure_linear(probe: Probe, config: dict[str, Any], small: bool) -> dict[str, Any]:
    """Give one Linear's forward and backward; in this group's fresh process, `held_after_above` is the cuBLAS /
    cuBLASLt workspace its first use left (the order of first uses is the configurations' order)."""
    torch = probe.torch
    c = config
    rows, fan_in, fan_out = (16, 8, 16) if small else (c["rows"], c["in"], c["out"])
    dtype = torch.float32 if c["dtype"].startswith("autocast") else probe.dtype(c["dtype"])
    generator = torch.Generator(device=probe.device).manual_seed(0)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device=probe.device, dtype=dtype, generator=generator, requires_grad=True)

    inputs = {"x": randn(rows, fan_in), "weight": randn(fan_out, fan_in), **({"bias": randn(fan_out)}
                                                                             if c["bias"] else {})}
    run = probe.run(inputs, lambda t: torch.nn.functional.linear(t["x"], t["weight"], t.get("bias")),
                    lambda: probe.autocast(c["dtype"]))
    import os

    return {"sizes": {"rows": rows, "in": fan_in, "out": fan_out}, "input_bytes": probe.storage_bytes(inputs.values()),
            "allocated_now": torch.cuda.memory_allocated() if probe.cuda else None,
            "env": {k: os.environ.get(k) for k in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
                                                   "TORCH_CUBLASLT_UNIFIED_WORKSPACE")},
            "runs": {"first": run}}


def measure_adamw(probe: Probe, config: dict[str, Any], small: bool) -> dict[str, Any]:
    """Give two AdamW steps' peaks above the parameters and gradients (the first makes the states)."""
    torch = probe.torch
    side = 16 if small else config["side"]
    count = config["tensors"]
    generator = torch.Generator(device=probe.device).manual_seed(0)
    params = [torch.randn(side, side, device=probe.device, generator=generator, requires_grad=True)
              for _ in range(count)] + [torch.randn(side, device=probe.device, generator=generator,
                                                    requires_grad=True) for _ in range(count)]
    for p in params:
        p.grad = torch.randn_like(p)
    impl = config["impl"]
    options = {"foreach": {"foreach": True}, "fused": {"fused": True}, "forloop": {"foreach": False}}[impl]
    optimizer = torch.optim.AdamW(params, lr=1e-3, **options)
    probe.release()
    steps = []
    for number in (1, 2):
        base = probe.base()
        started = time.perf_counter()
        optimizer.step()
        steps.append({"step": number, "phase": probe.phase(base), "seconds": round(time.perf_counter() - started, 4)})
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    result = {"sizes": {"tensors": 2 * count, "parameters": sum(p.numel() for p in params)},
              "parameter_bytes": probe.storage_bytes(params), "gradient_bytes": probe.storage_bytes(p.grad for p in
                                                                                                  params),
              "state_bytes": probe.storage_bytes(state), "state_tensors": len(state), "steps": steps}
    del optimizer, state, params
    probe.release()
    return result


def allocator_events(sequence: str, small: bool = False) -> list[tuple[int, bool]]:
    """Give a scripted sequence of (bytes, is a free) events, as onnxmem's allocator replay takes them: a free
    releases the latest live allocation of that many bytes."""
    mib = 2**20
    events: list[tuple[int, bool]] = []

    def alloc(*sizes: int) -> None:
        events.extend((s, False) for s in sizes)

    def free(*sizes: int) -> None:
        events.extend((s, True) for s in sizes)

    if sequence == "boundaries":  # kMinBlockSize, kSmallSize, kMinLargeAlloc, kLargeBuffer and their neighbours
        sizes = (1, 511, 512, 513, mib - 1, mib, mib + 1, 2 * mib, 10 * mib - 1, 10 * mib, 10 * mib + 1, 20 * mib,
                 20 * mib + 1)
        alloc(*sizes)
        free(*sizes[::2])
        alloc(700, mib // 2, 3 * mib, 12 * mib)
        free(*sizes[1::2], 700, mib // 2, 3 * mib, 12 * mib)
        alloc(*sizes)
    elif sequence == "small-many":  # the small pool: 2 MiB segments packed with many blocks
        rng = random.Random(1)
        sizes = [rng.choice((4, 64, 1000, 4096, 65536, 200_000, 524_288)) + rng.randrange(0, 3) * 512
                 for _ in range(40 if small else 300)]
        alloc(*sizes)
        free(*sizes[::2])
        alloc(*sizes[: len(sizes) // 3])
        free(*sizes[1::2], *sizes[: len(sizes) // 3])
    elif sequence == "mid":  # 1-10 MiB requests in 20 MiB segments: splitting and best fit
        sizes = [mib + 1, 3 * mib, 5 * mib + 12345, 9 * mib, 4 * mib, 2 * mib + 512, 7 * mib, 6 * mib]
        alloc(*sizes)
        free(sizes[1], sizes[3], sizes[5])
        alloc(2 * mib, 8 * mib, 3 * mib + 100)
        free(sizes[0], sizes[2])
        alloc(9 * mib + 7, mib + 1)
    elif sequence == "large":  # 10 MiB and over: segments of the request rounded to 2 MiB, split when reused
        alloc(30 * mib, 50 * mib + 1, 21 * mib)
        free(50 * mib + 1)
        alloc(25 * mib, 12 * mib, 11 * mib + 3)
        free(30 * mib, 25 * mib)
        alloc(40 * mib, 64 * mib)
    elif sequence == "fragment":  # freed holes too small for a later request: a new segment
        alloc(*([8 * mib] * 10))
        free(*([8 * mib] * 5))
        alloc(12 * mib, 6 * mib, 6 * mib, 16 * mib)
    else:  # random and its settings variants: log-uniform sizes, frees of random live sizes
        rng = random.Random(7)
        live: list[int] = []
        for _ in range(60 if small else 400):
            if live and rng.random() < 0.45:
                size = live.pop(rng.randrange(len(live)))
                free(size)
                continue
            size = max(1, int(2 ** rng.uniform(0, 26)))  # 1 B .. 64 MiB
            alloc(size)
            live.append(size)
    return events


def measure_allocator(probe: Probe, config: dict[str, Any], small: bool) -> dict[str, Any]:
    """Give the allocator's figures after each event of a scripted sequence (uint8 tensors of exactly the bytes)."""
    torch = probe.torch
    settings = config.get("settings")
    if settings and probe.cuda:
        torch.cuda.memory._set_allocator_settings(settings)
    events = allocator_events(config["sequence"], small)
    probe.release()
    start = probe.base()
    live: dict[int, list[Any]] = {}
    after: list[list[int]] = []
    for size, is_free in events:
        if is_free:
            live[size].pop()
        else:
            live.setdefault(size, []).append(torch.empty(size, dtype=torch.uint8, device=probe.device))
        if probe.cuda:
            s = torch.cuda.memory_stats()
            after.append([s.get("allocated_bytes.all.current", 0), s.get("reserved_bytes.all.current", 0),
                          s.get("segment.all.current", 0), s.get("requested_bytes.all.current", 0),
                          s.get("inactive_split_bytes.all.current", 0)])
    peaks = probe.phase(start)
    live.clear()
    probe.release()
    return {"settings": settings, "events": [[s, int(f)] for s, f in events], "start": start,
            "after_fields": ["allocated", "reserved", "segments", "requested", "inactive_split"],
            "after": after if probe.cuda else None, "peaks": peaks}


MEASURES: dict[str, Callable[[Probe, dict[str, Any], bool], dict[str, Any]]] = {
    "sdpa": measure_sdpa, "conv2d": measure_conv, "linear": measure_linear, "adamw": measure_adamw,
    "allocator": measure_allocator,
    **{op: measure_lm for op in ("cross_entropy", "linear_cross_entropy", "softmax", "layer_norm", "rms_norm",
                                 "gelu", "embedding", "dropout", "mul_broadcast", "sub_broadcast",
                                 "attention_out")},
}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def run_group(ctx: Any) -> None:
    """Measure the configurations of the case's group still wanted, in order, each row written as it is made;
    configurations not started within the group's seconds get a `budget` row (a later window measures them)."""
    from benchmarks.cuda.measure import Meter, error_text, is_oom, warm_up

    group = next(g for g in GROUPS if g.name == ctx.spec["name"])
    seconds = float(ctx.spec.get("args", {}).get("seconds", group.seconds))
    started = time.monotonic()
    probe = Probe(ctx.device)
    warm = None
    if not group.fresh:  # every library's workspace made before any op is measured
        warm = warm_up(Meter(ctx.device))
    broken: str | None = None
    for config in configs(group.name, ctx.small):
        key = key_of(group.name, config)
        if not ctx.wants(key):
            continue
        fields = {"group": group.name, "op": config["op"], "config": config}
        if broken is not None:  # a later process measures it (this one's CUDA context is unusable)
            ctx.row("singleop", key, **fields, error=f"not measured: {broken}", error_kind="crashed")
            continue
        elapsed = time.monotonic() - started
        if elapsed > seconds:
            ctx.row("singleop", key, **fields, error=f"not started: the group's {seconds:.0f} s were spent",
                    error_kind="budget")
            continue
        begun = time.perf_counter()
        try:
            with _quiet():
                measured = MEASURES[config["op"]](probe, config, ctx.small)
        except DeviceBroken as error:  # deterministic: done (the row says which run broke the device)
            ctx.row("singleop", key, **fields, error=f"device failed: {error}", error_kind="failed")
            broken = f"the device failed at {key}"
            continue
        except Exception as error:  # noqa: BLE001 - every failure becomes a row
            ctx.row("singleop", key, **fields, error=error_text(error), error_kind="oom" if is_oom(error) else "failed")
            probe.release()
            continue
        ctx.row("singleop", key, **fields, **measured, warm_up=warm, seconds=round(time.perf_counter() - begun, 3))


def plan_table() -> str:
    """Give the part's plan: per group, its configurations (GPU, dry run), runs of an op per configuration, its
    seconds, and the total with the process starts."""
    from benchmarks.cuda.common import table

    runs = {"sdpa": len(BACKENDS), "sdpa-variants": len(BACKENDS), "conv": 2, "conv-bench": 2}
    lines = [(g.name, len(configs(g.name)), len(configs(g.name, True)), runs.get(g.name, 1),
              "fresh" if g.fresh else "warmed", f"{g.seconds:.0f}") for g in GROUPS]
    total = f"total: {budget_s():.0f} s of GPU time ({sum(g.seconds for g in GROUPS):.0f} s measuring, " \
            f"{len(GROUPS)} process starts of {START_S:.0f} s)"
    return table(("group", "configs", "dry run", "runs each", "process", "seconds"), lines) + "\n" + total


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
    print(plan_table())
