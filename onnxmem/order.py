"""A memory-aware execution order: greedy "least peak memory first" over the same graph, as a separate pass.

Compilers reorder for peak memory (PyTorch Inductor's `topological_sort_lpmf`): among the ops whose inputs are
ready, run next the one whose outputs raise live memory least while it runs, and among equals the one that frees
most. The order is a heuristic, not an optimum; `liveness` evaluates it exactly like any other order, so the what-ifs
compare its peak with the given order's and list it only where it is lower (plan.what_ifs).
"""

from __future__ import annotations

from .graph import ACTIVATION, OUTPUT, ModelGraph
from .liveness import alias_roots
from .rules import DEFAULT_INFERENCE_RULES, InferenceRules
from .schedule import topological_order

_OWNS_BUFFER = (ACTIVATION, OUTPUT)


def memory_order(graph: ModelGraph, rules: InferenceRules = DEFAULT_INFERENCE_RULES) -> list[int]:
    """Give a topological order of the ops that greedily keeps live activation bytes low (least peak first)."""
    tensors = graph.tensors
    owner = alias_roots(graph, rules)  # views share their input's buffer, as liveness decides

    def find(t: int) -> int:
        return owner[t]

    def counted(root: int) -> bool:
        return tensors[root].kind in _OWNS_BUFFER and tensors[root].producer is not None

    size = [t.nbytes or 0 for t in tensors]
    allocates = [sum(size[t] for t in op.outputs if t >= 0 and find(t) == t and counted(t)) for op in graph.ops]
    readers: dict[int, set[int]] = {}  # buffer root -> ops that read any tensor living in it
    reads: list[set[int]] = []
    waits_on = [0] * len(graph.ops)
    unblocks: list[list[int]] = [[] for _ in graph.ops]
    for op in graph.ops:
        roots: set[int] = set()
        producers: set[int] = set()
        for t in (*op.inputs, *op.implicit_inputs):
            if t < 0:
                continue
            producer = tensors[t].producer
            if producer is not None:
                producers.add(producer)
            root = find(t)
            if counted(root):
                roots.add(root)
                readers.setdefault(root, set()).add(op.index)
        reads.append(roots)
        producers.discard(op.index)
        waits_on[op.index] = len(producers)
        for p in producers:
            unblocks[p].append(op.index)
    pinned = {find(t) for t in graph.outputs}  # graph outputs stay to the end
    remaining = {root: len(ops) for root, ops in readers.items()}

    ready = [op.index for op in graph.ops if waits_on[op.index] == 0]
    order: list[int] = []
    live = 0
    while ready:
        best_key: tuple[int, int, int] | None = None
        best = -1
        for candidate in ready:
            freed = sum(size[r] for r in reads[candidate] if remaining[r] == 1 and r not in pinned)
            freed += sum(size[t] for t in graph.ops[candidate].outputs
                         if t >= 0 and find(t) == t and counted(t) and t not in readers and t not in pinned)
            key = (live + allocates[candidate], allocates[candidate] - freed, candidate)
            if best_key is None or key < best_key:
                best_key, best = key, candidate
        assert best_key is not None
        ready.remove(best)
        order.append(best)
        live += best_key[1]
        for r in reads[best]:
            remaining[r] -= 1
        for nxt in unblocks[best]:
            waits_on[nxt] -= 1
            if waits_on[nxt] == 0:
                ready.append(nxt)
    if len(order) != len(graph.ops):  # a cycle: the model's order reports it with the nodes' names
        return topological_order(graph)
    return order
