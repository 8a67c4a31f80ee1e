"""One command run in a subprocess under a time and an address-space limit, with the peak RSS of that run alone:
the runner of benchmarks/fuzz.py and benchmarks/hostile_corpus.py (and their tests).

The peak is the run's own. `ru_maxrss` of a child counts the memory of the process it was before it called exec
(Linux keeps the high-water mark of the image exec replaces), and a child forked from the runner starts as a copy
of the runner: measured, a child running /bin/true reports 808 MiB when forked from a Python process holding 800 MiB
(subprocess with preexec_fn, and without it), so each run of the fuzz counted the fuzz's own memory (a pytest
session's, under tests/test_fuzz.py). Here a small parent (`python -S`: 4 MiB) sets the limit, forks and execs the
command, and reads its child's peak with os.wait4: the run's own peak, to within that parent's few MiB.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The run's parent: sets the address-space limit, forks the command, and writes its exit status and peak RSS; it
# dies of the signal that killed the command, so the runner sees the same exit.
_PARENT = """import os, resource, signal, sys
limit, report, *command = sys.argv[1:]
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))
    os.execv(command[0], command)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as out:
    out.write(str(usage.ru_maxrss * 1024))
code = os.waitstatus_to_exitcode(status)
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


@dataclass(frozen=True)
class Measured:
    """How one run ended and what it cost."""

    code: int  # the exit status; -N: killed by signal N
    seconds: float
    max_rss_bytes: int  # the run's own peak resident memory (0 where it was killed before it could be read)
    stderr: str
    timed_out: bool


def run_measured(command: Sequence[str], timeout: float, memory_bytes: int, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None) -> Measured:
    """Run `command` (its first item an absolute path to the program) under `timeout` seconds and `memory_bytes`
    of address space, its stdin and stdout empty; give its exit status, stderr and own peak RSS. A run past the
    timeout is killed with its parent (their own session) and reported as timed out."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err, tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "rss"
        process = subprocess.Popen([sys.executable, "-S", "-c", _PARENT, str(memory_bytes), str(report), *command],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                   env=None if env is None else dict(env), cwd=cwd, start_new_session=True)
        try:
            process.wait(timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the run and its parent
            process.wait()
            timed_out = True
        text = report.read_text() if report.exists() else ""
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    return Measured(process.returncode, time.perf_counter() - start, int(text) if text else 0, stderr, timed_out)


def in_fork(function: Callable[..., Any], *args: Any) -> Any:
    """Give function(*args) computed in a forked child, so that each measurement starts from the parent's heap and
    leaves nothing behind (caches, a library's buffers), passed back as JSON. Raises RuntimeError with the child's
    error, named by the function and its arguments."""
    import json

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            answer: dict[str, Any] = {"value": function(*args)}
        except BaseException as error:  # noqa: BLE001 - said to the parent, which raises it
            answer = {"error": f"{type(error).__name__}: {error}"}
        os.write(write, json.dumps(answer).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as stream:
        text = stream.read()
    os.waitpid(pid, 0)
    answer = json.loads(text) if text else {"error": "the child wrote nothing"}
    if "error" in answer:
        raise RuntimeError(f"{function.__name__}{args}: {answer['error']}")
    return answer["value"]
