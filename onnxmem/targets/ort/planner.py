"""The planner-shape pass: every tensor's type with the input dims left symbolic, as onnxruntime's memory planner
sees the model before any input arrives (it decides buffer reuse on these shapes)."""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import onnx
from onnx import ModelProto, ValueInfoProto

from onnxmem.ir.graph import Origin
from onnxmem.ir.load import initializer_type
from onnxmem.ir.tensor_types import UNKNOWN_TYPE, Dim, TensorType, TypeDecoder
from onnxmem.shapes.carry import carried_types
from onnxmem.shapes.dims import InputDim, input_dims
from onnxmem.shapes.infer import (
    _collect_types,
    _copy,
    _has_unknown_outputs,
    _inferred,
    _ort_symbolic_inference,
    _prepared,
    _shape_only_copy,
    has_rule,
    inference_ir_version,
    inferred_declared_types,
    rule_value_infos,
)
from onnxmem.shapes.rules import ONNX_DOMAIN_RULE_OPS
from onnxmem.shapes.values import FLOAT_VALUE_OPS
from onnxmem.targets.ort.tables import ORT_DATA_PROPAGATION_OPS, PLANNER_MERGES_DIMS, SHAPE_AS, SHAPE_INPUT_SLOTS
from onnxmem.views.report import Warning

if TYPE_CHECKING:
    from onnxmem.ir.graph import ModelGraph
    from onnxmem.ir.load import LoadedModel


# The symbolic types made inside one pipeline run (passes.pipeline.run_stages opens the scope: one_inference), by
# the model they are of: a provider transform that types the model as given to change it (the CUDA placement, the
# CPU provider's float16 Casts) and the planner-types stage read the same inference. Outside a scope: none kept.
_RUN_TYPES: ContextVar[dict[int, tuple[ModelProto, dict[str, TensorType]]] | None] = \
    ContextVar("onnxmem_run_types", default=None)


@contextmanager
def one_inference() -> Iterator[None]:
    """Within this scope, infer_symbolic infers each model once (the scope of one pipeline run: its models are
    not changed while it lasts); see placed_types."""
    token = _RUN_TYPES.set({})
    try:
        yield
    finally:
        _RUN_TYPES.reset(token)


def infer_symbolic(model: ModelProto, loaded: LoadedModel | None = None, free: list[InputDim] | None = None,
                   wiring: ModelGraph | None = None) -> dict[str, TensorType]:
    """Give every tensor's type with the input dims left symbolic, as a runtime's planner sees the model before
    any input arrives (see _symbolic_types), with the integer shape values onnxruntime's own data propagation
    carries to the nodes that read a shape (see ort_shape_inputs). Inside one_inference, each model once."""
    made = _RUN_TYPES.get()
    found = made.get(id(model)) if made is not None else None
    if found is not None and found[0] is model:
        return dict(found[1])
    types = _infer_symbolic(model, loaded, free, wiring)
    if made is not None:
        made[id(model)] = (model, types)
        return dict(types)
    return types


def run_types(model: ModelProto) -> dict[str, TensorType] | None:
    """Give the symbolic types infer_symbolic made of `model` in this scope (one_inference), if it made them."""
    made = _RUN_TYPES.get()
    found = made.get(id(model)) if made is not None else None
    return dict(found[1]) if found is not None and found[0] is model else None


def placed_types(given: LoadedModel, placed: LoadedModel) -> dict[str, TensorType] | None:
    """Give the symbolic types of `placed`, a model a provider transform made from `given` by inserting copies
    alone (nodes whose inference is Identity's: tables.SHAPE_AS, the CUDA provider's Memcpy), from the types
    infer_symbolic made of `given` in this scope (one_inference): a copy's two sides have one type, which is what
    ONNX's inference of the placed model finds (it infers the copies as Identity, the names of unknown dims
    carried through them). None where the scope holds no types of `given` or the transform did more than copy."""
    made = _RUN_TYPES.get()
    found = made.get(id(given.proto)) if made is not None else None
    facts = placed.facts
    if found is None or found[0] is not given.proto or facts is None:
        return None
    nodes = placed.proto.graph.node
    inserted = [i for i, origin in facts.provenance.items() if origin.origin is Origin.INSERTED]
    if len(nodes) != len(given.proto.graph.node) + len(inserted):
        return None  # (a node the transform dropped, duplicated or inlined: not copies alone)
    types = dict(found[1])
    for i in sorted(inserted):
        node = nodes[i]
        kind = f"{'' if node.domain in ('', 'ai.onnx') else node.domain}::{node.op_type}"
        shape_as = SHAPE_AS.get(kind)
        if shape_as is None or shape_as[0] != "Identity" or len(node.input) != 1 or len(node.output) != 1:
            return None
        # (one side of a copy keeps the tensor's name, the other is new: AddCopyNode renames the device side)
        (old, new), = [(a, b) for a, b in ((node.input[0], node.output[0]), (node.output[0], node.input[0]))
                       if a in types] or [("", "")]
        if not old or new in types:
            return None
        types[new] = types[old]
    return types


