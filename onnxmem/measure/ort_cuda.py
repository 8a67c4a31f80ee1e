"""Measure what onnxruntime really allocates on a CUDA GPU, to the byte, through an external allocator we count.

There is no Python API for the CUDA provider's allocator statistics, and the CPU method (the profiler's allocator
fields) does not cover device memory. Instead the CUDA provider is given the options `gpu_external_alloc`,
`gpu_external_free` and `gpu_external_empty_cache`: addresses of C functions it then calls for every device
allocation, bypassing its BFC arena. Those functions are ctypes callbacks that call cudaMalloc/cudaFree and record
every pointer and size in a pure-Python `AllocationCounter`, which tells live bytes and their peak per phase:

    setup      before the session (nothing is allocated on the device here)
    session    InferenceSession(...): initializers, and whatever the provider allocates up front
    run<i>     one InferenceSession.run: device copies of the graph inputs, activations, the memory pattern block,
               kernel scratch (e.g. cuDNN workspace obtained from the provider), graph outputs until copied back
    teardown   deleting the session (everything should be freed again; what is not shows as a leak)

Unlike the CPU measurement, graph inputs are counted (they are copied into device memory the allocator hands out).
Not counted: device memory that libraries allocate with cudaMalloc themselves (the CUDA context, cuBLAS/cuDNN
handles and their default workspaces) and host memory (pinned staging buffers, nodes that fell back to the CPU;
those are listed in `cpu_fallback_nodes`). `context_bytes` (NVML's device-wide used bytes around creating the CUDA
context) is a sanity check only: it includes other processes' activity.

Like cpu.py, this module imports onnxruntime inside functions only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import site
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy
import onnx

from onnxmem.errors import MissingExtraError, RuntimeMeasurementError
from onnxmem.measure.ort_cpu import (
    OPT_LEVELS,
    _import_ort,
    _load_optimized,
    _node_name,
    _one_line,
    _session_source,
    _split_runs,
    session_options,
    temporary_folder,
)

CUDA_PROVIDER = "CUDAExecutionProvider"

_NO_CUDA_PROVIDER = (
    "Validation on CUDA needs onnxruntime-gpu and an NVIDIA GPU with CUDA 13 / cuDNN 9, but the installed "
    "onnxruntime has no CUDAExecutionProvider: pip uninstall onnxruntime, then pip install \".[gpu]\" in a clone "
    "of onnxmem (its extra onnxmem[gpu]; the gpu extra conflicts with the cpu extra: both install the same "
    "onnxruntime module)"
)

# Sonames tried in order: onnxruntime-gpu >= 1.31 is built against CUDA 13; 12 and the unversioned name are
# fallbacks (any libcudart works: pointers from cudaMalloc are valid in every runtime sharing the primary context).
CUDART_NAMES: tuple[str, ...] = (
    ("cudart64_13.dll", "cudart64_12.dll", "cudart64_110.dll") if os.name == "nt"
    else ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
)
# Where the nvidia-* pip wheels (pulled by onnxruntime-gpu[cuda]) put libcudart, relative to site-packages.
_NVIDIA_LIB_DIRS = ("nvidia/cu13/lib", "nvidia/cu13/bin", "nvidia/cuda_runtime/lib", "nvidia/cuda_runtime/bin")

# Signatures of the external allocator the CUDA provider calls, from microsoft/onnxruntime
# onnxruntime/core/providers/cuda/cuda_allocator.h, class CUDAExternalAllocator:
#     typedef void* (*ExternalAlloc)(size_t size);
#     typedef void (*ExternalFree)(void* p);
#     typedef void (*ExternalEmptyCache)();
# (cuda_allocator.cc: Alloc calls alloc_ only for size > 0 and fails on a NULL result; Free calls free_ for every
# pointer, then empty_cache_ if the pointer came from Reserve.)
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
EMPTY_CACHE_FN = ctypes.CFUNCTYPE(None)

_MAX_STORED_ERRORS = 100  # a broken run can produce one error per free; keep the report small, count them all

# Hooks stay referenced for the life of the process: onnxruntime may free a device buffer after the Python
# session object is gone (provider teardown, thread-local caches), and a call through a collected CFUNCTYPE
# thunk crashes the process. A few small objects per measurement is the price.
_KEEP_ALIVE: list[AllocatorHooks] = []


# ---------------------------------------------------------------------------------------------------------------
# Counting (pure Python, no CUDA)


@dataclass(frozen=True)
class CounterError:
    """One inconsistent event: a free of a pointer never handed out, a double free, a failed allocation, ..."""

    kind: str  # "unknown_free" | "double_free" | "alloc_failed" | "live_pointer_reused"
    ptr: int
    size: int  # bytes requested (alloc_failed, live_pointer_reused) or 0
    phase: str
    event: int  # 1-based index of the event among all events


@dataclass(frozen=True)
class PhaseStats:
    """Live device bytes over one phase (from one mark to the next)."""

    label: str
    start_bytes: int  # live at the phase's start
    peak_bytes: int  # highest live within the phase (absolute, >= start_bytes)
    end_bytes: int  # live at the phase's end (or now, for the current phase)
    allocations: int  # successful allocations, zero-size ones included
    allocated_bytes: int
    frees: int  # frees of live pointers
    freed_bytes: int

    @property
    def peak_delta_bytes(self) -> int:
        """Peak above what was live when the phase started."""
        return self.peak_bytes - self.start_bytes


@dataclass(frozen=True)
class CounterSummary:
    """Everything an AllocationCounter saw, frozen."""

    events: int  # alloc, free and empty-cache calls (marks are not events)
    live_bytes: int
    peak_bytes: int
    live_allocations: int
    allocations: int
    allocated_bytes: int
    frees: int
    freed_bytes: int
    null_frees: int  # free(NULL): legal, ignored
    empty_cache_calls: int
    error_count: int
    errors: tuple[CounterError, ...]  # the first _MAX_STORED_ERRORS of them
    phases: tuple[PhaseStats, ...]

    def phase(self, label: str) -> PhaseStats:
        """The last phase with this label; KeyError if there is none."""
        for stats in reversed(self.phases):
            if stats.label == label:
                return stats
        raise KeyError(label)


@dataclass
class _Phase:
    label: str
    start_bytes: int
    peak_bytes: int
    allocations: int = 0
    allocated_bytes: int = 0
    frees: int = 0
    freed_bytes: int = 0

    def frozen(self, end_bytes: int) -> PhaseStats:
        return PhaseStats(label=self.label, start_bytes=self.start_bytes, peak_bytes=self.peak_bytes,
                          end_bytes=end_bytes, allocations=self.allocations, allocated_bytes=self.allocated_bytes,
                          frees=self.frees, freed_bytes=self.freed_bytes)


class AllocationCounter:
    """Exact live-byte bookkeeping of a stream of allocations and frees, split into labelled phases.

    Never raises on inconsistent input (it is fed from C callbacks, where an exception cannot propagate): a free
    of a pointer never handed out, a second free of a pointer, an allocation returning a pointer that is still
    live, and a failed allocation (pointer 0 for a non-zero size) are recorded as errors. Thread-safe: the CUDA
    provider may allocate from threads other than the one that runs the session.
    """

    def __init__(self, initial_label: str = "setup") -> None:
        self._lock = threading.Lock()
        self._live: dict[int, int] = {}  # pointer -> size
        self._freed: set[int] = set()  # pointers freed and not handed out again: a second free is a double free
        self._live_bytes = 0
        self._peak_bytes = 0
        self._events = 0
        self._allocations = 0
        self._allocated_bytes = 0
        self._frees = 0
        self._freed_bytes = 0
        self._null_frees = 0
        self._empty_cache_calls = 0
        self._error_count = 0
        self._errors: list[CounterError] = []
        self._closed: list[PhaseStats] = []
        self._phase = _Phase(initial_label, 0, 0)

    # -- events

    def alloc(self, ptr: int, size: int) -> None:
        """Record that `size` bytes were handed out at `ptr` (ptr 0: a failed allocation, unless size is 0)."""
        if size < 0:
            raise ValueError(f"allocation size cannot be negative: {size}")
        with self._lock:
            self._events += 1
            if ptr == 0:
                if size > 0:
                    self._error("alloc_failed", 0, size)
                else:  # cudaMalloc(0) may legitimately give NULL: an allocation of nothing, nothing to free
                    self._count_alloc(0)
                return
            old = self._live.pop(ptr, None)
            if old is not None:  # a free went unseen; drop the stale entry so live bytes stay right
                self._error("live_pointer_reused", ptr, size)
                self._live_bytes -= old
            self._freed.discard(ptr)
            self._live[ptr] = size
            self._live_bytes += size
            self._count_alloc(size)
            if self._live_bytes > self._phase.peak_bytes:
                self._phase.peak_bytes = self._live_bytes
            if self._live_bytes > self._peak_bytes:
                self._peak_bytes = self._live_bytes

    def free(self, ptr: int) -> None:
        """Record that `ptr` was released (NULL is ignored; unknown and double frees are recorded as errors)."""
        with self._lock:
            self._events += 1
            if ptr == 0:
                self._null_frees += 1
                return
            size = self._live.pop(ptr, None)
            if size is None:
                self._error("double_free" if ptr in self._freed else "unknown_free", ptr, 0)
                return
            self._freed.add(ptr)
            self._live_bytes -= size
            self._frees += 1
            self._freed_bytes += size
            self._phase.frees += 1
            self._phase.freed_bytes += size

    def empty_cache(self) -> None:
        """Record a call of the provider's empty-cache hook (nothing is cached here, so nothing changes)."""
        with self._lock:
            self._events += 1
            self._empty_cache_calls += 1

    def mark(self, label: str) -> None:
        """End the current phase and start one called `label`, beginning at what is live now."""
        with self._lock:
            self._closed.append(self._phase.frozen(self._live_bytes))
            self._phase = _Phase(label, self._live_bytes, self._live_bytes)

    # -- reading

    @property
    def live_bytes(self) -> int:
        """Bytes handed out and not yet freed."""
        return self._live_bytes

    @property
    def peak_bytes(self) -> int:
        """Highest live bytes ever."""
        return self._peak_bytes

    @property
    def events(self) -> int:
        """Number of alloc, free and empty-cache calls recorded."""
        return self._events

    @property
    def phases(self) -> tuple[PhaseStats, ...]:
        """Every phase so far, the current one last (its end_bytes is what is live now)."""
        with self._lock:
            return (*self._closed, self._phase.frozen(self._live_bytes))

    def summary(self) -> CounterSummary:
        """A frozen copy of every total, the errors and the phases."""
        with self._lock:
            phases = (*self._closed, self._phase.frozen(self._live_bytes))
            return CounterSummary(
                events=self._events, live_bytes=self._live_bytes, peak_bytes=self._peak_bytes,
                live_allocations=len(self._live), allocations=self._allocations,
                allocated_bytes=self._allocated_bytes, frees=self._frees, freed_bytes=self._freed_bytes,
                null_frees=self._null_frees, empty_cache_calls=self._empty_cache_calls,
                error_count=self._error_count, errors=tuple(self._errors), phases=phases)

    # -- internals (called with the lock held)

    def _count_alloc(self, size: int) -> None:
        self._allocations += 1
        self._allocated_bytes += size
        self._phase.allocations += 1
        self._phase.allocated_bytes += size

    def _error(self, kind: str, ptr: int, size: int) -> None:
        self._error_count += 1
        if len(self._errors) < _MAX_STORED_ERRORS:
            self._errors.append(CounterError(kind=kind, ptr=ptr, size=size, phase=self._phase.label,
                                             event=self._events))


