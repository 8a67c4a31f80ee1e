"""A decoder's stack of identical layers exported once and repeated in the ONNX graph: a 70B model's 80 layers are
2 layers' export and 78 copies of the second, made in milliseconds where tracing them takes minutes.

The model is exported with each stack of identical layers (an nn.ModuleList whose children have the same class,
parameter shapes and plain attributes, a layer index aside) cut to its first two; in the file, the nodes in the
second layer's module scope are copied once per missing layer, each copy reading what the previous copy made where
the second layer read what the first made, its own parameters (named as named_parameters names them:
'model.layers.7.mlp.up_proj.weight'), and what every layer shares (rotary tables, the mask) as it was. Its names,
module scopes and ATen op marks are those of its layer, so the file reads as the whole model's export.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

# Plain attributes of a layer's modules that differ between identical layers (the layer's index: what the KV cache
# is keyed by); every other plain attribute (a sliding window, an attention type) must be equal for layers to repeat.
LAYER_INDEX_ATTRIBUTES = frozenset({"layer_idx", "layer_id", "layer_index", "layer_number", "block_idx", "idx"})
# The ModuleList names of a layer stack and the fewest layers worth cutting (the export keeps two).
KEPT_LAYERS = 2
# The node metadata that names a module scope or an fx node: rewritten in each copy for its layer.
_SCOPE_KEYS = ("namespace", "pkg.torch.onnx.name_scopes", "pkg.torch.onnx.class_hierarchy")
_FX_NODE_KEY = "pkg.torch.onnx.fx_node"
_DROPPED_KEYS = ("pkg.torch.onnx.stack_trace",)
# The fx targets of a symbolic size's arithmetic (the exporter computes one once and reuses it where it can).
_SYMBOLIC = ("operator.", "torch.sym_", "aten.sym_")
_SUFFIX = "~"  # a copied value's name: the second layer's name, ~, the layer's index ('linear_7~12')


def _signature(module: Any) -> tuple[Any, ...]:
    """Give what makes two layers run the same graph: each submodule's class and plain attributes (the layer index
    aside), and each parameter's and buffer's name, shape and dtype."""
    parts: list[Any] = []
    for name, sub in module.named_modules():
        plain = sorted((k, v) for k, v in vars(sub).items() if not k.startswith("_") and k not in
                       LAYER_INDEX_ATTRIBUTES and isinstance(v, (int, float, str, bool, type(None))))
        parts.append((name, type(sub).__qualname__, tuple(plain)))
    parts += [(n, tuple(t.shape), str(t.dtype)) for n, t in (*module.named_parameters(), *module.named_buffers())]
    return tuple(parts)


def cut_layer_stacks(model: Any) -> dict[str, int]:
    """Cut every stack of identical layers of `model` (in place) to its first two; give each stack's module path and
    its full length."""
    import torch

    stacks: dict[str, int] = {}
    for name, module in list(model.named_modules()):
        if not isinstance(module, torch.nn.ModuleList) or len(module) <= KEPT_LAYERS or not name:
            continue
        if any(name.startswith(f"{other}.") for other in stacks):
            continue  # a list inside a layer already cut
        first = _signature(module[0])
        if all(_signature(layer) == first for layer in list(module)[1:]):
            stacks[name] = len(module)
            del module[KEPT_LAYERS:]
    return stacks


def _in_scope(node: Any, scope: str) -> bool:
    """Say whether a node runs inside the module `scope` (its namespace names it as a level: '/model.layers.1: ')."""
    return any(p.key == "namespace" and f"/{scope}: " in p.value for p in node.metadata_props)


def repeat_layers(proto: Any, stacks: dict[str, int], per_layer: Mapping[str, str] | None = None) -> bool:
    """Add to `proto` (a graph exported with each stack cut to two layers) the copies of each stack's second layer
    that make it its full length; False where a stack's two exported layers differ in structure (nothing changed:
    export the whole model instead). `per_layer` names the graph inputs and outputs that are the second layer's own
    (a decoder's past and present KV cache: 'past_key_values.1.key'), each with the template of its name in another
    layer ('past_key_values.{}.key'): each copy reads and writes its own, added to the graph's inputs and outputs
    after the second layer's."""
    graph = proto.graph
    plans = [_plan(graph, prefix) for prefix in stacks]
    if any(plan is None for plan in plans):
        return False
    for index, (prefix, count) in enumerate(stacks.items()):
        # (each stack's copies move the nodes after it: a later stack is planned again)
        plan = plans[0] if index == 0 else _plan(graph, prefix)
        assert plan is not None
        _repeat(graph, prefix, count, *plan, per_layer=dict(per_layer or {}))
    return True

def _plan(graph: Any, prefix: str) -> tuple[list[int], dict[str, str]] | None:
    """Give the positions of the second layer's nodes and, per value the first layer made, the second's that
    stands for it; None where the two layers' nodes differ."""
    first = [n for n, node in enumerate(graph.node) if _in_scope(node, f"{prefix}.0")]
    second = [n for n, node in enumerate(graph.node) if _in_scope(node, f"{prefix}.1")]
    if not second:
        return None
    # the exporter makes a constant or a shape's arithmetic once and reuses it: the second layer reads some of what
    # the first made (that stays shared) and has fewer nodes of its own. The two layers' nodes are paired by op and
    # ATen op in order; the first layer's unpaired nodes are the shared ones.
    def key(n: int) -> tuple[str, str]:
        node = graph.node[n]
        fx_node = next((p.value for p in node.metadata_props if p.key == _FX_NODE_KEY), "")
        return node.op_type, fx_node.partition("target=")[2].partition("]")[0]

    first = [n for n in first if graph.node[n].op_type != "Constant"]
    computed = [n for n in second if graph.node[n].op_type != "Constant"]
    matcher = difflib.SequenceMatcher(None, [key(n) for n in first], [key(n) for n in computed], autojunk=False)
    pairs = [(first[block.a + i], computed[block.b + i]) for block in matcher.get_matching_blocks()
             for i in range(block.size)]
    paired = {b for _, b in pairs}
    if any(n not in paired and not key(n)[1].startswith(_SYMBOLIC) for n in computed):
        return None  # the second layer computes something the first does not
    # (an unpaired symbolic size of the second layer, 'past + seq', is one the first read from before it: each
    # copy computes its own, as the second layer does)
    counterpart: dict[str, str] = {}
    for a, b in pairs:
        node_a, node_b = graph.node[a], graph.node[b]
        if len(node_a.output) != len(node_b.output):
            return None
        counterpart.update(zip(node_a.output, node_b.output, strict=True))
    return second, counterpart


def _repeat(graph: Any, prefix: str, count: int, second: list[int], counterpart: dict[str, str], *,
            per_layer: dict[str, str]) -> None:
    import onnx

    layer1 = f"{prefix}.1"
    made = [o for n in second for o in graph.node[n].output if o]
    made_set = set(made)
    scope_pattern = re.compile(re.escape(layer1) + r"(?=[.:'/ ]|$)")
    initializers = {t.name: t for t in graph.initializer if t.name.startswith(f"{layer1}.")}
    value_info = {v.name: v for v in graph.value_info if v.name in made_set}

    # the second layer's own graph inputs and outputs (read or written by its nodes), in the graph's order
    read = {i for n in second for i in graph.node[n].input}
    own_inputs = [v for v in graph.input if v.name in per_layer and v.name in read]
    own_outputs = [v for v in graph.output if v.name in per_layer and v.name in made_set]

    def named(value: str, layer: int) -> str:
        """The name of the second layer's `value` in layer `layer`."""
        if value in per_layer:
            return per_layer[value].format(layer)
        return value if layer == 1 else f"{value}{_SUFFIX}{layer}"

    namer = _Namer(named, made_set, per_layer, counterpart, initializers, layer1)
    templates = [_NodeTemplate(graph.node[n], namer, scope_pattern) for n in second]
    copies: list[Any] = []
    for layer in range(KEPT_LAYERS, count):
        scope = f"{prefix}.{layer}"
        copies += [template.copy(layer, scope) for template in templates]
        for name, tensor in initializers.items():
            copy = onnx.TensorProto()
            copy.CopyFrom(tensor)
            copy.name = namer(name, layer, scope)
            graph.initializer.append(copy)
        for name, info in value_info.items():
            copy_info = onnx.ValueInfoProto()
            copy_info.CopyFrom(info)
            copy_info.name = named(name, layer)
            graph.value_info.append(copy_info)
    last = count - 1
    # what read the second layer's results after it (the final norm, a graph output) reads the last layer's
    after = second[-1] + 1
    for node in list(graph.node)[after:]:
        node.input[:] = [named(i, last) if i in made_set and i not in per_layer else i for i in node.input]
    for output in graph.output:
        if output.name in made_set and output.name not in per_layer:
            output.name = named(output.name, last)
    _add_own_values(graph.input, own_inputs, named, count)
    _add_own_values(graph.output, own_outputs, named, count)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes[:after], *copies, *nodes[after:]])
    _extend_signature(graph, layer1, prefix, count)


