"""frontends/child.in_child: an export run in a forked child, its answer or its error sent back."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from onnxmem.errors import DimError, OnnxMemError
from onnxmem.frontends import child

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here: the export runs in the process")


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> None:
    # (this process has imported torch, and other tests may have left threads running: fork anyway)
    monkeypatch.setattr(child, "_can_fork", lambda: True)


def _pid_and(value: int) -> tuple[int, int]:
    return os.getpid(), value * 2


def test_the_answer_comes_back_from_another_process(forking: None) -> None:
    pid, doubled = child.in_child(_pid_and, 21)
    assert doubled == 42 and pid != os.getpid()


def _raise_dim_error() -> None:
    raise DimError("unbound dims: seq")


def test_an_onnxmem_error_is_raised_here_as_it_was_there(forking: None) -> None:
    with pytest.raises(DimError, match="unbound dims: seq"):
        child.in_child(_raise_dim_error)


def _killed(parent: int) -> None:
    if os.getpid() == parent:
        raise AssertionError("not in a child: nothing killed")
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_child_killed_without_an_answer_is_a_one_line_error(forking: None) -> None:
    with pytest.raises(OnnxMemError, match="ended without an answer .killed by signal 9"):
        child.in_child(_killed, os.getpid())


def _bug() -> None:
    raise KeyError("a bug")


def test_another_exception_is_an_internal_error_here(forking: None) -> None:
    with pytest.raises(RuntimeError, match="the export failed: KeyError"):
        child.in_child(_bug)


def test_it_runs_here_where_torch_is_imported_or_another_thread_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child.threading, "active_count", lambda: 1)
    monkeypatch.setattr(child, "_HEAVY", ("a module no test imports",))
    assert child._can_fork()
    monkeypatch.setattr(child, "_HEAVY", ("os",))  # (imported: as torch would be)
    assert not child._can_fork()
    pid, _ = child.in_child(_pid_and, 1)
    assert pid == os.getpid()
    monkeypatch.setattr(child, "_HEAVY", ("a module no test imports",))
    monkeypatch.undo()
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        assert not child._can_fork()
    finally:
        release.set()
        worker.join()
