"""The campaign's measurers: one case in this fresh process, its rows appended to the campaign's rows file.

    python benchmarks/cuda/measure.py '{"part": "training", "name": "resnet18", "keys": [...], "rows": "...",
                                       "work": "...", "device": "cuda", "dry_run": false, ...}'

Parts: singleop (one operator at a time: singleops.py), env (the machine), context (the CUDA context and one
library's first use), training (real steps per phase), memtracker (PyTorch's MemTracker, real and under
FakeTensorMode), fit (onnxmem.fit's answer trained for real), estimate (the export and onnxmem's estimate, CPU
only), ort (onnxmem.validate on the CUDA provider), selftest (the runner's own checks: ok, crash, hang). Every
failure is a row with its error; torch is imported inside the parts.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.cuda.common import RowWriter, make_row  # noqa: E402

OPTIMIZERS = ("sgd", "adamw")
PRECISIONS = ("fp32", "amp-bf16", "amp-fp16")
# (variant, optimizer, precision): the full grid, then the frozen backbone and the low-rank adapters
CONFIGS: tuple[tuple[str, str, str], ...] = (
    *(("full", o, p) for o in OPTIMIZERS for p in PRECISIONS),
    *((v, "adamw", p) for v in ("frozen", "lora") for p in ("fp32", "amp-bf16")),
)
MEMTRACKER_CONFIGS = (("full", "adamw", "fp32"), ("full", "sgd", "fp32"), ("full", "adamw", "amp-bf16"))
STEPS = 3
FIT_LIMIT = 16384  # the largest batch fit searches: a step at it stays short on a GPU
MAX_BISECT_S = 60  # fit's measured-max bisection stops starting probes after this
LIBRARIES = ("context", "cublas", "cublaslt", "cudnn", "all")
OPT_LEVELS = ("disable", "basic", "extended", "all")
ORT_BATCHES = (1, 8)
ORT_MODELS = ("tiny_cnn", "resnet18", "bert")
EXPORT_LIMIT = 8 * 2**20  # exports larger than this (graph only, weights stripped; ~5% of it zipped) stay behind
STAT_KEYS = (
    "allocated_bytes.all.peak", "allocated_bytes.large_pool.peak", "allocated_bytes.small_pool.peak",
    "requested_bytes.all.peak", "active_bytes.all.peak", "inactive_split_bytes.all.peak",
    "reserved_bytes.all.current", "reserved_bytes.all.peak", "reserved_bytes.large_pool.current",
    "reserved_bytes.small_pool.current", "segment.all.current", "segment.all.peak", "segment.large_pool.current",
    "segment.small_pool.current", "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
)


def training_key(model: str, variant: str, optimizer: str, precision: str) -> str:
    """Give the key of a training row."""
    return f"training/{model}/{variant}/{optimizer}/{precision}"


def estimate_key(model: str, variant: str, optimizer: str, precision: str) -> str:
    """Give the key of an estimate row."""
    return f"estimate/{model}/{variant}/{optimizer}/{precision}"


def export_key(model: str, graph: str) -> str:
    """Give the key of an export row (graph: full or lora)."""
    return f"export/{model}/{graph}"


# ---------------------------------------------------------------------------------------------------------------
# the device and its meter


class Meter:
    """PyTorch's CUDA allocator statistics, or nothing on the CPU (a dry run records None)."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.cuda = device == "cuda"
        self.device = torch.device(device)

    def sync(self) -> None:
        """Wait for the device's queued work."""
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> None:
        """Start a new peak at what is allocated now."""
        if self.cuda:
            self.sync()
            self.torch.cuda.reset_peak_memory_stats()

    def now(self) -> dict[str, int | None]:
        """Give the allocated and reserved bytes now."""
        if not self.cuda:
            return {"allocated": None, "reserved": None}
        return {"allocated": self.torch.cuda.memory_allocated(), "reserved": self.torch.cuda.memory_reserved()}

    def phase(self) -> dict[str, int | None]:
        """Give the peak since the last reset and what is held at the end."""
        if not self.cuda:
            return {"peak_allocated": None, "peak_reserved": None, "peak_requested": None, "end_allocated": None,
                    "end_reserved": None}
        self.sync()
        stats = self.torch.cuda.memory_stats()
        return {"peak_allocated": self.torch.cuda.max_memory_allocated(),
                "peak_reserved": self.torch.cuda.max_memory_reserved(),
                "peak_requested": stats.get("requested_bytes.all.peak"),
                "end_allocated": self.torch.cuda.memory_allocated(),
                "end_reserved": self.torch.cuda.memory_reserved()}

    def stats(self) -> dict[str, int] | None:
        """Give the selected memory_stats() keys."""
        if not self.cuda:
            return None
        stats = self.torch.cuda.memory_stats()
        return {k: stats[k] for k in STAT_KEYS if k in stats}

    def free(self) -> None:
        """Free what Python no longer holds and give the cache back to the device."""
        gc.collect()
        if self.cuda:
            self.sync()
            self.torch.cuda.empty_cache()

    def mem_get_info(self) -> tuple[int, int] | None:
        """Give (free, total) device bytes from the driver (None on the CPU)."""
        if not self.cuda:
            return None
        free, total = self.torch.cuda.mem_get_info()
        return int(free), int(total)


