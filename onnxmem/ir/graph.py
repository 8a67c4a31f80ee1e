"""ModelGraph: the networkx graph of operators and tensors, with every tensor's dtype, shape and bytes."""

from __future__ import annotations

import enum
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx
from onnx import AttributeProto, GraphProto

from onnxmem.errors import ModelFileError, quoted
from onnxmem.ir.modelcheck import weight_bytes_by_dtype
from onnxmem.ir.tensor_types import UNKNOWN_TYPE, Dim, TensorType
from onnxmem.shapes.rules import SHAPE_RULES, rule_key
from onnxmem.targets.ort.tables import CONTROL_FLOW
from onnxmem.views.report import Warning

if TYPE_CHECKING:
    import networkx as nx

WEIGHT, INPUT, ACTIVATION, OUTPUT, OUTER = "weight", "input", "activation", "output", "outer"
# A tensor onnxruntime keeps in host memory while the model runs on a device (the outputs of an op placed off the
# device: Op.placement): no device buffer, so liveness does not count it.
HOST = "host"
_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training")
# Domains whose operators onnxruntime implements; ONNX's schema registry does not know them.
_RUNTIME_DOMAINS = (
    "com.microsoft", "com.microsoft.nchwc", "com.microsoft.dml", "org.pytorch.aten", "com.ms.internal.nhwc",
)


@dataclass(slots=True)
class Tensor:
    """A value in the graph: its size where known, its kind, who makes it and who reads it."""

    index: int
    name: str
    dtype: int  # onnx.TensorProto element type; 0 where unknown
    shape: tuple[Dim, ...] | None  # None: rank unknown; a str or None dim: size unknown
    nbytes: int | None  # None: the size could not be known
    kind: str  # weight | input | activation | output | outer (a subgraph's read of its parent's tensor) | host
    producer: int | None = None  # op index
    consumers: list[int] = field(default_factory=list)  # op indices, implicit (subgraph) reads included


class Origin(enum.Enum):
    """Where an op came from: the model, or a change the runtime makes to it before it runs it."""

    MODEL = "model"  # a node of the model as given
    DUPLICATED = "duplicated"  # a copy the runtime made of a model node (onnxruntime's unique DequantizeLinear)
    INLINED = "inlined"  # a node of a function body the runtime inlined in place of its call
    INSERTED = "inserted"  # a node the runtime inserted (the CPU provider's Casts, the CUDA provider's Memcpy)


@dataclass(frozen=True, slots=True)
class Provenance:
    """An op's origin, and where the runtime added it, its rank among the ops of that origin: the order in which
    it numbers them (its node indices, which its execution order compares: schedule.ort_order)."""

    origin: Origin
    rank: int = 0


MODEL_NODE = Provenance(Origin.MODEL)
INSERTED_NODE = Provenance(Origin.INSERTED)  # (onnxruntime indexes the nodes it inserts in graph order: no rank)


class Placement(enum.Enum):
    """Where an op runs, and where its outputs are."""

    DEVICE = "device"  # on the provider's device, its outputs in device memory
    HOST = "host"  # on the host (a node a device provider leaves to the CPU): its outputs in host memory
    HOST_OUTPUTS = "host outputs"  # on the device, its outputs in host memory (Shape, Size, MemcpyToHost)


@dataclass(frozen=True)
class NodeFacts:
    """What the transforms that made a model say of its main graph's nodes, by node position: the provenance of
    each node not of the model as given, and the placement of each node not on the device (a node absent from
    either: MODEL_NODE, Placement.DEVICE). build_graph gives them to the ops (Op.provenance, Op.placement)."""

    provenance: Mapping[int, Provenance] = field(default_factory=dict)
    placement: Mapping[int, Placement] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.provenance) or bool(self.placement)


