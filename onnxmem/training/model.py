"""The model of a training step: the facts every simulation of the step reads, built once per training_memory call.

The forward nodes (ATen ops exported as several nodes fused back, folded ops restored: export.py) and the loss onnxmem
appends; the parameters; every value's size at the training precision; the storages views share; what needs a
gradient; and what each differentiable op keeps for backward, by its rule (rules.py SAVED_FOR_BACKWARD) and by
what the device's kernel keeps and allocates besides (DeviceModel.node_facts, onnxmem/targets/torch/).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from onnx import TensorProto

from onnxmem.ir.graph import INPUT, WEIGHT, ModelGraph, module_path
from onnxmem.targets.torch.base import DeviceModel, NodeContext, NodeFacts
from onnxmem.training.elementwise import elementwise_backward, same_tensor_type
from onnxmem.training.export import (
    Restored,
    fuse_aten_groups,
    fuse_decomposed,
    in_place_tails,
    read_recurrent_weights,
    restore_folded,
)
from onnxmem.training.lifetimes import held_by_locals
from onnxmem.training.options import BASE_PRECISIONS, TrainingOptions
from onnxmem.training.rules import (
    ATEN_VIEWS,
    AUTOCAST_LOW_PRECISION,
    DEFAULT_SAVES,
    EVAL_MODULES,
    GRAD_REENABLING_MODULES,
    GRAPH_SIGNATURE_PROPERTY,
    LOSSES,
    NON_DIFFERENTIABLE_INPUTS,
    NOT_DIFFERENTIABLE,
    NOT_PARAMETER_KINDS,
    TRAINING_VIEWS,
    TYPE_PROMOTING,
    Saves,
)
from onnxmem.training.values import (
    StepNode,
    StepValue,
    aten_op,
    is_tensor,
    module_classes,
    node_recurrent_dims,
    numel_of,
    rule_key,
    saves_rule,
)

_FLOATS = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})
# Buffers whose name says they are running statistics, not parameters (PyTorch's BatchNorm buffers).
_BUFFER_NAMES = ("running_mean", "running_var", "num_batches_tracked")
# Inputs of an op that are buffers even when they are float initializers.
_BUFFER_INPUTS: dict[str, tuple[int, ...]] = {"BatchNormalization": (3, 4)}


@dataclass
class StepModel:
    """Facts about the graph that every simulation reads: built once per training_memory call."""

    nodes: list[StepNode]
    values: list[StepValue]
    root: list[int]  # storage root of each value (views share their base's storage)
    members: dict[int, list[int]]  # storage root -> the values that live in it
    needs_grad: list[bool]  # per value
    differentiable: list[bool]  # per node: it has a backward (some input needs a gradient)
    params: list[int]  # trainable parameter values, in first-use order
    frozen: list[int]
    param_bytes: int  # at the training precision
    saved_by: dict[int, list[int]]  # storage root -> nodes that keep it for backward
    extras: dict[int, int]  # node -> bytes kept besides tensors (masks, indices, statistics)
    cast_copies: dict[tuple[int, int], int]  # (node, input value) -> bytes of autocast's low-precision copy
    weight_copies: dict[int, int]  # parameter value -> bytes of autocast's cached low-precision copy
    new_grads: dict[int, list[int]]  # node -> inputs whose gradient is a new buffer
    backward_temporaries: dict[int, int]  # node -> bytes its backward holds for a moment
    passthrough: dict[int, list[int]]  # node -> inputs whose gradient is the output's gradient
    unknown: dict[str, int]  # op types missing from SAVED_FOR_BACKWARD -> nodes
    model_output: int  # value the loss reads (or the loss itself)
    loss_value: int
    n_graph_nodes: int
    hidden: list[int] = field(default_factory=list)  # intermediates of decomposed ops simulated as one op
    restored: Restored | None = None  # ops an export folded away, simulated again
    assumed: dict[str, int] = field(default_factory=dict)  # DECOMPOSED assumptions -> chains matched
    unmatched: tuple[str, ...] = ()  # freeze and train patterns that match no parameter
    # storage root -> the last node of the module calls it is an argument of (Python holds a module's arguments
    # until its forward returns), from the dynamo export's module scopes, or of the statements that bind it to a
    # variable (lifetimes.py), whichever is later
    held_by_call: dict[int, int] = field(default_factory=dict)
    forward_temporaries: dict[int, int] = field(default_factory=dict)  # node -> bytes its forward holds a moment
    # node -> the autograd nodes PyTorch makes for it where not one (an unrolled recurrent op's cells on CPU)
    autograd_nodes: dict[int, int] = field(default_factory=dict)
    # what the ops ask of the device's libraries (DeviceModel.library_uses: oneDNN's primitives, MKL's GEMMs on CPU)
    library: object = None
    # freeze/train patterns that reach a tied weight by a name PyTorch's named_parameters does not give it
    tied_patterns: tuple[str, ...] = ()
    # modules whose forward makes their input require a gradient (rules.py GRAD_REENABLING_MODULES), where that
    # makes frozen ops keep activations
    reenabling_modules: tuple[str, ...] = ()


def _autocast_fp32(node: StepNode, device: DeviceModel) -> bool:
    """Say whether autocast runs the node in fp32 on the device (the loss onnxmem appends has no graph op)."""
    return device.autocast_fp32(rule_key(node), node.graph_op is None)


def _float_bytes(precision: str, low: bool) -> int:
    if precision == "fp32":
        return 4
    if precision == "bf16":
        return 2
    return 2 if low else 4


def _matches(name: str, module: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(module, p)
               or fnmatch.fnmatchcase(module, p.rstrip(".*") + ".*") for p in patterns)


def _is_trainable_name(name: str, module: str, options: TrainingOptions) -> bool:
    if options.train and not _matches(name, module, options.train):
        return False
    return not _matches(name, module, options.freeze)


def build_model(graph: ModelGraph, order: Sequence[int], options: TrainingOptions) -> StepModel:
    """Give the facts every simulation of the step reads: the forward ops (decomposed ATen ops fused back) and the
    loss, the parameters, the sizes at the training precision, the storages, what needs a gradient and what each
    differentiable op keeps for backward."""
    device = options.device_model
    values, nodes, hidden, restored, assumed = _forward(graph, order)
    n_graph_nodes = len(nodes)
    model_output, loss_value = _append_loss(graph, values, nodes, options)
    _wire(graph, values, nodes)
    params, frozen, unmatched, tied_patterns = _parameters(graph, values, nodes, options)
    _size_at_precision(values, nodes, params + frozen, options, device)
    quantized = _quantize_base(values, nodes, frozen, model_output, options)
    roots = _storage_roots(values, nodes, graph, device.clone_makes_storage)
    seeds, reenabling = _reenabled_inputs(values, nodes)
    needs_grad, differentiable = _gradient_flow(values, nodes, params, seeds)
    if reenabling:  # named where it makes frozen weighted ops run a backward (else the modules train anyway)
        without = _gradient_flow(values, nodes, params)[1]
        frozen_set = set(frozen)
        if not any(differentiable[n] and not without[n] and any(t in frozen_set for t in node.inputs)
                   for n, node in enumerate(nodes)):
            reenabling = ()
    needs = _BackwardNeeds()
    for n, node in enumerate(nodes):
        if differentiable[n]:
            _backward_needs(graph, n, node, values, roots, needs_grad, options, device, needs)
        else:
            _forward_only_needs(graph, n, node, values, needs_grad, options, device, needs)
    _dequantize_temporaries(nodes, values, quantized, differentiable, needs)
    param_bytes = sum(values[t].nbytes for t in params)
    members: dict[int, list[int]] = {}
    for t, r in enumerate(roots):
        members.setdefault(r, []).append(t)
    return StepModel(nodes, values, roots, members, needs_grad, differentiable, params, frozen, param_bytes,
                  needs.saved_by, needs.extras, needs.cast_copies, needs.weight_copies, needs.new_grads,
                  needs.backward_temporaries, needs.passthrough, needs.unknown, model_output, loss_value,
                  n_graph_nodes, hidden, restored, assumed, unmatched, _held(graph, nodes, values, roots),
                  needs.forward_temporaries, needs.autograd_nodes,
                  device.library_uses(nodes, values, needs_grad, differentiable, options.precision),
                  tied_patterns=tied_patterns, reenabling_modules=reenabling)


def _module_scopes(layer: str) -> list[str]:
    """Give the module calls a dynamo export's node is inside, outermost first, as scope prefixes (': pkg.M/enc:
    pkg.Encoder/add: aten.add' -> [': pkg.M', ': pkg.M/enc: pkg.Encoder']); none without module classes."""
    parts = layer.split("/")[:-1] if ":" in layer else []
    return ["/".join(parts[:i + 1]) for i in range(len(parts))]