def warm_up(meter: Meter) -> dict[str, Any]:
    """Give what the libraries' first use leaves allocated: matrix products in fp32, bf16 and fp16 (cuBLAS and
    cuBLASLt workspaces), a convolution forward and backward (cuDNN), under autocast too; made once before any
    model so that every step measured finds them made."""
    torch = meter.torch
    before = meter.now()
    device = meter.device
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        if not meter.cuda and dtype == torch.float16:
            continue
        a = torch.randn(64, 128, device=device, dtype=dtype, requires_grad=True)
        w = torch.randn(96, 128, device=device, dtype=dtype, requires_grad=True)
        b = torch.randn(96, device=device, dtype=dtype, requires_grad=True)
        torch.nn.functional.linear(a, w, b).sum().backward()
        (a @ w.t()).sum().backward()
        x = torch.randn(2, 4, 16, 16, device=device, dtype=dtype, requires_grad=True)
        k = torch.randn(8, 4, 3, 3, device=device, dtype=dtype, requires_grad=True)
        torch.nn.functional.conv2d(x, k, padding=1).sum().backward()
        del a, w, b, x, k
    meter.free()
    after = meter.now()
    return {"before": before, "after": after,
            "left_allocated": None if after["allocated"] is None else after["allocated"] - (before["allocated"] or 0)}


def autocast(meter: Meter, precision: str) -> contextlib.AbstractContextManager[Any]:
    """Give the autocast context of a precision (a null context for fp32)."""
    torch = meter.torch
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "amp-bf16" else torch.float16
    return torch.autocast(meter.device.type, dtype=dtype)


def make_optimizer(meter: Meter, name: str, parameters: list[Any]) -> Any:
    """Give the optimizer with PyTorch's defaults on the device (foreach on CUDA)."""
    torch = meter.torch
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=0.01)
    return torch.optim.AdamW(parameters, lr=1e-3)


def train_patterns(spec: Any, variant: str) -> tuple[str, ...]:
    """Give the fnmatch patterns of the parameters a variant trains (empty: all of them)."""
    from benchmarks.cuda import models

    return models.LORA_PATTERNS if variant == "lora" else tuple(spec.heads) if variant == "frozen" else ()


def tensor_bytes(tensors: Any) -> int:
    """Give the bytes of the tensors' storages."""
    return int(sum(t.numel() * t.element_size() for t in tensors))


# ---------------------------------------------------------------------------------------------------------------
# a training step, phase by phase


class Trainer:
    """One model on the device with its optimizer, inputs and targets, that runs measured training steps."""

    def __init__(self, meter: Meter, spec: Any, small: bool, variant: str, optimizer: str, precision: str,
                 batch: int) -> None:
        from benchmarks.cuda import models

        torch = meter.torch
        self.meter, self.spec, self.precision, self.batch = meter, spec, precision, batch
        self.before_model = meter.now()
        model = models.build(spec, small, variant)
        cpu_inputs = spec.inputs(batch, small)
        with torch.no_grad():
            shape = model.eval()(*(x[:1] for x in cpu_inputs)).shape
        model.train()
        shape = (batch, *shape[1:])
        self.targets = models.targets_for(spec, torch.Size(shape), batch, small).to(meter.device)
        self.model = model.to(meter.device)
        self.inputs = tuple(x.to(meter.device) for x in cpu_inputs)
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(meter, optimizer, self.trainable)
        self.scaler = torch.amp.GradScaler(meter.device.type) if precision == "amp-fp16" else None
        self.loss_of = models.loss_of

    def sizes(self) -> dict[str, int]:
        """Give the model's parameter, buffer, input and target sizes."""
        params = list(self.model.parameters())
        return {"parameters": sum(p.numel() for p in params),
                "trainable_parameters": sum(p.numel() for p in self.trainable),
                "parameter_bytes": tensor_bytes(params), "buffer_bytes": tensor_bytes(self.model.buffers()),
                "input_bytes": tensor_bytes(self.inputs), "target_bytes": tensor_bytes([self.targets])}

    def step(self, number: int) -> dict[str, Any]:
        """Give one step's memory: before it, per phase (forward, loss, backward, optimizer) and its peak."""
        meter = self.meter
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        before = meter.now()
        phases: dict[str, Any] = {}
        meter.reset_peak()
        with autocast(meter, self.precision):
            output = self.model(*self.inputs)
        phases["forward"] = meter.phase()
        meter.reset_peak()
        with autocast(meter, self.precision):
            loss = self.loss_of(output, self.targets)
        phases["loss"] = meter.phase()
        meter.reset_peak()
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        phases["backward"] = meter.phase()
        meter.reset_peak()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        phases["optimizer"] = meter.phase()
        value = float(loss.detach().float().item())
        del output, loss  # the loop holds the output and the loss until the step ends
        meter.sync()
        after = meter.now()
        peaks = [p["peak_allocated"] for p in phases.values() if p["peak_allocated"] is not None]
        reserved = [p["peak_reserved"] for p in phases.values() if p["peak_reserved"] is not None]
        return {"step": number, "before": before, "after": after, "phases": phases,
                "peak_allocated": max(peaks) if peaks else None, "peak_reserved": max(reserved) if reserved else None,
                "stats": meter.stats(), "loss": value, "seconds": round(time.perf_counter() - started, 4)}

    def close(self) -> None:
        """Drop the model, its optimizer and tensors, and give the memory back."""
        del self.model, self.inputs, self.targets, self.trainable, self.optimizer, self.scaler
        self.meter.free()