def _infer_symbolic(model: ModelProto, loaded: LoadedModel | None = None, free: list[InputDim] | None = None,
                    wiring: ModelGraph | None = None) -> dict[str, TensorType]:
    free = input_dims(model) if free is None else free
    types = _symbolic_types(model, loaded, free, wiring)
    shape_inputs = ort_shape_inputs(model, types, wiring)
    if not shape_inputs:
        return types
    rewired = _shape_only_copy(model)
    for node in rewired.graph.node:
        slot = SHAPE_INPUT_SLOTS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if slot is not None and slot < len(node.input) and node.input[slot] in shape_inputs:
            value = shape_inputs[node.input[slot]]
            name = f"onnxmem_shape_value::{value.name}"
            if not any(t.name == name for t in rewired.graph.initializer):
                copy = onnx.TensorProto()
                copy.CopyFrom(value)
                copy.name = name
                rewired.graph.initializer.append(copy)
            node.input[slot] = name
    found = _symbolic_types(rewired, None, free, None)
    return {name: found.get(name, found_type) for name, found_type in types.items()}


def ort_shape_inputs(model: ModelProto, types: Mapping[str, TensorType], wiring: ModelGraph | None = None) -> \
        dict[str, onnx.TensorProto]:
    """Give the integer values onnxruntime's graph resolution knows of the shape inputs of the nodes whose
    inference reads one (rules.inference.SHAPE_INPUT_SLOTS: ONNX's getShapeInput), where the node's output type is
    not already known, as initializers (see ort_shape_values). `wiring`: the model's graph, where the caller has
    built it (its ops find those nodes faster than the model's 100k nodes do)."""
    nodes = model.graph.node
    # (node, inputs, its first output's name or None without outputs) of the nodes of those op types
    if wiring is None:
        candidates = [(n, len(n.input), n.output[0] if n.output else None) for n in nodes
                      if n.op_type in SHAPE_INPUT_SLOTS]
    else:
        tensors = wiring.tensors
        candidates = [(nodes[op.index], len(op.inputs),
                       (tensors[op.outputs[0]].name if op.outputs[0] >= 0 else "") if op.outputs else None)
                      for op in wiring.ops if op.op_type in SHAPE_INPUT_SLOTS]
    reading = [n for n, inputs, first in candidates if n.domain in ("", "ai.onnx")
               and SHAPE_INPUT_SLOTS[n.op_type] < inputs and first is not None
               and not _known(types.get(first, UNKNOWN_TYPE))]
    if not reading:
        return {}
    values = ort_shape_values(model, types)
    found = {}
    for node in reading:
        name = node.input[SHAPE_INPUT_SLOTS[node.op_type]]
        value = values.get(name)
        ints = [v for v in value[0] if isinstance(v, int)] if value is not None and not value[1] else []
        if value is not None and len(ints) == len(value[0]):
            found[name] = onnx.helper.make_tensor(name, onnx.TensorProto.INT64, [len(ints)], ints)
    return found