def _held(graph: ModelGraph, nodes: list[StepNode], values: list[StepValue], roots: list[int]) -> dict[int, int]:
    """Give, per activation storage, the last node during which eager code holds it besides its readers: as a module
    call's argument (_held_by_calls) or in a Python variable (lifetimes.py), whichever is later."""
    held = _held_by_calls(nodes, values, roots)
    for r, n in held_by_locals(graph, nodes, values, roots).items():
        if held.get(r, -1) < n:
            held[r] = n
    return held


def _held_by_calls(nodes: list[StepNode], values: list[StepValue], roots: list[int]) -> dict[int, int]:
    """Give, per activation storage passed into a module call (read inside a module scope, made outside that call),
    the last node of the call: the caller's frame holds the argument until the module's forward returns. A call is
    a run of nodes in the module's scope in the file's order (PyTorch's: the schedule may interleave calls), so a
    module called twice (ResNet's shared ReLU) makes two calls."""
    if not any(":" in node.layer for node in nodes):
        return {}  # no module classes in the scopes (not a dynamo export): no calls to hold arguments
    file_order = sorted(range(len(nodes)), key=lambda n: (nodes[n].graph_op is None, nodes[n].graph_op or 0, n))
    calls: list[list[int]] = [[] for _ in nodes]  # per node, the calls it is inside, as indices into `end`
    end: list[int] = []  # per call, its last node in `nodes`
    open_calls: dict[str, int] = {}  # scope -> the call the previous node in the file was inside
    for n in file_order:
        scopes = _module_scopes(nodes[n].layer)
        for scope in scopes:
            call = open_calls.get(scope)
            if call is None:
                call = len(end)
                end.append(n)
            end[call] = max(end[call], n)
            calls[n].append(call)
        open_calls = dict(zip(scopes, calls[n], strict=True))
    held: dict[int, int] = {}
    for n, node in enumerate(nodes):
        for t in node.inputs:
            producer = values[t].producer if t >= 0 else None
            if producer is None or values[roots[t]].kind in (WEIGHT, INPUT) or not is_tensor(values[t]):
                continue
            made_in = set(calls[producer])
            for call in calls[n]:
                if call not in made_in and end[call] > held.get(roots[t], -1):
                    held[roots[t]] = end[call]
    return held


