"""What an --hf export traced before its layers are repeated (onnxmem.hf.trace_config gives it, write_traced
finishes it; a graph template makes one without torch: frontends/templates.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Traced:
    """A config's export before its layers are repeated (what trace_config gives and write_traced finishes): the
    ONNX model with each stack of identical layers cut to its first two, and what finishing it takes."""

    proto: Any  # onnx.ModelProto
    model_class: str
    task: str
    stacks: dict[str, int]  # each cut stack's module path and its full length
    axes: list[dict[int, str]]  # the symbolic axes of each graph input, in order (every layer's cache for decode)
    properties: dict[str, str]  # the model properties (a training export's mode and checkpointed layers)
    per_layer: dict[str, str] | None  # a decode export's per-layer inputs and outputs (frontends/decode.py)
    counts: tuple[int, int, int]  # parameters, their bytes, LoRA's parameters (HfModel's)

    @property
    def dims(self) -> tuple[str, ...]:
        # (the dims to bind: 'past + seq', an attention mask's, is bound with them)
        return tuple(dict.fromkeys(d for per_input in self.axes for d in per_input.values() if "+" not in d))