def is_oom(error: BaseException) -> bool:
    """Say whether an error is the device running out of memory (torch.OutOfMemoryError, or its message)."""
    return type(error).__name__ == "OutOfMemoryError" or "out of memory" in str(error).lower()


# what a tool cannot do on a model, every time (FakeTensorMode on a data-dependent op, a kernel's meta function
# that refuses fp32): an `unsupported` row, done, never tried again
UNSUPPORTED_ERRORS = ("DataDependentOutputException", "DynamicOutputShapeException", "GuardOnDataDependentSymNode",
                      "UnsupportedOperatorException")
UNSUPPORTED_MESSAGES = ("Expected inputs of BF16 type",)


def is_unsupported(error: BaseException) -> bool:
    """Say whether an error says the tool cannot run this model at all (not a fault of the harness)."""
    return type(error).__name__ in UNSUPPORTED_ERRORS or any(m in str(error) for m in UNSUPPORTED_MESSAGES)


def error_text(error: BaseException) -> str:
    """Give an error's type, message (cut) and the last frames of its traceback."""
    frames = traceback.format_exception(type(error), error, error.__traceback__)
    return (f"{type(error).__name__}: {str(error)[:600]} | " + "".join(frames[-3:])[-900:]).strip()


# ---------------------------------------------------------------------------------------------------------------
# the parts


class Context:
    """What every part gets: the case's spec, the row writer and a row maker that fills the common fields."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.writer = RowWriter(Path(spec["rows"]))
        self.keys = set(spec.get("keys", ()))
        self.device = spec.get("device", "cuda")
        self.dry_run = bool(spec.get("dry_run", False))
        self.small = bool(spec.get("small", self.dry_run))
        self.work = Path(spec.get("work", "."))
        self.case = spec.get("case", "")

    def wants(self, key: str) -> bool:
        """Say whether the key is still to be measured."""
        return key in self.keys

    def row(self, kind: str, key: str, **fields: Any) -> dict[str, Any]:
        """Give the row written (the common fields filled)."""
        return self.writer.write(make_row(kind, key, self.case, device=self.device, dry_run=self.dry_run,
                                          **fields))

    @contextlib.contextmanager
    def guarded(self, kind: str, key: str, unsupported: Callable[[BaseException], bool] | None = None,
                **fields: Any) -> Iterator[dict[str, Any]]:
        """Run the block; write the row it filled, or an error row if it raised (`unsupported` says which errors
        are the tool's limits: an `unsupported` row)."""
        row: dict[str, Any] = {}
        started = time.perf_counter()
        try:
            yield row
        except Exception as error:  # noqa: BLE001 - every failure becomes a row
            error_kind = "oom" if is_oom(error) else "unsupported" if unsupported and unsupported(error) \
                else "failed"
            self.row(kind, key, **{"seconds": round(time.perf_counter() - started, 2), **fields,
                                   "error": error_text(error), "error_kind": error_kind})
            return
        self.row(kind, key, **{"seconds": round(time.perf_counter() - started, 2), **fields, **row})


def nvml_used() -> dict[str, Any]:
    """Give the device's used bytes (NVML through pynvml, else nvidia-smi) and this process's, where visible."""
    pid = os.getpid()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            own = None
            with contextlib.suppress(Exception):
                for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if process.pid == pid:
                        own = int(process.usedGpuMemory or 0)
            return {"source": "pynvml", "used": int(info.used), "total": int(info.total), "process": own}
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no pynvml, no driver: try the command
        pass
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20, check=True).stdout
        used, total = (int(float(v)) * 2**20 for v in text.splitlines()[0].split(","))
        return {"source": "nvidia-smi", "used": used, "total": total, "process": None}
    except Exception as error:  # noqa: BLE001 - no GPU here (a dry run)
        return {"source": None, "used": None, "total": None, "process": None, "error": str(error)[:200]}


