"""onnxruntime's CPU execution provider: its float16 Casts and inlined function bodies (float16.py, inline.py), its
kernels' measured in-place and alias rules (targets.ort.tables), the weights it prepacks and its kernels' scratch
(targets.ort.arena), the initializers it uses in place outside its arena, and validate's measurement through the
profiler's allocator statistics (measure.ort_cpu)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnxmem.targets.ort.base import ExecutionProvider, OpScratch, SessionWeights
from onnxmem.targets.ort.rules import InferenceRules

if TYPE_CHECKING:
    import onnx

    from onnxmem.ir.graph import ModelGraph
    from onnxmem.ir.load import LoadedModel
    from onnxmem.ir.tensor_types import TensorType
    from onnxmem.views.report import Warning


@dataclass(frozen=True)
class CpuProvider(ExecutionProvider):
    """onnxruntime's CPUExecutionProvider (see the module's docstring)."""

    name: str = "cpu"
    measurement: str = "onnxmem.measure.ort_cpu:measure_cpu"
    float16_keeps_graph: bool = False  # a float16 model gets Casts: the converted model is analysed whole
    measures_arena: bool = True

    def transformed(self, loaded: LoadedModel, rules: InferenceRules) -> tuple[LoadedModel, list[Warning]]:
        """Give the model as the CPU provider runs it: float16 data meeting an operator without a float16 kernel
        is cast to float32 and back (float16.cpu_float16_casts), and a note of what changed."""
        import onnx

        from onnxmem.ir.load import has_float16
        from onnxmem.targets.ort.cpu.float16 import cpu_float16_casts, inserted_cast_count
        from onnxmem.targets.ort.cpu.inline import inlined_function_ops
        from onnxmem.targets.ort.planner import infer_symbolic
        from onnxmem.views.report import Warning

        if not has_float16(loaded.proto):
            return loaded, []
        changed = cpu_float16_casts(loaded, infer_symbolic(loaded.proto, loaded))
        holds_graphs = (loaded.nodes is None or loaded.nodes.graphs) and any(  # (the bytes' search says "may")
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for n in loaded.proto.graph.node for a in n.attribute)
        if changed is None:
            if not holds_graphs:
                return loaded, []
            return loaded, [Warning("cpu-float16-casts",
                                    "onnxruntime's CPU provider casts float16 data to float32 around operators "
                                    "without a float16 kernel inside If/Loop/Scan bodies too: not modelled there "
                                    "(their nodes are counted as given); on a GPU pass --provider cuda")]
        casts, readers = inserted_cast_count(changed.proto)
        inlined = inlined_function_ops(changed.proto)
        bodies = f"; {', '.join(inlined)} run as their ONNX function bodies, which it inlines" if inlined else ""
        subgraphs = "; the nodes of If/Loop/Scan bodies are counted as given (it casts there too: not modelled)" \
            if holds_graphs else ""
        return changed, [Warning("cpu-float16-casts",
                                 f"onnxruntime's CPU provider has no float16 kernel for {', '.join(readers)}: it "
                                 f"runs them in float32 between {casts} Casts it inserts (counted here){bodies}"
                                 f"{subgraphs}; on a GPU pass --provider cuda")]

    def buffer_rules(self, rules: InferenceRules) -> InferenceRules:
        return rules  # the defaults are this provider's, measured

    def session_weights(self, graph: ModelGraph, model: onnx.ModelProto, given: onnx.ModelProto | None = None,
                        sizes: Sequence[int | None] | None = None) -> SessionWeights:
        """The weights its kernels prepack and the small initializers copied in (arena.arena_weights)."""
        from onnxmem.targets.ort.arena import arena_weights

        weights = arena_weights(graph, model, given)
        return SessionWeights(weights.reserved, tuple(weights.in_regions))

    def kernel_scratch(self, graph: ModelGraph, model: onnx.ModelProto,
                       shape_of: Callable[[int], tuple[int, ...] | None] | None = None) -> dict[int, tuple[int, ...]]:
        from onnxmem.targets.ort.arena import kernel_scratch

        return kernel_scratch(graph, model, shape_of)

    def op_scratch(self, graph: ModelGraph, model: onnx.ModelProto) -> OpScratch:
        """None: the scratch its kernels allocate (kernel_scratch) is in the arena's simulation, and its measurement
        (the profiler's bytes in use) does not see scratch a kernel frees inside itself."""
        return OpScratch()

    def outside_arena_bytes(self, graph: ModelGraph, model: onnx.ModelProto) -> int:
        """The initializers it uses in place from the model (every weight the arena does not hold)."""
        from onnxmem.ir.graph import WEIGHT
        from onnxmem.targets.ort.arena import arena_weights

        inside = arena_weights(graph, model).held
        return sum(t.nbytes or 0 for t in graph.tensors if t.kind == WEIGHT and t.index not in inside)

    def validate_plan_types(self, ran: onnx.ModelProto, given: onnx.ModelProto,
                            plan_types: dict[str, TensorType]) -> dict[str, TensorType]:
        """The float16 nodes it converted: their float32 outputs as onnxruntime first inferred them."""
        if ran is given:
            return plan_types
        from onnxmem.shapes.infer import declared_types
        from onnxmem.targets.ort.cpu.float16 import with_inserted_cast_shapes
        from onnxmem.targets.ort.planner import infer_symbolic

        with_twins = with_inserted_cast_shapes(ran, plan_types)
        if with_twins is ran:
            return plan_types
        return {**infer_symbolic(with_twins), **declared_types(ran)}

    def validate_weights(self, graph: ModelGraph, ran: onnx.ModelProto, given: onnx.ModelProto) -> int:
        from onnxmem.targets.ort.arena import arena_weight_bytes

        return arena_weight_bytes(graph, ran, given)

    def validate_measured_weights(self, measured: Any, run: Any) -> int:
        return int(run.baseline_bytes)

    def validate_notes(self, measured: Any) -> tuple[str, ...]:
        return (
            "measured: onnxruntime's profiler allocator statistics (mem_bytes_requested_in_use), exact on CPU; "
            "scratch memory a kernel allocates and frees inside itself is not seen",
            "estimated on the graph onnxruntime ran, in the order it ran it; steady runs: the memory-pattern block "
            "(best-fit replay of the first run's planned buffers, 256-byte aligned) plus graph outputs",
            "weights: the arena holds prepacked MatMul/Gemm weights (padded to 16 columns), the quantized kernels' "
            "packed weights (MatMulInteger, QLinearConv, QGemm, ...: MLAS's AVX2 packing) and initializers under "
            "128 bytes; larger initializers are used in place from the model and are not measured",
        )


CPU = CpuProvider()
