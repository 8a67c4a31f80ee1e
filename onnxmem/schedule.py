"""Execution orders over a ModelGraph: the model's own order, and others a runtime or a planner might use."""

from __future__ import annotations

from .errors import ModelFileError
from .graph import ModelGraph

ORDERS = ("model", "topological")


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


def execution_order(graph: ModelGraph, name: str) -> list[int]:
    """Give the named order ('model' or 'topological')."""
    if name == "model":
        return model_order(graph)
    if name == "topological":
        return topological_order(graph)
    raise ValueError(f"unknown order '{name}'; choose from {', '.join(ORDERS)}")
