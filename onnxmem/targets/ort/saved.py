"""The facts of a graph onnxruntime saved after its own changes (optimized_model_filepath, which validate reads):
which of its nodes onnxruntime added, told by the names it gives them (the provider transforms of targets/ort
give the same names to the nodes they add, and say so in LoadedModel.facts; a saved graph carries only names)."""

from __future__ import annotations

import onnx

from onnxmem.ir.graph import INSERTED_NODE, NodeFacts, Origin, Provenance
from onnxmem.targets.ort.cpu.float16 import INSERTED_CAST_PREFIX
from onnxmem.targets.ort.cpu.inline import inlined_node_rank
from onnxmem.targets.ort.cuda.placement import MEMCPY_OPS, MEMCPY_PREFIX
from onnxmem.targets.ort.qdq import DUPLICATED_SUFFIX


def saved_graph_facts(model: onnx.ModelProto) -> NodeFacts:
    """Give the provenance of the main graph's nodes as their names tell it: the Casts InsertCastTransformer
    inserted and the Memcpy copies (INSERTED), the DequantizeLinear duplicates of EnsureUniqueDQForNodeUnit
    (DUPLICATED, ranked by the node they copy, then by their own position) and the nodes of inlined function bodies
    (INLINED, ranked by the index their name carries). A node's name is the graph's (graph.build_graph: its own,
    else '<OpType>_<position>'); Constant nodes are the model's."""
    provenance: dict[int, Provenance] = {}
    names: list[str] = []
    duplicates: list[int] = []
    for position, node in enumerate(model.graph.node):
        op_type = node.op_type
        name = node.name or f"{op_type}_{position}"
        names.append(name)
        if op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        if (op_type == "Cast" and name.startswith(INSERTED_CAST_PREFIX)) or \
                (op_type in MEMCPY_OPS and name.startswith(MEMCPY_PREFIX)):
            provenance[position] = INSERTED_NODE
        elif op_type == "DequantizeLinear" and DUPLICATED_SUFFIX in name:
            duplicates.append(position)
        elif (rank := inlined_node_rank(name)) is not None:
            provenance[position] = Provenance(Origin.INLINED, rank)
    if duplicates:
        by_name = {name: position for position, name in enumerate(names)}
        duplicates.sort(key=lambda i: (by_name.get(names[i].split(DUPLICATED_SUFFIX)[0], i), i))
        for rank, position in enumerate(duplicates):
            provenance[position] = Provenance(Origin.DUPLICATED, rank)
    return NodeFacts(provenance)