def rss_bytes() -> int | None:
    """Give this process's resident set size (the dry run's stand-in for device memory)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def part_env(ctx: Context) -> None:
    """Write the environment row: the GPU, its memory from torch and nvidia-smi, the driver, CUDA, versions."""
    with ctx.guarded("env", "env") as row:
        import importlib.metadata as metadata

        import torch

        versions = {}
        for name in ("torch", "transformers", "timm", "torchvision", "onnx", "onnxscript", "onnxruntime",
                     "onnxruntime-gpu", "nvidia-ml-py", "numpy"):
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                versions[name] = None
        row.update(python=sys.version.split()[0], versions=versions, torch_cuda=torch.version.cuda,
                   cuda_available=torch.cuda.is_available(), nvml=nvml_used(), cpu_count=os.cpu_count(),
                   env={k: os.environ.get(k) for k in ("CUDA_MODULE_LOADING", "PYTORCH_CUDA_ALLOC_CONF",
                                                       "CUBLAS_WORKSPACE_CONFIG", "CUDA_VISIBLE_DEVICES")})
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,memory.used,driver_version",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
            row["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()[:200]
        except (OSError, subprocess.SubprocessError) as error:
            row["nvidia_smi"] = f"unavailable: {error}"
        backends: dict[str, Any] = {"matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                                    "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
                                    "cudnn_benchmark": torch.backends.cudnn.benchmark}
        with contextlib.suppress(Exception):
            backends["preferred_blas_library"] = str(torch.backends.cuda.preferred_blas_library())
        row["backends"] = backends
        if ctx.device == "cuda" and torch.cuda.is_available():
            properties = torch.cuda.get_device_properties(0)
            free, total = torch.cuda.mem_get_info()
            row.update(gpu=properties.name, total_memory_torch=int(properties.total_memory),
                       capability=f"{properties.major}.{properties.minor}",
                       multiprocessors=properties.multi_processor_count, mem_get_info={"free": free, "total": total},
                       cudnn=torch.backends.cudnn.version())


def part_context(ctx: Context) -> None:
    """Write the row of the CUDA context and one library's first use (ctx.spec name: context, cublas, cublaslt,
    cudnn or all), NVML's device-wide used bytes and torch.cuda.mem_get_info at each stage."""
    library = ctx.spec["name"]
    with ctx.guarded("context", f"context/{library}", library=library) as row:
        stages: dict[str, Any] = {"start": {"nvml": nvml_used(), "rss": rss_bytes()}}
        started = time.perf_counter()
        import torch

        stages["torch_imported"] = {"rss": rss_bytes(), "seconds": round(time.perf_counter() - started, 3)}
        cuda = ctx.device == "cuda"
        device = torch.device(ctx.device)

        def stage(name: str) -> None:
            if cuda:
                torch.cuda.synchronize()
            entry: dict[str, Any] = {"nvml": nvml_used() if cuda else None, "rss": rss_bytes(),
                                     "seconds": round(time.perf_counter() - started, 3)}
            if cuda:
                free, total = torch.cuda.mem_get_info()
                entry.update(mem_get_info_free=free, mem_get_info_total=total,
                             allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved())
            stages[name] = entry

        torch.zeros(1, device=device)  # the context (lazy module loading: kernels load on first use)
        stage("context")
        if library in ("cublas", "all"):
            a = torch.randn(1024, 1024, device=device)
            (a @ a).sum().item()
            stage("cublas")
        if library in ("cublaslt", "all"):
            dtype = torch.bfloat16
            x = torch.randn(256, 512, device=device, dtype=dtype)
            w = torch.randn(1024, 512, device=device, dtype=dtype)
            b = torch.randn(1024, device=device, dtype=dtype)
            torch.nn.functional.linear(x, w, b).float().sum().item()  # addmm with a bias: cuBLASLt's epilogue
            stage("cublaslt")
        if library in ("cudnn", "all"):
            x = torch.randn(8, 32, 64, 64, device=device, requires_grad=True)
            k = torch.randn(64, 32, 3, 3, device=device, requires_grad=True)
            torch.nn.functional.conv2d(x, k, padding=1).sum().backward()
            stage("cudnn")
        deltas = {}
        names = list(stages)
        for previous, current in zip(names, names[1:], strict=False):
            used = [(stages[n].get("nvml") or {}).get("used") for n in (previous, current)]
            if None not in used:
                deltas[current] = used[1] - used[0]
        row.update(stages=stages, nvml_delta=deltas, cudnn=torch.backends.cudnn.version() if cuda else None,
                   lazy_loading=os.environ.get("CUDA_MODULE_LOADING", "default (lazy)"))


def part_training(ctx: Context) -> None:
    """Write one row per configuration of one model: steps 1-3, each phase's peaks, the allocator's statistics."""
    import torch

    from benchmarks.cuda import models

    spec = models.SPECS[ctx.spec["name"]]
    meter = Meter(ctx.device)
    torch.backends.cudnn.benchmark = False
    warm = warm_up(meter)
    batch = spec.dry_batch if ctx.small else spec.batch
    for index, (variant, optimizer, precision) in enumerate(CONFIGS):
        key = training_key(spec.name, variant, optimizer, precision)
        if not ctx.wants(key):
            continue
        fields = {"model": spec.name, "family": spec.family, "variant": variant, "optimizer": optimizer,
                  "precision": precision, "batch": batch, "dims": {"batch": batch}, "config_index": index,
                  "train": list(train_patterns(spec, variant))}
        with ctx.guarded("training", key, **fields) as row:
            trainer = Trainer(meter, spec, ctx.small, variant, optimizer, precision, batch)
            try:
                row.update(warm_up=warm, before_model=trainer.before_model, **trainer.sizes())
                row["baseline"] = meter.now()
                row["steps"] = [trainer.step(n) for n in range(1, STEPS + 1)]
            finally:
                trainer.close()
        meter.free()  # also after a failure: the next configuration starts from an empty cache


def _load_onnxmem() -> Any:
    import onnxmem

    return onnxmem


def training_options(onnxmem: Any, device: str, optimizer: str, precision: str, train: tuple[str, ...] = ()) \
        -> Any:
    """Give onnxmem's TrainingOptions of a configuration (cross-entropy on the first output)."""
    return onnxmem.TrainingOptions(optimizer=optimizer, precision=precision, device=device, loss="cross_entropy",
                                   train=train)