def _forward(graph: ModelGraph, order: Sequence[int]) -> \
        tuple[list[StepValue], list[StepNode], list[int], Restored, dict[str, int]]:
    """Give the step's values (the graph's tensors), its forward nodes in `order` with the ops an export folded away
    restored, the ops exported from one ATen op or decomposed from one fused again, the intermediates those fused
    ops hide, what was restored and which decompositions were assumed."""
    values = [StepValue(t.name, t.shape, numel_of(t.shape), t.nbytes or 0, t.dtype in _FLOATS, t.kind,
                     is_sequence=t.dtype == 0) for t in graph.tensors]
    nodes = []
    for op_index in order:
        op = graph.ops[op_index]
        nodes.append(StepNode(op.op_type, op.domain, op.name, op.layer, op.inputs, op.outputs, op_index,
                              aten=aten_op(op.origin)))
    nodes, restored = restore_folded(nodes, values, graph)
    nodes, grouped = fuse_aten_groups(nodes, values, graph)
    nodes, hidden, assumed = fuse_decomposed(nodes, values, graph)
    nodes = read_recurrent_weights(nodes, values, graph)
    return values, nodes, grouped + hidden, restored, assumed


def _append_loss(graph: ModelGraph, values: list[StepValue], nodes: list[StepNode], options: TrainingOptions) -> \
        tuple[int, int]:
    """Append the loss's ops after the model's first float output (unless that output is already a scalar); give
    (the value the loss reads, the loss value)."""
    outputs = [t for t in graph.outputs if values[t].is_float]
    model_output = outputs[0] if outputs else (graph.outputs[0] if graph.outputs else -1)
    loss_value = model_output
    if model_output >= 0 and (values[model_output].numel or 0) > 1:
        previous = model_output
        for i, step in enumerate(LOSSES[options.loss]):
            numel = values[model_output].numel if step.output == "same" else 1
            values.append(StepValue(f"loss/{step.op_type}", None, numel, 0, True, "loss"))
            out = len(values) - 1
            nodes.append(StepNode(step.op_type, "", f"loss/{step.op_type}_{i}", "loss", (previous,), (out,), None))
            previous = out
        loss_value = previous
    return model_output, loss_value


def _wire(graph: ModelGraph, values: list[StepValue], nodes: list[StepNode]) -> None:
    """Set each value's producer and consumers (node positions; a subgraph's implicit reads included)."""
    for n, node in enumerate(nodes):
        for t in node.outputs:
            if t >= 0:
                values[t].producer = n
        for t in node.inputs:
            if t >= 0:
                values[t].consumers.append(n)
        if node.graph_op is not None:
            for t in graph.ops[node.graph_op].implicit_inputs:
                values[t].consumers.append(n)


def _parameters(graph: ModelGraph, values: list[StepValue], nodes: list[StepNode], options: TrainingOptions) -> \
        tuple[list[int], list[int], tuple[str, ...], tuple[str, ...]]:
    """Give the trainable and the frozen parameters, in first-use order: float initializers that feed computation,
    not buffers (running statistics), not scalars; the freeze/train patterns that match none of them; and the
    patterns that reach a tied weight only by a name PyTorch does not give it (tied_weight_name)."""
    unmatched = {("freeze", p) for p in options.freeze} | {("train", p) for p in options.train}
    buffers: set[int] = {graph.tensor_index[name] for name in _signature_buffers(graph) if name in graph.tensor_index}
    for node in nodes:
        for i in _BUFFER_INPUTS.get(node.op_type, ()):
            if i < len(node.inputs) and node.inputs[i] >= 0:
                buffers.add(node.inputs[i])
    params: list[int] = []
    frozen: list[int] = []
    tied: list[str] = []
    named = set(re.findall(r": PARAMETER target='([^']+)'", graph.properties.get(GRAPH_SIGNATURE_PROPERTY, "")))
    seen: set[int] = set()
    for node in nodes:
        for t in node.inputs:
            v = values[t] if t >= 0 else None
            if v is None or t in seen or v.kind != WEIGHT or not v.is_float or graph.tensors[t].producer is not None:
                continue
            seen.add(t)
            if t in buffers or any(b in v.name for b in _BUFFER_NAMES) or (v.numel or 0) <= 1:
                continue
            module = module_path(node.layer)
            name = tied_weight_name(v.name, [_module_name(nodes[c].layer) for c in v.consumers if c < len(nodes)],
                                    named)
            if unmatched:
                unmatched -= {(flag, p) for flag, p in unmatched
                              if _matches(name, module, (p,)) or _matches(v.name, module, (p,))}
            if _is_trainable_name(name, module, options):
                params.append(t)
            else:
                frozen.append(t)
            if name != v.name:
                flags = (("train", options.train), ("freeze", options.freeze))
                tied += [f"{flag} pattern '{p}' reaches '{v.name}' (the export's name) but not '{name}'"
                         for flag, patterns in flags for p in patterns
                         if _matches(v.name, module, (p,)) and not _matches(name, module, (p,))]
    return params, frozen, tuple(f"{flag} pattern '{p}'" for flag, p in sorted(unmatched)), tuple(tied)


