"""`python -m onnxmem`: the same as the `onnxmem` command."""

from .console import run

run()
