"""The model as onnxruntime's CPU provider runs float16 data: Casts to float32 and back around every operator
without a float16 kernel (cpu_float16_casts; the function bodies it inlines first: inline.py), and the shapes its
planner compares on the graph it saved (with_inserted_cast_shapes)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Container, Mapping, Sequence

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

from onnxmem.ir.graph import INSERTED_NODE, NodeFacts, Origin, Placement, Provenance
from onnxmem.ir.load import LoadedModel, model_shell
from onnxmem.ir.tensor_types import Dim, TensorType, decode_type
from onnxmem.targets.ort.cpu.inline import NodeMemo, holds_graph, infer_node, inline_functions
from onnxmem.targets.ort.cpu.kernels import CPU_FLOAT16_KERNELS
from onnxmem.targets.ort.planner import declared_dim_names, runtime_view

# The name onnxruntime's InsertCastTransformer gives the Casts it adds (AddCastNode: "InsertedPrecisionFreeCast_"
# and the cast tensor's name); the transform names its Casts so. Onnxruntime adds them after the model's nodes,
# so their node indices come after every other's: the transform gives them the provenance INSERTED, which its
# execution order ranks so (schedule.ort_order).
INSERTED_CAST_PREFIX = "InsertedPrecisionFreeCast_"
# Initializers up to this many elements are read by the provider transform's shape inference (axes, shapes).
_INFERENCE_VALUES_UP_TO = 64


def cpu_float16_casts(loaded: LoadedModel, types: Mapping[str, TensorType]) -> LoadedModel | None:
    """Give the model as onnxruntime's CPU provider runs it where float16 data meets an operator without a float16
    kernel (rules.kernels.CPU_FLOAT16_KERNELS).

    An ONNX operator with a function body (Softmax, Gelu, ...: the schema's body at the model's opset, built for
    the node's types where the body depends on them) is first replaced by that body, as the graph partitioner's
    InlineNodes does (core/framework/graph_partitioner.cc; Graph::InlineFunction: the body's Constants become
    initializers, its tensors are renamed '_inlfunc_<OpType>[_token_<n>]_<name>', its nodes are indexed after
    every node of the model, a body's own function ops again after those): see inline.inline_functions.
    Then every operator without a float16 kernel runs in float32, its float16 inputs cast to float32 (one Cast per
    tensor), its outputs cast back to float16 where a float16 reader or a graph output needs them
    (core/optimizer/insert_cast_transformer.cc: InsertCastTransformer, whose net effect after its
    RemoveDuplicateCastTransformer this is; an operator with a float16 kernel between two converted ones is
    converted too, as its ForceSingleNodeCPUFloat16ToFloat32 does), then the duplicate remover's work on the
    model's own Casts (_without_duplicate_casts). A converted node's float32 output is declared with the shape
    onnxruntime first infers for it (_first_output_shapes), which its planner compares. None where no operator
    needs a Cast. `types`: the model's tensor types (planner.infer_symbolic). The main graph only: a subgraph's
    nodes are left as they are (the caller says so). The model's facts (LoadedModel.facts) follow its nodes; the
    bodies' nodes are INLINED (ranked in the order inlined), the Casts INSERTED."""
    model = loaded.proto
    graph = model.graph
    versions = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    known = dict(types)

    def fp16(name: str) -> bool:
        return bool(name) and known.get(name, (0, None, None))[0] == TensorProto.FLOAT16

    kernels: dict[tuple[str, str], bool] = {}  # (op type, domain) -> _cpu_float16_kernel: asked once per kind

    def has_kernel(node: onnx.NodeProto) -> bool:
        kind = (node.op_type, node.domain)
        found = kernels.get(kind)
        if found is None:
            found = kernels[kind] = _cpu_float16_kernel(node, versions)
        return found

    def no_kernel(node: onnx.NodeProto) -> bool:
        return any(fp16(name) for name in node.input) and not has_kernel(node)

    # values shape inference reads, as onnxruntime's reads its constant initializers (small ones: axes, shapes)
    constants = {t.name: t for t in graph.initializer if t.data_location != TensorProto.EXTERNAL
                 and math.prod(t.dims) <= _INFERENCE_VALUES_UP_TO}
    memo: NodeMemo = {}  # (see inline.infer_node)
    inlined = inline_functions(graph, versions, known, no_kernel, constants, memo)
    nodes = list(graph.node) if inlined is None else inlined.nodes
    has_fp16_input = [any(fp16(name) for name in node.input) for node in nodes]
    unassigned = [has_fp16_input[i] and not has_kernel(node) for i, node in enumerate(nodes)]
    if not any(unassigned) and inlined is None:
        return None
    # the node making each tensor, but Constant nodes: onnxruntime makes them initializers first (no edges)
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out and not
                (node.op_type == "Constant" and node.domain in ("", "ai.onnx"))}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            if name:
                readers.setdefault(name, []).append(i)
    outputs = {v.name for v in graph.output}
    def needs_cast(i: int) -> bool:  # NodeNeedsInputCastToFp32: unassigned, with a float16 input
        return unassigned[i] and has_fp16_input[i]

    if len(nodes) > 1:  # ForceSingleNodeCPUFloat16ToFloat32, in node order as onnxruntime walks its nodes
        walk = range(len(nodes)) if inlined is None else sorted(range(len(nodes)), key=inlined.rank.__getitem__)
        for i in walk:
            node = nodes[i]
            # IsIsolatedFp16NodeOnCpu: a node with a float16 kernel, an input made by a node, no subgraph and no
            # graph output, whose float16 inputs made by nodes all come from nodes that need a Cast and whose
            # float16 outputs (one at least) all go to such nodes (float16 initializers and graph inputs are no
            # edges: they get a Cast of their own; of a variadic input, only the first tensor is looked at)
            if unassigned[i] or holds_graph(node) or any(out in outputs for out in node.output) \
                    or not any(name in producer for name in node.input) \
                    or not any(fp16(name) for name in node.input):
                continue
            if any(fp16(node.input[k]) and node.input[k] in producer and not needs_cast(producer[node.input[k]])
                   for k in _typed_inputs(node, versions)):
                continue
            fp16_outputs = [out for out in node.output if fp16(out)]
            if fp16_outputs and all(needs_cast(r) for out in fp16_outputs for r in readers.get(out, [])):
                unassigned[i] = True
    as_fp32: dict[str, str] = {}  # a float16 tensor -> its float32 twin (a converted node's output, or a Cast's)
    out_nodes: list[onnx.NodeProto] = []
    # A converted node's float32 output keeps the shape onnxruntime first inferred for it, while the node read the
    # Casts of its float16 inputs (their shapes: the float16 tensors', declared or inferred); when the duplicate
    # remover rewires it to the converted producer's output, inference runs again and the merge keeps the names
    # found first (_first_output_shapes). Measured: an inlined Softmax's ReduceSum takes its ReduceMax's freed
    # buffer, its Div the Sub's, where the float16 input's declared shape names every dim, and not where
    # inference from the converted producers leaves a dim empty.
    declared = declared_dim_names(model)
    twins: list[onnx.ValueInfoProto] = []
    float_types: dict[tuple[Dim, ...], onnx.TypeProto] = {}  # (see _float_value)
    out_rank: list[int] = []  # per node: onnxruntime's node index, up to order (the inserted Casts after all)
    inserted_rank = len(nodes) if inlined is None else max(inlined.rank, default=0) + 1
    facts = loaded.facts or NodeFacts()
    originals = len(graph.node)  # (a rank below: the model's node at that position; above: an inlined one)
    out_facts: list[tuple[Provenance | None, Placement | None]] = []  # per node: its facts, where not the defaults

    def add(node: onnx.NodeProto, rank: int | None = None) -> None:
        nonlocal inserted_rank
        out_nodes.append(node)
        if rank is None:
            rank, inserted_rank = inserted_rank, inserted_rank + 1
            out_facts.append((INSERTED_NODE, None))
        elif rank < originals:
            out_facts.append((facts.provenance.get(rank), facts.placement.get(rank)))
        else:
            out_facts.append((Provenance(Origin.INLINED, rank - originals), None))
        out_rank.append(rank)

    for i, node in enumerate(nodes):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        rank = i if inlined is None else inlined.rank[i]
        if not unassigned[i]:
            add(copy, rank)
            continue
        for j, name in enumerate(node.input):
            if not fp16(name):
                continue
            if name not in as_fp32:
                as_fp32[name] = f"{INSERTED_CAST_PREFIX}{name}"
                add(onnx.helper.make_node("Cast", [name], [as_fp32[name]], name=as_fp32[name], to=TensorProto.FLOAT))
            copy.input[j] = as_fp32[name]
        for attr in copy.attribute:
            if attr.name == "dtype" and attr.type == AttributeProto.INT and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.FLOAT
        back = []
        first_shapes: dict[str, tuple[Dim, ...]] | None = None
        for j, name in enumerate(node.output):
            if not fp16(name):
                continue
            twin = as_fp32[name] = f"{INSERTED_CAST_PREFIX}{name}"
            copy.output[j] = twin
            if first_shapes is None:
                first_shapes = _first_output_shapes(node, versions, known, declared, constants, memo)
            shape = first_shapes.get(name)
            if shape is not None and any(d is not None for d in shape):
                twins.append(_float_value(twin, shape, float_types))
            # a Cast back where a float16 reader or a graph output needs it, or where nothing reads the output
            # (InsertCastTransformer casts every float16 output back; the duplicate remover drops only the Casts
            # a converted reader makes redundant: an LSTM's unread Y_h keeps its Cast)
            if name in outputs or not readers.get(name) or any(not unassigned[r] for r in readers[name]):
                back.append(onnx.helper.make_node("Cast", [twin], [name], name=twin,
                                                  to=TensorProto.FLOAT16))
        add(copy, rank)
        for cast in back:
            add(cast)
    as_float = set(as_fp32.values())

    def dtype(name: str) -> int:
        return TensorProto.FLOAT if name in as_float else known.get(name, (0, None, None))[0]

    kept = _without_duplicate_casts(out_nodes, out_rank, dtype, outputs)
    out_nodes = [out_nodes[i] for i in kept]
    provenance: dict[int, Provenance] = {}
    placement: dict[int, Placement] = {}
    for position, i in enumerate(kept):
        made, where = out_facts[i]
        if made is not None:
            provenance[position] = made
        if where is not None:
            placement[position] = where
    changed = ModelProto()
    changed.CopyFrom(model_shell(model))
    changed.graph.CopyFrom(_without_nodes(graph))
    if inlined is not None:
        changed.graph.initializer.extend(inlined.initializers)
    changed.graph.value_info.extend(twins)
    changed.graph.node.extend(out_nodes)
    return dataclasses.replace(loaded, proto=changed, data=None, nodes=None, facts=NodeFacts(provenance, placement))


def inserted_cast_count(model: ModelProto) -> tuple[int, list[str]]:
    """Give the number of Casts cpu_float16_casts inserted in its model and the op types that read them (sorted)."""
    casts = sum(1 for n in model.graph.node if n.op_type == "Cast" and n.name.startswith(INSERTED_CAST_PREFIX))
    readers = sorted({n.op_type for n in model.graph.node if n.op_type != "Cast" and
                      any(i.startswith(INSERTED_CAST_PREFIX) for i in n.input)})
    return casts, readers


def with_inserted_cast_shapes(ran: ModelProto, types: Mapping[str, TensorType]) -> ModelProto:
    """Give onnxruntime's saved graph (`ran`: optimized_model_filepath, Casts inserted) with the float32 output of
    each converted node declared as onnxruntime first inferred it (see cpu_float16_casts: from the float16 tensors
    its inputs were cast from, a removed one's shape first inferred the same way), for the planner's shapes; the
    graph as given where it holds no converted node. `types`: the graph's types (infer_symbolic, declared)."""
    graph = ran.graph
    if not any(out.startswith(INSERTED_CAST_PREFIX) for node in graph.node if node.op_type != "Cast"
               for out in node.output):
        return ran
    versions = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in ran.opset_import}
    declared = declared_dim_names(ran)
    constants = {t.name: t for t in graph.initializer if t.data_location != TensorProto.EXTERNAL
                 and math.prod(t.dims) <= _INFERENCE_VALUES_UP_TO}
    known: dict[str, TensorType] = dict(types)

    def half(name: str) -> str:  # the float16 tensor a float32 twin stands for
        return name[len(INSERTED_CAST_PREFIX):] if name.startswith(INSERTED_CAST_PREFIX) else name

    twins = []
    memo: NodeMemo = {}  # (see inline.infer_node)
    float_types: dict[tuple[Dim, ...], onnx.TypeProto] = {}  # (see _float_value)
    for node in _topological(graph):
        if node.op_type == "Cast" or not any(out.startswith(INSERTED_CAST_PREFIX) for out in node.output):
            continue
        view = onnx.NodeProto()
        view.CopyFrom(node)
        for j, name in enumerate(node.input):
            if name.startswith(INSERTED_CAST_PREFIX) and half(name) in known:
                view.input[j] = half(name)
        for j, name in enumerate(node.output):
            view.output[j] = half(name)
        shapes = _first_output_shapes(view, versions, known, declared, constants, memo)
        for name in node.output:
            shape = shapes.get(half(name))
            if shape is None or not name.startswith(INSERTED_CAST_PREFIX):
                continue
            if half(name) not in known:  # removed with its Casts: its shape is the one first inferred
                known[half(name)] = (TensorProto.FLOAT16, shape, None)
            if any(d is not None for d in shape):
                twins.append(_float_value(name, shape, float_types))
    changed = ModelProto()
    changed.CopyFrom(ran)
    changed.graph.value_info.extend(twins)
    return changed