def estimate_fields(report: Any) -> dict[str, Any]:
    """Give the training report's figures a score needs: both steps' peaks and phases, and each part."""
    training = report.training

    def step(s: Any) -> dict[str, Any]:
        return {"peak_bytes": s.peak_bytes, "peak_phase": s.peak_phase, "peak_event": s.peak_event,
                "phases": {p.phase: {"peak_bytes": p.peak_bytes, "end_bytes": p.end_bytes}
                           for p in s.phases}}

    return {"peak_bytes": training.peak_bytes, "first_step": step(training.first_step),
            "later_step": step(training.later_step), "weights_bytes": training.weights_bytes,
            "gradient_bytes": training.gradient_bytes, "optimizer_state_bytes": training.optimizer_state_bytes,
            "saved_activation_bytes": training.saved_activation_bytes, "input_bytes": training.input_bytes,
            "trainable_parameters": training.trainable_parameters, "optimizer_impl": training.optimizer_impl,
            "unknown_backward_ops": list(training.unknown_backward_ops),
            "warnings": sorted({w.code for w in report.warnings})}


def export_graph(spec: Any, small: bool, graph: str, folder: Path) -> tuple[Path, dict[str, Any]]:
    """Give the path of the graph-only ONNX export of a model (export_for_training, dynamic batch; weights moved
    to an external file that is then deleted: onnxmem reads shapes, not values) and its facts."""
    import onnx

    from benchmarks.cuda import models
    from onnxmem.torch import export_for_training

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{spec.name}.{graph}.onnx"
    started = time.perf_counter()
    model = models.build(spec, small, "lora" if graph == "lora" else "full")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        with models.onnx_export_translations():  # what the exporter cannot translate (MoE experts)
            export_for_training(model, spec.inputs(2, small), path, {"batch": 0})
    exported = time.perf_counter() - started
    proto = onnx.load(str(path))
    whole = path.stat().st_size
    data = path.name + ".data"
    onnx.save(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data,
              size_threshold=0)
    (folder / data).unlink(missing_ok=True)
    return path, {"bytes": path.stat().st_size, "bytes_with_weights": whole, "nodes": len(proto.graph.node),
                  "export_seconds": round(exported, 2), "opset": {o.domain or "ai.onnx": o.version
                                                                  for o in proto.opset_import}}


def part_estimate(ctx: Context) -> None:
    """Write the export rows of one model (full and LoRA graphs), copy the small ones to work/exports, and write
    onnxmem's estimate of every training configuration (computed here, on the CPU)."""
    from benchmarks.cuda import models

    spec = models.SPECS[ctx.spec["name"]]
    onnxmem = _load_onnxmem()
    batch = spec.dry_batch if ctx.small else spec.batch
    folder = ctx.work / "graphs"
    shipped = ctx.work / "exports"
    paths: dict[str, Path] = {}
    for graph in ("full", "lora"):
        wanted = [c for c in CONFIGS if (c[0] == "lora") == (graph == "lora")
                  and ctx.wants(estimate_key(spec.name, *c))]
        if not ctx.wants(export_key(spec.name, graph)) and not wanted:
            continue
        with ctx.guarded("export", export_key(spec.name, graph), model=spec.name, graph=graph) as row:
            path, facts = export_graph(spec, ctx.small, graph, folder)
            paths[graph] = path
            row.update(facts)
            if facts["bytes"] <= EXPORT_LIMIT:
                shipped.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, shipped / path.name)
                row["file"] = path.name
            else:
                row["file"] = None
                row["note"] = f"not shipped: {facts['bytes']:,} B is over {EXPORT_LIMIT:,} B"
    for variant, optimizer, precision in CONFIGS:
        key = estimate_key(spec.name, variant, optimizer, precision)
        graph = "lora" if variant == "lora" else "full"
        if not ctx.wants(key) or graph not in paths:
            continue
        train = train_patterns(spec, variant)
        fields = {"model": spec.name, "variant": variant, "optimizer": optimizer, "precision": precision,
                  "dims": {"batch": batch}, "file": paths[graph].name, "train": list(train),
                  "training_device": ctx.device}
        with ctx.guarded("estimate", key, **fields) as row:
            report = onnxmem.analyze(str(paths[graph]), {"batch": batch},
                                     training=training_options(onnxmem, ctx.device, optimizer, precision, train),
                                     provider="cuda")
            row.update(estimate_fields(report))


def part_memtracker(ctx: Context) -> None:
    """Write PyTorch's MemTracker on the same steps: on the real device (beside max_memory_allocated), and under
    FakeTensorMode (an estimate that runs nothing)."""
    from benchmarks.cuda import models

    spec = models.SPECS[ctx.spec["name"]]
    meter = Meter(ctx.device)
    warm = warm_up(meter)
    batch = spec.dry_batch if ctx.small else spec.batch
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except Exception as error:  # noqa: BLE001
        for config in MEMTRACKER_CONFIGS:
            for mode in ("real", "fake"):
                key = f"memtracker/{spec.name}/{'/'.join(config[1:])}/{mode}"
                if ctx.wants(key):
                    ctx.row("memtracker", key, model=spec.name, mode=mode, error=f"MemTracker unavailable: {error}",
                            error_kind="failed")
        return
    for variant, optimizer, precision in MEMTRACKER_CONFIGS:
        for mode in ("real", "fake"):
            key = f"memtracker/{spec.name}/{optimizer}/{precision}/{mode}"
            if not ctx.wants(key):
                continue
            fields = {"model": spec.name, "variant": variant, "optimizer": optimizer, "precision": precision,
                      "mode": mode, "batch": batch, "dims": {"batch": batch}}
            # FakeTensorMode cannot run a data-dependent op (.item(), a branch on a tensor): unsupported
            with ctx.guarded("memtracker", key, unsupported=is_unsupported if mode == "fake" else None,
                             **fields) as row:
                if mode == "real":
                    row.update(_memtracker_real(meter, MemTracker, spec, ctx.small, optimizer, precision, batch),
                               warm_up=warm)
                else:
                    row.update(_memtracker_fake(meter, MemTracker, spec, ctx.small, optimizer, precision, batch))


