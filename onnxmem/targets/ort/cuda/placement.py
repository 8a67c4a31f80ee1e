"""The model as onnxruntime's CUDA provider runs it: which nodes it leaves on the CPU (no CUDA kernel; the shape
subgraphs GetCpuPreferredNodes hands back) and the Memcpy nodes MemcpyTransformer inserts between the two memories
(rules.cuda says where each rule comes from). Taken from onnxruntime's source, not measured: no GPU was available.

The transform says where each node runs (LoadedModel.facts: Placement.HOST for a node on the CPU, HOST_OUTPUTS for a
device node that writes host memory, the MemcpyToHost copies included; the copies are INSERTED): graph.build_graph
gives their ops those facts and their outputs the kind HOST, which liveness does not count as device bytes."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Mapping

import onnx
from onnx import AttributeProto, ModelProto, TensorProto

from onnxmem.ir.graph import INSERTED_NODE, NodeFacts, Provenance
from onnxmem.ir.graph import Placement as Where
from onnxmem.ir.load import LoadedModel, has_float16
from onnxmem.ir.tensor_types import TensorType
from onnxmem.targets.ort.cuda.tables import (
    CUDA_CPU_INPUTS,
    CUDA_CPU_OUTPUTS,
    CUDA_KERNEL_TYPES,
    CUDA_TYPED_INPUT,
    CUDA_UNTYPED,
    DEVICE_ONLY_TYPES,
    SMALL_INITIALIZER_ELEMENTS,
)
from onnxmem.views.report import Warning

_PLACED_KEY = "onnxmem.device"  # the model metadata that marks a model this transform made (already_placed)
MEMCPY_PREFIX = "onnxmem_Memcpy_"  # the names of the Memcpy nodes the transform inserts
MEMCPY_OPS = ("MemcpyFromHost", "MemcpyToHost")
DEVICE_SUFFIX = "_CUDAExecutionProvider"  # AddCopyNode: GenerateNodeArgName(arg->Name() + "_" + provider_.Type())
_STANDARD = ("", "ai.onnx")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the CUDA provider runs a model's main-graph nodes (node indices), and the copies it adds."""

    host_nodes: tuple[int, ...]  # no CUDA kernel, or a CPU-preferred shape node
    fallback_ops: tuple[str, ...]  # op types without a CUDA kernel for their types
    shape_nodes: int  # nodes GetCpuPreferredNodes handed back to the CPU
    to_device: tuple[str, ...]  # tensors copied host -> device (MemcpyFromHost)
    to_host: tuple[str, ...]  # tensors copied device -> host (MemcpyToHost)


def _key(node: onnx.NodeProto) -> str:
    return f"{'' if node.domain in _STANDARD else node.domain}::{node.op_type}"


def node_kinds(model: ModelProto) -> set[str]:
    """Give the operator kinds (domain::op_type) of the main graph's nodes: one pass, as a graph has few kinds."""
    pairs = {(node.domain, node.op_type) for node in model.graph.node}  # (no call a node: 100k on a large graph)
    return {f"{'' if domain in _STANDARD else domain}::{op_type}" for domain, op_type in pairs}


def needs_placement(kinds: set[str]) -> bool:
    """Say whether the CUDA provider could run a node of the main graph (of these node_kinds) on the CPU: a Shape or
    Size node (the start of a shape subgraph) or an op without a CUDA kernel (its types are then needed to place
    the rest)."""
    return any(key in CUDA_CPU_OUTPUTS or (key not in CUDA_KERNEL_TYPES and key not in _CONSTANT_KINDS)
               for key in kinds)


_CONSTANT_KINDS = ("::Constant",)  # (_key of a Constant node: onnxruntime makes them initializers)


def _lacks_half_kernel(kinds: set[str]) -> bool:
    """Say whether an op of these node_kinds has a CUDA kernel without float16 (its inputs' types then decide)."""
    return any(key not in CUDA_UNTYPED and TensorProto.FLOAT16 not in CUDA_KERNEL_TYPES.get(key, (TensorProto.FLOAT16,))
               for key in kinds)


