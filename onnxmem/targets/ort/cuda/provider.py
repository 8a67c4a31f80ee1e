"""onnxruntime's CUDA execution provider: the nodes it leaves on the CPU and the Memcpy copies it inserts
(placement.py), its kernels' in-place and alias declarations (tables.py: from its source, not measured), every
initializer on the device and the graph inputs copied in each run, and validate's measurement through its
gpu_external_alloc hooks (measure.ort_cuda)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnxmem.targets.ort.base import ExecutionProvider, OpScratch, SessionWeights
from onnxmem.targets.ort.cuda.tables import (
    CUDA_ALIASES,
    CUDA_CPU_INPUTS,
    CUDA_IN_PLACE,
    CUDNN_CONV_WORKSPACE,
    CUDNN_CONV_WORKSPACE_AT,
    CUDNN_CONVOLUTIONS,
    ConvKey,
)
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES, InferenceRules
from onnxmem.targets.ort.tables import TAKES_NO_FREED_BUFFER

if TYPE_CHECKING:
    import onnx

    from onnxmem.ir.graph import ModelGraph, Op
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
        """The initializers read in device memory, reserved on the device at session creation (host_weights: the
        others stay in host memory); each run copies the graph inputs in."""
        from onnxmem.ir.graph import WEIGHT

        on_host = host_weights(graph)
        reserved = sum(t.nbytes or 0 for t in graph.tensors if t.kind == WEIGHT and t.index not in on_host)
        inputs = tuple((sizes[t] if sizes is not None else graph.tensors[t].nbytes) or 0 for t in graph.inputs)
        return SessionWeights(reserved, (), inputs)

    def kernel_scratch(self, graph: ModelGraph, model: onnx.ModelProto,
                       shape_of: Callable[[int], tuple[int, ...] | None] | None = None) -> dict[int, tuple[int, ...]]:
        """cuDNN's convolution workspace, per Conv op whose shape was measured (conv_workspaces): allocated from
        the provider's allocator while the Conv runs. cuBLAS's workspace is cuBLAS's own (not the allocator's)."""
        return {op: (size,) for op, size in conv_workspaces(graph, model, shape_of)[0].items()}

    def op_scratch(self, graph: ModelGraph, model: onnx.ModelProto) -> OpScratch:
        """cuDNN's convolution workspace (conv_workspaces), live while each Conv runs above the tensors live then,
        which the allocation hooks of validate's measurement see; a Conv whose shape was not measured is counted as
        none, and a warning (cuda-conv-workspace) names it."""
        known, unknown = conv_workspaces(graph, model)
        return OpScratch(known, (conv_workspace_warning(unknown),) if unknown else ())

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
            "checked on one H100 (benchmarks/cuda/score_ort.py): the graph's activations, inputs and weights are "
            "exact at level disable; cuDNN's conv workspace is counted only for the conv shapes measured "
            "(targets/ort/cuda/tables.py), not in this estimate's peak",
        ]
        if measured.context_bytes is not None:
            notes.append(f"CUDA context and libraries (NVML, device-wide, approximate): {measured.context_bytes} "
                         "bytes")
        if measured.cpu_fallback_nodes:
            shown = ", ".join(measured.cpu_fallback_nodes[:5])
            notes.append(f"{len(measured.cpu_fallback_nodes)} nodes ran on the CPU provider and are not counted: "
                         f"{shown}")
        return tuple(notes)


def _ints(node: onnx.NodeProto, name: str) -> tuple[int, ...] | None:
    for attr in node.attribute:
        if attr.name == name:
            return tuple(attr.ints)
    return None


def conv_key(node: onnx.NodeProto, x: tuple[int, ...], w: tuple[int, ...], dtype: int) -> ConvKey | None:
    """Give a Conv's key in tables.CUDNN_CONV_WORKSPACE (its input per sample, weight, strides, pads, dilations,
    group and element type), or None where its pads are not explicit numbers (auto_pad other than NOTSET)."""
    for attr in node.attribute:
        if attr.name == "auto_pad" and attr.s not in (b"", b"NOTSET"):
            return None
    rank = len(w) - 2
    strides = _ints(node, "strides") or (1,) * rank
    pads = _ints(node, "pads") or (0,) * (2 * rank)
    dilations = _ints(node, "dilations") or (1,) * rank
    group = next((int(a.i) for a in node.attribute if a.name == "group"), 1)
    return (tuple(x[1:]), tuple(w), tuple(strides), tuple(pads), tuple(dilations), group, dtype)


def _static(shape: Sequence[object] | None) -> tuple[int, ...] | None:
    """Give a shape whose every dim is a number, else None."""
    if shape is None or not all(isinstance(v, int) for v in shape):
        return None
    return tuple(int(v) for v in shape if isinstance(v, int))


def conv_workspaces(graph: ModelGraph, model: onnx.ModelProto,
                    shape_of: Callable[[int], tuple[int, ...] | None] | None = None,
                    ) -> tuple[dict[int, int], tuple[str, ...]]:
    """Give the cuDNN workspace of each convolution op on the device (CUDNN_CONVOLUTIONS) whose shape
    tables.CUDNN_CONV_WORKSPACE(_AT) holds (op index -> bytes), and the names of those whose workspace is not known
    (a shape not measured, or not known: counted as none)."""
    from onnxmem.ir.graph import Placement as Where

    nodes: list[onnx.NodeProto] | None = None  # (read where a convolution is: a large graph has 100k nodes)
    by_name: dict[str, onnx.NodeProto] | None = None
    known: dict[int, int] = {}
    unknown: list[str] = []
    for op in graph.ops:
        if (op.op_type if op.domain in ("", "ai.onnx") else f"{op.domain}::{op.op_type}") not in CUDNN_CONVOLUTIONS \
                or op.placement is not Where.DEVICE:
            continue
        # the graph's ops are the main graph's nodes, in order (graph.build_graph); by name where another model
        nodes = nodes if nodes is not None else list(model.graph.node)
        node = nodes[op.index] if op.index < len(nodes) and nodes[op.index].op_type == op.op_type else None
        if node is None:
            by_name = by_name if by_name is not None else {n.name: n for n in nodes if n.name}
            node = by_name.get(op.name)
        size = _workspace(graph, op, node, shape_of) if node is not None and len(op.inputs) > 1 \
            and min(op.inputs[:2]) >= 0 else None
        if size is None:
            unknown.append(op.name)
        else:
            known[op.index] = size
    return known, tuple(unknown)


def _workspace(graph: ModelGraph, op: Op, node: onnx.NodeProto,
               shape_of: Callable[[int], tuple[int, ...] | None] | None) -> int | None:
    """Give the workspace the tables give a convolution op (its node: `node`), or None where they do not (they
    hold Conv's, measured; FusedConv runs another cuDNN call)."""
    if op.op_type != "Conv" or op.domain not in ("", "ai.onnx"):
        return None
    x_t, w_t = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    y_t = graph.tensors[op.outputs[0]] if op.outputs and op.outputs[0] >= 0 else None
    x = _static(shape_of(x_t.index) if shape_of is not None else x_t.shape)
    w = _static(shape_of(w_t.index) if shape_of is not None else w_t.shape)
    key = conv_key(node, x, w, x_t.dtype) if x and w and len(x) == len(w) >= 3 else None
    if key is None or not x:
        return None
    at = CUDNN_CONV_WORKSPACE_AT.get((key, x[0]))
    if at is not None:
        return at
    form = CUDNN_CONV_WORKSPACE.get(key)
    if form is None:
        return None
    operands, extra = form
    sizes = {"x": x_t.nbytes, "w": w_t.nbytes, "y": y_t.nbytes if y_t is not None else None}
    if any(sizes[o] is None for o in operands):
        return None
    return sum(int(sizes[o] or 0) for o in operands) + extra


def conv_workspace_warning(unknown: Sequence[str]) -> Warning:
    """Give the warning naming the convolutions whose cuDNN workspace is not measured, and what is assumed."""
    from onnxmem.views.report import Warning

    shown = ", ".join(unknown[:6]) + (f" and {len(unknown) - 6} more" if len(unknown) > 6 else "")
    return Warning("cuda-conv-workspace",
                   f"cuDNN's convolution workspace is not measured for {len(unknown)} convolution op(s) ({shown}): "
                   "counted as 0 bytes while each runs; cuDNN allocates its plan's workspace from the provider's "
                   "memory above the live tensors (the measured ones, targets/ort/cuda/tables.py, reach the conv's "
                   "input, weight and output reordered, or 9.6 MB, on an H100), so the peak may be low by that much")


def host_weights(graph: ModelGraph) -> frozenset[int]:
    """Give the initializers (tensor indices) that every reader reads in host memory: a node on the CPU, or an input
    slot the CUDA kernel reads on the host (tables.CUDA_CPU_INPUTS: a Reshape's shape, a ReduceMean's axes). The
    session places an initializer where its readers read it (session_state_utils.cc, the allocation planner's
    location of each initializer; one read in both memories is copied to both), so these take no device memory.
    Measured (benchmarks/results/cuda/2026-11-27-h100-80gb.jsonl, ort/tiny_cnn and ort/resnet18, every level, b1 and
    b8): the device held 32 bytes less than every initializer, the Reshape's shape and the ReduceMean's axes
    (int64[2] each); bert (-part2.jsonl) 104 bytes less at level disable: its shape constants read by the 22
    nodes the CPU ran and by Reshape and Slice's host inputs."""
    from onnxmem.ir.graph import WEIGHT
    from onnxmem.ir.graph import Placement as Where

    readers: dict[int, list[bool]] = {}  # weight -> for each read, whether it is in host memory
    for op in graph.ops:
        host_slots = CUDA_CPU_INPUTS.get(f"{'' if op.domain in ('', 'ai.onnx') else op.domain}::{op.op_type}", ())
        for slot, t in enumerate(op.inputs):
            if t >= 0 and graph.tensors[t].kind == WEIGHT:
                readers.setdefault(t, []).append(op.placement is Where.HOST or slot in host_slots)
        for t in op.implicit_inputs:  # read by a subgraph: as the node runs
            if t >= 0 and graph.tensors[t].kind == WEIGHT:
                readers.setdefault(t, []).append(op.placement is Where.HOST)
    return frozenset(t for t, host in readers.items() if all(host))


CUDA = CudaProvider()