def _snapshot(tracker: Any) -> dict[str, dict[str, int]]:
    """Give MemTracker's peak snapshot with plain keys: {device: {reference type: bytes}}."""
    snapshot = tracker.get_tracker_snapshot("peak")
    return {str(device): {str(getattr(k, "value", k)): int(v) for k, v in per.items()}
            for device, per in snapshot.items()}


def _memtracker_real(meter: Meter, tracker_class: Any, spec: Any, small: bool, optimizer: str, precision: str,
                     batch: int) -> dict[str, Any]:
    """Give MemTracker's peaks of the first step and of steps 2-3 on the device, with the allocator's beside."""
    trainer = Trainer(meter, spec, small, "full", optimizer, precision, batch)
    try:
        results: dict[str, Any] = {"baseline": meter.now(), **trainer.sizes()}
        tracker = tracker_class()
        tracker.track_external(trainer.model, trainer.optimizer, *trainer.inputs, trainer.targets)
        for number in range(1, STEPS + 1):
            tracker.reset_mod_stats()  # it refuses a module's second forward otherwise
            started = time.perf_counter()
            with tracker:  # entering starts a new peak
                step = trainer.step(number)
            results["first" if number == 1 else f"step{number}"] = {
                "tracker_peak": _snapshot(tracker), "step": step, "seconds": round(time.perf_counter() - started, 3)}
        return results
    finally:
        trainer.close()


