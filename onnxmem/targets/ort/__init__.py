"""onnxruntime inference: one ExecutionProvider per provider (base.py), cpu/ and cuda/ each with its class and rule
tables, and what they share here (the arena, the planner's view of shapes, QDQ, the common rule tables).

PROVIDERS names every provider a report can assume; execution_provider gives one by name."""

from __future__ import annotations

from onnxmem.errors import OnnxMemError
from onnxmem.targets.ort.base import ExecutionProvider
from onnxmem.targets.ort.cpu.provider import CPU
from onnxmem.targets.ort.cuda.provider import CUDA

# What differs between them in a report: the Casts the CPU provider inserts around operators without a float16
# kernel; the nodes the CUDA provider leaves on the CPU, the Memcpy copies it inserts and its kernels' in-place rules
# (from onnxruntime's source, not measured).
PROVIDERS: dict[str, ExecutionProvider] = {"cuda": CUDA, "cpu": CPU}
DEFAULT_PROVIDER = "cuda"


def execution_provider(provider: str | ExecutionProvider) -> ExecutionProvider:
    """Give the execution provider of this name (one given is given back).

    Raises
    ------
    OnnxMemError
        No provider has this name; the message names the choices.
    """
    if isinstance(provider, ExecutionProvider):
        return provider
    found = PROVIDERS.get(provider)
    if found is None:
        raise OnnxMemError(f"unknown provider '{provider}': choose from {', '.join(PROVIDERS)}")
    return found


__all__ = ["DEFAULT_PROVIDER", "PROVIDERS", "ExecutionProvider", "execution_provider"]