def already_placed(model: ModelProto) -> bool:
    """Say whether the model is one this transform made (placed_model marks the model itself)."""
    return any(p.key == _PLACED_KEY for p in model.metadata_props)


def _is_constant(node: onnx.NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in _STANDARD


def cuda_placement(model: ModelProto, types: Mapping[str, TensorType]) -> Placement:
    """Give where onnxruntime's CUDA provider runs each node of the main graph (rules.cuda): the CPU takes the
    nodes without a CUDA kernel for their types (GetCapability), then the nodes GetCpuPreferredNodes finds
    downstream of host tensors; MemcpyTransformer copies what crosses between them. `types`: the model's tensor
    types (planner.infer_symbolic); a tensor without one is assumed to have a kernel."""
    graph = model.graph
    nodes = list(graph.node)
    initializer_elements: dict[str, int] = {}
    for init in graph.initializer:
        count = 1
        for d in init.dims:
            count *= d
        initializer_elements[init.name] = count
    for node in nodes:  # onnxruntime makes Constant nodes initializers when it loads the model
        if _is_constant(node) and node.output:
            initializer_elements[node.output[0]] = _constant_elements(node)
    graph_inputs = {v.name for v in graph.input if v.name not in initializer_elements}

    def dtype(name: str) -> int:
        return types.get(name, (0, None, None))[0] if name else 0

    def has_kernel(node: onnx.NodeProto) -> bool:
        key = _key(node)
        supported = CUDA_KERNEL_TYPES.get(key)
        if supported is None:
            return False
        if key in CUDA_UNTYPED:
            return True
        slot = CUDA_TYPED_INPUT.get(key, 0)
        kind = dtype(node.input[slot]) if slot < len(node.input) else 0
        return kind == 0 or kind in supported

    live = [i for i, node in enumerate(nodes) if not _is_constant(node)]
    on_device = {i for i in live if has_kernel(nodes[i])}
    readers: dict[str, list[int]] = {}
    for i in live:
        for name in nodes[i].input:
            if name:
                readers.setdefault(name, []).append(i)
    cpu_nodes = _cpu_preferred(nodes, on_device, readers, initializer_elements, graph_inputs, dtype)
    device = on_device - cpu_nodes
    host = sorted(set(live) - device)

    # MemcpyTransformer: each tensor's reads and writes, by memory
    device_reads: set[str] = set()
    host_reads: set[str] = set()
    device_made: set[str] = set()
    host_made: set[str] = set()
    for i in live:
        node = nodes[i]
        cpu_in = CUDA_CPU_INPUTS.get(_key(node), ()) if i in device else ()
        cpu_out = CUDA_CPU_OUTPUTS.get(_key(node), ()) if i in device else ()
        for j, name in enumerate(node.input):
            if name:
                (device_reads if i in device and j not in cpu_in else host_reads).add(name)
        for j, name in enumerate(node.output):
            if name:
                (device_made if i in device and j not in cpu_out else host_made).add(name)
    # in the order AddCopyNode adds them: graph inputs read both ways (in the graph's order), then by name
    to_device = [v.name for v in graph.input if v.name in graph_inputs and v.name in device_reads
                 and v.name in host_reads] + sorted(host_made & device_reads)
    to_host = sorted(device_made & host_reads)
    fallback = sorted({nodes[i].op_type for i in live if i not in on_device})
    return Placement(tuple(host), tuple(fallback), len(cpu_nodes), tuple(to_device), tuple(to_host))


def _cpu_preferred(nodes: list[onnx.NodeProto], on_device: set[int], readers: Mapping[str, list[int]],
                   initializer_elements: Mapping[str, int], graph_inputs: set[str],
                   dtype: Callable[[str], int]) -> set[int]:
    """GetCpuPreferredNodes (core/framework/fallback_cpu_capability.cc): the device nodes downstream of a host
    tensor whose every input is a host tensor, a graph input or a small initializer (and none float16 ...)."""
    host_tensors: set[str] = set()
    candidates: list[int] = []
    for i in sorted(on_device):
        node = nodes[i]
        for j in CUDA_CPU_OUTPUTS.get(_key(node), ()):
            if j < len(node.output) and node.output[j]:
                host_tensors.add(node.output[j])
                candidates.extend(readers.get(node.output[j], ()))
    heapq.heapify(candidates)  # popped in topological (the file's) order, as its priority queue does
    visited: set[int] = set()
    cpu: set[int] = set()
    while candidates:
        i = heapq.heappop(candidates)
        if i in visited:
            continue
        visited.add(i)
        node = nodes[i]
        outputs = [o for o in node.output if o]
        if i not in on_device:  # no CUDA kernel: a CPU node, its outputs host tensors
            host_tensors.update(outputs)
            for o in outputs:
                for r in readers.get(o, ()):
                    heapq.heappush(candidates, r)
            continue
        cpu_inputs = CUDA_CPU_INPUTS.get(_key(node), ())
        place = True
        for j, name in enumerate(node.input):
            if dtype(name) in DEVICE_ONLY_TYPES:
                place = False
                break
            if name and (initializer_elements.get(name, SMALL_INITIALIZER_ELEMENTS + 1) <= SMALL_INITIALIZER_ELEMENTS
                         or name in graph_inputs):
                continue
            if name not in host_tensors or j in cpu_inputs:
                place = False
                break
        if place:
            cpu.add(i)
            host_tensors.update(outputs)
            for o in outputs:
                for r in readers.get(o, ()):
                    heapq.heappush(candidates, r)
    return cpu


def _constant_elements(node: onnx.NodeProto) -> int:
    for attr in node.attribute:
        if attr.name == "value" and attr.type == AttributeProto.TENSOR:
            count = 1
            for d in attr.t.dims:
                count *= d
            return count
        if attr.name in ("value_floats", "value_ints"):
            return len(attr.floats) + len(attr.ints)
        if attr.name in ("value_float", "value_int"):
            return 1
    return SMALL_INITIALIZER_ELEMENTS + 1


def placed_model(loaded: LoadedModel, placement: Placement) -> LoadedModel | None:
    """Give the model with the placement written into it: each MemcpyFromHost and MemcpyToHost inserted after the
    node that makes its source (its device readers reading the device copy, as AddCopyNode rewires them), and in
    its facts where each node runs (the model's facts follow its nodes). None where the placement changes
    nothing."""
    model = loaded.proto
    graph = model.graph
    nodes = list(graph.node)
    host = set(placement.host_nodes)
    host_outputs = {i for i, node in enumerate(nodes) if i not in host and _key(node) in CUDA_CPU_OUTPUTS}
    if not host and not host_outputs and not placement.to_device and not placement.to_host:
        return None
    to_device = {name: f"{name}{DEVICE_SUFFIX}" for name in placement.to_device}
    to_host = {name: f"{name}{DEVICE_SUFFIX}" for name in placement.to_host}
    copies_after: dict[int, list[onnx.NodeProto]] = {}  # node index (-1: before every node) -> copies
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    counter = 0

    def copy_node(op: str, source: str, target: str) -> onnx.NodeProto:
        nonlocal counter
        made = onnx.helper.make_node(op, [source], [target], name=f"{MEMCPY_PREFIX}{counter}")
        counter += 1
        return made

    for name, device_name in to_device.items():
        copies_after.setdefault(producer.get(name, -1), []).append(copy_node("MemcpyFromHost", name, device_name))
    for name, device_name in to_host.items():
        copies_after.setdefault(producer.get(name, -1), []).append(copy_node("MemcpyToHost", device_name, name))
    facts = loaded.facts or NodeFacts()
    provenance: dict[int, Provenance] = {}
    where: dict[int, Where] = {}
    out_nodes: list[onnx.NodeProto] = []

    def add_copies(copies: list[onnx.NodeProto]) -> None:
        for made in copies:
            provenance[len(out_nodes)] = INSERTED_NODE
            if made.op_type == "MemcpyToHost":  # runs on the device, writes host memory
                where[len(out_nodes)] = Where.HOST_OUTPUTS
            out_nodes.append(made)

    add_copies(copies_after.get(-1, []))
    for i, node in enumerate(nodes):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        position = len(out_nodes)
        if i in facts.provenance:
            provenance[position] = facts.provenance[i]
        if i in host:
            where[position] = Where.HOST
        else:
            if i in host_outputs:  # a device kernel that writes its output in host memory (Shape, Size)
                where[position] = Where.HOST_OUTPUTS
            elif i in facts.placement:
                where[position] = facts.placement[i]
            cpu_in = CUDA_CPU_INPUTS.get(_key(node), ())
            for j, name in enumerate(copy.input):
                if name in to_device and j not in cpu_in:
                    copy.input[j] = to_device[name]
                elif name in to_host and j not in cpu_in:
                    copy.input[j] = to_host[name]
            cpu_out = CUDA_CPU_OUTPUTS.get(_key(node), ())
            for j, name in enumerate(copy.output):
                if name in to_host and j not in cpu_out:
                    copy.output[j] = to_host[name]
        out_nodes.append(copy)
        add_copies(copies_after.get(i, []))
    changed = ModelProto()
    changed.CopyFrom(model)
    del changed.graph.node[:]
    changed.graph.node.extend(out_nodes)
    changed.metadata_props.add(key=_PLACED_KEY, value="placed")  # (already_placed: the transform runs once)
    declarations = _declarations(graph)
    for name in (*to_device, *to_host):  # the copies' types, where the model declares the source's
        declared = declarations.get(name)
        if declared is not None:
            info = changed.graph.value_info.add()
            info.CopyFrom(declared)
            info.name = to_device.get(name) or to_host[name]
    return dataclasses.replace(loaded, proto=changed, data=None, nodes=None, facts=NodeFacts(provenance, where))


def _declarations(graph: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto]:
    """Give each declared value's ValueInfo by name (value_info first, then inputs, then outputs: the first wins)."""
    declared: dict[str, onnx.ValueInfoProto] = {}
    for values in (graph.value_info, graph.input, graph.output):
        for v in values:
            declared.setdefault(v.name, v)
    return declared


def on_cuda(loaded: LoadedModel) -> tuple[LoadedModel, list[Warning]]:
    """Give the model as onnxruntime's CUDA provider runs it (cuda_placement, placed_model) and a note of what it
    leaves on the CPU and copies; the model as it is, and no note, where it runs wholly on the device."""
    model = loaded.proto
    if already_placed(model):
        return loaded, []
    kinds = node_kinds(model)
    if not (needs_placement(kinds) or (has_float16(model) and _lacks_half_kernel(kinds))):
        return loaded, []  # (a float16 model whose ops have float16 CUDA kernels runs wholly on the device)
    from onnxmem.targets.ort.planner import (
        infer_symbolic,  # (planner imports the inference passes: only where a node may move,
    )

    placement = cuda_placement(model, infer_symbolic(model, loaded))
    changed = placed_model(loaded, placement)
    if changed is None:
        return loaded, []
    parts = []
    assert changed.facts is not None
    writers = sorted({changed.proto.graph.node[i].op_type for i, where in changed.facts.placement.items()
                      if where is Where.HOST_OUTPUTS and changed.proto.graph.node[i].op_type not in MEMCPY_OPS})
    if writers:
        parts.append(f"{'/'.join(writers)} on the device with their outputs in host memory")
    if placement.shape_nodes:
        parts.append(f"{placement.shape_nodes} nodes of shape subgraphs (after Shape/Size) on the CPU")
    fallback = len(placement.host_nodes) - placement.shape_nodes
    if fallback:
        parts.append(f"{fallback} nodes without a CUDA kernel for their types on the CPU "
                     f"({', '.join(placement.fallback_ops)})")
    copies = []
    if placement.to_device:
        copies.append(f"{len(placement.to_device)} MemcpyFromHost (device copies, counted)")
    if placement.to_host:
        copies.append(f"{len(placement.to_host)} MemcpyToHost (host copies)")
    if copies:
        parts.append(" and ".join(copies))
    return changed, [Warning(
        "cuda-host-nodes",
        f"onnxruntime's CUDA provider runs {'; '.join(parts)}: tensors in host memory are not counted as device "
        "bytes (onnxruntime's placement, from its source: onnxmem/targets/ort/cuda/placement.py)")]