def _memtracker_fake(meter: Meter, tracker_class: Any, spec: Any, small: bool, optimizer: str, precision: str,
                     batch: int) -> dict[str, Any]:
    """Give MemTracker's peak of two steps run under FakeTensorMode (nothing allocated on the device)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from benchmarks.cuda import models

    started = time.perf_counter()
    cpu_inputs = spec.inputs(batch, small)
    with torch.no_grad():
        probe = models.build(spec, small).eval()
        shape = probe(*(x[:1] for x in cpu_inputs)).shape
    del probe
    with FakeTensorMode(), meter.device:  # built on the device (moving fake parameters fails to swap them)
        model = models.build(spec, small)
        inputs = tuple(torch.zeros(x.shape, dtype=x.dtype, device=meter.device) for x in cpu_inputs)
        target_shape = (batch, *shape[1:-1]) if spec.per_token else (batch,)
        targets = torch.zeros(target_shape, dtype=torch.long, device=meter.device)
        opt = make_optimizer(meter, optimizer, [p for p in model.parameters() if p.requires_grad])
        tracker = tracker_class()
        tracker.track_external(model, opt, *inputs, targets)
        peaks = []
        for _ in range(2):
            tracker.reset_mod_stats()
            with tracker:
                opt.zero_grad(set_to_none=True)
                with autocast(meter, precision):
                    output = model(*inputs)
                    loss = models.loss_of(output, targets)
                loss.backward()
                opt.step()
                del output, loss
            peaks.append(_snapshot(tracker))
    return {"tracker_peak": peaks[-1], "tracker_peak_first": peaks[0],
            "seconds": round(time.perf_counter() - started, 3)}


def part_fit(ctx: Context) -> None:
    """Write onnxmem.fit's answer against this process's real free device memory, then train at the answer (it
    must run) and at the next batch (expected: torch.OutOfMemoryError), each for STEPS steps."""
    from benchmarks.cuda import models

    spec = models.SPECS[ctx.spec["name"]]
    onnxmem = _load_onnxmem()
    meter = Meter(ctx.device)
    warm = warm_up(meter)
    info = meter.mem_get_info()
    # the dry run has no device to fill: a pretend free memory, small enough that the batch stays small
    free = info[0] if info else int(ctx.spec.get("args", {}).get("dry_memory", 24 * 2**20))
    options = training_options(onnxmem, ctx.device, "adamw", "fp32")
    base = f"fit/{spec.name}"
    answer: dict[str, Any] = {}
    path = ctx.work / "fit" / f"{spec.name}.full.onnx"  # not the CPU lane's file, which it may be writing now
    with ctx.guarded("fit", f"{base}/answer", model=spec.name, optimizer="adamw", precision="fp32") as row:
        path, facts = export_graph(spec, ctx.small, "full", path.parent)
        started = time.perf_counter()
        result = onnxmem.fit(str(path), memory=free, runtime="pytorch", reserve=0, training=options,
                             search="batch", what_if=False, provider="cuda", limit=FIT_LIMIT)
        answer["batch"] = result.max_value if result.bounded else 0  # unbounded: no batch to try
        row.update(export=facts, free_bytes=free, mem_get_info=info, warm_up=warm, max_value=result.max_value,
                   max_power_of_two=result.max_power_of_two, bounded=result.bounded, budget_bytes=result.budget_bytes,
                   evaluations=result.evaluations, fit_seconds=round(time.perf_counter() - started, 2),
                   curve=[_plain(p) for p in result.curve][-6:], allocator=result.target.allocator)
    if not answer.get("batch"):
        return
    ran_at_answer: bool | None = None
    for label, batch in (("at-answer", answer["batch"]), ("above-answer", answer["batch"] + 1)):
        key = f"{base}/{label}"
        if ctx.wants(key):
            attempt = _fit_attempt(ctx, meter, spec, batch, answer["batch"], free,
                                   "runs" if label == "at-answer" else "oom")
            ctx.row("fit", key, **attempt)
            if label == "at-answer":
                ran_at_answer = attempt.get("ran")
    key = f"{base}/measured-max"
    if ctx.wants(key) and meter.cuda:
        # the largest batch that runs STEPS steps, by bisection: below the answer where the answer OOMed (the
        # first windows: the allocator's fragmentation), above it up to 2% more where it ran (how much fit leaves)
        probes: list[dict[str, Any]] = []
        if ran_at_answer:
            low, high = answer["batch"], answer["batch"] + max(2, answer["batch"] // 50)
            assumed = "the answer ran; the bisection assumes 2% above it OOMs (a probe there that runs is kept)"
        else:
            low, high = max(1, int(answer["batch"] * 0.85)), answer["batch"] + 1  # high: known to fail
            assumed = "the bisection starts at 85% of the answer, assumed to run"
        started = time.perf_counter()
        while high - low > max(1, answer["batch"] // 400) and time.perf_counter() - started < MAX_BISECT_S:
            middle = (low + high) // 2
            attempt = _fit_attempt(ctx, meter, spec, middle, answer["batch"], free, "probe")
            probes.append({k: attempt.get(k) for k in ("batch", "ran", "oom", "error_message", "seconds")}
                          | {"peak_allocated": max((s.get("peak_allocated") or 0 for s in attempt["steps"]),
                                                   default=None),
                             "peak_reserved": max((s.get("peak_reserved") or 0 for s in attempt["steps"]),
                                                  default=None)})
            if attempt.get("ran"):
                low = middle
            elif attempt.get("oom"):
                high = middle
            else:
                break
        ctx.row("fit", key, model=spec.name, fit_answer=answer["batch"], free_bytes=free, largest_run=low,
                smallest_oom=high, probes=probes, note=f"largest_run is a lower bound: {assumed}; it stops "
                f"within 0.25% of the answer or after {MAX_BISECT_S} s")
    key = f"{base}/defaults"
    if ctx.wants(key) and info is None:
        ctx.row("fit", key, model=spec.name, note="cpu dry run: no device memory total to fit against")
    elif ctx.wants(key):
        # what a user gets from the whole memory with the runtime's stated fixed costs (context, workspaces)
        with ctx.guarded("fit", key, model=spec.name, total_bytes=info[1]) as row:
            result = onnxmem.fit(str(path), memory=info[1], runtime="pytorch", training=options, search="batch",
                                 what_if=False, provider="cuda", limit=FIT_LIMIT)
            row.update(max_value=result.max_value, budget_bytes=result.budget_bytes,
                       reserve=[_plain(r) for r in result.target.reserve], measured_answer=answer["batch"])


def _fit_attempt(ctx: Context, meter: Any, spec: Any, batch: int, answer: int, free: int,
                 expected: str) -> dict[str, Any]:
    """Give one training run of STEPS steps at the batch: whether it ran or OOMed, with its steps."""
    steps: list[dict[str, Any]] = []  # the steps made before an OOM are kept
    attempt: dict[str, Any] = {"model": spec.name, "batch": batch, "fit_answer": answer,
                               "free_bytes": free, "expected": expected, "steps": steps}
    started = time.perf_counter()
    trainer = None
    try:
        trainer = Trainer(meter, spec, ctx.small, "full", "adamw", "fp32", batch)
        attempt.update(trainer.sizes())
        for number in range(1, STEPS + 1):
            steps.append(trainer.step(number))
        attempt["oom"] = False
    except Exception as error:  # noqa: BLE001 - an OOM is the expected answer above the fit
        if is_oom(error):
            attempt.update(oom=True, error_message=str(error)[:400])
        else:
            attempt.update(oom=None, error=error_text(error), error_kind="failed")
    finally:
        if trainer is not None:
            trainer.close()
        meter.free()
    if not meter.cuda:
        attempt["note"] = "cpu dry run: no device memory to run out of"
    attempt["ran"] = attempt.get("oom") is False
    attempt["seconds"] = round(time.perf_counter() - started, 2)
    attempt["stats_after"] = meter.stats()
    return attempt


def _plain(value: Any) -> Any:
    """Give a dataclass as builtins (fit's curve points)."""
    import dataclasses

    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def export_eval(spec: Any, small: bool, folder: Path) -> tuple[Path, str]:
    """Give the path of an eval-mode ONNX export of the model with a dynamic batch, and the name of its batch
    dim."""
    import onnx
    import torch

    from benchmarks.cuda import models

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{spec.name}.eval.onnx"
    model = models.build(spec, small).eval()
    inputs = spec.inputs(2, small)
    dynamic = tuple({0: torch.export.Dim.DYNAMIC} for _ in inputs)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), dynamo=True, dynamic_shapes=dynamic)
    proto = onnx.load(str(path), load_external_data=False)
    dim = proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    return path, dim