@dataclass(slots=True)
class Op:
    """An operator node, with the tensors it reads and writes as indices into ModelGraph.tensors."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[int, ...]  # -1 for an omitted optional input
    outputs: tuple[int, ...]  # -1 for an omitted optional output
    implicit_inputs: tuple[int, ...] = ()  # outer tensors that its subgraphs read
    subgraphs: tuple[ModelGraph, ...] = ()
    layer: str = ""
    # the PyTorch op this node was exported from, "<aten target> <fx node> <argument tensors...>" (the dynamo
    # exporter's pkg.torch.onnx.fx_node metadata), or "": nodes sharing it are one ATen op decomposed
    origin: str = ""
    provenance: Provenance = MODEL_NODE  # where it came from (the transform that made it says: NodeFacts)
    placement: Placement = Placement.DEVICE  # where it runs (ditto)
    # the Python frames the PyTorch op behind it ran in, outermost first, each 'file:line function<TAB>source line' (the
    # dynamo exporter's pkg.torch.onnx.stack_trace), interned; () where not known
    frames: tuple[str, ...] = ()


class ModelGraph:
    """The one graph every pass reads: arrays of ops and tensors, and their networkx view indexed like them.

    Each tensor knows its producer and consumers, each op its input and output tensors: the adjacency that
    passes sweep. `nx` is the same graph as a networkx DiGraph for graph algorithms. The model's node order
    is kept in `ops` (a valid schedule when the file is in topological order, as ONNX requires).
    """

    def __init__(self, ops: list[Op], tensors: list[Tensor], inputs: list[int], outputs: list[int],
                 warnings: list[Warning], tensor_index: dict[str, int] | None = None) -> None:
        self.ops = ops
        self.tensors = tensors
        self.inputs = inputs
        self.outputs = outputs
        self.warnings = warnings
        # tensor name -> index (`tensor_index`: made by the caller, of the same tensors)
        self.tensor_index = {t.name: t.index for t in tensors} if tensor_index is None else tensor_index
        # the model's and the main graph's metadata_props (onnxmem.torch.export_for_training records the mode it
        # exported in; the dynamo exporter, which of the weights are parameters and which buffers)
        self.properties: dict[str, str] = {}
        # whether every op reads only tensors made by ops before it (build_graph knows it; the orders then need not
        # check that the file's order is topological, nor look for a cycle): False where not known
        self.in_file_order = False
        # where the graph is a body a node holds: the bytes of its own initializers and Constants by element type,
        # read from the file (exact whatever shape inference gives its tensors); empty for the main graph
        self.own_weights: dict[int, int] = {}
        self._nx: nx.DiGraph | None = None

    @property
    def nx(self) -> nx.DiGraph:
        """The networkx view: op i is node i, tensor j is node len(ops) + j; producer -> tensor -> consumer.

        Built on first use, once: the liveness sweep reads the arrays above, and building this view would cost
        a large part of a report that never needs it.
        """
        if self._nx is None:
            # Imported here: networkx's import is start-up that a report (which sweeps the arrays) never needs.
            import networkx

            graph = networkx.DiGraph()
            n = len(self.ops)
            graph.add_nodes_from(range(n + len(self.tensors)))
            edges: list[tuple[int, int]] = []
            for op in self.ops:
                edges.extend((n + t, op.index) for t in (*op.inputs, *op.implicit_inputs) if t >= 0)
                edges.extend((op.index, n + t) for t in op.outputs if t >= 0)
            graph.add_edges_from(edges)
            self._nx = graph
        return self._nx

    def with_sizes(self, shapes: list[tuple[Dim, ...] | None], nbytes: list[int | None],
                   dtypes: list[int] | None = None) -> ModelGraph:
        """Give the same graph with other tensor shapes and sizes (and element types), the ops and their wiring
        shared."""
        kinds = dtypes if dtypes is not None else [t.dtype for t in self.tensors]
        tensors = [Tensor(t.index, t.name, dtype, shape, size, t.kind, t.producer, t.consumers)
                   for t, dtype, shape, size in zip(self.tensors, kinds, shapes, nbytes, strict=True)]
        sized = ModelGraph(self.ops, tensors, self.inputs, self.outputs, self.warnings, self.tensor_index)
        sized.properties = self.properties
        sized.in_file_order = self.in_file_order
        sized.own_weights = self.own_weights
        return sized

    def set_types(self, types: Mapping[str, TensorType]) -> None:
        """Size every tensor, subgraphs' included, from `types` (tensor name -> inferred type), in place."""
        get = types.get
        for t in self.tensors:
            t.dtype, t.shape, t.nbytes = get(t.name, UNKNOWN_TYPE)
        for op in self.ops:
            for sub in op.subgraphs:
                sub.set_types(types)

    def op_node(self, op: int) -> int:
        """Give the networkx node id of op `op`."""
        return op

    def tensor_node(self, tensor: int) -> int:
        """Give the networkx node id of tensor `tensor`."""
        return len(self.ops) + tensor

    def tensors_of_kind(self, *kinds: str) -> list[Tensor]:
        """Give the tensors of the given kinds, in index order."""
        return [t for t in self.tensors if t.kind in kinds]