def _float_value(name: str, shape: tuple[Dim, ...], types: dict[tuple[Dim, ...], onnx.TypeProto]) -> \
        onnx.ValueInfoProto:
    """Give onnx.helper.make_tensor_value_info(name, FLOAT, shape), each distinct shape's type made once (`types`)."""
    value = onnx.ValueInfoProto(name=name)
    made = types.get(shape)
    if made is None:
        made = types[shape] = onnx.helper.make_tensor_type_proto(TensorProto.FLOAT, shape)
    value.type.CopyFrom(made)
    return value


def _topological(graph: GraphProto) -> list[onnx.NodeProto]:
    """Give the graph's nodes in a topological order (the file's, where it is one)."""
    made = {name for name in (*(i.name for i in graph.input), *(t.name for t in graph.initializer))}
    made.add("")
    pending = list(graph.node)
    order: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for node in pending:
            if all(name in made for name in node.input):
                order.append(node)
                made.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):  # inputs from nowhere (a subgraph's outer names): keep the file's order
            order.extend(rest)
            break
        pending = rest
    return order


def _first_output_shapes(node: onnx.NodeProto, versions: Mapping[str, int], known: Mapping[str, TensorType],
                         declared: Container[str], constants: Mapping[str, TensorProto],
                         memo: NodeMemo | None = None) -> dict[str, tuple[Dim, ...]]:
    """Give the output shapes ONNX's inference gives the node on its inputs' shapes as onnxruntime holds them
    (planner.runtime_view: an undeclared 'unk__N' is an empty dim), by output name; {} where it cannot (no first
    shape: inference's later one stands)."""
    inferred = infer_node(node, versions, known, constants, lambda shape: runtime_view(shape, declared), memo)
    shapes = {}
    for name, type_proto in (inferred or {}).items():
        shape = decode_type(type_proto)[1]
        if shape is not None:
            shapes[name] = shape
    return shapes


