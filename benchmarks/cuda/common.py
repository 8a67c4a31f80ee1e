"""What the campaign's driver, measurers, scorer and tests share, without torch: the row writer, the case keys, the
skip-done logic, the time budget and the child-process runner.

A row is one JSON object on one line of rows.jsonl (schema in benchmarks/results/cuda/README.md). Every row has
`schema`, `kind`, `key`, `case`, `time` and `error` (None when it succeeded); a measurement is done when a row with
its key and no error exists (an error of kind "failed", a deterministic exception, counts as done too, so that a
later window does not spend its minutes on it again; a timeout, a crash, a budget skip or a part skipped for
want of what it needs does not).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "onnxmem.cuda-campaign/1"
ROOT = Path(__file__).resolve().parent.parent.parent
MEASURE = Path(__file__).resolve().parent / "measure.py"

# the parts in the order the campaign runs them: the most valuable data first (the single ops lead since the
# 2026-11-27 window measured the whole models)
PARTS = ("singleop", "context", "training", "fit", "ort", "memtracker", "estimate")
# error kinds that leave a measurement to be done again by a later window (skipped: the part could not run here);
# `failed` and `unsupported` (the tool cannot run this model: FakeTensorMode on a data-dependent op) are done
RETRY_ERRORS = ("timeout", "budget", "crashed", "skipped")
# failures the harness has since fixed: a failed row whose key starts with the prefix and whose error holds the text
# is measured again (benchmarks/cuda/models.py: LoRALinear reads as the Linear it wraps; wav2vec2's encoders leave
# LayerDrop's data-dependent branch out of train mode; mixtral's experts export)
FIXED_FAILURES = (
    ("training/t5/lora/", "'LoRALinear' object has no attribute 'weight'"),
    ("export/t5/lora", "'LoRALinear' object has no attribute 'weight'"),
    ("export/wav2vec2/", "GuardOnDataDep"),
    ("memtracker/wav2vec2/", "DataDependentOutputException"),  # the same LayerDrop branch under FakeTensorMode
    ("export/mixtral_moe/", "grouped_mm_fallback"),
)


def now_iso() -> str:
    """Give the current UTC time as an ISO 8601 string (seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# rows whose figures come from onnxmem's own answer as well as the GPU (fit's batch, run at and past the answer):
# measured again whenever onnxmem's code changed since (their `estimator` fingerprint differs)
ESTIMATOR_KINDS = ("fit",)


@functools.lru_cache(maxsize=1)
def estimator_fingerprint() -> str:
    """Give a fingerprint of onnxmem's code (its package's .py files): fit's answer is this code's."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "onnxmem").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def make_row(kind: str, key: str, case: str = "", error: str | None = None, error_kind: str | None = None,
             **fields: Any) -> dict[str, Any]:
    """Give a row: the fields every row has, then `fields` (a fit row: the estimator's fingerprint too)."""
    if kind in ESTIMATOR_KINDS:
        fields.setdefault("estimator", estimator_fingerprint())
    return {"schema": SCHEMA, "kind": kind, "key": key, "case": case or key, "time": now_iso(), "error": error,
            "error_kind": error_kind if error is not None else None, **fields}


class RowWriter:
    """Appends rows to a JSON-lines file, each one flushed and fsynced as it is made (a killed run keeps them).

    Safe across threads and processes: the measurers of the GPU lane and of the CPU lane append to the same file at
    once, each line in one locked write.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, row: dict[str, Any]) -> dict[str, Any]:
        """Give the row after appending it as one line (flush + fsync)."""
        data = (json.dumps(row, default=_json_default) + "\n").encode("utf-8")
        with self._lock:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)  # other processes append to the same file
                view = memoryview(data)
                while view:
                    view = view[os.write(descriptor, view):]
                os.fsync(descriptor)
            finally:
                os.close(descriptor)  # closing releases the lock
        return row


def _json_default(value: Any) -> Any:
    """Give a JSON-ready stand-in for a value json cannot write (a path, a device, a dtype)."""
    return str(value)


def read_rows(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    """Give every row of the JSON-lines files (or folders holding *.jsonl) given; unreadable lines are skipped (a
    line cut by a killed run)."""
    rows: list[dict[str, Any]] = []
    for given in paths:
        path = Path(given)
        files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
        for file in files:
            if not file.exists():
                continue
            for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    return rows


def done_keys(rows: Iterable[dict[str, Any]]) -> set[str]:
    """Give the keys already measured: rows without an error, or with one that another try would repeat (a fit row
    only while onnxmem's code is the one it measured: estimator_fingerprint)."""
    rows = list(rows)
    # a model whose largest batch that runs is measured (fit/MODEL/measured-max: the batches that ran and ran out
    # of memory) needs no new fit rows when the code changes: score_fit.py scores any answer against those bounds
    bounded = {str(r.get("key")).rsplit("/", 1)[0] for r in rows
               if str(r.get("key", "")).endswith("/measured-max") and r.get("error") is None and r.get("probes")}
    done = set()
    for row in rows:
        key = row.get("key")
        if not key or row.get("kind") in ("campaign", "env", "summary"):
            continue
        if row.get("kind") in ESTIMATOR_KINDS and row.get("estimator") != estimator_fingerprint() \
                and str(key).rsplit("/", 1)[0] not in bounded:
            continue  # onnxmem's answer has changed since: measure it again
        if row.get("error") is None or row.get("error_kind") not in RETRY_ERRORS and not fixed_since(row):
            done.add(str(key))
    return done


def fixed_since(row: dict[str, Any]) -> bool:
    """Say whether a failed row's failure is one the harness has since fixed (FIXED_FAILURES)."""
    key, error = str(row.get("key")), str(row.get("error") or "")
    return any(key.startswith(prefix) and text in error for prefix, text in FIXED_FAILURES)


@dataclass
class Case:
    """One unit of work run in a fresh process: a part, a model (or a library), and the row keys it makes."""

    part: str
    name: str  # the model, or the library for the context part
    keys: tuple[str, ...]  # the rows it makes when all goes well
    timeout_s: float  # its own limit
    min_s: float  # do not start it with less time than this left
    lane: str = "gpu"  # gpu: one at a time, in order; cpu: in the worker pool beside the GPU lane
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """Give the case's id (part/name)."""
        return f"{self.part}/{self.name}"

    def todo(self, done: set[str]) -> tuple[str, ...]:
        """Give the keys of this case not yet done."""
        return tuple(k for k in self.keys if k not in done)


def order_cases(cases: Sequence[Case], parts: Sequence[str]) -> list[Case]:
    """Give the cases in the campaign's order: by the part's rank in PARTS (most valuable first), then as given."""
    rank = {p: i for i, p in enumerate(PARTS)}
    wanted = [c for c in cases if c.part in parts]
    return sorted(wanted, key=lambda c: rank.get(c.part, len(PARTS)))


def pending_cases(cases: Sequence[Case], done: set[str]) -> tuple[list[Case], list[Case]]:
    """Give (the cases with something left to do, the cases entirely done already)."""
    todo, skipped = [], []
    for case in cases:
        (todo if case.todo(done) else skipped).append(case)
    return todo, skipped


class Budget:
    """The campaign's time budget: whether a case may start, and the limit it gets.

    `reserve_s` is kept back for the end (the table, the archive); a case starts only when its `min_s` fits in what
    is left after the reserve, and its timeout is cut to what is left.
    """

    def __init__(self, total_s: float, reserve_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_s = total_s
        self.reserve_s = reserve_s
        self.clock = clock
        self.started = clock()

    def elapsed(self) -> float:
        """Give the seconds since the budget started."""
        return self.clock() - self.started

    def left(self) -> float:
        """Give the seconds left for cases (the reserve taken off), never below 0."""
        return max(0.0, self.total_s - self.reserve_s - self.elapsed())

    def may_start(self, case: Case) -> bool:
        """Say whether the case may start: its minimum fits in what is left."""
        return self.left() >= case.min_s

    def timeout_for(self, case: Case) -> float:
        """Give the case's limit: its own timeout, cut to what is left (at least 1 s)."""
        return max(1.0, min(case.timeout_s, self.left()))


@dataclass
class ChildResult:
    """How a child process ended."""

    returncode: int | None  # None: killed at its timeout
    seconds: float
    tail: str  # the end of its output (stdout and stderr together)

    @property
    def timed_out(self) -> bool:
        """Say whether the child was killed at its timeout."""
        return self.returncode is None


def run_child(command: Sequence[str], timeout_s: float, env: dict[str, str] | None = None,
              cwd: Path | None = None, tail_chars: int = 2000) -> ChildResult:
    """Give how a child process ended: run it in its own process group and kill the group at the timeout (a
    hung CUDA call or a grandchild cannot outlive it)."""
    started = time.monotonic()
    with subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                          cwd=str(cwd) if cwd else None, start_new_session=True) as process:
        with _ACTIVE_LOCK:
            ACTIVE.add(process)
        try:
            output, _ = process.communicate(timeout=timeout_s)
            code: int | None = process.returncode
        except subprocess.TimeoutExpired:
            _kill_group(process)
            output, _ = process.communicate()
            code = None
        finally:
            with _ACTIVE_LOCK:
                ACTIVE.discard(process)
    text = output.decode("utf-8", errors="replace") if output else ""
    return ChildResult(code, time.monotonic() - started, text[-tail_chars:])


# the children running now (each in its own session: killing the driver would not end them)
ACTIVE: set[subprocess.Popen[bytes]] = set()
_ACTIVE_LOCK = threading.Lock()


def kill_active() -> int:
    """Give the number of running children whose process groups were killed (the driver's last act when it is
    stopped: a child in its own session would outlive it and hold the GPU)."""
    with _ACTIVE_LOCK:
        running = list(ACTIVE)
    for process in running:
        _kill_group(process)
    return len(running)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill the child's process group (its own session, so nothing else)."""
    import signal

    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()


def case_command(case: Case, rows_path: Path, work: Path, done: set[str], settings: dict[str, Any]) -> list[str]:
    """Give the command line that runs one case in a fresh Python (measure.py reads its JSON argument)."""
    spec = {"part": case.part, "name": case.name, "keys": list(case.todo(done)), "rows": str(rows_path),
            "work": str(work), "case": case.id, "args": case.args, **settings}
    return [sys.executable, str(MEASURE), json.dumps(spec)]


def outcome_row(case: Case, result: ChildResult, made: int) -> dict[str, Any] | None:
    """Give the row that records how a child failed (a timeout, a crash, or an exit without its rows), or None
    when it ended well."""
    if result.timed_out:
        return make_row(case.part, case.id, case.id, error=f"timed out after {result.seconds:.0f} s "
                        f"({made} rows made)", error_kind="timeout", model=case.name, seconds=round(result.seconds, 1),
                        tail=result.tail[-800:])
    if result.returncode != 0:
        return make_row(case.part, case.id, case.id, error=f"exit code {result.returncode} ({made} rows made)",
                        error_kind="crashed", model=case.name, seconds=round(result.seconds, 1),
                        tail=result.tail[-800:])
    return None


def iter_new_rows(path: Path, offset: int) -> Iterator[tuple[dict[str, Any], int]]:
    """Give each row appended to `path` after byte `offset`, with the offset after it."""
    if not path.exists():
        return
    with open(path, "rb") as handle:
        handle.seek(offset)
        for raw in handle:
            offset += len(raw)
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                yield row, offset


def fmt_bytes(value: Any) -> str:
    """Give bytes as MiB with one decimal ('-' when absent)."""
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value / 2**20:,.1f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Give a plain fixed-width table (the device tool keeps only the end of the output: keep it short)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