def build_graph(model: onnx.ModelProto, types: Mapping[str, TensorType] | None = None,
                metadata: bool = True, facts: NodeFacts | None = None) -> ModelGraph:
    """Give the graph of a model, sized by the type of each tensor that inference found (unsized without
    `types`: the wiring alone, to size later with ModelGraph.set_types). `metadata` False: the caller knows no
    node has metadata naming its layer (see load.NodeKinds), which is then not read. `facts`: what the transforms
    that made the model say of its main graph's nodes (their ops' provenance and placement; the outputs of an op
    placed off the device are HOST tensors)."""
    types = {} if types is None else types
    known_ops = _known_functions(model)
    graph = _Builder(types, known_ops, metadata).build(model.graph, outer=frozenset(), facts=facts or None)
    graph.properties = {prop.key: prop.value for prop in (*model.metadata_props, *model.graph.metadata_props)}
    return graph


def _known_functions(model: onnx.ModelProto) -> set[tuple[str, str]]:
    return {(f.domain, f.name) for f in model.functions}


class _Builder:
    def __init__(self, types: Mapping[str, TensorType], functions: set[tuple[str, str]], metadata: bool) -> None:
        self.types = types
        self.functions = functions
        self.metadata = metadata
        self.known: dict[tuple[str, str] | str, bool] = {}  # by (domain, op type); by op type in domain ''

    def build(self, graph: GraphProto, outer: frozenset[str], facts: NodeFacts | None = None) -> ModelGraph:
        tensors: list[Tensor] = []
        index: dict[str, int] = {}
        warnings: list[Warning] = []

        types_get = self.types.get
        sized = bool(self.types)  # (wiring alone: every tensor starts unsized)
        ahead: list[int] = []  # the tensors read before the op that makes them (the file is then out of order)

        def add(name: str, kind: str) -> int:
            dtype, shape, nbytes = types_get(name, UNKNOWN_TYPE) if sized else UNKNOWN_TYPE
            i = len(tensors)
            tensors.append(Tensor(i, name, dtype, shape, nbytes, kind, None, []))
            index[name] = i
            if kind == "?":
                ahead.append(i)
            return i

        for init in graph.initializer:
            add(init.name, WEIGHT)
        inputs = [index[v.name] if v.name in index else add(v.name, INPUT) for v in graph.input]
        inputs = [i for i in inputs if tensors[i].kind == INPUT]
        graph_outputs = {v.name for v in graph.output}

        index[""] = -1  # an omitted optional input or output (no tensor has an empty name)
        ops: list[Op] = []
        unknown_ops: dict[str, int] = {}
        known = self.known
        metadata = self.metadata
        index_get = index.get
        make_tensor, make_op = Tensor, Op
        scope: frozenset[str] | None = None  # names a subgraph may read; built at the first subgraph
        provenance_of = facts.provenance.get if facts is not None else None
        placement_of = facts.placement.get if facts is not None else None
        provenance, placement, device = MODEL_NODE, Placement.DEVICE, Placement.DEVICE
        for position, node in enumerate(graph.node):
            op_type, domain = node.op_type, node.domain
            name = node.name or f"{op_type}_{position}"
            input_names = node.input[:]
            op_index = len(ops)
            op_inputs = []
            for tname in input_names:
                found = index_get(tname)  # ("" is -1: an omitted input)
                if found is None:
                    # "?": resolved after the loop, as the file may list nodes out of order.
                    found = add(tname, OUTER if tname in outer else "?")
                if found >= 0:
                    tensors[found].consumers.append(op_index)
                op_inputs.append(found)
            subgraphs: tuple[ModelGraph, ...] = ()
            implicit: list[int] = []
            if (op_type in CONTROL_FLOW or domain not in _STANDARD_DOMAINS) and len(node.attribute):
                subgraph_protos = body_graphs(node)
                if subgraph_protos and scope is None:
                    scope = outer | _all_names(graph)
                if scope is not None:
                    subgraphs = tuple(self.build(g, scope) for g in subgraph_protos)
                    for sub, proto in zip(subgraphs, subgraph_protos, strict=True):
                        sub.own_weights = weight_bytes_by_dtype(proto)
                for sub in subgraphs:
                    for t in sub.tensors:
                        if t.kind == OUTER and t.name not in input_names:
                            if t.name not in index:
                                add(t.name, OUTER if t.name in outer else "?")
                            if index[t.name] not in implicit:
                                implicit.append(index[t.name])
            kind = WEIGHT if op_type == "Constant" and domain in ("", "ai.onnx") else ACTIVATION
            if provenance_of is not None and placement_of is not None:
                provenance = provenance_of(position, MODEL_NODE)
                placement = placement_of(position, device)
                if placement is not device:
                    kind = HOST
            op_outputs = []
            for oname in node.output[:]:  # (a slice is a list made at once: twice as fast as iterating the field)
                if not oname:
                    op_outputs.append(-1)
                    continue
                existing = index_get(oname)
                out_kind = OUTPUT if kind == ACTIVATION and oname in graph_outputs else kind
                if existing is None:  # (add, inlined: most tensors are made here)
                    existing = index[oname] = len(tensors)
                    dtype, shape, nbytes = types_get(oname, UNKNOWN_TYPE) if sized else UNKNOWN_TYPE
                    tensors.append(make_tensor(existing, oname, dtype, shape, nbytes, out_kind, op_index, []))
                else:
                    tensor = tensors[existing]
                    if tensor.kind != "?":
                        raise ModelFileError(
                            f"invalid graph: tensor '{oname}' is produced twice (again by node '{name}')")
                    if op_index in tensor.consumers:  # (a cycle of one node: the order's cycle check sees none)
                        raise ModelFileError(
                            f"invalid graph: it has a cycle through nodes {name} (it reads its own output "
                            f"{quoted(oname)})")
                    tensor.kind = out_kind
                    tensor.producer = op_index
                op_outputs.append(existing)
            for in_id in implicit:
                tensors[in_id].consumers.append(op_index)
            frames: tuple[str, ...] = ()
            if metadata:
                layer, origin, frames = _layer_and_origin(node, name, metadata)
            else:  # (_layer_and_origin without metadata, inlined: the scope before the name's last '/')
                head, _, rest = name.rpartition("/")
                layer = (head if head.strip("/") else "") if rest else _scope_of(name)
                origin = ""
            ops.append(make_op(op_index, name, op_type, domain, tuple(op_inputs), tuple(op_outputs),
                               tuple(implicit) if implicit else (), subgraphs, layer, origin, provenance, placement,
                               frames))
            operator = op_type if not domain else (domain, op_type)  # (ONNX's domain '': by op type alone)
            is_known = known.get(operator)
            if is_known is None:
                is_known = known[operator] = self._lookup_known(node)
            if not is_known:
                key = f"{domain + '::' if domain else ''}{op_type}"
                unknown_ops[key] = unknown_ops.get(key, 0) + 1

        for t in tensors:
            if t.kind == "?":
                reader = ops[t.consumers[0]].name if t.consumers else "?"
                raise ModelFileError(
                    f"invalid graph: tensor '{t.name}' read by node '{reader}' is produced by no node, "
                    "input or initializer")
        outputs = []
        for v in graph.output:
            if not v.name or v.name not in index:
                raise ModelFileError(f"invalid graph: graph output '{v.name}' is produced by no node")
            outputs.append(index[v.name])
        for op_name, count in unknown_ops.items():
            warnings.append(Warning(
                "unknown-operator",
                f"operator {op_name} ({count} nodes) is not in the ONNX standard or onnxruntime's domains: "
                "its outputs are sized only if shape inference found them, and it is assumed to use no "
                "memory beyond its outputs"))
        del index[""]
        built = ModelGraph(ops, tensors, inputs, outputs, warnings, index)
        built.in_file_order = not ahead
        return built

    def _lookup_known(self, node: onnx.NodeProto) -> bool:
        if node.domain in _RUNTIME_DOMAINS or (node.domain, node.op_type) in self.functions or \
                rule_key(node.op_type, node.domain) in SHAPE_RULES:  # onnxruntime's contrib ops in ONNX's domain
            return True
        if node.domain in _STANDARD_DOMAINS:
            return bool(onnx.defs.has(node.op_type, node.domain))
        return False


