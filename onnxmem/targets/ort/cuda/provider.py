"""onnxruntime's CUDA execution provider: the nodes it leaves on the CPU and the Memcpy copies it inserts
(placement.py), its kernels' in-place and alias declarations (tables.py: from its source, not measured), every
initializer on the device and the graph inputs copied in each run, and validate's measurement through its
gpu_external_alloc hooks (measure.ort_cuda)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnxmem.targets.ort.base import ExecutionProvider, SessionWeights
from onnxmem.targets.ort.cuda.tables import CUDA_ALIASES, CUDA_IN_PLACE
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES, InferenceRules
from onnxmem.targets.ort.tables import TAKES_NO_FREED_BUFFER

if TYPE_CHECKING:
    import onnx

    from onnxmem.ir.graph import ModelGraph
    from onnxmem.ir.load import LoadedModel
    from onnxmem.views.report import Warning

# The CUDA provider's kernels declare other in-place and alias rules (tables.py: from its source, not measured).
CUDA_INFERENCE_RULES = InferenceRules(dict(CUDA_ALIASES), CUDA_IN_PLACE, no_freed_buffer=TAKES_NO_FREED_BUFFER)


@dataclass(frozen=True)
class CudaProvider(ExecutionProvider):
    """onnxruntime's CUDAExecutionProvider (see the module's docstring)."""

    name: str = "cuda"
    measurement: str = "onnxmem.measure.ort_cuda:measure_cuda"
    float16_keeps_graph: bool = True  # its placement does not depend on float32 against float16
    measures_arena: bool = False  # the measurement counts every allocation, its arena bypassed

    def transformed(self, loaded: LoadedModel, rules: InferenceRules) -> tuple[LoadedModel, list[Warning]]:
        """Give the model as the CUDA provider runs it: the nodes it leaves on the CPU and the copies between host
        and device memory (placement.on_cuda), and a note of what changed."""
        from onnxmem.targets.ort.cuda.placement import on_cuda

        return on_cuda(loaded)

    def buffer_rules(self, rules: InferenceRules) -> InferenceRules:
        return CUDA_INFERENCE_RULES if rules is DEFAULT_INFERENCE_RULES else rules

    def session_weights(self, graph: ModelGraph, model: onnx.ModelProto, given: onnx.ModelProto | None = None,
                        sizes: Sequence[int | None] | None = None) -> SessionWeights:
        """Every initializer, reserved on the device at session creation; each run copies the graph inputs in."""
        from onnxmem.ir.graph import WEIGHT

        reserved = sum(t.nbytes or 0 for t in graph.tensors if t.kind == WEIGHT)
        inputs = tuple((sizes[t] if sizes is not None else graph.tensors[t].nbytes) or 0 for t in graph.inputs)
        return SessionWeights(reserved, (), inputs)

    def kernel_scratch(self, graph: ModelGraph, model: onnx.ModelProto,
                       shape_of: Callable[[int], tuple[int, ...] | None] | None = None) -> dict[int, tuple[int, ...]]:
        """None modelled: the scratch tables are the CPU kernels' (measured there); what the CUDA kernels allocate
        (cuBLAS and cuDNN workspaces, per-kernel scratch) is their own and not known here."""
        return {}

    def outside_arena_bytes(self, graph: ModelGraph, model: onnx.ModelProto) -> int:
        return 0  # every initializer is in the arena (session_weights)

    def validate_weights(self, graph: ModelGraph, ran: onnx.ModelProto, given: onnx.ModelProto) -> int:
        """Device memory: every initializer is copied to the GPU when the session is created."""
        return self.session_weights(graph, ran, given).reserved

    def validate_measured_weights(self, measured: Any, run: Any) -> int:
        return int(measured.session_bytes)

    def validate_notes(self, measured: Any) -> tuple[str, ...]:
        notes = [
            "measured: every device allocation of onnxruntime's CUDA provider, counted through gpu_external_alloc "
            "(its arena bypassed); memory that CUDA, cuBLAS and cuDNN allocate themselves (context, handles, "
            "default workspaces) is not seen by it",
            "estimated on the graph onnxruntime ran, in the order it ran it, with the CUDA kernels' in-place and alias "
            "rules (as `onnxmem report --provider cuda`); graph inputs are added (each run copies them to the device); "
            "weights: every initializer, copied to the device",
            "not yet checked on a GPU by this project: differences are what the CUDA provider does beyond the CPU "
            "rules (kernel workspaces, per-kernel scratch, its own alignment)",
        ]
        if measured.context_bytes is not None:
            notes.append(f"CUDA context and libraries (NVML, device-wide, approximate): {measured.context_bytes} "
                         "bytes")
        if measured.cpu_fallback_nodes:
            shown = ", ".join(measured.cpu_fallback_nodes[:5])
            notes.append(f"{len(measured.cpu_fallback_nodes)} nodes ran on the CPU provider and are not counted: "
                         f"{shown}")
        return tuple(notes)


CUDA = CudaProvider()