def ort_shape_values(model: ModelProto, types: Mapping[str, TensorType]) -> dict[str, tuple[list[int | None], bool]]:
    """Give the shape values onnxruntime's graph resolution propagates: per tensor, its integer elements (None: not
    known) and whether it is a scalar. Two kinds of rule, from onnxruntime's graph.cc and data_propagation/:
    ONNX's partial data propagation functions (rules.inference.ORT_DATA_PROPAGATION_OPS) for outputs of rank 1,
    which read only the values propagated so far (not the initializers: measured on Swin's pad list, Sub(8,
    Gather(Shape(...), [0])) stays unknown); onnxruntime's own rules for scalar outputs (Gather, Add, Sub, Mul, Div)
    and for Size, Squeeze and Unsqueeze, which keep integers only and read no initializer but Gather's index
    (measured on onnxruntime 1.32: Div(Gather(Shape(x), 2), 16), Add(.., 1) and Unsqueeze(1) stay unknown, Mul
    and Sub of two propagated scalars are known). ONNX's Cast rule reads the rank-1 channel only: a scalar that
    onnxruntime's own rules made is unknown past a Cast (measured: BEiT's relative position index, TorchScript,
    sized a ConstantOfShape through Div, Cast and Add that the planner leaves unsized: its Slices reused each
    other's buffers here, not there, +21% at batch 1)."""
    # Gather's index, the one constant these rules read (a single value): the small integer initializers and
    # Constant values, each sized from its header before its data is decoded (a larger one is never an index here)
    constants: dict[str, list[int]] = {}
    tensors = [(t.name, t) for t in model.graph.initializer]
    tensors += [(n.output[0], n.attribute[0].t) for n in model.graph.node if n.op_type == "Constant" and n.output
                and n.attribute and n.attribute[0].name == "value"]
    for name, tensor in tensors:
        if tensor.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and len(tensor.dims) <= 1 and \
                tensor.data_location != onnx.TensorProto.EXTERNAL and (not tensor.dims or tensor.dims[0] <= 64):
            constants[name] = [int(v) for v in onnx.numpy_helper.to_array(tensor).reshape(-1)]
    values: dict[str, tuple[list[int | None], bool]] = {}

    def scalar(name: str) -> int | None:  # onnxruntime's own rules: a propagated single value, never a constant
        found = values.get(name)
        return found[0][0] if found is not None and len(found[0]) == 1 else None

    arithmetic = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
                  "Div": lambda a, b: int(a / b) if b else None}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ORT_DATA_PROPAGATION_OPS or not node.output:
            continue
        op, out = node.op_type, node.output[0]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if op in ("Shape", "Size"):
            shape = types.get(node.input[0], UNKNOWN_TYPE)[1]
            if shape is None:
                continue
            dims = [d if isinstance(d, int) else None for d in shape]
            if op == "Size":
                if all(isinstance(d, int) for d in dims):
                    values[out] = ([math.prod(d for d in dims if d is not None)], True)
                continue
            start, end = int(attrs.get("start", 0)), attrs.get("end")
            values[out] = (dims[start:int(end)] if end is not None else dims[start:], False)
        elif op == "Cast" and node.input[0] in values and not values[node.input[0]][1]:
            values[out] = values[node.input[0]]
        elif op == "Gather" and node.input[0] in values and int(attrs.get("axis", 0)) == 0:
            data = values[node.input[0]][0]
            index = constants.get(node.input[1])
            if index is not None and len(index) == 1 and _is_scalar(types, node.input[1]) \
                    and -len(data) <= index[0] < len(data) and data[index[0]] is not None:
                values[out] = ([data[index[0]]], True)
        elif op == "Unsqueeze":
            value = scalar(node.input[0])
            if value is not None and _is_scalar(types, node.input[0]):
                values[out] = ([value], False)
        elif op == "Squeeze" and node.input[0] in values and len(values[node.input[0]][0]) == 1:
            values[out] = (values[node.input[0]][0], True)
        elif op == "Concat" and all(name in values and not values[name][1] for name in node.input):
            values[out] = ([v for name in node.input for v in values[name][0]], False)
        elif op in arithmetic and len(node.input) == 2:
            if _is_scalar(types, out) or (node.input[0] in values and values[node.input[0]][1]):
                a, b = scalar(node.input[0]), scalar(node.input[1])
                if a is not None and b is not None and (result := arithmetic[op](a, b)) is not None:
                    values[out] = ([result], True)
            elif op != "Div" and node.input[0] in values and node.input[1] in values:
                first, second = values[node.input[0]][0], values[node.input[1]][0]
                if len(first) == len(second) or 1 in (len(first), len(second)):
                    size = max(len(first), len(second))
                    pairs = [(first[0 if len(first) == 1 else i], second[0 if len(second) == 1 else i])
                             for i in range(size)]
                    values[out] = ([arithmetic[op](a, b) if a is not None and b is not None else None
                                    for a, b in pairs], False)
    return values