# The type groups RemoveDuplicateCastTransformer compares (GetTypeGroup): a Cast to a lower group loses precision.
_CAST_TYPE_GROUP: dict[int, int] = {
    TensorProto.BOOL: 0,
    **{t: 1 for t in (TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
                      TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64)},
    **{t: 2 for t in (TensorProto.BFLOAT16, TensorProto.DOUBLE, TensorProto.FLOAT, TensorProto.FLOAT16)},
}


def _without_duplicate_casts(nodes: list[onnx.NodeProto], rank: Sequence[int], dtype: Callable[[str], int],
                             outputs: Container[str]) -> list[int]:
    """Give the positions of the nodes kept (their inputs rewired) after onnxruntime's
    RemoveDuplicateCastTransformer (insert_cast_transformer.cc), which runs after the Casts go in: walking the
    Casts in node index order (`rank`), a Cast's reader that is a Cast back to its input's type (not making a
    graph output) goes, its readers reading the first Cast's input; the first Cast
    goes too where Casts were all its readers and it makes no graph output (the Casts kept then read its input).
    A Cast to a lower type group followed by one to a higher group is left alone (a real loss of precision). The
    net effect on the inserted Casts is already in cpu_float16_casts; this drops the pairs a model's own Cast
    makes with them (keep_io_types' input Casts, a body's CastLike of a constant, a Cast to a float32 output)."""
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in (*node.input, *_subgraph_reads(node)):  # a subgraph's read is an edge of its node
            if name:
                readers.setdefault(name, []).append(i)
    gone: set[int] = set()
    source: dict[str, str] = {}  # a tensor no longer made -> the one its readers read instead

    def read(name: str) -> str:
        while name in source:
            name = source[name]
        return name

    for i in sorted(range(len(nodes)), key=rank.__getitem__):
        node = nodes[i]
        if i in gone or node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        first_in, first_out = read(node.input[0]), node.output[0]
        src, dst = _CAST_TYPE_GROUP.get(dtype(first_in)), _CAST_TYPE_GROUP.get(dtype(first_out))
        if src is None or dst is None:
            continue
        children = [r for r in readers.get(first_out, []) if r not in gone]
        casts = [r for r in children if nodes[r].op_type == "Cast" and nodes[r].domain in ("", "ai.onnx")]
        if any(_CAST_TYPE_GROUP.get(dtype(nodes[r].output[0])) is None or
               (src > dst and _CAST_TYPE_GROUP[dtype(nodes[r].output[0])] > dst) for r in casts):
            continue
        removed = [r for r in casts if nodes[r].output[0] not in outputs and
                   dtype(nodes[r].output[0]) == dtype(first_in)]
        for r in removed:
            gone.add(r)
            source[nodes[r].output[0]] = first_in
        if children and len(casts) == len(children) and first_out not in outputs:
            gone.add(i)
            source[first_out] = first_in
    if not gone:
        return list(range(len(nodes)))
    kept = []
    for i, node in enumerate(nodes):
        if i in gone:
            continue
        for j, name in enumerate(node.input):
            node.input[j] = read(name)
        _rename_subgraph_reads(node, read)
        kept.append(i)
    return kept


