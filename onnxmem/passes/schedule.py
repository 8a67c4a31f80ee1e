"""Execution orders over a ModelGraph that read only its wiring: the model's own, onnxruntime's, a topological
sort, and one given by node names (the registry of orders is orders.py; the memory-aware one is order.py)."""

from __future__ import annotations

from collections.abc import Sequence

from onnxmem.errors import ModelFileError
from onnxmem.ir.graph import MODEL_NODE, ModelGraph, Origin


def model_order(graph: ModelGraph) -> list[int]:
    """Give the model's node order when it is topological (ONNX requires it), else a topological sort."""
    if graph.in_file_order:
        return list(range(len(graph.ops)))
    for op in graph.ops:
        for t in (*op.inputs, *op.implicit_inputs):
            if t >= 0:
                producer = graph.tensors[t].producer
                if producer is not None and producer >= op.index:
                    return topological_order(graph)
    return [op.index for op in graph.ops]


def topological_order(graph: ModelGraph) -> list[int]:
    """Give a topological order of the ops, ties broken by position in the file."""
    import networkx as nx  # only when the file's own order is not topological: see ModelGraph.nx

    n = len(graph.ops)
    try:
        order = nx.lexicographical_topological_sort(graph.nx)
        return [node for node in order if node < n]
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(graph.nx)
        names = [graph.ops[a].name for a, _ in cycle if a < n]
        raise ModelFileError(f"invalid graph: it has a cycle through nodes {', '.join(names[:5])}") from None


def named_order(graph: ModelGraph, names: Sequence[str]) -> list[int]:
    """Give the ops in the order of their names; an op missing from the list or out of topological order is an
    error, except Constant ops (initializers to a runtime), which run first."""
    index = {op.name: op.index for op in graph.ops}
    unknown = [n for n in names if n not in index]
    if unknown:
        raise ModelFileError(f"execution order names nodes the graph does not have: {', '.join(unknown[:5])}")
    listed = [index[n] for n in names]
    constants = [op.index for op in graph.ops if op.op_type == "Constant" and op.index not in set(listed)]
    order = constants + listed
    if sorted(order) != list(range(len(graph.ops))):
        missing = ", ".join(graph.ops[i].name for i in sorted(set(range(len(graph.ops))) - set(order))[:5])
        raise ModelFileError(f"execution order misses or repeats nodes: {missing or 'a node listed twice'}")
    step = {op: s for s, op in enumerate(order)}
    for op in order:
        for t in (*graph.ops[op].inputs, *graph.ops[op].implicit_inputs):
            producer = graph.tensors[t].producer if t >= 0 else None
            if producer is not None and step[producer] > step[op]:
                raise ModelFileError(f"execution order runs '{graph.ops[op].name}' before its input's producer")
    return order


def ort_order(graph: ModelGraph) -> list[int]:
    """Give the order onnxruntime's sequential executor runs the ops in (ExecutionOrder::DEFAULT).

    GraphViewer's order is Graph::ReverseDFSFrom over the leaves (ops none of whose outputs another op reads),
    comparing node indices: the last leaf's inputs are explored first, the highest-index input first, and an op
    is emitted after all of its inputs (docs/ort-memory-planner.md; it matched onnxruntime 1.32 on 19 graphs).
    Constant nodes become initializers before onnxruntime indexes the rest; they run first here, costing nothing.
    The nodes onnxruntime adds (Op.provenance, as the provider's transforms say) are indexed after every node of
    the model: the DequantizeLinear duplicates of EnsureUniqueDQForNodeUnit (qdq.unique_dequantize), then the nodes
    of the function bodies its partitioner inlines, then the Casts its CPU provider inserts and the Memcpy nodes
    its MemcpyTransformer inserts, each in the order it added them (their provenance's rank; the inserted ones:
    in graph order).
    """
    ops = graph.ops
    # one pass over the ops: the Constants and the nodes onnxruntime adds
    constants: list[int] = []
    inserted: list[int] = []
    duplicates: list[tuple[int, int]] = []  # (its rank among the duplicates, op)
    inlined: list[tuple[int, int]] = []  # (its rank among the inlined nodes, op)
    for op in ops:
        if op.op_type == "Constant" and op.domain in ("", "ai.onnx"):
            constants.append(op.index)
            continue
        provenance = op.provenance
        if provenance is MODEL_NODE:  # (most ops: one identity test)
            continue
        origin = provenance.origin
        if origin is Origin.INSERTED:
            inserted.append(op.index)
        elif origin is Origin.DUPLICATED:
            duplicates.append((provenance.rank, op.index))
        elif origin is Origin.INLINED:
            inlined.append((provenance.rank, op.index))
    skip = set(constants)
    # onnxruntime's node indices, up to order: the model's nodes, then the DequantizeLinear duplicates, the nodes
    # of inlined function bodies (in the order they were inlined) and the inserted nodes
    added = [op for _, op in sorted(duplicates)] + [op for _, op in sorted(inlined)] + inserted
    rank: list[int] | None = None  # onnxruntime's node index, where it is not the op's own
    if added:
        rank = list(range(len(ops)))
        for k, index in enumerate(added):
            rank[index] = len(ops) + k
    # per tensor: the op that makes it, where the walk follows it (-1: none, or a Constant); index -1 (an omitted
    # input) reads the last entry, -1
    made_by = [-1 if t.producer is None or t.producer in skip else t.producer for t in graph.tensors]
    made_by.append(-1)
    inputs_of: list[list[int]] = []
    has_reader = [False] * len(ops)
    for op in ops:
        producers = []  # one entry per edge, duplicates kept
        for t in op.inputs:
            p = made_by[t]
            if p >= 0:
                producers.append(p)
                has_reader[p] = True
        for t in op.implicit_inputs:
            p = made_by[t]
            if p >= 0:
                producers.append(p)
                has_reader[p] = True
        if rank is None:
            producers.sort()
        else:
            producers.sort(key=rank.__getitem__)
        inputs_of.append(producers)
    # the walk's stack: an op to explore, or ~op (negative) to emit once its inputs are
    stack = [op.index for op in ops if not has_reader[op.index] and op.index not in skip]
    if rank is not None:
        stack.sort(key=rank.__getitem__)
    visited = [False] * len(ops)
    order = list(constants)
    while stack:
        index = stack.pop()
        if index < 0:
            order.append(~index)
            continue
        if visited[index]:
            continue
        visited[index] = True
        stack.append(~index)
        stack.extend(inputs_of[index])  # (one visited by the time it is popped is skipped there, as above)
    if len(order) != len(ops):  # unreachable ops only exist in a graph with a cycle: report it
        return topological_order(graph)
    if graph.in_file_order:
        return order  # (no cycle: the walk emits every op after its inputs)
    position = [0] * len(ops)
    for step, index in enumerate(order):
        position[index] = step
    for i, producers in enumerate(inputs_of):
        at = position[i]
        for j in producers:
            if position[j] > at:
                return topological_order(graph)  # a cycle the walk went through: reported there
    return order
