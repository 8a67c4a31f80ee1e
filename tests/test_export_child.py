"""frontends/child.in_child: an export run in a forked child, its answer or its error sent back."""

from __future__ import annotations

import os
import signal

import pytest

from onnxmem.errors import DimError, OnnxMemError
from onnxmem.frontends import child

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here: the export runs in the process")


@pytest.fixture(autouse=True)
def _fork_even_with_torch_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child, "_HEAVY", ("a module no test imports",))


def _pid_and(value: int) -> tuple[int, int]:
    return os.getpid(), value * 2


def test_the_answer_comes_back_from_another_process() -> None:
    pid, doubled = child.in_child(_pid_and, 21)
    assert doubled == 42 and pid != os.getpid()


def _raise_dim_error() -> None:
    raise DimError("unbound dims: seq")


def test_an_onnxmem_error_is_raised_here_as_it_was_there() -> None:
    with pytest.raises(DimError, match="unbound dims: seq"):
        child.in_child(_raise_dim_error)


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_child_killed_without_an_answer_is_a_one_line_error() -> None:
    with pytest.raises(OnnxMemError, match="ended without an answer .killed by signal 9"):
        child.in_child(_killed)


def _bug() -> None:
    raise KeyError("a bug")


def test_another_exception_is_an_internal_error_here() -> None:
    with pytest.raises(RuntimeError, match="the export failed: KeyError"):
        child.in_child(_bug)


def test_where_the_heavy_modules_are_here_it_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child, "_HEAVY", ("os",))
    pid, _ = child.in_child(_pid_and, 1)
    assert pid == os.getpid()


def test_where_other_threads_run_it_runs_here() -> None:
    import threading

    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        pid, _ = child.in_child(_pid_and, 1)
    finally:
        release.set()
        worker.join()
    assert pid == os.getpid()