class _Namer:
    """The name of a value the second layer reads or writes in another layer's copy: its own results and cache
    (named), what the previous layer made where the second read the first's (counterpart), its parameters (under the
    copy's scope), and anything else (shared) as it is. Each value is classified once."""

    OWN, PREVIOUS, PARAMETER, SHARED = range(4)

    def __init__(self, named: Any, made: set[str], per_layer: Mapping[str, str], counterpart: Mapping[str, str],
                 initializers: Mapping[str, Any], layer1: str) -> None:
        self.named, self.counterpart, self.layer1 = named, counterpart, layer1
        self.made, self.per_layer, self.initializers = made, per_layer, initializers
        self.kinds: dict[str, int] = {}

    def kind(self, value: str) -> int:
        found = self.kinds.get(value)
        if found is None:
            found = self.OWN if value in self.made or value in self.per_layer else \
                self.PREVIOUS if value in self.counterpart else \
                self.PARAMETER if value in self.initializers else self.SHARED
            self.kinds[value] = found
        return found

    def __call__(self, value: str, layer: int, scope: str) -> str:
        kind = self.kind(value)
        if kind == self.OWN:
            return str(self.named(value, layer))
        if kind == self.PREVIOUS:  # what the previous layer made
            return str(self.named(self.counterpart[value], layer - 1))
        if kind == self.PARAMETER:
            return scope + value[len(self.layer1):]
        return value


