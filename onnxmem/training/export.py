"""What an export did to the model PyTorch trains, undone: ops it folded away simulated again, eval-mode copies made
the train-mode op, ATen ops exported as several nodes (or decomposed into a chain) fused back into one, a recurrent
op's run-time weight re-layout dropped; and the export's mode and the warnings it earns.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from onnxmem.ir.graph import ACTIVATION, WEIGHT, ModelGraph, fx_arguments
from onnxmem.training.rules import (
    ATEN_IN_PLACE_TAIL,
    ATEN_SAVED_FOR_BACKWARD,
    ATEN_WITH_DROPOUT,
    CHECKPOINT_LAYERS_PROPERTY,
    DECOMPOSED,
    EVAL_MODULES,
    EXPORT_MODE_PROPERTY,
    EXPORTER_WEIGHT_NAME,
    FOLDED_ATEN,
    FOLDS_INTO,
    RECURRENT_WEIGHT_RELAYOUT,
    Decomposed,
    Folded,
)
from onnxmem.training.values import StepNode, StepValue, aten_op, is_tensor, module_classes, saves_rule

# Warnings a training report carries about its export: each is stated in the report's assumptions as
# '[code] message' (TrainingReport has no warnings of its own), and training_warnings gives them back.
EXPORT_WARNINGS = ("training-unknown-shape", "folded-normalization", "eval-export", "export-mode-unknown",
                   "unmatched-pattern", "tied-weight-pattern", "unmodelled-kernel", "grad-reenabled", "eager-lifetimes")


@dataclass
class Restored:
    """What an export folded or removed and the simulation restores: what the export warnings say."""

    folded_into: dict[str, list[str]] = field(default_factory=dict)  # module ('BatchNorm') -> nodes folded into
    kept_bytes_values: list[int] = field(default_factory=list)  # the restored ops' inputs (kept for backward)
    by_names: bool = False  # found by exporter weight names (no ATen marks), not by ATen marks
    eval_marks: bool = False  # an ATen op says the model was exported in eval mode
    eval_copies: dict[str, int] = field(default_factory=dict)  # op -> eval-mode copies simulated as that op
    p0_copies: dict[str, int] = field(default_factory=dict)  # op -> its p=0 copies in a train-mode export (aliases)


def restore_folded(nodes: list[StepNode], values: list[StepValue], graph: ModelGraph) \
        -> tuple[list[StepNode], Restored]:
    """Give the nodes with the ops an export folded away simulated again (a BatchNorm after the node it was folded
    into, reading a new copy of that node's output; rules.py FOLDED_ATEN, FOLDS_INTO) and eval-mode copies
    of train-mode ops made that op again (EVAL_MODULES), and what was restored."""
    restored = Restored()
    groups: dict[str, list[int]] = {}
    folded: dict[int, Folded] = {}  # position of the node folded into -> the op restored after it
    trained = traced_in_train_mode(graph)
    for n, node in enumerate(nodes):
        op = graph.ops[node.graph_op] if node.graph_op is not None else None
        name = aten_op(op.origin) if op is not None else ""
        if name in FOLDED_ATEN:
            restored.eval_marks |= FOLDED_ATEN[name].eval
            groups.setdefault(op.origin.split(" ", 2)[1] if op is not None else "", []).append(n)
        if node.op_type == "Identity":
            classes = module_classes(node.layer)
            if classes and classes[-1] in EVAL_MODULES:
                made = EVAL_MODULES[classes[-1]]
                copies = restored.p0_copies if trained else restored.eval_copies
                copies[made] = copies.get(made, 0) + 1
                if not trained:
                    node.op_type = made
    for members in groups.values():
        rule = FOLDED_ATEN[aten_op(graph.ops[nodes[members[0]].graph_op].origin)]  # type: ignore[index]
        if not any(nodes[m].op_type == rule.restores for m in members):
            folded[members[-1]] = rule
    marked = any(op.origin for op in graph.ops)
    parameter_names = any(v.kind == WEIGHT and v.is_float and "." in v.name and not re.match(EXPORTER_WEIGHT_NAME,
                                                                                           v.name) for v in values)
    if not marked and parameter_names:
        readers = {t for node in nodes if node.op_type in {f.restores for f in FOLDS_INTO.values()}
                   for t in node.inputs}
        for n, node in enumerate(nodes):
            weight = node.inputs[1] if node.op_type in FOLDS_INTO and len(node.inputs) > 1 else -1
            if weight >= 0 and values[weight].kind == WEIGHT and re.match(EXPORTER_WEIGHT_NAME, values[weight].name) \
                    and node.outputs and node.outputs[0] not in readers:
                folded[n] = FOLDS_INTO[node.op_type]
                restored.by_names = True
    if not folded:
        return nodes, restored
    result: list[StepNode] = []
    for n, node in enumerate(nodes):
        result.append(node)
        fold = folded.get(n)
        y = node.outputs[0] if fold is not None and node.outputs else -1
        if fold is None or y < 0 or not values[y].is_float:
            continue
        before = values[y]
        values.append(StepValue(f"{before.name} (before the folded {fold.module})", before.shape, before.numel,
                             before.nbytes, True, ACTIVATION))
        copy = len(values) - 1
        node.outputs = (copy, *node.outputs[1:])
        result.append(StepNode(fold.restores, "", f"{node.name} (folded {fold.module})", node.layer, (copy,), (y,),
                            node.graph_op, restored=True))
        restored.folded_into.setdefault(fold.module, []).append(node.name)
        restored.kept_bytes_values.append(copy)
    return result, restored


def read_recurrent_weights(nodes: list[StepNode], values: list[StepValue], graph: ModelGraph) -> list[StepNode]:
    """Give the nodes with the exporter's run-time re-layout of each recurrent op's weights dropped (the nodes of
    rules.py RECURRENT_WEIGHT_RELAYOUT types that carry the op's fx node and compute only from parameters),
    the op reading the parameters instead (inputs W, R, B replaced by their first parameter, the others appended).
    The copies are no activations of PyTorch's step: the hand formula does not count them either."""
    producer: dict[int, int] = {}
    for n, node in enumerate(nodes):
        for t in node.outputs:
            if t >= 0:
                producer[t] = n

    def origin(n: int) -> str:
        node = nodes[n]
        return graph.ops[node.graph_op].origin if node.graph_op is not None and not node.restored else ""

    def parameters(t: int, key: str, chain: set[int]) -> list[int] | None:
        """The parameters float value t is laid out from (through nodes of the op's fx node), or None."""
        n = producer.get(t)
        if n is None:
            return [t] if values[t].kind == WEIGHT and values[t].is_float else None
        node = nodes[n]
        if node.op_type not in RECURRENT_WEIGHT_RELAYOUT or " ".join(origin(n).split(" ", 2)[:2]) != key:
            return None
        chain.add(n)
        found: list[int] = []
        for i in node.inputs:
            if i < 0 or not values[i].is_float:
                continue  # indices, shapes and axes
            leaves = parameters(i, key, chain)
            if leaves is None:
                return None
            found.extend(leaves)
        return found or None

    dropped: set[int] = set()
    rewired: dict[int, StepNode] = {}
    for n, node in enumerate(nodes):
        rule = saves_rule(node.op_type, node.domain)
        if rule is None or not rule.recurrent:
            continue
        key = " ".join(origin(n).split(" ", 2)[:2])
        if not key:
            continue
        inputs = list(node.inputs)
        appended: list[int] = []
        chain: set[int] = set()
        for i in (1, 2, 3):
            if i >= len(inputs) or inputs[i] < 0:
                continue
            leaves = parameters(inputs[i], key, chain)
            if leaves is None or inputs[i] in leaves:
                continue
            inputs[i] = leaves[0]
            appended.extend(leaves[1:])
        if not chain:
            continue
        extra = [t for t in dict.fromkeys(appended) if t not in inputs]  # a parameter sliced thrice is read once
        rewired[n] = dataclasses.replace(node, inputs=(*inputs, *extra))
        dropped |= chain
    if not rewired:
        return nodes
    # a dropped node's outputs must have no reader but the chain and the recurrent ops it feeds
    kept_readers = {t for m, node in enumerate(nodes) if m not in dropped
                    for t in (rewired[m].inputs if m in rewired else node.inputs) if t >= 0}
    made = {t for m in dropped for t in nodes[m].outputs if t >= 0}
    if made & (kept_readers | set(graph.outputs)):
        return nodes
    return [rewired.get(m, node) for m, node in enumerate(nodes) if m not in dropped]


def fuse_aten_groups(nodes: list[StepNode], values: list[StepValue], graph: ModelGraph) -> \
        tuple[list[StepNode], list[int]]:
    """Give the nodes with each group exported from one ATen op of rules.py ATEN_SAVED_FOR_BACKWARD (the
    nodes sharing the dynamo exporter's fx node) replaced by that op, at the group's last node; and the group's
    intermediates."""
    groups: dict[str, list[int]] = {}
    for n, node in enumerate(nodes):
        origin = graph.ops[node.graph_op].origin if node.graph_op is not None and not node.restored else ""
        if origin and aten_op(origin) in ATEN_SAVED_FOR_BACKWARD:
            groups.setdefault(" ".join(origin.split(" ", 2)[:2]), []).append(n)
    if not any(len(members) > 1 for members in groups.values()):
        return nodes, []
    readers: dict[int, list[int]] = {}
    for n, node in enumerate(nodes):
        for t in node.inputs:
            if t >= 0:
                readers.setdefault(t, []).append(n)
    graph_outputs = set(graph.outputs)
    fused: dict[int, StepNode] = {}
    removed: set[int] = set()
    hidden: list[int] = []
    for key, members in groups.items():
        if len(members) < 2:
            continue
        made = {t for n in members for t in nodes[n].outputs if t >= 0}
        inside = set(members)
        last = members[-1]
        read_outside = [t for t in made if t in graph_outputs or any(r not in inside for r in readers.get(t, ()))]
        # the group's tensors read outside it; its shape arithmetic and constants may be read outside too (the
        # exporter shares a Constant between ops): those nodes stay, outside the fused op
        exported = [t for t in read_outside if is_tensor(values[t])]
        # one result, read only after the group's last node (where the op is placed)
        if len(exported) != 1 or any(r not in inside and r < last for r in readers.get(exported[0], ())):
            continue
        kept = _producers_of(members, set(read_outside) - set(exported), nodes)
        external = [t for n in members for t in nodes[n].inputs
                    if t >= 0 and t not in made and values[t].is_float and (values[t].numel or 0) > 1]
        named = [graph.tensor_index[name] for name in fx_arguments(graph.ops[nodes[last].graph_op])  # type: ignore[index]
                 if name in graph.tensor_index]
        inputs = tuple(t for t in dict.fromkeys(named or external) if t in external)
        if not inputs:
            continue
        name = aten_op(key)
        if name in ATEN_WITH_DROPOUT and any(nodes[m].op_type == "Dropout" for m in members):
            name = ATEN_WITH_DROPOUT[name]
        fused[last] = StepNode(f"aten::{name}", "", nodes[last].name, nodes[members[0]].layer, inputs,
                            (exported[0],), nodes[last].graph_op)
        removed.update(m for m in members[:-1] if m not in kept)
        hidden.extend(t for m in members if m not in kept for t in nodes[m].outputs if t >= 0 and t != exported[0])
    if not fused:
        return nodes, []
    return [fused.get(n, node) for n, node in enumerate(nodes) if n not in removed], hidden


def in_place_tails(values: list[StepValue], nodes: list[StepNode], graph: ModelGraph) -> list[tuple[int, int]]:
    """Give (output, product) for each node that writes into the product before it, as PyTorch's one kernel does
    (rules.py ATEN_IN_PLACE_TAIL: a Linear's bias Add after its MatMul, one addmm): a tail op of the same fx node
    reading that product's float output, which it alone reads and whose size its output has."""
    found = []
    for n, node in enumerate(nodes):
        rule = ATEN_IN_PLACE_TAIL.get(node.aten)
        if rule is None or node.restored or node.graph_op is None or node.op_type not in rule[1] \
                or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1 or node.outputs[0] < 0:
            continue
        out = values[node.outputs[0]]
        fx_node = graph.ops[node.graph_op].origin.split(" ", 2)[:2]
        for t in node.inputs:
            producer = values[t].producer if t >= 0 else None
            op = nodes[producer].graph_op if producer is not None else None
            if producer is None or op is None or nodes[producer].op_type not in rule[0] \
                    or graph.ops[op].origin.split(" ", 2)[:2] != fx_node or values[t].consumers != [n] \
                    or not values[t].is_float or values[t].numel != out.numel:
                continue
            found.append((node.outputs[0], t))
            break
    return found


def _producers_of(members: list[int], wanted: set[int], nodes: list[StepNode]) -> set[int]:
    """Give the members of a group that make `wanted` and the members those read from, transitively."""
    made_by = {t: m for m in members for t in nodes[m].outputs if t >= 0}
    kept: set[int] = set()
    todo = [made_by[t] for t in wanted if t in made_by]
    while todo:
        m = todo.pop()
        if m not in kept:
            kept.add(m)
            todo.extend(made_by[t] for t in nodes[m].inputs if t in made_by)
    return kept


def fuse_decomposed(nodes: list[StepNode], values: list[StepValue], graph: ModelGraph) -> \
        tuple[list[StepNode], list[int], dict[str, int]]:
    """Give the nodes with every chain of rules.py DECOMPOSED replaced by the one op it stands for (at the
    chain's last node), the intermediates the chains made, and how many chains each assumption covers. Nodes with
    ATen marks are never matched: the marks say which op they come from."""
    graph_outputs = set(graph.outputs)
    readers: dict[int, list[int]] = {}
    per_scope: dict[str, int] = {}
    for n, node in enumerate(nodes):
        for t in node.inputs:
            if t >= 0:
                readers.setdefault(t, []).append(n)
        if node.graph_op is not None:
            per_scope[node.layer] = per_scope.get(node.layer, 0) + 1
    fused: dict[int, StepNode] = {}  # position of a chain's last node -> the op
    removed: set[int] = set()
    hidden: list[int] = []
    assumed: dict[str, int] = {}
    for n in range(len(nodes)):
        if n in removed or nodes[n].graph_op is None or graph.ops[nodes[n].graph_op].origin:  # type: ignore[index]
            continue
        for pattern in DECOMPOSED:
            chain = _match_chain(pattern, n, nodes, values, readers, graph_outputs)
            if chain is None or any(m in removed or m in fused for m in chain):
                continue
            first, last = nodes[chain[0]], nodes[chain[-1]]
            if pattern.own_scope and (not first.layer or per_scope.get(first.layer) != len(chain)
                                      or any(nodes[m].layer != first.layer for m in chain)):
                continue
            x = next(t for t in first.inputs if t >= 0 and values[t].numel != 1)
            fused[chain[-1]] = StepNode(pattern.op_type, "", last.name, first.layer, (x,), (last.outputs[0],),
                                     last.graph_op)
            removed.update(chain[:-1])
            hidden.extend(nodes[m].outputs[0] for m in chain[:-1])
            if pattern.assumption:
                assumed[pattern.assumption] = assumed.get(pattern.assumption, 0) + 1
            break
    if not fused:
        return nodes, [], assumed
    return [fused.get(n, node) for n, node in enumerate(nodes) if n not in removed], hidden, assumed


def _match_chain(pattern: Decomposed, start: int, nodes: list[StepNode], values: list[StepValue],
                 readers: dict[int, list[int]], graph_outputs: set[int]) -> list[int] | None:
    """Give the positions of a chain of `pattern` starting at node `start`, or None."""

    def scalar(t: int) -> bool:
        return t >= 0 and values[t].numel == 1 and values[t].is_float

    node = nodes[start]
    if node.op_type != pattern.chain[0] or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    tensors = [t for t in node.inputs if t >= 0 and not scalar(t)]
    if len(tensors) != 1 or len(node.inputs) - len(tensors) != sum(scalar(t) for t in node.inputs):
        return None
    x = tensors[0]
    chain = [start]
    for i, op_type in enumerate(pattern.chain[1:], start=1):
        previous = nodes[chain[-1]].outputs[0]
        if previous in graph_outputs or len(readers.get(previous, [])) != 1:
            return None
        m = readers[previous][0]
        node = nodes[m]
        if node.op_type != op_type or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
            return None
        wanted = [previous, x] if i in pattern.reads_input else [previous]
        rest = list(node.inputs)
        for t in wanted:
            if t not in rest:
                return None
            rest.remove(t)
        if not all(scalar(t) for t in rest):
            return None
        chain.append(m)
    return chain



def traced_in_train_mode(graph: ModelGraph) -> bool:
    """Say whether the graph shows a train-mode trace: a Dropout node, a BatchNormalization that updates its running
    statistics, or export_for_training's record of the mode."""
    return graph.properties.get(EXPORT_MODE_PROPERTY) == "training" or any(
        op.op_type == "Dropout" or (op.op_type == "BatchNormalization" and len([t for t in op.outputs if t >= 0]) > 1)
        for op in graph.ops)


def checkpoint_layers(graph: ModelGraph) -> tuple[str, ...]:
    """Give the modules the model's library checkpoints one by one, as the export names them (the
    CHECKPOINT_LAYERS_PROPERTY onnxmem.torch's and onnxmem.hf's exports write); () where the file does not say."""
    return tuple(filter(None, graph.properties.get(CHECKPOINT_LAYERS_PROPERTY, "").split(",")))


def export_mode(graph: ModelGraph, restored: Restored | None = None) -> str:
    kinds = {op.op_type for op in graph.ops}
    if restored is not None and restored.eval_marks:
        return "eval"
    if traced_in_train_mode(graph):
        return "training"
    if "BatchNormalization" in kinds or (restored is not None and (restored.by_names or restored.eval_copies)):
        return "eval"
    return "either"


# What to do instead of an export that folded or removed training memory.
RECOMMENDED_EXPORT = ("export in train mode with BatchNorm and Dropout kept: onnxmem.torch.export_for_training(model, "
                      "args, path), or torch.onnx.export(model.train(), args, path, dynamo=True, optimize=False)")


def export_findings(restored: Restored | None, values: list[StepValue], mode: str) -> list[str]:
    """Give the export warnings as '[code] message': ops the export folded (restored and counted here), an
    eval-mode export (its Dropout layers are gone: not counted)."""
    restored = restored or Restored()
    findings = []
    removed_dropout = ("the export was made in eval mode, which removes Dropout: the masks of any Dropout layers "
                       "the model has are not counted")
    if restored.folded_into:
        kept = sum(values[t].nbytes for t in restored.kept_bytes_values)
        layers = "; ".join(f"{len(nodes)} {module} layer(s) into {', '.join(nodes[:3])}"
                           + (", ..." if len(nodes) > 3 else "") for module, nodes in restored.folded_into.items())
        how = ("Conv weights with an exporter's name, not a parameter's, say so" if restored.by_names
               else "the ATen ops that mark those nodes say so")
        findings.append(f"[folded-normalization] the export folded {layers} ({how}): the graph lacks what they keep "
                        f"for backward in training. They are simulated again after those nodes (their inputs, "
                        f"{kept:,} bytes, and statistics are counted)"
                        + (f"; {removed_dropout}" if mode == "eval" else "") + ". For an exact estimate, "
                        + RECOMMENDED_EXPORT)
    elif mode == "eval":
        copies = ", ".join(f"{count} {op}" for op, count in restored.eval_copies.items())
        kept_as_copies = f" ({copies} layer(s) it kept as copies are simulated in train mode)" if copies else ""
        findings.append(f"[eval-export] {removed_dropout}{kept_as_copies}; BatchNorm is assumed to train on batch "
                        f"statistics. For an exact estimate, {RECOMMENDED_EXPORT}")
    return findings