_INTEGER_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})


def sizes_from_float_arithmetic(model: ModelProto) -> bool:
    """Say whether a size in the model's main graph may follow from float arithmetic on sizes: a Cast to an integer
    type of what a Floor, Ceil or Round gave, through the shape-value operators (torchvision's transform resizes to
    floor(size * scale) and pads to ceil(size / 32.0) * 32, in float, then concatenated and cast). Sizing computes
    such values (shapes.values.FLOAT_VALUE_OPS) and onnxruntime's graph resolution never does (ONNX's data
    propagation and its own rules carry integers only), so its planner knows fewer shapes than sizing even where
    every input dim is fixed, and the planner's types must be inferred (infer_symbolic) there too (measured,
    onnxruntime 1.32: a Relu after such a Pad is not done in place)."""
    nodes = model.graph.node
    rounded = {n.output[0] for n in nodes if n.op_type in ("Floor", "Ceil", "Round") and n.output
               and n.domain in ("", "ai.onnx")}
    if not rounded:
        return False
    for node in nodes:  # (in the file's order: a graph's nodes are sorted)
        if node.domain not in ("", "ai.onnx") or not any(name in rounded for name in node.input):
            continue
        if node.op_type == "Cast":
            if any(a.name == "to" and a.i in _INTEGER_TYPES for a in node.attribute):
                return True
        elif node.op_type in FLOAT_VALUE_OPS:
            rounded.update(name for name in node.output if name)
    return False


def _is_scalar(types: Mapping[str, TensorType], name: str) -> bool:
    return types.get(name, UNKNOWN_TYPE)[1] == ()


def _symbolic_types(model: ModelProto, loaded: LoadedModel | None = None, free: list[InputDim] | None = None,
                    wiring: ModelGraph | None = None) -> dict[str, TensorType]:
    """Give every tensor's type with the input dims left symbolic, as a runtime's planner sees the model before
    any input arrives (onnxruntime decides buffer reuse on these shapes: equal names are equal sizes).

    `loaded`: the model as loaded from its file, whose NodeKinds tell which passes can be skipped; `free`: the
    model's input_dims where the caller has them; `wiring`: the model's graph, where the caller has built it (its
    ops find the nodes the planner rounds read faster than the model's nodes do).
    """
    free = input_dims(model) if free is None else free
    nodes = loaded.nodes if loaded is not None else None
    subgraphs = nodes is None or nodes.graphs  # whether a node may hold a graph (see _collect_types)
    merges = nodes is None or nodes.merges  # whether a node may merge dims (see _planner_rounds)
    # The model as it was read serves inference where preparation would change nothing in it (no Constant node
    # to fold, no fused operator to rewrite, an IR version inference reads as it is, every free dim named): no
    # copy, no serialization.
    as_read = loaded.data if loaded is not None and nodes is not None and not nodes.prepared and \
        model.ir_version == inference_ir_version(model.ir_version) and \
        all(d.name != f"{d.input}_dim{d.axis}" for d in free) else None
    prepared: list[ModelProto] = []

    def light() -> ModelProto:  # the model inference reads, where a round adds to it: made at first use
        if not prepared:
            prepared.append(_prepared(model, free, {}))
        return prepared[0]

    candidates: list[onnx.NodeProto] | None = []
    if merges:  # the model's own nodes serve where preparation changed none of them (no fused op was rewritten)
        candidates = _candidate_nodes(model, wiring) if wiring is not None and nodes is not None and \
            not nodes.prepared else None
    if as_read is not None and not subgraphs and candidates is not None and \
            not any(n.domain not in ("", "ai.onnx") and not has_rule(n) for n in candidates):
        # The rounds read nothing of the inferred model but its declared types (no operator needs onnxruntime's
        # inference, no node holds a graph): they are read from inference's bytes without parsing its nodes.
        try:
            declared = inferred_declared_types(as_read, TypeDecoder())
        except Exception:  # noqa: BLE001 - onnx raises several types; the bound inference reports the failure
            return _collect_types(light().graph, TypeDecoder())
        weights = {t.name: initializer_type(t) for t in model.graph.initializer}
        return _planner_rounds(light, None, [], subgraphs=False, candidates=candidates, weights=weights,
                               collected=declared)
    try:
        inferred = _inferred(as_read if as_read is not None else light(), data_prop=False)
    except Exception:  # noqa: BLE001 - onnx raises several types; the bound inference reports the failure
        return _collect_types(light().graph, TypeDecoder())
    return _planner_rounds(light, inferred, [], subgraphs=subgraphs, candidates=candidates)


