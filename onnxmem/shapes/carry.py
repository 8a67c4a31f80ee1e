"""Carrying types a round of rules learned through the graph node by node, in place of inferring the whole graph
again: what ONNX's inference of the graph would give, or None where it cannot be told so (the caller infers)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import onnx
from onnx import AttributeProto, ModelProto, TensorProto, ValueInfoProto

from onnxmem.ir.dtypes import tensor_bytes
from onnxmem.ir.tensor_types import Dim, TensorType, TypeDecoder, decode_type
from onnxmem.shapes.values import _is_shape_constant
from onnxmem.targets.ort.tables import CONTROL_FLOW

_NO_SCHEMA = "no schema"  # (ONNX infers nothing for the operator: its outputs keep what the graph declares)


@functools.cache
def _schema(op_type: str, version: int, domain: str) -> onnx.defs.OpSchema | str | None:
    """Give the operator's schema where ONNX's inference runs its inference function alone; _NO_SCHEMA where ONNX
    knows no such operator; None where it would enter a function body (not told node by node here)."""
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return _NO_SCHEMA
    return schema if schema.has_type_and_shape_inference_function else None


def carried_types(light: ModelProto, before: Mapping[str, TensorType],
                  learned: Sequence[ValueInfoProto]) -> dict[str, TensorType] | None:
    """Give the types _collect_types gives of ONNX's inference (no data propagation) of `light`, whose value_info
    ends with `learned` (a round of rules: types of outputs its last inference left unknown), from `before`, what
    the last inference of `light` without `learned` gave: the same, but for the nodes that read a type that
    changed (or make a learned one), each inferred alone (ONNX's inference function of its schema) from its
    inputs' types and merged into what the graph declares, as the whole graph's inference does.

    The whole graph's inference names each dim it cannot infer 'unk__N', counting in node order; so None (infer
    instead) where the count could differ: a node inferred here leaves a dim unknown, a changed output had a
    name its inputs did not carry (one the last inference made up), or a learned type has an unknown dim. None
    too where a node so reached holds a graph, enters a function body, or has an input of no type.
    """
    decode = TypeDecoder()
    if any(not _complete(decode(value.type)) for value in learned):
        return None
    learned_names = {v.name for v in learned}
    graph = light.graph
    if light.functions:
        return None
    versions = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in light.opset_import}
    declared = {v.name: v.type for v in (*graph.output, *graph.value_info)}
    constants: dict[str, TensorProto] | None = None  # (read where a reached node reads a constant input)
    types = dict(before)
    changed: set[str] = set()
    memo: dict[tuple[object, ...], list[TensorType | None] | None] = {}  # layers repeat their nodes' types
    for node in graph.node:
        if not any(out in learned_names for out in node.output) and not any(name in changed for name in node.input):
            continue
        if node.op_type in CONTROL_FLOW or any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS)
                                               for a in node.attribute):
            return None
        domain = "" if node.domain == "ai.onnx" else node.domain
        schema = _schema(node.op_type, versions[domain], domain) if domain in versions else _NO_SCHEMA
        if schema is None:
            return None
        inferred: dict[str, TensorType] = {}
        if not isinstance(schema, str):
            if constants is None:
                # (the values inference reads: small ones; a large model's copy for inference holds no others)
                constants = {t.name: t for t in graph.initializer if _is_shape_constant(t)}
            found = _infer_alone(schema, node, types, constants, light, memo)
            if found is None:
                return None
            inferred = found
        for out in node.output:
            if not out:
                continue
            known = declared.get(out)
            new = _merged(inferred.get(out), None if known is None else decode(known))
            old = types.get(out)
            # (the rules write what they learn into the types the caller holds: a learned output of an operator
            # ONNX does not know, untyped in the last inference, is a change even where `before` holds it)
            if new == old and not (out in learned_names and isinstance(schema, str)):
                continue
            if new is None or not _complete(new) or \
                    (old is not None and not isinstance(schema, str) and _made_up(old, node, before)):
                return None
            types[out] = new
            changed.add(out)
    return _in_inference_order(light, types, before)


def _infer_alone(schema: onnx.defs.OpSchema, node: onnx.NodeProto, types: Mapping[str, TensorType],
                 constants: Mapping[str, TensorProto], light: ModelProto,
                 memo: dict[tuple[object, ...], list[TensorType | None] | None]) -> dict[str, TensorType] | None:
    """Give ONNX's inference function's output types of the node alone, from its inputs' types and constant
    values, by output name; None where an input has no type or the function fails. A Cast's is its input's shape
    at the element type it names. The answers are kept in `memo` for the node's kind, attributes and input types
    with their dim names numbered in order of appearance (an inference function compares names, never reads
    them: layers that differ only in their names share one answer)."""
    inputs: list[TensorType | None] = []
    for name in node.input:
        found = types.get(name) if name else None
        if name and (found is None or found[0] == 0):
            return None
        inputs.append(found)
    if node.op_type == "Cast" and len(inputs) == 1 and inputs[0] is not None and len(node.output) == 1 and \
            len(node.attribute) == 1 and node.attribute[0].name == "to" and node.domain in ("", "ai.onnx"):
        source = inputs[0]
        return {node.output[0]: _tensor_type(node.attribute[0].i, source[1])}
    names: dict[str, str] = {}  # a dim name -> its canonical one, in order of appearance
    key_inputs: list[tuple[int, tuple[Dim, ...] | None, bytes | None] | None] = []
    for name, found in zip(node.input, inputs, strict=True):
        if found is None:
            key_inputs.append(None)
            continue
        shape = found[1]
        if shape is not None:
            shape = tuple(names.setdefault(d, f"d{len(names)}") if isinstance(d, str) else d for d in shape)
        key_inputs.append((found[0], shape, constants[name].SerializeToString() if name in constants else None))
    key = (node.op_type, node.domain, tuple(bool(out) for out in node.output),
           b"".join(a.SerializeToString() for a in node.attribute), *key_inputs)
    if key not in memo:
        canonical = onnx.NodeProto()
        canonical.CopyFrom(node)
        del canonical.input[:], canonical.output[:]
        canonical.input.extend(f"i{k}" if name else "" for k, name in enumerate(node.input))
        canonical.output.extend(f"o{k}" if name else "" for k, name in enumerate(node.output))
        input_types = {f"i{k}": onnx.helper.make_tensor_type_proto(entry[0], entry[1])
                       for k, entry in enumerate(key_inputs) if entry is not None}
        data = {f"i{k}": constants[name] for k, name in enumerate(node.input) if name in constants}
        try:
            outputs = onnx.shape_inference.infer_node_outputs(schema, canonical, input_types, data,
                                                              opset_imports=list(light.opset_import))
        except Exception:  # noqa: BLE001 - onnx raises several types here; the whole inference says more
            memo[key] = None
        else:
            memo[key] = [decode_type(outputs[f"o{k}"]) if f"o{k}" in outputs else None
                         for k in range(len(node.output))]
    answer = memo[key]
    if answer is None:
        return None
    back = {canonical_name: name for name, canonical_name in names.items()}
    result: dict[str, TensorType] = {}
    for out, typed in zip(node.output, answer, strict=True):
        if out and typed is not None:
            shape = typed[1]
            if shape is not None and any(isinstance(d, str) for d in shape):
                typed = _tensor_type(typed[0], tuple(back.get(d, d) if isinstance(d, str) else d for d in shape))
            result[out] = typed
    return result


def _tensor_type(dtype: int, shape: tuple[Dim, ...] | None) -> TensorType:
    """Give decode_type's (dtype, shape, bytes) of a tensor type."""
    if shape is None:
        return dtype, None, None
    count = 1
    for d in shape:
        if not isinstance(d, int):
            return dtype, shape, None
        count *= d
    return dtype, shape, tensor_bytes(dtype, count)


