"""The one change onnxruntime makes to a QDQ model at every optimization level, on every execution provider:
EnsureUniqueDQForNodeUnit (core/optimizer/qdq_transformer/ensure_unique_dq_for_node_unit.cc), which
InferenceSession::TransformGraph applies before the level-1 optimizations, unless the session sets
session.disable_quant_qdq. A DequantizeLinear read by several nodes is duplicated so that each reader has its own:
each duplicate makes a float tensor of its own, allocated before its reader runs, so a report of the file as
given (one float tensor shared by the readers) undercounts what the session allocates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import onnx
from onnx import ModelProto

from onnxmem.ir.graph import NodeFacts, Origin, Placement, Provenance
from onnxmem.ir.load import LoadedModel

# onnxruntime names a duplicate after the DequantizeLinear it copies ("<name>/duplicated", its output
# "<output>/duplicated"); onnxruntime adds the duplicates after the model's nodes, so their node indices come after
# every other's: the transform gives each the provenance DUPLICATED, ranked in the order onnxruntime indexes them
# (that of the DequantizeLinear it copies, then its own), which its execution order follows (schedule.ort_order).
DUPLICATED_SUFFIX = "/duplicated"
DQ_DOMAINS = ("", "ai.onnx", "com.microsoft")


def unique_dequantize(loaded: LoadedModel) -> LoadedModel | None:
    """Give the model with a DequantizeLinear of its own for each reader of a shared one, as onnxruntime's
    EnsureUniqueDQForNodeUnit makes it, or None where no DequantizeLinear is shared.

    Per DequantizeLinear of the main graph, one edge per (reader, input position): the first reader keeps the
    original and each other edge gets a duplicate; where the original's output is a graph output or a subgraph
    reads it, every same-graph edge gets a duplicate and the original stays for those. A duplicate is placed just
    before its reader (the file stays in topological order). The model's facts (LoadedModel.facts) follow its
    nodes; each duplicate is DUPLICATED."""
    if loaded.data is not None and b"DequantizeLinear" not in loaded.data:
        return None  # (the file as read names no such operator: a search of its bytes, not a walk of its nodes)
    graph = loaded.proto.graph
    nodes = list(graph.node)
    if not any(node.op_type == "DequantizeLinear" for node in nodes):
        return None
    shared = _shared_dequantize(nodes, {v.name for v in graph.output}, _subgraph_reads(nodes))
    if not shared:
        return None
    taken: set[str] = {n.name for n in nodes} | {o for n in nodes for o in n.output} | \
        {v.name for v in graph.input} | {t.name for t in graph.initializer}
    before: dict[int, list[tuple[int, onnx.NodeProto]]] = {}  # reader's position -> (DQ, duplicate) placed before it
    renamed: dict[tuple[int, int], str] = {}  # (reader, input position) -> the duplicate's output
    for dq_index, edges in shared:
        original = nodes[dq_index]
        for reader, position in edges:
            name = _fresh(f"{original.name or original.output[0]}{DUPLICATED_SUFFIX}", taken)
            output = _fresh(f"{original.output[0]}{DUPLICATED_SUFFIX}", taken)
            copy = onnx.NodeProto()
            copy.CopyFrom(original)
            copy.name = name
            del copy.output[:]
            copy.output.append(output)
            before.setdefault(reader, []).append((dq_index if original.name else -1, copy))
            renamed[(reader, position)] = output
    facts = loaded.facts or NodeFacts()
    provenance: dict[int, Provenance] = {}
    placement: dict[int, Placement] = {}
    moved = [0] * len(nodes)  # per node: its position in the new graph
    copies: list[tuple[int, int]] = []  # (the named DequantizeLinear it copies or -1, position) per duplicate
    out_nodes: list[onnx.NodeProto] = []
    for i, node in enumerate(nodes):
        for dq_index, duplicate in before.get(i, ()):
            copies.append((dq_index, len(out_nodes)))
            out_nodes.append(duplicate)
        moved[i] = len(out_nodes)
        if i in facts.provenance:
            provenance[moved[i]] = facts.provenance[i]
        if i in facts.placement:
            placement[moved[i]] = facts.placement[i]
        if not any((i, j) in renamed for j in range(len(node.input))):
            out_nodes.append(node)
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for j in range(len(copy.input)):
            if (i, j) in renamed:
                copy.input[j] = renamed[(i, j)]
        out_nodes.append(copy)
    # onnxruntime indexes the duplicates in the order of the DequantizeLinear they copy (an unnamed one's: in their
    # own), after any made before
    first = 1 + max((p.rank for p in provenance.values() if p.origin is Origin.DUPLICATED), default=-1)
    ordered = sorted((moved[dq] if dq >= 0 else position, position) for dq, position in copies)
    for rank, (_, position) in enumerate(ordered, start=first):
        provenance[position] = Provenance(Origin.DUPLICATED, rank)
    changed = ModelProto()
    changed.CopyFrom(loaded.proto)
    del changed.graph.node[:]
    changed.graph.node.extend(out_nodes)
    return dataclasses.replace(loaded, proto=changed, data=None, nodes=None,
                               facts=NodeFacts(provenance, placement))


def _shared_dequantize(nodes: list[onnx.NodeProto], graph_outputs: set[str], subgraph_reads: set[str]) -> \
        list[tuple[int, list[tuple[int, int]]]]:
    """Give each DequantizeLinear that needs duplicates (its position) with the edges (reader, input position)
    that get one, in file order."""
    readers: dict[str, list[tuple[int, int]]] = {}
    for i, node in enumerate(nodes):
        for j, name in enumerate(node.input):
            if name:
                readers.setdefault(name, []).append((i, j))
    shared = []
    for i, node in enumerate(nodes):
        if node.op_type != "DequantizeLinear" or node.domain not in DQ_DOMAINS or not node.output:
            continue
        output = node.output[0]
        edges = readers.get(output, [])
        keeps_original = output in graph_outputs or output in subgraph_reads
        if len(edges) > (0 if keeps_original else 1):
            shared.append((i, edges if keeps_original else edges[1:]))
    return shared


def _subgraph_reads(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """Give the names that the subgraphs of these nodes read (at any depth)."""
    names: set[str] = set()
    for node in nodes:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else
                        attr.graphs if attr.type == onnx.AttributeProto.GRAPHS else []):
                names.update(name for inner in sub.node for name in inner.input if name)
                names |= _subgraph_reads(sub.node)
    return names


def _fresh(name: str, taken: set[str]) -> str:
    """Give `name`, or onnxruntime's form of a free variant of it ('<name>_token_<n>'), and take it."""
    fresh, n = name, 0
    while fresh in taken:
        fresh, n = f"{name}_token_{n}", n + 1
    taken.add(fresh)
    return fresh