def body_graphs(node: onnx.NodeProto) -> list[GraphProto]:
    """Give the graphs a node holds in its attributes (If's branches, Loop's and Scan's bodies), in order."""
    graphs: list[GraphProto] = []
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            graphs.append(attr.g)
        elif attr.type == AttributeProto.GRAPHS:
            graphs.extend(attr.graphs)
    return graphs


def _all_names(graph: GraphProto) -> set[str]:
    names = {t.name for t in graph.initializer} | {v.name for v in graph.input}
    for node in graph.node:
        names.update(o for o in node.output if o)
    return names


def module_path(layer: str) -> str:
    """Give a dotted module path from a node's scope: '/encoder/layers.0/attn' -> 'encoder.layers.0.attn', or a
    dynamo export's namespace (': pkg.Model/layer4: torch.nn.Sequential/layer4.0: Block/layer4.0.conv2: Conv2d/
    conv2d: aten.conv2d.default') -> 'layer4.0.conv2', the name model.named_modules() gives it."""
    if ":" in layer:
        # (the last part names the ATen op, not a module)
        names = [n for n in (part.split(":")[0].strip() for part in layer.split("/")[:-1]) if n]
        if all(inner.startswith(outer + ".") for outer, inner in zip(names, names[1:], strict=False)):
            return names[-1] if names else ""  # each level already a full path ('layer4/layer4.0'): the innermost
        return ".".join(names)
    return ".".join(p for p in layer.split("/") if p)


