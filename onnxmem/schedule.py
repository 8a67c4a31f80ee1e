"""Execution orders over a ModelGraph: the model's own order, and others a runtime or a planner might use."""

from __future__ import annotations

from .errors import ModelFileError
from .graph import ModelGraph

ORDERS = ("model", "ort", "memory", "topological")


def model_order(graph: ModelGraph) -> list[int]:
    """Give the model's node order when it is topological (ONNX requires it), else a topological sort."""
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


def ort_order(graph: ModelGraph) -> list[int]:
    """Give the order onnxruntime's sequential executor runs the ops in (ExecutionOrder::DEFAULT).

    GraphViewer's order is Graph::ReverseDFSFrom over the leaves (ops none of whose outputs another op reads),
    comparing node indices: the last leaf's inputs are explored first, the highest-index input first, and an op
    is emitted after all of its inputs (docs/ort-memory-planner.md; it matched onnxruntime 1.32 on 19 graphs).
    Constant nodes become initializers before onnxruntime indexes the rest; they run first here, costing nothing.
    """
    ops = graph.ops
    constants = [op.index for op in ops if op.op_type == "Constant" and op.domain in ("", "ai.onnx")]
    skip = set(constants)
    inputs_of: list[list[int]] = []
    has_reader = [False] * len(ops)
    for op in ops:
        producers = []
        for t in (*op.inputs, *op.implicit_inputs):  # one entry per edge, duplicates kept
            producer = graph.tensors[t].producer if t >= 0 else None
            if producer is not None and producer not in skip:
                producers.append(producer)
                has_reader[producer] = True
        inputs_of.append(sorted(producers))
    stack = [(op.index, False) for op in ops if not has_reader[op.index] and op.index not in skip]
    visited = [False] * len(ops)
    order = list(constants)
    while stack:
        index, leave = stack.pop()
        if leave:
            order.append(index)
            continue
        if visited[index]:
            continue
        visited[index] = True
        stack.append((index, True))
        stack.extend((j, False) for j in inputs_of[index] if not visited[j])
    if len(order) != len(ops):  # unreachable ops only exist in a graph with a cycle: report it
        return topological_order(graph)
    return order


def execution_order(graph: ModelGraph, name: str) -> list[int]:
    """Give the named order: the model's, onnxruntime's, a memory-aware greedy one, or a topological sort."""
    if name == "model":
        return model_order(graph)
    if name == "ort":
        return ort_order(graph)
    if name == "memory":
        from .order import memory_order  # the greedy pass lives apart; it imports this module

        return memory_order(graph)
    if name == "topological":
        return topological_order(graph)
    raise ValueError(f"unknown order '{name}'; choose from {', '.join(ORDERS)}")