def _module_name(layer: str) -> str:
    """Give the name of the module a node runs in, as named_modules gives it: a dynamo export's innermost scope
    ('model.lm_head' in ': Wrapper/model: Causal/model.lm_head: Linear/linear: aten.linear.default'), else the
    module path."""
    if ":" in layer:
        names = [part.split(":")[0].strip() for part in layer.split("/")]
        return names[-2] if len(names) >= 2 else ""
    return module_path(layer)


def tied_weight_name(name: str, readers: list[str], named: set[str] | frozenset[str] = frozenset()) -> str:
    """Give the name PyTorch's named_parameters gives a weight: a weight tied across modules (read by several) is
    listed once, by the module that registered it first, which is the first to read it in the forward (an
    embedding before the head tied to it), while the dynamo exporter names the initializer by another owner (a
    hand-tied head's, Falcon's, GPT-2's: 'lm_head.weight' where named_parameters gives only 'wte.weight';
    benchmarks/training_single_ops.py --tied). `named`: the parameter names the export's graph signature lists
    (each owner's, a tied weight's under both): the first reader's name is taken only where it is one of them."""
    owner = name.rpartition(".")[0]
    first = next((r for r in readers if r), "")
    if not first or not owner or owner == first or owner not in readers:
        return name
    resolved = f"{first}.{name.rpartition('.')[2]}"
    if named and resolved not in named:
        return name
    return resolved


def _signature_buffers(graph: ModelGraph) -> list[str]:
    """Give the weights the dynamo exporter's graph signature lists as buffers or constants, not parameters."""
    signature = graph.properties.get(GRAPH_SIGNATURE_PROPERTY, "")
    kinds = "|".join(NOT_PARAMETER_KINDS)
    return re.findall(rf": (?:{kinds}) target='([^']+)'", signature)


def _size_at_precision(values: list[StepValue], nodes: list[StepNode], parameters: list[int],
                       options: TrainingOptions, device: DeviceModel) -> None:
    """Size the values at the training precision: parameters at the master precision, float inputs likewise,
    each op's float outputs at the width autocast (or the precision) gives them; the rest as stored."""
    low_precision = options.precision != "fp32"
    for t in parameters:
        v = values[t]
        v.nbytes = (v.numel or 0) * (2 if options.precision == "bf16" else 4)
    for v in values:
        if v.kind == INPUT and v.is_float and v.numel is not None:
            v.nbytes = v.numel * (2 if options.precision == "bf16" else 4)
    for node in nodes:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        if options.precision.startswith("amp-"):
            if key in AUTOCAST_LOW_PRECISION:
                size = 2
            elif _autocast_fp32(node, device):
                size = 4
            else:
                # PyTorch's type promotion: the widest float input with dims decides, a parameter or buffer
                # among them (MobileBERT's NoNorm `x * weight`, rotary's cos and sin: a 16-bit Linear output
                # times an fp32 weight is fp32); a 0-dim or 1-element constant (a Python scalar in the export)
                # does not take part, nor a Linear's bias added after its 16-bit product (one addmm in PyTorch);
                # only elementwise arithmetic promotes (TYPE_PROMOTING: BatchNorm and LayerNorm keep a 16-bit input's
                # dtype with fp32 weights) (benchmarks/training_zoo_amp_ops.py)
                widths = [values[t].nbytes // (values[t].numel or 1) for t in node.inputs
                          if t >= 0 and values[t].is_float and values[t].numel
                          and (values[t].kind != WEIGHT or (key in TYPE_PROMOTING and (values[t].numel or 0) > 1
                                                            and not _linear_bias(node, values, nodes)))]
                size = max(widths, default=4)
        else:
            size = _float_bytes(options.precision, low_precision)
        for t in node.outputs:
            numel = values[t].numel if t >= 0 else None
            if numel is not None and values[t].is_float:
                values[t].nbytes = numel * size


def _linear_bias(node: StepNode, values: list[StepValue], nodes: list[StepNode]) -> bool:
    """Say whether the node is an Add of a weight to a low-precision product (a Linear's bias, which PyTorch adds
    inside its 16-bit addmm under autocast)."""
    return node.op_type == "Add" and any(
        t >= 0 and (p := values[t].producer) is not None and nodes[p].op_type in AUTOCAST_LOW_PRECISION
        for t in node.inputs)


# ops a Linear's weight passes through on its way to the product (the export's t(), a dtype cast)
_WEIGHT_WAYS = frozenset({"Transpose", "Cast", "Identity", "Reshape"})
_LINEAR_PRODUCTS = frozenset({"MatMul", "Gemm", "aten::linear"})