# An fx node's text names its arguments as %name (frontends/layers.py renames them per copy).
_FX_ARGUMENT = re.compile(r"%([\w.~]+)")


class _NodeTemplate:
    """A second-layer node, taken apart once, that makes its copy in any layer: the node without its metadata, and
    each metadata entry's text split at what a copy renames (the module scope, the fx node's own name and
    arguments)."""

    def __init__(self, node: Any, namer: _Namer, scope_pattern: re.Pattern[str]) -> None:
        import onnx

        self.namer, self.name = namer, node.name
        self.inputs, self.outputs = list(node.input), list(node.output)
        self.bare = onnx.NodeProto()
        self.bare.CopyFrom(node)
        del self.bare.metadata_props[:]
        # per entry: (key, kind, parts): kind "scope" (text pieces around each scope), "fx" (own name; the rest's
        # pieces, every odd one an argument's name), "" (kept as it is)
        self.properties: list[tuple[str, str, Any]] = []
        for p in node.metadata_props:
            if p.key in _DROPPED_KEYS:
                continue
            if p.key in _SCOPE_KEYS:
                self.properties.append((p.key, "scope", scope_pattern.split(p.value)))
            elif p.key == _FX_NODE_KEY:
                own, _, rest = p.value.partition(" ")
                self.properties.append((p.key, "fx", (own[1:], _FX_ARGUMENT.split(rest))))
            else:
                self.properties.append((p.key, "", p.value))

    def copy(self, layer: int, scope: str) -> Any:
        """Give this node's copy in layer `layer` (its module scope `scope`)."""
        import onnx

        namer = self.namer
        node = onnx.NodeProto()
        node.CopyFrom(self.bare)
        node.name = namer.named(self.name, layer)
        node.input[:] = [namer(i, layer, scope) if i else i for i in self.inputs]
        node.output[:] = [namer(o, layer, scope) if o else o for o in self.outputs]
        for key, kind, parts in self.properties:
            if kind == "scope":
                value = scope.join(parts)
            elif kind == "fx":
                own, pieces = parts
                value = _fx_node_text(own, pieces, lambda name: namer(name, layer, scope), layer)
            else:
                value = parts
            node.metadata_props.add(key=key, value=value)
        return node


def _add_own_values(values: Any, own: list[Any], named: Any, count: int) -> None:
    """Add to a graph's inputs or outputs each copy's own (the second layer's `own`, renamed per layer), after the
    second layer's last."""
    import onnx

    if not own:
        return
    at = max(i for i, v in enumerate(values) if v.name in {o.name for o in own}) + 1
    kept = list(values)
    added = []
    for layer in range(KEPT_LAYERS, count):
        for value in own:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(value)
            copy.name = named(value.name, layer)
            added.append(copy)
    del values[:]
    values.extend([*kept[:at], *added, *kept[at:]])


def _fx_node_text(name: str, pieces: list[str], renamed: Any, layer: int) -> str:
    """Give an fx node's text ('%linear_7 : ... args = (%mul_3, ...)', its own name `name` and the rest split at its
    arguments' names: `pieces`) with its own name and arguments named as in layer `layer`: the node's own name made
    unique per layer even where it names no ONNX value."""
    mapped = renamed(name)
    own = "%" + (mapped if mapped != name else f"{name}{_SUFFIX}{layer}")
    rest = "".join(piece if i % 2 == 0 else "%" + renamed(piece) for i, piece in enumerate(pieces))
    return f"{own} {rest}"


def _extend_signature(graph: Any, layer1: str, prefix: str, count: int) -> None:
    """Add the copies' parameters and buffers to the exporter's graph signature (each input line of the second
    layer's, once per copy), where the training estimate reads which weights are parameters."""
    key = "pkg.torch.export.ExportedProgram.graph_signature"
    for prop in graph.metadata_props:
        if prop.key != key:
            continue
        lines = prop.value.split("\n")
        second = [line for line in lines if f"target='{layer1}." in line]
        added: list[str] = [line.replace(f"target='{layer1}.", f"target='{prefix}.{layer}.")
                            for layer in range(KEPT_LAYERS, count) for line in second]
        at = max((i for i, line in enumerate(lines) if line in second), default=len(lines) - 1) + 1
        prop.value = "\n".join([*lines[:at], *added, *lines[at:]])


def total_parameters(named: Iterable[tuple[str, Any]]) -> int:
    """Give the elements of the tensors named (a model's named_parameters)."""
    return sum(t.numel() for _, t in named)
