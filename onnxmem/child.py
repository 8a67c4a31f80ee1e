"""ChildJob: work run in a forked child process while the caller goes on (onnx's C++ shape inference holds the
GIL, so a thread would not overlap it), its result sent back pickled."""

from __future__ import annotations

import marshal
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# A child process costs milliseconds to start and to send its result back; on a graph of fewer nodes the work it
# overlaps (about 7 us per node to build a graph, 9 to simulate a training step) is smaller than that.
FORK_FROM_NODES = 5000
# The same for work that starts before its model is parsed, by the size of the model's file: the generated LLM
# graphs take 170 to 190 bytes a node, so about 5000 nodes (embedded weights only make a file larger).
FORK_FROM_BYTES = 800 * 1024


class ChildJob(Generic[T]):
    """`work` run in a forked child while the caller goes on, its result sent back pickled, where the platform
    allows it and the process has one thread (forking a threaded process is unsafe); elsewhere, and where the
    child fails (its exit status is not 0), result() runs `work` here, so its errors surface here as they would
    anyway. `work` is told whether it runs in the child (where it may change the objects it reads: they are its
    own)."""

    def __init__(self, work: Callable[[bool], T], nodes: int | None = None, file_bytes: int | None = None) -> None:
        """`nodes`: the size of the graph `work` reads; a smaller one than FORK_FROM_NODES runs here. `file_bytes`:
        the size of the file `work` reads its graph from, where it is not parsed yet (see FORK_FROM_BYTES)."""
        self._work = work
        self._pid: int | None = None
        self.forked = False  # whether `work` runs in a child
        small = (nodes is not None and nodes < FORK_FROM_NODES) or \
            (file_bytes is not None and file_bytes < FORK_FROM_BYTES)
        if small or sys.platform != "linux" or threading.active_count() != 1 or _native_threads():
            return
        read, write = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            return
        if pid == 0:  # the child: send the result, or exit 1; never return into the caller's code
            status = 1
            try:
                os.close(read)
                data = memoryview(_dumps(work(True)))
                while data:
                    data = data[os.write(write, data):]
                status = 0
            finally:
                os._exit(status)
        os.close(write)
        self._pid, self._read = pid, read
        self.forked = True

    def result(self) -> T:
        if self._pid is None:
            return self._work(False)
        with os.fdopen(self._read, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        return _loads(data) if status == 0 else self._work(False)

    def __enter__(self) -> ChildJob[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()  # a result not taken (the caller failed meanwhile): the child is not left behind

    def cancel(self) -> None:
        """Stop the child, if it still runs and its result was not taken."""
        if self._pid is not None:
            os.kill(self._pid, signal.SIGKILL)
            os.close(self._read)
            os.waitpid(self._pid, 0)
            self._pid = None


def _dumps(value: Any) -> bytes:
    """Give a result as bytes: by marshal where it is made of builtins only (a 120k-entry dict of types: 10 ms,
    where pickle takes 45), else by pickle; the first byte says which."""
    try:
        return b"M" + marshal.dumps(value)
    except ValueError:  # an object marshal does not know
        return b"P" + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _loads(data: bytes) -> Any:
    return marshal.loads(data[1:]) if data[:1] == b"M" else pickle.loads(data[1:])


def _native_threads() -> bool:
    """Say whether a library that runs thread pools of its own, which threading does not count, is loaded
    (onnxruntime after a session, torch): a child forked then could inherit a lock one of them holds."""
    return any(name in sys.modules for name in ("onnxruntime", "torch"))