def _rename_subgraph_reads(node: onnx.NodeProto, read: Callable[[str], str]) -> None:
    """Rename the outer tensors the node's subgraphs read, as `read` maps them."""
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs) \
            if attr.type == AttributeProto.GRAPHS else []
        for graph in graphs:
            for inner in graph.node:
                for j, name in enumerate(inner.input):
                    inner.input[j] = read(name)
                _rename_subgraph_reads(inner, read)


def _cpu_float16_kernel(node: onnx.NodeProto, versions: Mapping[str, int]) -> bool:
    """Say whether onnxruntime's CPU provider has a float16 kernel for this node's operator at its opset."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    spans = CPU_FLOAT16_KERNELS.get(f"{domain}::{node.op_type}")
    if not spans:
        return False
    opset = versions.get(domain, 1)
    try:
        since = onnx.defs.get_schema(node.op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        since = opset
    return any(first <= since <= last for first, last in spans)


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Give the names the node's subgraphs read (every input of their nodes, at any depth; their own tensors too,
    which name nothing of the outer graph in a valid model unless they shadow it)."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs) \
            if attr.type == AttributeProto.GRAPHS else []
        for graph in graphs:
            for inner in graph.node:
                names.update(inner.input)
                names.update(_subgraph_reads(inner))
    return names


def _typed_inputs(node: onnx.NodeProto, versions: Mapping[str, int]) -> list[int]:
    """Give the positions of the inputs IsIsolatedFp16NodeOnCpu looks at: per formal input of the node's schema
    whose type is a constraint (T, T1, ...), its first present tensor (a variadic input's first only: measured,
    Relu's opset-18 body Max(X, CastLike(0, X)) between converted nodes runs in float32 though its second input
    comes from a Cast it does not look at); every input where the schema is unknown."""
    try:
        schema = onnx.defs.get_schema(node.op_type, versions.get(node.domain or "", 1), node.domain)
    except onnx.defs.SchemaError:
        return list(range(len(node.input)))
    constrained = {c.type_param_str for c in schema.type_constraints}
    positions = []
    start = 0
    formals = schema.inputs
    for formal in formals:  # a variadic formal input is the last: it takes the rest
        variadic = formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic
        count = max(len(node.input) - start, 0) if variadic else (1 if start < len(node.input) else 0)
        if formal.type_str in constrained:
            first = next((k for k in range(start, start + count) if node.input[k]), None)
            if first is not None:
                positions.append(first)
        start += count
    return positions


def _without_nodes(graph: GraphProto) -> GraphProto:
    """Give a copy of the graph without its nodes (its initializers, inputs, outputs and declared values kept)."""
    copy = GraphProto()
    copy.name = graph.name
    copy.initializer.extend(graph.initializer)
    copy.sparse_initializer.extend(graph.sparse_initializer)
    copy.input.extend(graph.input)
    copy.output.extend(graph.output)
    copy.value_info.extend(graph.value_info)
    return copy
