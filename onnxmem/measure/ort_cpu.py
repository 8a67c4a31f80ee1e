"""Measure what onnxruntime really allocates on CPU, to the byte, from its profiler's allocator statistics.

This is the only module of onnxmem that imports onnxruntime, and it does so inside functions, so that the rest of
the package works without the "cpu" extra.

The method (see docs/ort-memory-planner.md): with profiling on and the CPU arena on, onnxruntime (>= 1.29) writes
on every node event of the profile JSON the statistics of the arena the node ran on, sampled after the kernel ran
and before its dead inputs are released:

    mem_bytes_requested_in_use   bytes requested by live allocations now (no arena rounding)
    mem_requested_in_use_delta   change of the above while this kernel ran
    mem_bytes_in_use, mem_in_use_delta, mem_in_use_peak, mem_arena_held, mem_arena_held_delta (arena chunk sizes)

Baseline = in_use - delta of the first run's first node event: what the arena held before any kernel ran (weights
that live in the arena, e.g. prepacked MatMul weights; plain initializers are not in the arena and not counted).
Peak activation bytes of a run = max over the run's node events of mem_bytes_requested_in_use, minus that baseline.
Graph inputs (fed from numpy) are never counted; graph outputs are. From the second run on, with the memory
pattern, the pattern block is allocated before the run's first node and counts in the peak (`start_bytes`).
Scratch memory that a kernel allocates and frees inside itself is not seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy
import onnx

from onnxmem.errors import ModelFileError, RuntimeMeasurementError, require_extra
from onnxmem.ir.load import external_data_problems

OPT_LEVELS = ("disable", "basic", "extended", "all")

# The profile's allocator fields (checked against onnxruntime 1.32.0's JSON).
_IN_USE = "mem_bytes_requested_in_use"
_ARENA_HELD = "mem_arena_held"
_IN_USE_DELTA = "mem_requested_in_use_delta"
_KERNEL_SUFFIX = "_kernel_time"

# Optimized models above this size of external weights are returned without their weights loaded.
_LOAD_WEIGHTS_LIMIT = 1 << 30


@dataclass(frozen=True)
class RunMeasurement:
    """One InferenceSession.run, as the profiler's allocator statistics saw it."""

    run_index: int
    peak_activation_bytes: int  # max over node events of mem_bytes_requested_in_use minus baseline
    baseline_bytes: int  # arena bytes in use before the first node of the first run (weights living in the arena)
    peak_node: str  # node name at the peak (first node reaching it)
    # Activation bytes already in use when the run's first node started, included in the peak: from the second
    # run on with the memory pattern, the pattern block (held for the whole run). 0 for a first run.
    start_bytes: int = 0
    # What the arena holds from the system when the run's last kernel ends (mem_arena_held: its regions and the
    # bytes it reserved), -1 where the profile does not say
    arena_held_bytes: int = -1


@dataclass(frozen=True)
class CpuMeasurement:
    """Every run of one session, the order onnxruntime ran the nodes in, and the graph it ran."""

    runs: tuple[RunMeasurement, ...]
    execution_order: tuple[str, ...]  # node names in the order onnxruntime ran them (from the profile, run 0)
    optimized_model: onnx.ModelProto | None  # the graph onnxruntime ran (optimized_model_filepath), or None
    settings: dict[str, str]  # every pinned setting, for printing

    @property
    def first_run(self) -> RunMeasurement:
        return self.runs[0]

    @property
    def steady_run(self) -> RunMeasurement:
        """The last run: from the second run on the memory pattern (if on) is in force."""
        return self.runs[-1]