def runtime_view(shape: tuple[Dim, ...] | None, declared: Container[str] = ()) -> tuple[Dim, ...] | None:
    """Give a shape as onnxruntime's planner holds it: ONNX names every dim it cannot infer 'unk__N', where
    onnxruntime leaves the dim empty, and an empty dim equals nothing (measured: Softmax after a dynamic Reshape
    is not done in place). A 'unk__N' the model file itself declares (`declared`: declared_dim_names; a file saved
    after ONNX's shape inference carries them in its value_info) is a name to onnxruntime like any other, which
    it propagates and compares (measured: a quantized BERT's MatMulInteger output takes the freed buffer of an
    Add whose declared shape names the same 'unk__9')."""
    if shape is None:
        return None
    return tuple(None if isinstance(d, str) and d.startswith("unk__") and d not in declared else d for d in shape)


def declared_dim_names(model: ModelProto) -> frozenset[str]:
    """Give the 'unk__N' dim names the model's main graph declares (its inputs, outputs and value_info): names
    onnxruntime reads from the file, not ones ONNX's inference made up (see runtime_view)."""
    return frozenset(d.dim_param for v in (*model.graph.input, *model.graph.output, *model.graph.value_info)
                     if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")
                     for d in v.type.tensor_type.shape.dim if d.dim_param.startswith("unk__"))


_PLANNER_ROUNDS = 128  # (see infer._RULE_ROUNDS): rounds stop as soon as one learns nothing


def _planner_rounds(light: Callable[[], ModelProto], inferred: ModelProto | None, warnings: list[Warning],
                    subgraphs: bool = True, candidates: Sequence[onnx.NodeProto] | None = None,
                    weights: Mapping[str, TensorType] | None = None,
                    collected: dict[str, TensorType] | None = None) -> dict[str, TensorType]:
    """Give the types onnxruntime's planner knows: ONNX's inference (no value propagation), and what onnxruntime
    knows besides, fed back into it until nothing more is learned.

    Contrib operators: onnxruntime infers their outputs from their schemas, from their inputs' shapes, and
    propagates no shape values (measured: after a Reshape whose target is computed, it knows no shape). Its
    Python symbolic inference knows the contrib operators but also propagates shape values symbolically, so it
    knows more than the planner: its type for a contrib operator's output is taken only where every input of
    that operator is known. Concat merges each dim from all its inputs, where ONNX's 'unk__N' names would win
    (rules.inference.PLANNER_MERGES_DIMS).

    `candidates`: the nodes the rounds look at (see _candidate_nodes), where the caller has them (None: they are
    read from `inferred`); `weights`: the types of the graph's initializers, where the caller has them;
    `collected`: the types collected from `inferred` but its initializers', where they were collected before
    (`inferred` is then not read: None, where the model has no contrib operator).
    """
    # the nodes the rounds look at: contrib operators and those that merge dims (the others, read once)
    nodes = _candidate_nodes(inferred) if candidates is None and inferred is not None else candidates or []
    ruled = [n for n in nodes if has_rule(n)]  # typed by our shape rules (rules.shapes), in node order
    contrib: dict[str, ValueInfoProto] = {}  # onnxruntime's symbolic inference: the last resort, for the rest
    if inferred is not None and any(n.domain not in ("", "ai.onnx") and not has_rule(n) for n in nodes) and \
            _has_unknown_outputs(inferred.graph):
        found = _ort_symbolic_inference(_copy(inferred), warnings)
        if found is not inferred:
            contrib = {v.name: v for v in found.graph.value_info}
            contrib.update((v.name, v) for v in found.graph.output)

    def collect(inferred: ModelProto) -> dict[str, TensorType]:
        types = _collect_types(inferred.graph, TypeDecoder(), subgraphs=subgraphs, initializers=weights is None)
        types.update(weights or {})  # (where _collect_types puts them: last)
        return types

    learned_before: set[str] = set()
    if collected is not None:
        types = collected
        types.update(weights or {})
    else:
        assert inferred is not None
        types = collect(inferred)
    for _ in range(_PLANNER_ROUNDS):
        learned = rule_value_infos(ruled, types, learned_before)
        for node in nodes:
            if has_rule(node):
                continue
            if node.domain not in ("", "ai.onnx"):
                if contrib and not all(out in types and _known(types[out]) for out in node.output if out) \
                        and all(_known(types.get(i, UNKNOWN_TYPE)) for i in node.input if i):
                    learned.extend(contrib[out] for out in node.output if out in contrib
                                   and out not in learned_before and not (out in types and _known(types[out])))
            elif node.op_type in PLANNER_MERGES_DIMS and node.output and node.output[0] not in learned_before:
                merged = _merged_dims(node, types)
                if merged is not None:
                    learned.append(merged)
        if not learned:
            return types
        learned_before.update(v.name for v in learned)
        light().graph.value_info.extend(learned)
        carried = carried_types(light(), types, learned)  # (the learned types carried node by node, where told)
        if carried is not None:
            types = carried
            continue
        try:
            inferred = _inferred(light(), data_prop=False)
        except Exception:  # noqa: BLE001 - keep what the rounds before found
            return types
        types = collect(inferred)
    return types