# ---------------------------------------------------------------------------------------------------------------
# The device and the C callbacks


class DeviceBackend(Protocol):
    """What the callbacks allocate from: cudaMalloc/cudaFree for real, a fake in tests."""

    def malloc(self, size: int) -> int:
        """Give a device pointer to `size` bytes, or 0 when the allocation fails."""
        ...

    def free(self, ptr: int) -> None:
        """Release a pointer malloc gave."""
        ...

    def create_context(self) -> int | None:
        """Create the CUDA context now; give the device bytes that took if measurable, else None."""
        ...


class AllocatorHooks:
    """The three C callbacks handed to the CUDA provider, routing every allocation through an AllocationCounter.

    The CFUNCTYPE objects are attributes of this object: keep it referenced while any session that got its
    addresses can still call them (measure_cuda keeps it for the life of the process).
    """

    def __init__(self, backend: DeviceBackend, counter: AllocationCounter) -> None:
        self.backend = backend
        self.counter = counter
        self.alloc_fn = ALLOC_FN(self._alloc)
        self.free_fn = FREE_FN(self._free)
        self.empty_cache_fn = EMPTY_CACHE_FN(self._empty_cache)

    # Exceptions cannot cross into C (ctypes would print them and return NULL / nothing): catch everything,
    # and let a failed allocation show as NULL, which onnxruntime turns into an error of its own.
    def _alloc(self, size: int) -> int | None:
        try:
            ptr = self.backend.malloc(int(size))
        except Exception:  # noqa: BLE001 - see above
            ptr = 0
        try:
            self.counter.alloc(ptr, int(size))
        except Exception:  # noqa: BLE001
            pass
        return ptr or None

    def _free(self, ptr: int | None) -> None:
        # Record before releasing: once cudaFree returns, another thread may be handed the same address.
        try:
            self.counter.free(ptr or 0)
        except Exception:  # noqa: BLE001
            pass
        if ptr:
            try:
                self.backend.free(ptr)
            except Exception:  # noqa: BLE001
                pass

    def _empty_cache(self) -> None:
        try:
            self.counter.empty_cache()
        except Exception:  # noqa: BLE001
            pass

    @staticmethod
    def _address(fn: Any) -> int:
        address = ctypes.cast(fn, ctypes.c_void_p).value
        assert address is not None  # a CFUNCTYPE object always has a thunk address
        return int(address)

    @property
    def alloc_address(self) -> int:
        """Address of `void* alloc(size_t)`."""
        return self._address(self.alloc_fn)

    @property
    def free_address(self) -> int:
        """Address of `void free(void*)`."""
        return self._address(self.free_fn)

    @property
    def empty_cache_address(self) -> int:
        """Address of `void empty_cache(void)`."""
        return self._address(self.empty_cache_fn)

    def provider_options(self) -> dict[str, str]:
        """The CUDA provider options that make it allocate through these callbacks (addresses as decimal text)."""
        return {"gpu_external_alloc": str(self.alloc_address), "gpu_external_free": str(self.free_address),
                "gpu_external_empty_cache": str(self.empty_cache_address)}


