"""Shared helpers for tests that drive the CLI in-process: invoke a command, save a model to a temp path."""

from __future__ import annotations

from pathlib import Path

import onnx
from click.testing import CliRunner

from onnxmem.cli.commands import main


def run(*args: str) -> tuple[int, str, str]:
    """Invoke ``onnxmem`` with ``args``; return (exit code, stdout, stderr)."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def save(model: onnx.ModelProto, path: Path) -> str:
    """Save ``model`` at ``path`` and return the path as a string."""
    onnx.save(model, str(path))
    return str(path)
