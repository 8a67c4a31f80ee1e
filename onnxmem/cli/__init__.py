"""The `onnxmem` command: click commands over the library (commands.py) and its entry point (console.py).

Importing this package imports neither: the console installs its signal handlers before click and the library load.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """Give `main`, the click group (onnxmem.cli.commands.main), on first use."""
    if name == "main":
        from onnxmem.cli.commands import main

        return main
    raise AttributeError(f"module 'onnxmem.cli' has no attribute '{name}'")
