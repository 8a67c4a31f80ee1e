"""ExecutionProvider: everything a report, fit, check and validate need to know about one onnxruntime execution
provider, behind one interface. A new provider is a new folder beside cpu/ and cuda/ with a class implementing
this and its rule tables, and an entry in targets.ort.PROVIDERS; nothing outside targets/ changes.

What a provider decides:
- what it does to the graph before it runs it (transformed: the CPU provider's float16 Casts and inlined function
  bodies, the CUDA provider's placement and Memcpy copies); onnxruntime's own change to QDQ models comes first on
  every provider (runtime_model),
- its kernels' in-place and alias declarations (buffer_rules),
- what its arena holds from session creation (session_weights: prepacked weights, initializers copied in, graph
  inputs copied in each run) and the scratch its kernels allocate there while they run (kernel_scratch),
- the scratch its kernels hold while they run that its measurement sees above the live tensors, which the liveness
  peak counts at the op's step (op_scratch: the CUDA provider's cuDNN convolution workspaces; none on CPU),
- what fit and check count besides its arena (outside_arena_bytes),
- whether the float16 what-if may re-size the same graph (float16_keeps_graph),
- validate's measurement (measure: the function that runs onnxruntime, imported when called) and how its
  estimate reads it (the validate_* members).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

    from onnxmem.ir.graph import ModelGraph
    from onnxmem.ir.load import LoadedModel
    from onnxmem.ir.tensor_types import TensorType
    from onnxmem.targets.ort.rules import InferenceRules
    from onnxmem.views.report import Warning


@dataclass(frozen=True)
class SessionWeights:
    """What an onnxruntime session's arena holds besides the activations: bytes reserved at their exact size at
    session creation (outside the regions), allocations made in its regions at creation, and the bytes of each graph
    input that every run copies into the arena before it starts."""

    reserved: int
    in_regions: tuple[int, ...] = ()
    inputs_per_run: tuple[int, ...] = ()


@dataclass(frozen=True)
class OpScratch:
    """The bytes each op's kernel allocates while it runs and frees before the next op (a library's workspace), by
    op index, which liveness counts above the tensors live at the op's step; and the warnings naming the ops whose
    scratch is not known (each says what is assumed)."""

    bytes_by_op: Mapping[int, int] = field(default_factory=dict)
    warnings: tuple[Warning, ...] = ()


@dataclass(frozen=True)
class ExecutionProvider(ABC):
    """One onnxruntime execution provider (see the module's docstring). Implementations are frozen dataclasses
    with no state: one instance per provider, in targets.ort.PROVIDERS."""

    name: str  # onnxruntime's provider, as the CLI and the report's JSON name it ("cpu", "cuda")
    # validate's measurement, "module:function", imported when validate runs (the only import of onnxruntime)
    measurement: str
    # whether the float16 what-if may re-size the graph it has (no change this provider makes depends on element
    # types); else the converted model is analysed whole
    float16_keeps_graph: bool
    # whether validate's measurement sees what the arena holds from the device (then the simulation is compared)
    measures_arena: bool

    def runtime_model(self, given: LoadedModel, rules: InferenceRules) -> tuple[LoadedModel, list[Warning]]:
        """Give the model as onnxruntime runs it on this provider, and a note of what changed: its own change to
        QDQ models (every level, every provider: qdq.unique_dequantize), made before it partitions the graph, then
        this provider's (transformed)."""
        from onnxmem.targets.ort.qdq import unique_dequantize

        return self.transformed(unique_dequantize(given) or given, rules)

    @abstractmethod
    def transformed(self, loaded: LoadedModel, rules: InferenceRules) -> tuple[LoadedModel, list[Warning]]:
        """Give the model as this provider runs it (after onnxruntime's QDQ change), and a note of what changed."""

    @abstractmethod
    def buffer_rules(self, rules: InferenceRules) -> InferenceRules:
        """Give the buffer rules an analysis on this provider uses: its kernels' own where `rules` are the
        defaults (the CPU provider's, measured), else `rules` as given."""

    @abstractmethod
    def session_weights(self, graph: ModelGraph, model: onnx.ModelProto, given: onnx.ModelProto | None = None,
                        sizes: Sequence[int | None] | None = None) -> SessionWeights:
        """Give what the arena holds besides activations (SessionWeights). `model`: the model the graph was built
        from; `given`: the model as the user gave it; `sizes`: each tensor's bytes where not the graph's own."""

    @abstractmethod
    def kernel_scratch(self, graph: ModelGraph, model: onnx.ModelProto,
                       shape_of: Callable[[int], tuple[int, ...] | None] | None = None) -> dict[int, tuple[int, ...]]:
        """Give, per op index, the bytes of the scratch its kernel allocates from the arena while it runs."""

    @abstractmethod
    def op_scratch(self, graph: ModelGraph, model: onnx.ModelProto) -> OpScratch:
        """Give the scratch each op's kernel holds while it runs, above the tensors live then, that the activation
        peak counts (OpScratch; liveness's `scratch`), on the graph built from `model` and sized."""

    @abstractmethod
    def outside_arena_bytes(self, graph: ModelGraph, model: onnx.ModelProto) -> int:
        """Give the bytes a session holds for inference outside its arena (fit and check add them)."""

    def measure(self, source: str | onnx.ModelProto, feeds: Mapping[str, Any], *, opt_level: str, runs: int,
                mem_pattern: bool) -> Any:
        """Run the model in onnxruntime on this provider and give its measurement (validate's)."""
        module, function = self.measurement.split(":")
        measure = getattr(importlib.import_module(module), function)
        return measure(source, feeds, opt_level=opt_level, runs=runs, mem_pattern=mem_pattern)

    def validate_plan_types(self, ran: onnx.ModelProto, given: onnx.ModelProto,
                            plan_types: dict[str, TensorType]) -> dict[str, TensorType]:
        """Give the types onnxruntime's planner compared on the graph it ran (`plan_types`: as its inference finds
        them and the file declares them), where this provider's changes typed some otherwise."""
        return plan_types

    @abstractmethod
    def validate_weights(self, graph: ModelGraph, ran: onnx.ModelProto, given: onnx.ModelProto) -> int:
        """Give the weight bytes validate's measurement counts (the graph onnxruntime ran, of `ran`)."""

    @abstractmethod
    def validate_measured_weights(self, measured: Any, run: Any) -> int:
        """Give the weight bytes a measurement (`measured`, one of its runs: `run`) holds."""

    @abstractmethod
    def validate_notes(self, measured: Any) -> tuple[str, ...]:
        """Give validate's notes on what its measurement sees and what the estimate counts."""
