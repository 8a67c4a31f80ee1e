"""A memory-aware execution order: greedy "least peak memory first" over the same graph, as a separate pass.

Compilers reorder for peak memory (PyTorch Inductor's `topological_sort_lpmf`): among the ops whose inputs are
ready, run next the one whose outputs raise live memory least while it runs, and among equals the one that frees
most. The order is a heuristic, not an optimum; `liveness` evaluates it exactly like any other order, so the what-ifs
compare its peak with the given order's and list it only where it is lower (plan.what_ifs).
"""

from __future__ import annotations

from onnxmem.ir.graph import ACTIVATION, OUTPUT, ModelGraph
from onnxmem.passes.liveness import alias_roots
from onnxmem.passes.schedule import topological_order
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES, InferenceRules

_OWNS_BUFFER = (ACTIVATION, OUTPUT)


def memory_order(graph: ModelGraph, rules: InferenceRules = DEFAULT_INFERENCE_RULES) -> list[int]:
    """Give a topological order of the ops that greedily keeps live activation bytes low (least peak first)."""
    tensors = graph.tensors
    ops = graph.ops
    owner = alias_roots(graph, rules)  # views share their input's buffer, as liveness decides
    size = [t.nbytes or 0 for t in tensors]
    # per tensor: whether its buffer is an activation's (views are counted in their root's buffer)
    counted = [t.kind in _OWNS_BUFFER and t.producer is not None for t in tensors]
    readers: dict[int, int] = {}  # buffer root -> the ops that read any tensor living in it (how many)
    reads: list[list[int]] = []  # per op: the buffers it reads (no graph output's: those stay to the end)
    waits_on = [0] * len(ops)
    unblocks: list[list[int]] = [[] for _ in ops]
    pinned = {owner[t] for t in graph.outputs}  # graph outputs stay to the end
    for op in ops:
        index = op.index
        roots: set[int] = set()
        producers: set[int] = set()
        for t in (*op.inputs, *op.implicit_inputs) if op.implicit_inputs else op.inputs:
            if t < 0:
                continue
            producer = tensors[t].producer
            if producer is not None:
                producers.add(producer)
            root = owner[t]
            if counted[root]:
                roots.add(root)
        for root in roots:  # (a set: an op reading a buffer twice is one reader)
            readers[root] = readers.get(root, 0) + 1
        reads.append([r for r in roots if r not in pinned])
        producers.discard(index)
        waits_on[index] = len(producers)
        for p in producers:
            unblocks[p].append(index)
    # per op: the bytes of the buffers it makes (its outputs that are a buffer's root), and what it frees whatever
    # runs before it: those that no op reads (and no graph output)
    allocates = [0] * len(ops)
    unread = [0] * len(ops)
    for t, tensor in enumerate(tensors):
        producer = tensor.producer
        if producer is not None and counted[t] and owner[t] == t:
            allocates[producer] += size[t]
            if t not in readers and t not in pinned:
                unread[producer] += size[t]
    remaining = dict(readers)

    ready = [op.index for op in ops if waits_on[op.index] == 0]
    order: list[int] = []
    live = 0
    while ready:
        best_key: tuple[int, int, int] | None = None
        best = -1
        for candidate in ready:
            freed = unread[candidate]
            for r in reads[candidate]:
                if remaining[r] == 1:
                    freed += size[r]
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