def _is_candidate(op_type: str, domain: str) -> bool:
    """Say whether the planner rounds look at a node of this kind (see _planner_rounds)."""
    return op_type in PLANNER_MERGES_DIMS or domain not in ("", "ai.onnx") or op_type in ONNX_DOMAIN_RULE_OPS


def _candidate_nodes(model: ModelProto, wiring: ModelGraph | None = None) -> list[onnx.NodeProto]:
    """Give the nodes of the model's graph the planner rounds look at: found from its graph where the caller has it
    (faster than reading every node's op type from the model)."""
    nodes = model.graph.node
    if wiring is None:
        return [n for n in nodes if _is_candidate(n.op_type, n.domain)]
    return [nodes[op.index] for op in wiring.ops if _is_candidate(op.op_type, op.domain)]


def _merged_dims(node: onnx.NodeProto, types: Mapping[str, TensorType]) -> ValueInfoProto | None:
    """Give the output type of a Concat with each dim merged as onnxruntime does (the first input dim with a
    value or a name; 'unk__N' is no name), where that names a dim ONNX's inference left 'unk__N'; else None."""
    dtype, current, _ = types.get(node.output[0], UNKNOWN_TYPE)
    if current is None:
        return None
    unknown = [j for j, d in enumerate(current) if d is None or (isinstance(d, str) and d.startswith("unk__"))]
    if not unknown:
        return None  # no dim to learn (the usual case: reading the node's inputs costs more)
    axis = next((a.i for a in node.attribute if a.name == "axis"), PLANNER_MERGES_DIMS[node.op_type])
    axis %= max(len(current), 1)
    if unknown == [axis]:
        return None  # the concatenated dim is never merged (a KV cache's past + new: the usual unknown one)
    shapes = [types.get(name, UNKNOWN_TYPE)[1] for name in node.input if name]
    dims: list[int | str | None] = [None if isinstance(d, str) and d.startswith("unk__") else d for d in current]
    changed = False
    for j in unknown:
        if j == axis:
            continue
        for shape in shapes:
            d = shape[j] if shape is not None and len(shape) == len(current) else None
            if isinstance(d, int) or (isinstance(d, str) and not d.startswith("unk__")):
                dims[j] = d
                changed = True
                break
    return onnx.helper.make_tensor_value_info(node.output[0], dtype, dims) if changed else None


def _known(t: TensorType) -> bool:
    shape = t[1]
    return shape is not None and all(isinstance(d, int) or (isinstance(d, str) and not d.startswith("unk__"))
                                     for d in shape)
