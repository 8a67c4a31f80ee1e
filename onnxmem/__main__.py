"""`python -m onnxmem`: the same as the `onnxmem` command."""

from onnxmem.cli.console import run

run()
