"""`python -m onnxmem`: the same as the `onnxmem` command."""

from .cli import run

run()