def _complete(t: TensorType) -> bool:
    return t[0] != 0 and t[1] is not None and all(d is not None for d in t[1])


def _made_up(old: TensorType, node: onnx.NodeProto, before: Mapping[str, TensorType]) -> bool:
    """Say whether `old` (the last inference's type of an output of `node`) holds a 'unk__N' name none of the
    node's inputs held: one that inference made up at this node, whose count the later names follow."""
    names = {d for d in old[1] or () if isinstance(d, str) and d.startswith("unk__")}
    if not names:
        return False
    carried = {d for name in node.input if name in before for d in before[name][1] or ()}
    return not names <= carried


def _merged(inferred: TensorType | None, declared: TensorType | None) -> TensorType | None:
    """Give ONNX's merge of an inferred output type into the type the graph declares (mergeShapesAndTypes: an
    inferred size wins, else the declared size or name, else the inferred name); None where neither is known or
    they disagree."""
    if inferred is None or declared is None:
        return inferred if inferred is not None else declared
    a, b = inferred, declared
    if a[0] and b[0] and a[0] != b[0]:
        return None
    dtype = b[0] or a[0]
    if a[1] is None or b[1] is None:
        shape = b[1] if a[1] is None else a[1]
    elif len(a[1]) != len(b[1]):
        return None
    else:
        dims: list[Dim] = []
        for source, target in zip(a[1], b[1], strict=True):
            if isinstance(source, int):
                if isinstance(target, int) and target != source:
                    return None
                dims.append(source)
            else:
                dims.append(target if target is not None else source)
        shape = tuple(dims)
    return _tensor_type(dtype, shape)


def _in_inference_order(light: ModelProto, types: dict[str, TensorType],
                        before: Mapping[str, TensorType]) -> dict[str, TensorType]:
    """Give `types` in the order _collect_types reads them from ONNX's inference of `light`: its inputs, outputs
    and declared values, then the values inference adds, in node order, then its initializers, then the rest (its
    subgraphs' values) as `before` held them."""
    graph = light.graph
    ordered: dict[str, TensorType] = {}
    for values in (graph.input, graph.output, graph.value_info):
        for value in values:
            if value.name in types:
                ordered.setdefault(value.name, types[value.name])
    for node in graph.node:
        for out in node.output:
            if out in types:
                ordered.setdefault(out, types[out])
    for tensor in graph.initializer:
        if tensor.name in types:
            ordered.setdefault(tensor.name, types[tensor.name])
    for name in before:
        if name in types:
            ordered.setdefault(name, types[name])
    return ordered