def _quantize_base(values: list[StepValue], nodes: list[StepNode], frozen: list[int], model_output: int,
                   options: TrainingOptions) -> dict[int, list[int]]:
    """Size the frozen Linear weights at options.base_precision (bitsandbytes' layout: BASE_PRECISIONS), all but
    the one that makes the model's output (transformers' quantization leaves the lm_head out); give each
    quantized weight's products (the nodes that dequantize it while they run)."""
    if not options.base_precision:
        return {}
    layout = BASE_PRECISIONS[options.base_precision]
    head = set(_weight_sources(values, nodes, values[model_output].producer)) if model_output >= 0 else set()
    quantized: dict[int, list[int]] = {}
    for t in frozen:
        v = values[t]
        if not v.is_float or not v.numel or not v.shape or len(v.shape) != 2 or t in head:
            continue
        products = _products_reading(values, nodes, t)
        if not products:
            continue  # an embedding (Gather) or a norm's weight: bitsandbytes quantizes Linear layers only
        rows = v.shape[0] if nodes[products[0]].op_type == "Gemm" else v.shape[-1]  # the output features
        v.nbytes = layout.nbytes(v.numel, rows if isinstance(rows, int) else 1)
        v.quantized = True
        quantized[t] = products
    return quantized


def _products_reading(values: list[StepValue], nodes: list[StepNode], t: int) -> list[int]:
    """Give the Linear products that read weight `t` as an operand (through a transpose or a cast), [] where any
    other op reads it."""
    found: list[int] = []
    stack = [t]
    while stack:
        for n in values[stack.pop()].consumers:
            node = nodes[n]
            if node.op_type in _LINEAR_PRODUCTS:
                found.append(n)
            elif node.op_type in _WEIGHT_WAYS and node.outputs and node.outputs[0] >= 0:
                stack.append(node.outputs[0])
            else:
                return []
    return found


def _weight_sources(values: list[StepValue], nodes: list[StepNode], n: int | None) -> list[int]:
    """Give the weights node `n` reads, directly or through a transpose or a cast."""
    if n is None:
        return []
    found, stack = [], list(nodes[n].inputs)
    while stack:
        t = stack.pop()
        if t < 0:
            continue
        if values[t].kind == WEIGHT:
            found.append(t)
        elif values[t].producer is not None and nodes[values[t].producer].op_type in _WEIGHT_WAYS:  # type: ignore[index]
            stack.extend(nodes[values[t].producer].inputs)  # type: ignore[index]
    return found


def _dequantize_temporaries(nodes: list[StepNode], values: list[StepValue], quantized: dict[int, list[int]],
                            differentiable: list[bool], needs: _BackwardNeeds) -> None:
    """Add the weight each quantized Linear dequantizes while it runs (bitsandbytes' MatMul4Bit: dequantize_4bit(B)
    to the input's dtype in forward, and again in backward for the input's gradient) as that node's temporaries."""
    for t, products in quantized.items():
        numel = values[t].numel or 0
        for n in products:
            node = nodes[n]
            operand = next((i for i in node.inputs if i >= 0 and values[i].kind != WEIGHT and values[i].is_float
                            and values[i].numel), None)
            width = values[operand].nbytes // (values[operand].numel or 1) if operand is not None else 4
            needs.forward_temporaries[n] = needs.forward_temporaries.get(n, 0) + numel * width
            if differentiable[n]:
                needs.backward_temporaries[n] = needs.backward_temporaries.get(n, 0) + numel * width


def _storage_roots(values: list[StepValue], nodes: list[StepNode], graph: ModelGraph,
                   clones_copy: bool = True) -> list[int]:
    """Give each value's storage root: PyTorch's views share their input's storage (the ONNX ops that are views in
    PyTorch, and any node the exporter marks with an ATen view op), and BatchNormalization's running statistics are
    updated in place; an exported aten.clone is a storage of its own where `clones_copy` (the device's
    clone_makes_storage)."""
    root = list(range(len(values)))

    def find(t: int) -> int:
        while root[t] != t:
            root[t] = root[root[t]]
            t = root[t]
        return t

    for node in nodes:
        source = TRAINING_VIEWS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if source is not None and clones_copy and _is_copy(node):
            continue
        if source is None and node.graph_op is not None and not node.restored \
                and aten_op(graph.ops[node.graph_op].origin) in ATEN_VIEWS:
            tensors = [i for i, t in enumerate(node.inputs) if t >= 0 and is_tensor(values[t])]
            source = tensors[0] if len(tensors) == 1 else None
        if source is None or source >= len(node.inputs) or node.inputs[source] < 0:
            continue
        for t in node.outputs:
            if t >= 0:
                root[t] = find(node.inputs[source])
    for out, product in in_place_tails(values, nodes, graph):
        root[out] = find(product)
    for node in nodes:
        if node.op_type == "BatchNormalization":
            for out, inp in ((1, 3), (2, 4)):
                if out < len(node.outputs) and node.outputs[out] >= 0 and inp < len(node.inputs):
                    root[node.outputs[out]] = find(node.inputs[inp])
    return [find(t) for t in range(len(values))]


def _is_copy(node: StepNode) -> bool:
    """Say whether an Identity is a copy in PyTorch: the dynamo exporter writes aten.clone (`.contiguous()` of a
    transposed tensor, `.clone()`, `.reshape()` of an expanded one) as an Identity, and clone always makes a new
    storage; not inside a Dropout module, where the clone stands for F.dropout(p=0), which returns its input
    (rules.py EVAL_MODULES). Measured: StableLM's attention output, transposed then `.contiguous()`, is a second
    storage beside the attention's output while o_proj keeps it (benchmarks/training_single_ops.py --clone)."""
    return node.op_type == "Identity" and node.aten == "clone" and not node.restored \
        and not any(c in EVAL_MODULES for c in module_classes(node.layer))