def _cudart_dirs() -> list[Path]:
    """Directories of the nvidia-* pip wheels that may hold libcudart, for every site-packages on the path."""
    roots: list[str] = []
    try:
        roots.extend(site.getsitepackages())
    except AttributeError:  # virtualenv's old site.py has no getsitepackages
        pass
    roots.append(site.getusersitepackages())
    roots.extend(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    dirs: list[Path] = []
    for root in dict.fromkeys(roots):
        for sub in _NVIDIA_LIB_DIRS:
            path = Path(root) / sub
            if path.is_dir() and path not in dirs:
                dirs.append(path)
    return dirs


def load_cudart(names: Sequence[str] = CUDART_NAMES, dirs: Iterable[Path] | None = None) -> ctypes.CDLL | None:
    """The CUDA runtime library loaded with ctypes, or None when none of `names` is found.

    Bare names first: after onnxruntime.preload_dlls() the runtime onnxruntime uses is already loaded and dlopen
    finds it by soname. Then each name in each of `dirs` (default: the nvidia pip wheels' lib directories).
    """
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    for directory in _cudart_dirs() if dirs is None else dirs:
        for name in names:
            path = Path(directory) / name
            if path.is_file():
                try:
                    return ctypes.CDLL(str(path))
                except OSError:
                    continue
    return None


def require_cudart(names: Sequence[str] = CUDART_NAMES, dirs: Iterable[Path] | None = None) -> ctypes.CDLL:
    """The CUDA runtime library; MissingExtraError naming what was looked for when it cannot be loaded."""
    lib = load_cudart(names, dirs)
    if lib is None:
        raise MissingExtraError(
            f"Validation on CUDA needs the CUDA runtime library ({', '.join(names)}), found neither on the library "
            "path nor in the nvidia pip packages: pip install \".[gpu]\" in a clone of onnxmem (its extra "
            "onnxmem[gpu]: onnxruntime-gpu[cuda,cudnn])")
    return lib


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _nvml_used_bytes(index: int) -> int | None:
    """Device-wide used bytes from NVML, or None when NVML cannot say."""
    name = "nvml.dll" if os.name == "nt" else "libnvidia-ml.so.1"
    try:
        nvml = ctypes.CDLL(name)
        if nvml.nvmlInit_v2() != 0:
            return None
        try:
            handle = ctypes.c_void_p()
            memory = _NvmlMemory()
            if nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
                return None
            if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
                return None
            return int(memory.used)
        finally:
            nvml.nvmlShutdown()
    except (OSError, AttributeError):
        return None


class CudartBackend:
    """cudaMalloc/cudaFree on one device, through ctypes."""

    def __init__(self, lib: ctypes.CDLL, device_id: int) -> None:
        self.lib = lib
        self.device_id = device_id
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaMalloc.restype = ctypes.c_int
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaFree.restype = ctypes.c_int
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaSetDevice.restype = ctypes.c_int

    def malloc(self, size: int) -> int:
        """A device pointer to `size` bytes on this backend's device, or 0 on failure."""
        # The provider's own CUDAAllocator sets the device before every cudaMalloc; the callback runs on
        # onnxruntime's threads, whose current device is not ours to assume.
        if self.lib.cudaSetDevice(self.device_id) != 0:
            return 0
        ptr = ctypes.c_void_p()
        if self.lib.cudaMalloc(ctypes.byref(ptr), size) != 0:
            return 0
        return int(ptr.value or 0)

    def free(self, ptr: int) -> None:
        """cudaFree the pointer; errors are ignored (as onnxruntime does: frees may fail during shutdown)."""
        self.lib.cudaFree(ctypes.c_void_p(ptr))

    def create_context(self) -> int | None:
        """Create the primary context of the device; the NVML used-bytes difference that took, if measurable.

        None when NVML is missing, when CUDA_VISIBLE_DEVICES is set (NVML's device index then differs from the
        CUDA one) or when nothing changed (the context already existed in this process).
        """
        same_index = "CUDA_VISIBLE_DEVICES" not in os.environ
        before = _nvml_used_bytes(self.device_id) if same_index else None
        if self.lib.cudaSetDevice(self.device_id) != 0 or self.lib.cudaFree(None) != 0:
            raise RuntimeMeasurementError(f"cannot create a CUDA context on device {self.device_id}")
        after = _nvml_used_bytes(self.device_id) if before is not None else None
        if before is None or after is None or after <= before:
            return None
        return after - before


def _make_backend(device_id: int) -> DeviceBackend:
    """The backend measure_cuda allocates from (tests replace this function with a fake device)."""
    return CudartBackend(require_cudart(), device_id)


# ---------------------------------------------------------------------------------------------------------------
# The measurement


@dataclass(frozen=True)
class CudaRun:
    """One InferenceSession.run, as the counting allocator saw it."""

    run_index: int
    peak_activation_bytes: int  # peak live bytes during the run minus live bytes at its start
    start_bytes: int  # live at the run's start (the session's bytes, plus anything an earlier run kept)
    end_bytes: int  # live at the run's end (more than start_bytes: the run left something allocated)


@dataclass(frozen=True)
class CudaMeasurement:
    """Every run of one CUDA session, counted at the allocator, and what the session holds between runs."""

    session_bytes: int  # live after InferenceSession(...): weights and what the provider allocates up front
    runs: tuple[CudaRun, ...]
    settings: dict[str, str]  # every pinned setting, for printing
    # NVML's device-wide used bytes before/after creating the CUDA context: a sanity check only (other
    # processes, driver rounding); None when not measurable.
    context_bytes: int | None
    execution_order: tuple[str, ...]  # node names in the order onnxruntime ran them (profile, run 0)
    counter: CounterSummary  # every phase: setup, session, run0.., teardown
    session_peak_bytes: int = 0  # peak live bytes while the session was being created
    cpu_fallback_nodes: tuple[str, ...] = field(default=())  # nodes that ran on the CPU provider (not counted)
    optimized_model: onnx.ModelProto | None = None  # the graph onnxruntime ran (optimized_model_filepath)

    @property
    def first_run(self) -> CudaRun:
        """The first run."""
        return self.runs[0]

    @property
    def steady_run(self) -> CudaRun:
        """The last run: from the second run on the memory pattern (if on) is in force."""
        return self.runs[-1]


def _profile_order(events: list[dict[str, Any]], runs: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Node names of run 0 in execution order, and those of them that ran on the CPU provider."""
    try:
        grouped = _split_runs(events, runs)
    except RuntimeMeasurementError:
        return (), ()
    first = grouped[0] if grouped else []
    order = tuple(_node_name(e) for e in first)
    on_cpu = tuple(_node_name(e) for e in first
                   if str(e.get("args", {}).get("provider", "")) == "CPUExecutionProvider")
    return order, on_cpu


def _read_profile(path_text: str) -> list[dict[str, Any]]:
    path = Path(path_text)
    if not path.is_absolute():
        path = Path.cwd() / path
    try:
        with open(path, encoding="utf-8") as f:
            events = json.load(f)
    except (OSError, ValueError):
        return []
    return events if isinstance(events, list) else []


def measure_cuda(model: onnx.ModelProto | str | os.PathLike[str], feeds: dict[str, numpy.ndarray], *,
                 opt_level: str = "disable", runs: int = 2, mem_pattern: bool = True,
                 device_id: int = 0) -> CudaMeasurement:
    """Run the model `runs` times on onnxruntime's CUDA provider and count every device allocation it makes.

    Pinned: CUDAExecutionProvider (CPU provider as fallback for unsupported nodes), graph optimization level
    `opt_level`, intra-op and inter-op threads 1, sequential execution, default execution order, memory pattern
    `mem_pattern`, cuDNN algorithm search HEURISTIC with the default (not maximal) workspace so that cuDNN's
    workspace is deterministic, arena extension kSameAsRequested, and the counting external allocator (which
    replaces the provider's arena). The profile is written into a temporary directory that is always removed.
    Raises MissingExtraError without onnxruntime-gpu, a CUDA provider or libcudart, and RuntimeMeasurementError
    (onnxruntime's reason, one line) when onnxruntime cannot create the CUDA provider, load or run the model.
    """
    if opt_level not in OPT_LEVELS:
        raise ValueError(f"opt_level must be one of {', '.join(OPT_LEVELS)}, not {opt_level!r}")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    if device_id < 0:
        raise ValueError(f"device_id cannot be negative: {device_id}")
    ort = _import_ort("onnxruntime-gpu", "gpu", "Validation on CUDA")
    if CUDA_PROVIDER not in ort.get_available_providers():
        raise MissingExtraError(_NO_CUDA_PROVIDER)
    preload = getattr(ort, "preload_dlls", None)
    if callable(preload):  # loads CUDA/cuDNN from the nvidia pip packages; also lets load_cudart find libcudart
        try:
            preload()
        except Exception:  # noqa: BLE001 - a missing library is reported, more precisely, by session creation
            pass
    backend = _make_backend(device_id)
    context_bytes = backend.create_context()

    cuda_options = {
        "device_id": str(device_id),
        "cudnn_conv_algo_search": "HEURISTIC",
        "cudnn_conv_use_max_workspace": "0",
        "arena_extend_strategy": "kSameAsRequested",
        "do_copy_in_default_stream": "1",
        "enable_cuda_graph": "0",
    }
    settings = {
        "onnxruntime": str(ort.__version__),
        "execution_provider": CUDA_PROVIDER,
        **{f"cuda.{key}": value for key, value in cuda_options.items()},
        "cuda.gpu_external_alloc": "onnxmem counting allocator (cudaMalloc/cudaFree)",
    }
    counter = AllocationCounter("setup")
    hooks = AllocatorHooks(backend, counter)
    _KEEP_ALIVE.append(hooks)
    provider_options = {**cuda_options, **hooks.provider_options()}

    with temporary_folder("onnxmem-ort-cuda-") as tmp:
        workdir = Path(tmp)
        source = _session_source(model, workdir)

        so, pinned = session_options(ort, opt_level, mem_pattern, workdir, workdir / "optimized.onnx")
        settings.update(pinned)
        settings["runs"] = str(runs)

        sess = None
        events: list[dict[str, Any]] = []
        failure = ""
        # onnxruntime's exception is turned into a message inside `except` and raised outside it: its traceback
        # holds the InferenceSession.run frame, hence the session and its device memory, for as long as the
        # exception (or a new one chained to it) lives.
        try:
            counter.mark("session")
            try:
                sess = ort.InferenceSession(source, sess_options=so, providers=[CUDA_PROVIDER, "CPUExecutionProvider"],
                                            provider_options=[provider_options, {}])
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception classes
                failure = f"onnxruntime cannot load the model: {_one_line(exc)}"
            if sess is not None:
                failure = _provider_problem(sess, hooks)
            if sess is not None and not failure:
                try:
                    for i in range(runs):
                        counter.mark(f"run{i}")
                        sess.run(None, feeds)
                except Exception as exc:  # noqa: BLE001
                    failure = f"onnxruntime cannot run the model: {_one_line(exc)}"
            counter.mark("teardown")
            if sess is not None and not failure:
                events = _read_profile(sess.end_profiling())
        finally:
            del sess  # frees the session's device memory (seen by the counter) and its profile file handle
        if failure:
            raise RuntimeMeasurementError(failure)
        optimized = _load_optimized(workdir / "optimized.onnx")

    summary = counter.summary()
    order, on_cpu = _profile_order(events, runs)
    session = summary.phase("session")
    measured = tuple(CudaRun(run_index=i, peak_activation_bytes=p.peak_delta_bytes, start_bytes=p.start_bytes,
                             end_bytes=p.end_bytes)
                     for i, p in enumerate(summary.phase(f"run{i}") for i in range(runs)))
    return CudaMeasurement(session_bytes=session.end_bytes, runs=measured, settings=settings,
                           context_bytes=context_bytes, execution_order=order, counter=summary,
                           session_peak_bytes=session.peak_bytes, cpu_fallback_nodes=on_cpu,
                           optimized_model=optimized)


def _provider_problem(sess: Any, hooks: AllocatorHooks) -> str:
    """Why the session's numbers would be wrong, or "" when it runs on the CUDA provider with our allocator.

    onnxruntime's Python API silently falls back to the CPU provider when the CUDA provider cannot be created
    (no GPU, CUDA or cuDNN libraries missing); and a provider that ignored the external allocator options would
    allocate from its arena, unseen by the counter.
    """
    providers = list(sess.get_providers())
    if not providers or providers[0] != CUDA_PROVIDER:
        return ("onnxruntime could not create the CUDA execution provider (no usable NVIDIA GPU, or the CUDA 13 / "
                f"cuDNN 9 libraries are missing) and fell back to {', '.join(providers) or 'nothing'}")
    try:
        applied = sess.get_provider_options().get(CUDA_PROVIDER, {})
    except Exception:  # noqa: BLE001 - older or plugin providers may not report options; the check is extra
        return ""
    address = applied.get("gpu_external_alloc")
    if address is not None and str(address) != str(hooks.alloc_address):
        return (f"the CUDA provider did not take the counting allocator (gpu_external_alloc is {address}); "
                "device memory cannot be counted")
    return ""