# the exporter names an op outside every module '_empty_nn_module_stack_from_metadata_hook'
EMPTY_MODULE_STACK = "_empty_nn_module_stack"


def layer_name(layer: str) -> str:
    """Give the name a report lists a layer by: a dynamo export's namespace as its module's name (module_path; an op
    outside every module is top level), a scope from a node's name as it is ('/model/layers.0/attn')."""
    if ":" not in layer:
        return layer
    return module_path("/".join(p for p in layer.split("/") if not p.strip().startswith(EMPTY_MODULE_STACK)))


def _scope_of(name: str) -> str:
    """Give the scope a node's name carries: what comes before its last '/', where a '/' stands between two other
    characters ('/model/layers.0/MatMul' -> '/model/layers.0'; 'MatMul', '/MatMul': '')."""
    return name.rsplit("/", 1)[0] if "/" in name and "/" in name.strip("/") else ""


def _layer_and_origin(node: onnx.NodeProto, name: str, metadata: bool = True) -> tuple[str, str, tuple[str, ...]]:
    layer = origin = ""
    frames: tuple[str, ...] = ()
    for prop in node.metadata_props if metadata and len(node.metadata_props) else ():
        if prop.key in ("pkg.torch.onnx.name_scopes", "namespace") and not layer:
            layer = prop.value
        elif prop.key == "pkg.torch.onnx.fx_node":
            origin = _fx_origin(prop.value)
        elif prop.key == "pkg.torch.onnx.stack_trace":
            frames = stack_frames(prop.value)
    if not layer:
        layer = _scope_of(name)
    return layer, origin, frames


_FRAME = re.compile(r'File "([^"]*)", line (\d+), in ([^\n]*)\n([^\n]*)')


def stack_frames(trace: str) -> tuple[str, ...]:
    """Give the frames of a Python stack trace as the dynamo exporter writes it ('File "m.py", line 12, in forward\n
    x = self.fc(x)' per frame), outermost first, each 'm.py:12 forward<TAB>x = self.fc(x)', interned (nodes share
    them)."""
    return tuple(sys.intern(f"{path}:{line} {function.strip()}\t{code.strip()}")
                 for path, line, function, code in _FRAME.findall(trace))


def _fx_origin(fx_node: str) -> str:
    # '%sdpa : [num_users=1] = call_function[target=torch.ops.aten.scaled_dot_product_attention.default](args =
    # (%view_5, %view_6, %view_7), kwargs = {})' -> 'torch.ops...default %sdpa view_5 view_6 view_7'
    target = fx_node.partition("target=")[2].partition("]")[0]
    if not target:
        return ""
    arguments = fx_node.partition("args = (")[2].partition("), kwargs")[0]
    names = [a.strip()[1:] for a in arguments.split(",") if a.strip().startswith("%")]
    return " ".join([target, fx_node.split(" ", 1)[0], *names])


def fx_arguments(op: Op) -> list[str]:
    """Give the names of the tensors the PyTorch op behind `op` took as arguments (see Op.origin), in order."""
    return op.origin.split(" ")[2:]