def _import_ort(package: str = "onnxruntime", extra: str = "cpu", purpose: str = "Validation on CPU") -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise require_extra(package, extra, purpose) from exc
    return onnxruntime


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _named_copy(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Give every unnamed node of the main graph a unique name, so that profile events can be told apart.

    onnxruntime names a node's profile event "<node name>_kernel_time"; unnamed nodes would all be "_kernel_time".
    The name given is "<op_type>_<position in the node list>" (suffixed with "_<k>" if that is taken).
    """
    nodes = model.graph.node
    if all(n.name for n in nodes):
        return model, False
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    taken = {n.name for n in copy.graph.node if n.name}
    for i, n in enumerate(copy.graph.node):
        if n.name:
            continue
        name, k = f"{n.op_type}_{i}", 1
        while name in taken:
            name, k = f"{n.op_type}_{i}_{k}", k + 1
        n.name = name
        taken.add(name)
    return copy, True


def _session_source(model: onnx.ModelProto | str | os.PathLike[str], workdir: Path) -> bytes | str:
    """What to hand to InferenceSession: the model's bytes, or a path (kept for models with external data)."""
    if isinstance(model, onnx.ModelProto):
        named, _ = _named_copy(model)
        if named.ByteSize() < 2**31 - 1:
            return named.SerializeToString()
        path = workdir / "model.onnx"
        onnx.save_model(named, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx.data", size_threshold=1024)
        return str(path)
    path = Path(os.fspath(model))
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    try:  # read only the graph (not external weights) to check node names
        proto = onnx.load_model(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError, OSError, ...
        raise ModelFileError(f"cannot read {path} as ONNX: {_one_line(exc)}") from exc
    # onnx and onnxruntime refuse external data outside the model's folder with their own errors, and a reader
    # opened on a pipe blocks: every file is looked at first, without opening it.
    problems = external_data_problems(proto, path.parent)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ModelFileError(f"{path}: its external data cannot be read: {problems[0]}{more}")
    if all(n.name for n in proto.graph.node):
        return str(path)  # onnxruntime resolves external data next to the model; it writes nothing there
    full = onnx.load_model(str(path), load_external_data=True)
    return _session_source(full, workdir)


@contextlib.contextmanager
def temporary_folder(prefix: str) -> Iterator[str]:
    """Give a temporary folder, removed when the block ends, also when the process is sent SIGTERM meanwhile.

    SIGTERM ends a process without unwinding it, which would leave the folder behind: while the block runs in
    the main thread, and only where SIGTERM has its default action (the host program has not chosen its own),
    SIGTERM raises SystemExit(143) instead, so the block closes on the way out. (SIGINT needs nothing: its
    KeyboardInterrupt unwinds.)
    """
    handled = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if handled:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as folder:
            yield folder
    finally:
        if handled:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise SystemExit(128 + signum)


def _load_optimized(path: Path) -> onnx.ModelProto | None:
    if not path.is_file():
        return None
    data = path.parent / (path.name + ".data")
    load_weights = not data.is_file() or data.stat().st_size <= _LOAD_WEIGHTS_LIMIT
    try:
        return onnx.load_model(str(path), load_external_data=load_weights)
    except Exception:  # noqa: BLE001 - the saved graph is a convenience; the measurement stands without it
        return None


def _split_runs(events: list[dict[str, Any]], runs: int) -> list[list[dict[str, Any]]]:
    """Group node events by run.

    Every InferenceSession.run writes one Session event named "model_run" spanning [ts, ts + dur], written after
    the run's node events; node events of a run lie inside that span. Assigning each node event to the model_run
    span containing its start separates the runs without ending profiling between runs (a session's profiling
    cannot be restarted once ended).
    """
    spans = sorted((int(e["ts"]), int(e["ts"]) + int(e.get("dur", 0)))
                   for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    if len(spans) != runs:
        raise RuntimeMeasurementError(
            f"the onnxruntime profile holds {len(spans)} 'model_run' events for {runs} runs; cannot separate runs")
    nodes = [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith(_KERNEL_SUFFIX)]
    grouped: list[list[dict[str, Any]]] = [[] for _ in spans]
    for e in nodes:
        ts = int(e["ts"])
        for i, (start, end) in enumerate(spans):
            if start <= ts <= end:
                grouped[i].append(e)
                break
    for group in grouped:
        group.sort(key=lambda e: int(e["ts"]))
    return grouped


def _node_name(event: Mapping[str, Any]) -> str:
    return str(event["name"])[: -len(_KERNEL_SUFFIX)]


def _stat(event: Mapping[str, Any], key: str) -> int | None:
    value = event.get("args", {}).get(key)
    return None if value is None else int(value)


def _baseline(events: list[dict[str, Any]]) -> int:
    """Arena bytes in use just before the first node of these events started (in_use - delta of the first)."""
    first = events[0]
    in_use, delta = _stat(first, _IN_USE), _stat(first, _IN_USE_DELTA)
    if in_use is None or delta is None:
        raise RuntimeMeasurementError(
            "the onnxruntime profile has no allocator statistics on node events "
            "(needs onnxruntime >= 1.29 with the CPU arena on)")
    return in_use - delta


def _measure_run(index: int, events: list[dict[str, Any]], baseline: int) -> RunMeasurement:
    """Peak of one run over the session's baseline.

    The `*_delta` of a node event is the change while that kernel ran, so first.in_use - first.delta is what was
    in use when the run's first kernel started. For the first run that is the session's baseline (weights held in
    the arena). From the second run on, with the memory pattern, it also holds the pattern block, allocated when
    the run starts: that block is activation memory, so every run is measured against the first run's baseline.
    """
    if not events:
        return RunMeasurement(run_index=index, peak_activation_bytes=0, baseline_bytes=baseline, peak_node="")
    start = _baseline(events)
    peak, peak_node = start, ""
    for e in events:  # the first node reaching the run's maximum
        value = _stat(e, _IN_USE)
        if value is not None and (value > peak or (value == peak and not peak_node)):
            peak, peak_node = value, _node_name(e)
    # What the arena holds at the run's end: the statistics of the event that ends last (the last by start time
    # may be a Loop body's node, sampled before its Loop allocated its outputs; the events of a run can read
    # different allocators, so the most any of them saw is not it).
    last = max(enumerate(events), key=lambda pair: (int(pair[1]["ts"]) + int(pair[1].get("dur", 0)), pair[0]))[1]
    held = _stat(last, _ARENA_HELD)
    return RunMeasurement(run_index=index, peak_activation_bytes=peak - baseline, baseline_bytes=baseline,
                          peak_node=peak_node, start_bytes=start - baseline,
                          arena_held_bytes=-1 if held is None else held)


def session_options(ort: Any, opt_level: str, mem_pattern: bool, workdir: Path,
                    optimized_path: Path) -> tuple[Any, dict[str, str]]:
    """Give onnxruntime session options with every setting that moves the peak pinned, and those settings
    for printing: one thread each way, sequential, default order, memory reuse on, memory pattern `mem_pattern`,
    fatal logs only, the profile in `workdir` and the graph onnxruntime runs saved at `optimized_path`."""
    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    so = ort.SessionOptions()
    so.graph_optimization_level = levels[opt_level]
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.execution_order = ort.ExecutionOrder.DEFAULT
    so.enable_mem_reuse = True
    so.enable_mem_pattern = bool(mem_pattern)
    so.log_severity_level = 4  # fatal only: a failed load is reported through the exception, on one line
    so.enable_profiling = True
    so.profile_file_prefix = str(workdir / "ort_profile")
    so.optimized_model_filepath = str(optimized_path)
    # Big weights of the saved graph go to a side file (a single protobuf cannot exceed 2 GiB).
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                optimized_path.name + ".data")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    settings = {
        "graph_optimization_level": str(levels[opt_level]).split(".")[-1],
        "intra_op_num_threads": "1",
        "inter_op_num_threads": "1",
        "execution_mode": "ORT_SEQUENTIAL",
        "execution_order": "DEFAULT",
        "enable_mem_reuse": "True",
        "enable_mem_pattern": str(bool(mem_pattern)),
        "log_severity_level": "4",
    }
    return so, settings


def measure_cpu(model: onnx.ModelProto | str | os.PathLike[str], feeds: dict[str, numpy.ndarray], *,
                opt_level: str = "disable", runs: int = 2, mem_pattern: bool = True) -> CpuMeasurement:
    """Run the model `runs` times on onnxruntime's CPU provider with every memory-relevant setting pinned.

    Pinned: CPUExecutionProvider only, graph optimization level `opt_level`, intra-op and inter-op threads 1,
    sequential execution, default execution order, CPU arena on, memory reuse on, memory pattern `mem_pattern`,
    fatal logs only (see session_options). The profile and the optimized model are written into a temporary
    directory that is always removed; nothing is written next to the model. Raises RuntimeMeasurementError
    (onnxruntime's reason, one line)
    when onnxruntime cannot load or run the model.
    """
    if opt_level not in OPT_LEVELS:
        raise ValueError(f"opt_level must be one of {', '.join(OPT_LEVELS)}, not {opt_level!r}")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    ort = _import_ort()
    settings = {"onnxruntime": str(ort.__version__), "execution_provider": "CPUExecutionProvider"}
    with temporary_folder("onnxmem-ort-") as tmp:
        workdir = Path(tmp)
        source = _session_source(model, workdir)
        optimized_path = workdir / "optimized.onnx"
        so, pinned = session_options(ort, opt_level, mem_pattern, workdir, optimized_path)
        so.enable_cpu_mem_arena = True
        so.add_session_config_entry("session.disable_prepacking", "0")  # prepacked weights live in the arena
        settings.update(pinned)
        settings.update({"enable_cpu_mem_arena": "True", "session.disable_prepacking": "0", "runs": str(runs)})

        sess = None
        try:
            try:
                sess = ort.InferenceSession(source, sess_options=so, providers=["CPUExecutionProvider"])
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception classes
                raise RuntimeMeasurementError(f"onnxruntime cannot load the model: {_one_line(exc)}") from None
            try:
                for _ in range(runs):
                    sess.run(None, feeds)
            except Exception as exc:  # noqa: BLE001
                raise RuntimeMeasurementError(f"onnxruntime cannot run the model: {_one_line(exc)}") from None
            profile_path = Path(sess.end_profiling())
            if not profile_path.is_absolute():
                profile_path = Path.cwd() / profile_path
            try:
                with open(profile_path, encoding="utf-8") as f:
                    events = json.load(f)
            except (OSError, ValueError) as exc:
                raise RuntimeMeasurementError(f"cannot read the onnxruntime profile: {_one_line(exc)}") from None
        finally:
            del sess  # release onnxruntime's files before the directory goes

        grouped = _split_runs(events, runs)
        first = next((group for group in grouped if group), None)
        baseline = _baseline(first) if first else 0
        measured = tuple(_measure_run(i, group, baseline) for i, group in enumerate(grouped))
        order = tuple(_node_name(e) for e in grouped[0])
        optimized = _load_optimized(optimized_path)
    return CpuMeasurement(runs=measured, execution_order=order, optimized_model=optimized, settings=settings)

