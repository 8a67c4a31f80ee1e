"""Run an export in a child process of its own (POSIX fork), so that the process that analyses the file never
holds torch, transformers and the exporter (about 500 MiB that stay imported after an export, and the exporter's
garbage): the command's peak memory is the larger of the export's and the analysis's, not their sum."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from onnxmem.errors import OnnxMemError

T = TypeVar("T")

# what the child imports: where the parent holds them already, the export runs in the parent (nothing to save)
_HEAVY = ("torch", "transformers")


def _can_fork() -> bool:
    """Say whether a forked child can run the export: POSIX, torch and transformers not imported here, and no other
    Python thread running."""
    return hasattr(os, "fork") and not any(name in sys.modules for name in _HEAVY) and threading.active_count() == 1


def in_child(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Give function(*args, **kwargs) run in a forked child, its result (or the OnnxMemError it raised) sent back
    pickled; run here where there is no fork (Windows), where torch or transformers is imported already, or where
    other threads run (a lock one of them holds would stay held in the child). A child that ends without an answer
    (killed: out of memory) is an OnnxMemError that says so; an interrupt ends the child."""
    if not _can_fork():
        return function(*args, **kwargs)
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        code = 0
        try:
            answer: tuple[str, Any] = ("ok", function(*args, **kwargs))
        except OnnxMemError as error:
            answer = ("error", error)
        except BaseException as error:  # noqa: BLE001 (the parent raises it as its own internal error)
            answer = ("failed", f"{type(error).__name__}: {error}")
        try:
            data = pickle.dumps(answer)
        except Exception:  # noqa: BLE001 (an error whose arguments do not pickle: its message)
            data = pickle.dumps(("error", OnnxMemError(str(answer[1]))))
        try:
            with os.fdopen(write, "wb") as stream:
                stream.write(data)
        except BaseException:  # noqa: BLE001
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as stream:
            data = stream.read()
        _, status = os.waitpid(pid, 0)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    if not data:
        how = f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else \
            f"exit status {os.WEXITSTATUS(status)}"
        raise OnnxMemError(f"the export's process ended without an answer ({how}; out of memory?)")
    kind, value = pickle.loads(data)  # noqa: S301 (our own child's answer)
    if kind == "ok":
        return value
    if kind == "error":
        raise value
    raise RuntimeError(f"the export failed: {value}")