def _reenabled_inputs(values: list[StepValue], nodes: list[StepNode]) -> tuple[list[int], tuple[str, ...]]:
    """Give the float activations read by the ops of modules that make their input require a gradient
    (rules.py GRAD_REENABLING_MODULES), and those modules' class names."""
    seeds: list[int] = []
    classes: set[str] = set()
    for node in nodes:
        found = [c.rsplit(".", 1)[-1] for c in module_classes(node.layer)]
        hit = next((c for c in found if c in GRAD_REENABLING_MODULES), None)
        if hit is None:
            continue
        classes.add(hit)
        seeds.extend(t for t in node.inputs if t >= 0 and values[t].is_float and values[t].kind != WEIGHT)
    return seeds, tuple(sorted(classes))


def _gradient_flow(values: list[StepValue], nodes: list[StepNode], params: list[int],
                   seeds: Sequence[int] = ()) -> tuple[list[bool], list[bool]]:
    """Give what needs a gradient (trainable parameters, activations the model's code makes require one, and what
    is computed from them), per value, and which nodes have a backward, per node."""
    needs_grad = [False] * len(values)
    for t in (*params, *seeds):
        needs_grad[t] = True
    differentiable = [False] * len(nodes)
    for n, node in enumerate(nodes):
        settings = NON_DIFFERENTIABLE_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
        if not any(t >= 0 and needs_grad[t] and i not in settings for i, t in enumerate(node.inputs)):
            continue
        if node.op_type in NOT_DIFFERENTIABLE:
            continue
        differentiable[n] = True
        for t in node.outputs:
            if t >= 0 and (values[t].is_float or values[t].is_sequence):
                needs_grad[t] = True
    return needs_grad, differentiable


@dataclass
class _BackwardNeeds:
    """What the differentiable nodes keep for backward and allocate in it (see StepModel's fields of these names)."""

    saved_by: dict[int, list[int]] = field(default_factory=dict)
    extras: dict[int, int] = field(default_factory=dict)
    cast_copies: dict[tuple[int, int], int] = field(default_factory=dict)
    weight_copies: dict[int, int] = field(default_factory=dict)
    new_grads: dict[int, list[int]] = field(default_factory=dict)
    backward_temporaries: dict[int, int] = field(default_factory=dict)
    passthrough: dict[int, list[int]] = field(default_factory=dict)
    unknown: dict[str, int] = field(default_factory=dict)
    forward_temporaries: dict[int, int] = field(default_factory=dict)
    autograd_nodes: dict[int, int] = field(default_factory=dict)