def part_ort(ctx: Context) -> None:
    """Write onnxmem.validate on onnxruntime's CUDA provider (the CPU provider in a dry run) for one small model
    at batch 1 and 8, each optimization level; the driver runs this part only where the provider loaded."""
    from benchmarks.cuda import models

    spec = models.SPECS[ctx.spec["name"]]
    onnxmem = _load_onnxmem()
    provider = "cuda" if ctx.device == "cuda" else "cpu"
    path: Path | None = None
    dim = "batch"
    for level in OPT_LEVELS:
        for batch in ORT_BATCHES:
            key = f"ort/{spec.name}/{level}/b{batch}"
            if not ctx.wants(key):
                continue
            with ctx.guarded("ort", key, model=spec.name, opt_level=level, batch=batch, provider=provider) as row:
                if path is None:
                    path, dim = export_eval(spec, ctx.small, ctx.work / "graphs")
                validation = onnxmem.validate(str(path), {dim: batch}, provider=provider, opt_level=level)
                result = validation.to_dict()
                row.update(dims={dim: batch}, exact=validation.exact, runs=result.get("runs"),
                           raw_estimate=result.get("raw_estimate"), settings=result.get("settings"),
                           nodes_run=result.get("nodes_run"), notes=list(result.get("notes", ()))[:6],
                           warnings=sorted({w.get("code") for w in result.get("warnings", ())
                                            if isinstance(w, dict)}))
        key = f"ort/{spec.name}/{level}/optimized"
        if ctx.wants(key):
            with ctx.guarded("ort", key, model=spec.name, opt_level=level, provider=provider) as row:
                if path is None:
                    path, dim = export_eval(spec, ctx.small, ctx.work / "graphs")
                row["optimized_graph"] = save_optimized(path, provider, level, ctx.work / "exports",
                                                        f"{spec.name}.ort-{level}.onnx")


def save_optimized(path: Path, provider: str, level: str, folder: Path, name: str) -> str | None:
    """Save the graph onnxruntime runs at an optimization level on the provider (optimized_model_filepath), its
    weights moved out and deleted as export_graph does, under the campaign's exports (zipped with the rows): the
    optimized graphs a CPU scorer needs to compare the later runs at basic and above; give its name, or None where
    onnxruntime could not write it."""
    import onnx
    import onnxruntime

    levels = {"disable": onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL}
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = levels[level]
    options.optimized_model_filepath = str(target)
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    try:
        onnxruntime.InferenceSession(str(path), options, providers=providers)
        proto = onnx.load(str(target))
    except Exception:  # noqa: BLE001 - a graph not saved is a field left empty, never a failed row
        return None
    data = name + ".data"
    onnx.save(proto, str(target), save_as_external_data=True, all_tensors_to_one_file=True, location=data,
              size_threshold=0)
    (folder / data).unlink(missing_ok=True)
    return name


def part_ort_check(ctx: Context) -> None:
    """Write the row saying whether onnxruntime's CUDA provider loads here (the rebuilt onnxruntime-gpu)."""
    with ctx.guarded("ort", "ort/provider") as row:
        import onnxruntime

        with contextlib.suppress(Exception):
            onnxruntime.preload_dlls()
        providers = onnxruntime.get_available_providers()
        row.update(onnxruntime=onnxruntime.__version__, onnxruntime_file=onnxruntime.__file__, providers=providers,
                   cuda="CUDAExecutionProvider" in providers)


def part_selftest(ctx: Context) -> None:
    """Write a row, crash or hang as the case's name says: the runner's own test (no torch)."""
    mode = ctx.spec["name"]
    if mode == "ok":
        ctx.row("selftest", "selftest/ok", value=1)
    elif mode == "crash":
        ctx.row("selftest", "selftest/crash-first-row", value=1)
        os._exit(3)
    elif mode == "hang":
        ctx.row("selftest", "selftest/hang-first-row", value=1)
        import threading

        threading.Event().wait()  # never set: the runner's timeout must end this process


def part_singleop(ctx: Context) -> None:
    """Write the rows of one single-op group (benchmarks/cuda/singleops.py)."""
    from benchmarks.cuda import singleops

    singleops.run_group(ctx)


PARTS: dict[str, Callable[[Context], None]] = {
    "singleop": part_singleop, "env": part_env, "context": part_context, "training": part_training,
    "estimate": part_estimate, "memtracker": part_memtracker, "fit": part_fit, "ort": part_ort,
    "ort-check": part_ort_check, "selftest": part_selftest,
}


def main() -> None:
    """Run the case given as this process's JSON argument."""
    spec = json.loads(sys.argv[1])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    ctx = Context(spec)
    try:
        PARTS[spec["part"]](ctx)
    except Exception as error:  # noqa: BLE001 - a failure outside a row's guard is still a row
        ctx.row(spec["part"], spec.get("case", spec["part"]), error=error_text(error), error_kind="failed",
                model=spec.get("name"))


if __name__ == "__main__":
    main()