def _backward_needs(graph: ModelGraph, n: int, node: StepNode, values: list[StepValue], roots: list[int],
                    needs_grad: list[bool], options: TrainingOptions, device: DeviceModel,
                    needs: _BackwardNeeds) -> None:
    """Add what differentiable node `n` keeps for backward (by its rule in SAVED_FOR_BACKWARD, and what the device's
    kernel keeps besides: DeviceModel.node_facts), its extra buffers, its backward's and forward's temporaries and
    its inputs' gradients to `needs`."""
    # the device may run another kernel than the generic rule's (CUDA's attention backends): its rule key
    key = device.kernel_key(NodeContext(graph, n, node, values, needs_grad, options.precision, rule_key(node)))
    rule = saves_rule(key, "")
    if rule is None:
        key = rule_key(node)
        needs.unknown[key] = needs.unknown.get(key, 0) + 1
        rule = DEFAULT_SAVES
    inputs = list(node.inputs)
    out0 = values[node.outputs[0]] if node.outputs and node.outputs[0] >= 0 else None
    facts = device.node_facts(NodeContext(
        graph, n, node, values, needs_grad, options.precision, key, rule.recurrent,
        node_recurrent_dims(node, values) if rule.recurrent else None))
    _kept_for_backward(n, node, rule, values, roots, needs_grad, options, device, needs)
    extra = _extra_bytes(n, node, rule, values, roots, out0, facts, needs)
    if extra:
        needs.extras[n] = extra
    temporaries = needs.backward_temporaries
    if rule.batched_backward_temporaries and out0 is not None and not any(
            t >= 0 and values[roots[t]].kind == WEIGHT for t in inputs):
        temporaries[n] = rule.batched_backward_temporaries * out0.nbytes
    if options.precision.startswith("amp-") and _autocast_fp32(node, device):
        # autocast runs the op on an fp32 copy of a 16-bit input: backward makes that copy's fp32 gradient, then
        # casts it to the input's width (ToCopyBackward): the gradient is counted at the input's width, the fp32
        # one is wider by this much
        upcast = 0
        for t in inputs:
            numel = values[t].numel if t >= 0 and needs_grad[t] and values[t].is_float else None
            if numel and values[t].nbytes // numel < 4:
                upcast += (4 - values[t].nbytes // numel) * numel
        if upcast:
            temporaries[n] = temporaries.get(n, 0) + upcast
    if options.precision.startswith("amp-") and node.op_type in AUTOCAST_LOW_PRECISION:
        # a trainable weight read through a view (the export's transpose of a 3-D Linear's weight): the product's
        # backward makes its 16-bit gradient, cast to the fp32 one, as for a weight read directly (simulate.py adds
        # that one) (benchmarks/training_single_ops.py --linear-bias: autocast bf16, 3-D input as 2-D's)
        for t in inputs:
            r = roots[t] if t >= 0 else -1
            numel = values[t].numel if r >= 0 else None
            if numel and r != t and values[r].kind == WEIGHT and values[r].is_float and needs_grad[r]:
                temporaries[n] = temporaries.get(n, 0) + numel * 2
    if facts.backward_temporaries:
        temporaries[n] = temporaries.get(n, 0) + facts.backward_temporaries
    if facts.forward_temporaries:
        needs.forward_temporaries[n] = needs.forward_temporaries.get(n, 0) + facts.forward_temporaries
    if facts.autograd_nodes is not None:
        needs.autograd_nodes[n] = facts.autograd_nodes
    settings = NON_DIFFERENTIABLE_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
    for i, t in enumerate(inputs):
        if t < 0 or not needs_grad[t] or i in settings:
            continue
        if i in rule.grad_passthrough and same_tensor_type(values[t], out0):
            needs.passthrough.setdefault(n, []).append(t)
        else:
            needs.new_grads.setdefault(n, []).append(t)
    # (the gradients the step counts at this event: what the elementwise backward holds beyond them)
    made = sum(values[t].nbytes for t in needs.new_grads.get(n, []))
    elementwise = elementwise_backward(node, values, needs_grad, device.promotes_by_copy)
    if elementwise > made:
        temporaries[n] = temporaries.get(n, 0) + elementwise - made


def _forward_only_needs(graph: ModelGraph, n: int, node: StepNode, values: list[StepValue], needs_grad: list[bool],
                        options: TrainingOptions, device: DeviceModel, needs: _BackwardNeeds) -> None:
    """Add what the forward of node `n`, which runs no backward (frozen, or before anything trains), holds a moment
    besides its outputs (DeviceModel.node_facts: a CPU convolution's reorders run with or without a gradient). A
    recurrent op is left out: without a backward its kernel is another one (DeviceModel.unmodelled names it)."""
    key = device.kernel_key(NodeContext(graph, n, node, values, needs_grad, options.precision, rule_key(node)))
    rule = saves_rule(key, "")
    if rule is None or rule.recurrent:
        return
    facts = device.node_facts(NodeContext(graph, n, node, values, needs_grad, options.precision, key))
    if facts.forward_temporaries:
        needs.forward_temporaries[n] = needs.forward_temporaries.get(n, 0) + facts.forward_temporaries


def _kept_for_backward(n: int, node: StepNode, rule: Saves, values: list[StepValue], roots: list[int],
                       needs_grad: list[bool], options: TrainingOptions, device: DeviceModel,
                       needs: _BackwardNeeds) -> None:
    """Add the tensors node `n` keeps for backward: the storages it saves, or under autocast the low-precision
    copies of the fp32 activations and weights it reads."""
    inputs = node.inputs
    kept: list[int] = []
    for i in rule.inputs:
        if i < len(inputs) and inputs[i] >= 0:
            kept.append(inputs[i])
    for i in rule.cross:
        if i < len(inputs) and inputs[i] >= 0 and any(
                j != i and t >= 0 and needs_grad[t] for j, t in enumerate(inputs)):
            kept.append(inputs[i])
    for i in rule.outputs:
        if i < len(node.outputs) and node.outputs[i] >= 0:
            kept.append(node.outputs[i])
    low = options.precision.startswith("amp-") and node.op_type in AUTOCAST_LOW_PRECISION
    upcast = options.precision.startswith("amp-") and not low and _autocast_fp32(node, device)
    for t in kept:
        v = values[t]
        if not v.is_float and v.kind in (WEIGHT, INPUT):
            continue
        if upcast and v.is_float and v.numel and v.nbytes // v.numel < 4:
            # autocast runs the op on an fp32 copy of its 16-bit input: the copy is what it keeps (nll_loss
            # after CUDA's 16-bit log_softmax: the H100 rows' loss phase)
            needs.cast_copies[(n, t)] = v.numel * 4
            continue
        if v.quantized:
            continue  # bitsandbytes keeps the quantized weight itself (a parameter: nothing new)
        w = t if v.kind == WEIGHT else roots[t]
        if low and v.is_float and v.numel and (v.kind == WEIGHT or values[w].kind == WEIGHT and needs_grad[w]
                                               and values[w].numel == v.numel and values[w].is_float):
            # the cached cast copy is what the op keeps: autocast casts a trainable weight once per forward, a
            # transposed view (a 3-D Linear's export) reading that copy (benchmarks/training_autocast_cache.py)
            needs.weight_copies[w] = (values[w].numel or 0) * 2
            continue
        if low and v.is_float and v.numel and values[roots[t]].nbytes // max(values[roots[t]].numel or 1, 1) == 4:
            needs.cast_copies[(n, t)] = v.numel * 2  # a cast copy of an fp32 activation is what the op keeps
            continue
        if v.kind in (WEIGHT, INPUT):
            continue
        needs.saved_by.setdefault(roots[t], []).append(n)


def _extra_bytes(n: int, node: StepNode, rule: Saves, values: list[StepValue], roots: list[int],
                 out0: StepValue | None, facts: NodeFacts, needs: _BackwardNeeds) -> int:
    """Give the bytes node `n` keeps for backward besides tensors: masks, indices, statistics, and what the device's
    kernel keeps (a recurrent op's workspace or reserve space)."""
    extra = 0
    inputs = node.inputs
    if rule.extra_bits_per_output_element and out0 is not None and out0.numel is not None:
        carrier = rule.extra_output
        if carrier is not None and carrier < len(node.outputs) and node.outputs[carrier] >= 0:
            needs.saved_by.setdefault(roots[node.outputs[carrier]], []).append(n)
        elif facts.mask_like_output:
            extra += out0.nbytes
        else:
            extra += (out0.numel * rule.extra_bits_per_output_element + 7) // 8
    if rule.stats and inputs and inputs[0] >= 0:
        extra += 4 * rule.stats_values * _stat_count(values[inputs[0]], rule)
    if rule.input_sized_extra and inputs and inputs[0] >= 0:
        extra += rule.input_sized_extra * values[inputs[0]].nbytes
    extra += _attention_extra_bytes(n, rule, inputs, values, roots, facts.math_in_fp32, needs)
    extra += facts.kept_bytes
    return extra


def _attention_extra_bytes(n: int, rule: Saves, inputs: tuple[int, ...], values: list[StepValue], roots: list[int],
                           upcast: bool, needs: _BackwardNeeds) -> int:
    """Give the bytes an attention op keeps besides its inputs' storages: the [..., q_len, kv_len] tensors and the
    copies its rule names (in fp32 where `upcast`: the device's kernel computes them in fp32); an input it keeps as
    it is goes to needs.saved_by."""

    def widened(value: StepValue, nbytes: int) -> int:
        width = value.nbytes // value.numel if value.numel else 4
        return nbytes * 4 // width if upcast and 0 < width < 4 else nbytes

    extra = 0
    if rule.attention_probabilities and len(inputs) > 1 and inputs[0] >= 0 and inputs[1] >= 0:
        query = values[inputs[0]]
        probabilities = _attention_bytes(query, values[inputs[1]])
        extra += rule.attention_probabilities * widened(query, probabilities)
        if rule.attention_masks and query.numel:
            extra += rule.attention_masks * probabilities // (query.nbytes // query.numel)  # one byte each
    repeat = _kv_repeat(values, inputs) if rule.repeated_kv else 1
    extra += sum(widened(values[inputs[i]], values[inputs[i]].nbytes) * (repeat if i in (1, 2) else 1)
                 for i in rule.copies if i < len(inputs) and inputs[i] >= 0)
    for i in rule.copies_when_view:
        t = inputs[i] if i < len(inputs) else -1
        if t >= 0 and (roots[t] != t or widened(values[t], values[t].nbytes) != values[t].nbytes):
            extra += widened(values[t], values[t].nbytes)  # a copy: of the reshaped view, or in fp32
        elif t >= 0 and values[t].kind not in (WEIGHT, INPUT):
            needs.saved_by.setdefault(t, []).append(n)
    return extra


def _kv_repeat(values: list[StepValue], inputs: tuple[int, ...]) -> int:
    """Give how many query heads share one key/value head (q [..., heads, L, E] against k [..., kv_heads, S, E]),
    1 where it cannot be read."""
    if len(inputs) < 2 or inputs[0] < 0 or inputs[1] < 0:
        return 1
    q_shape, k_shape = values[inputs[0]].shape, values[inputs[1]].shape
    if not q_shape or not k_shape or len(q_shape) < 3 or len(k_shape) < 3:
        return 1
    q_heads, kv_heads = q_shape[-3], k_shape[-3]
    if isinstance(q_heads, int) and isinstance(kv_heads, int) and kv_heads > 0 and q_heads % kv_heads == 0:
        return q_heads // kv_heads
    return 1


def _stat_count(value: StepValue, rule: Saves) -> int:
    """Give how many statistics a norm keeps: one per channel (axis 1), or per row of the axes before
    rule.stats_axis."""
    shape = value.shape
    if value.numel is None or not shape:
        return 0
    if rule.stats == "channels":
        return shape[1] if len(shape) > 1 and isinstance(shape[1], int) else 0
    # ModelGraph keeps no attributes; every exporter we know writes LayerNormalization's axis as -1
    rows = 1
    for d in shape[:rule.stats_axis % len(shape)]:
        rows *= d if isinstance(d, int) else 1
    return rows


def _attention_bytes(query: StepValue, key: StepValue) -> int:
    """Give the bytes of one [..., q_len, kv_len] tensor of attention from q [..., q_len, E] and k [..., kv_len, E]
    (at q's element size)."""
    q_shape, k_shape = query.shape, key.shape
    if not q_shape or not k_shape or not query.numel or not isinstance(q_shape[-1], int) \
            or not isinstance(k_shape[-2] if len(k_shape) > 1 else None, int) or not q_shape[-1]:
        return 0
    kv_len = k_shape[-2]
    assert isinstance(kv_len, int)
    return query.nbytes // q_shape[-1] * kv_len

