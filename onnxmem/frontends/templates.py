"""Graph templates: a config's export made without torch, from the export of an architecture's reference config
whose sizes are rewritten to the config's. A first `--hf` call on a config of a shipped family (Llama, Mistral,
Qwen2, Mixtral, Whisper) then takes a second or two: no torch, transformers or exporter is imported (their imports
and the exporter's two traces are 13-14 CPU s of a first export, which no change inside them removes).

How a template is made (frontends/template_maker.py, offline, with torch): the reference config is exported with
its layer stacks cut to two (hf.trace_config), then once per integer key with that key doubled. Each integer the
graph holds (an initializer's dim, a constant's value at each of its uses, an attribute, a value_info's dim: the
"slots") is compared, position by position, across the exports:
  - unchanged by every key: fixed;
  - changed by some keys, by a power of two each: a monomial of those keys (value x (config / reference)^e per
    key: a head's dim is hidden_size^1 x num_attention_heads^-1);
  - a key that changes the graph's structure (the experts' branches of an MoE layer) must be equal;
  - a layer count changes the stack's length: the copies frontends/layers.py makes.
The monomials are then checked against exports of other configs of the family, which a slot that is no monomial
(a fused projection's heads x head_dim + 2 x kv_heads x head_dim) fails: the template is not made.

Where a template applies (find_template): the config's model_type, task and mode are the template's; each key is
its reference's, but for the sized keys (any positive value whose monomials are whole numbers), the keys that
change nothing, values the graph never holds (token ids, epsilons, rope's theta and factors: they change a weight's
values, never a size), and dropout probabilities (only whether they are zero). Sized keys equal in the reference
must be equal in the config and the others distinct (the code branches on a KV head count equal to the head count).
A key only one side gives is compared with the config class's default, a derived one (head_dim where the reference
derives it) with its monomial. Anything else exports as before: a template never answers for a config it was not
checked for.

What the graph then says is what the template's transformers and torch exported (recorded in the template and
printed where it is used): ONNXMEM_HF_TEMPLATES=off always exports with the installed ones.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

TEMPLATES_ENV = "ONNXMEM_HF_TEMPLATES"
FOLDER = Path(__file__).resolve().parents[1] / "templates"
FORMAT = 1
SUFFIX = ".template.json"
GRAPH_SUFFIX = ".template.onnx.gz"
# Keys whose values no graph holds: a config's identity and generation settings.
_IGNORED = re.compile(r"(^|_)token_ids?$|^(transformers_version|_name_or_path|use_cache|return_dict|"
                      r"output_attentions|output_hidden_states|torchscript|suppress_tokens|begin_suppress_tokens|"
                      r"forced_decoder_ids|_attn_implementation_autoset|model_type)$")
# Numbers that only set weights' or constants' values (compared nowhere), and probabilities compared as zero or not.
_VALUE_ONLY = re.compile(r"(_eps|epsilon|rope_theta|initializer_range|init_std|initializer_factor|layerdrop|"
                         r"logit_scale|_multiplier)$")
_ROPE = re.compile(r"^rope_(scaling|parameters)$")
_PROBABILITY = re.compile(r"(dropout|_pdrop|dropout_prob|dropout_rate)$")
_ALIASES = {"torch_dtype": "dtype"}
# The graph's integers a template rewrites, by where they are.
LARGEST = 1 << 48  # the largest size a template writes (a dim of 2^48 elements is no model's)
LARGEST_BYTES = 1 << 62  # the most bytes of weights it writes (the sparse data file's length)
KEPT_LAYERS = 2  # (frontends/layers.py's: a template's stacks hold two layers)
_SMALL = 64  # an embedded integer tensor of at most this many elements holds sizes (a Reshape's shape)


# The fields of a record (make_template's).
_FIELDS = frozenset({"model_type", "model_class", "task", "asked", "training", "reference", "aliases", "defaults",
                     "sizes", "sized", "free", "fixed", "derived", "layers", "axes", "per_layer", "properties",
                     "slots", "versions"})


@dataclass(frozen=True)
class Template:
    """A family's template: its record (template.json) and where its graph is."""

    path: Path
    record: dict[str, Any]

    def instantiate(self, sizes: Mapping[str, int]) -> Any:
        """Give the Traced (frontends/traced.py) of the config whose sizes are `sizes` (instantiate's)."""
        return instantiate(self, sizes)

    @property
    def label(self) -> str:
        made = self.record["versions"]
        return (f"onnxmem's {self.record['model_type']} template (exported with transformers "
                f"{made.get('transformers', '?')}, torch {made.get('torch', '?')})")


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(TEMPLATES_ENV, "").strip().lower() not in {"0", "off", "no", "false", "none"}


def _templates(folder: Path) -> Iterator[Template]:
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a torn or foreign file is no template
        if isinstance(record, dict) and record.get("format") == FORMAT and _FIELDS <= record.keys():
            yield Template(path, record)


def _of_mode(config: Mapping[str, Any], training: bool, task: str | None, folder: Path | None) -> Iterator[Template]:
    """Give the templates of `config`'s family made for this mode (training or not, the task asked or found)."""
    for template in _templates(FOLDER if folder is None else folder):
        record = template.record
        if record["model_type"] == config.get("model_type") and record["training"] == training and \
                task in (record["asked"], record["task"]):
            yield template


def _sizes_or_reason(template: Template, config: Mapping[str, Any]) -> dict[str, int] | str | None:
    try:
        return sizes_or_reason(template.record, config)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):
        return None  # a record not of this format's shape: no template


def find_template(config: Mapping[str, Any], *, training: bool, task: str | None, lora: int | None,
                  folder: Path | None = None) -> tuple[Template, dict[str, int]] | None:
    """Give the template that exports `config` (a config.json's object) for this mode and the sizes it binds, or
    None where no template is checked for it (then the config is exported)."""
    if lora is not None:
        return None
    for template in _of_mode(config, training, task, folder):
        sizes = _sizes_or_reason(template, config)
        if isinstance(sizes, dict):
            return template, sizes
    return None


def refusal(config: Mapping[str, Any], *, training: bool, task: str | None, folder: Path | None = None) -> str | None:
    """Give why the template of this config's family and mode does not apply to it, None where there is none."""
    for template in _of_mode(config, training, task, folder):
        found = _sizes_or_reason(template, config)
        if isinstance(found, str):
            return f"{template.label} does not apply: {found}"
    return None


def _canonical(config: Mapping[str, Any], aliases: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        key = _ALIASES.get(key, aliases.get(key, key))
        if not _IGNORED.search(key):
            out[key] = value
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(key: str, mine: Any, theirs: Any) -> bool:
    """Say whether two values of a key make the same graph (sizes aside)."""
    if _number(mine) and _number(theirs):
        if _VALUE_ONLY.search(key):
            return True
        if _PROBABILITY.search(key):
            return (mine == 0) == (theirs == 0)
        return bool(mine == theirs) and type(mine) is type(theirs) or (isinstance(mine, float) and mine == theirs)
    if _ROPE.search(key) and isinstance(mine, dict) and isinstance(theirs, dict):
        return set(mine) == set(theirs) and all(
            _number(mine[k]) and _number(theirs[k]) or mine[k] == theirs[k] for k in mine)
    return bool(mine == theirs)


def _monomial(reference: int, powers: Mapping[str, int], reference_sizes: Mapping[str, int],
              sizes: Mapping[str, int]) -> Fraction:
    value = Fraction(reference)
    for key, power in powers.items():
        value *= Fraction(sizes[key], reference_sizes[key]) ** power
    return value


def applies(record: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, int] | None:
    """Give the sizes `config` binds where the template `record` exports it (see the module's text), else None."""
    found = sizes_or_reason(record, config)
    return found if isinstance(found, dict) else None


def sizes_or_reason(record: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, int] | str:
    """Give the sizes `config` binds where the template `record` exports it, else why it does not (a few words)."""
    if config.get("model_type") != record["model_type"]:
        return f"model_type {config.get('model_type')!r}"
    aliases = record["aliases"]
    mine, theirs = _canonical(config, aliases), _canonical(record["reference"], aliases)
    defaults = record["defaults"]
    reference_sizes: dict[str, int] = record["sizes"]
    sizes: dict[str, int] = {}
    for key in reference_sizes:
        value = mine.get(key)
        if not _number(value) or not isinstance(value, int) or value < 1:
            return f"no {key} (a positive integer)"
        sizes[key] = value
    free, derived = set(record["free"]), record["derived"]
    for key in sorted((set(mine) | set(theirs)) - set(reference_sizes) - free):
        if key in derived:
            if key in mine and (derived[key] is None or not _number(mine[key]) or
                                _monomial(derived[key][0], derived[key][1], reference_sizes, sizes) != mine[key]):
                return f"{key} {mine[key]} is not the one its class derives"
            continue
        if key not in defaults and (key not in mine or key not in theirs):
            continue  # a key the config class does not know, on one side: no model code reads it
        missing = "(absent)"
        a, b = mine.get(key, defaults.get(key, missing)), theirs.get(key, defaults.get(key, missing))
        if not _same(key, a, b):
            return f"{key} {json.dumps(a)[:40]}, the template's {json.dumps(b)[:40]}"
    for key in record["layers"].values():
        if sizes[key] < KEPT_LAYERS:
            return f"{key} {sizes[key]}: the template traced {KEPT_LAYERS} layers"
    sized = record["sized"]
    for i, a in enumerate(sized):
        for b in sized[i + 1:]:
            if (reference_sizes[a] == reference_sizes[b]) != (sizes[a] == sizes[b]):
                return f"{a} {'=' if sizes[a] == sizes[b] else '!='} {b}, unlike the template's"
    for _, reference, powers in record["slots"]:
        value = _monomial(reference, powers, reference_sizes, sizes)
        if value.denominator != 1 or value < 0 or value > LARGEST:
            monomial = " x ".join(f"{k}^{e}" for k, e in powers.items())
            return f"a size of its graph is {float(value):.6g} at these sizes (a multiple of {monomial})"
    return sizes


# ---- the graph's integers ------------------------------------------------------------------------------------

def _dims(value: Any) -> Any:
    return value.type.tensor_type.shape.dim


def slots(proto: Any) -> tuple[list[Any], dict[tuple[Any, ...], int]]:
    """Give a graph's structure (each node's op, attributes' names and where each input comes from, by position)
    and its integers by where they are. A constant is read where it is used: the exporter makes one Constant node
    per distinct value and shares it, so a size equal to another constant of the graph (a head's dim of 32 and an
    axis' 32) shares a node the reference's graph did not; each use of a constant is its own slot instead."""
    import onnx
    from onnx import numpy_helper

    graph = proto.graph
    where: dict[str, Any] = {"": ""}
    structure: list[Any] = []
    values: dict[tuple[Any, ...], int] = {}
    for i, tensor in enumerate(graph.initializer):
        where[tensor.name] = ("init", i)
        structure.append(("init", tensor.data_type, len(tensor.dims), tensor.data_location))
        for d, dim in enumerate(tensor.dims):
            values[("init", i, d)] = dim
        if tensor.data_location != onnx.TensorProto.EXTERNAL and _integers(tensor):
            for e, v in enumerate(numpy_helper.to_array(tensor).ravel().tolist()):
                values[("initval", i, e)] = int(v)
    for i, value in enumerate(graph.input):
        where[value.name] = ("in", i)
    constants: dict[str, Any] = {}
    k = 0  # (the node's position among those that are no Constant)
    for node in graph.node:
        if _is_constant(node):
            constants[node.output[0]] = node
            continue
        inputs: list[Any] = []
        for j, name in enumerate(node.input):
            constant = constants.get(name)
            if constant is None:
                inputs.append(where.get(name, ("?", name)))
                continue
            dtype, dims, elements = constant_value(constant)
            inputs.append(("const", dtype, len(dims), elements is None))
            for d, dim in enumerate(dims):
                values[("cdim", k, j, d)] = dim
            for e, v in enumerate(elements or ()):
                values[("cval", k, j, e)] = v
        attributes: list[Any] = []
        for attribute in node.attribute:
            attributes.append((attribute.name, attribute.type))
            if attribute.type == onnx.AttributeProto.INT:
                values[("attr", k, attribute.name, -1)] = attribute.i
            elif attribute.type == onnx.AttributeProto.INTS:
                for e, v in enumerate(attribute.ints):
                    values[("attr", k, attribute.name, e)] = v
            elif attribute.type == onnx.AttributeProto.STRING:
                attributes.append(attribute.s)
        structure.append((node.op_type, node.domain, tuple(attributes), tuple(inputs), len(node.output)))
        for o, name in enumerate(node.output):
            where[name] = (k, o)
        k += 1
    for kind, infos in (("in", graph.input), ("out", graph.output), ("vi", graph.value_info)):
        for i, info in enumerate(infos):
            if info.name in constants:
                continue  # (a constant's shape is its value's)
            structure.append((kind, where.get(info.name, ("?", info.name)) if kind != "in" else i,
                              info.type.tensor_type.elem_type, len(_dims(info))))
            for d, dim in enumerate(_dims(info)):
                if dim.HasField("dim_value"):
                    values[(kind, i, d)] = dim.dim_value
                else:
                    structure.append((kind, i, d, "sym"))
    return structure, values


def _is_constant(node: Any) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1


def constant_value(node: Any) -> tuple[int, list[int], list[int] | None]:
    """Give a Constant node's element type, dims and, for a small integer one, its elements (else None)."""
    import onnx
    from onnx import numpy_helper

    attribute = node.attribute[0]
    if attribute.type == onnx.AttributeProto.TENSOR:
        tensor = attribute.t
        elements = [int(v) for v in numpy_helper.to_array(tensor).ravel().tolist()] if _integers(tensor) else None
        return tensor.data_type, list(tensor.dims), elements
    if attribute.name == "value_ints":
        return onnx.TensorProto.INT64, [len(attribute.ints)], list(attribute.ints)
    if attribute.name == "value_int":
        return onnx.TensorProto.INT64, [], [attribute.i]
    return attribute.type, [], None  # (a float, floats, a string: no size)


def _integers(tensor: Any) -> bool:
    import onnx

    count = math.prod(tensor.dims)
    return tensor.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and count <= _SMALL


def rewrite(proto: Any, values: Mapping[tuple[Any, ...], int]) -> None:
    """Set each of a graph's integers `values` gives (slots' addresses) in place; a constant whose uses take
    different values is split, one Constant node per value."""
    from onnx import numpy_helper

    graph = proto.graph
    computed = [node for node in graph.node if not _is_constant(node)]
    uses: dict[tuple[int, int], dict[int, int]] = {}
    for address, value in values.items():
        kind = address[0]
        if kind == "init":
            graph.initializer[address[1]].dims[address[2]] = value
        elif kind == "initval":
            tensor = graph.initializer[address[1]]
            array = numpy_helper.to_array(tensor).copy()
            array.reshape(-1)[address[2]] = value
            tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
        elif kind == "attr":
            attribute = _attribute(computed[address[1]], address[2])
            if address[3] < 0:
                attribute.i = value
            else:
                attribute.ints[address[3]] = value
        elif kind == "cval":
            uses.setdefault((address[1], address[2]), {})[address[3]] = value
        elif kind == "cdim":
            pass  # (make_template refuses a constant whose shape changes: its dims are its reference's)
        else:
            infos = {"in": graph.input, "out": graph.output, "vi": graph.value_info}[kind]
            _dims(infos[address[1]])[address[2]].dim_value = value
    if uses:
        _set_constants(graph, computed, uses)


def _set_constants(graph: Any, computed: list[Any], uses: Mapping[tuple[int, int], Mapping[int, int]]) -> None:
    """Give each use of a constant (a node's input) the elements `uses` says, a Constant node per distinct value."""
    constants = {node.output[0]: node for node in graph.node if _is_constant(node)}
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, node in enumerate(computed):
        for j, name in enumerate(node.input):
            if name in constants:
                readers.setdefault(name, []).append((k, j))
    added: dict[str, list[Any]] = {}
    for name, uses_of in readers.items():
        node = constants[name]
        dtype, dims, elements = constant_value(node)
        if elements is None:
            continue  # (no integers: nothing to set)
        by_value: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for use in uses_of:
            changed = uses.get(use) or {}
            by_value.setdefault(tuple(changed.get(e, v) for e, v in enumerate(elements)), []).append(use)
        for n, (value, users) in enumerate(by_value.items()):
            if list(value) == elements and n == 0:
                continue
            target = node
            if n > 0:  # (a second value: a Constant node of its own)
                target = type(node)()
                target.CopyFrom(node)
                target.output[0] = f"{name}~t{n}"
                target.name = f"{node.name}~t{n}" if node.name else ""
                added.setdefault(name, []).append(target)
                for k, j in users:
                    computed[k].input[j] = target.output[0]
            _set_constant(target, dtype, dims, list(value))
    if added:
        nodes = list(graph.node)
        del graph.node[:]
        for node in nodes:
            graph.node.append(node)
            for extra in added.get(node.output[0] if _is_constant(node) else "", ()):
                graph.node.append(extra)


def _set_constant(node: Any, dtype: int, dims: list[int], elements: list[int]) -> None:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    attribute = node.attribute[0]
    if attribute.type == onnx.AttributeProto.TENSOR:
        kind = np.int64 if dtype == onnx.TensorProto.INT64 else np.int32
        attribute.t.CopyFrom(numpy_helper.from_array(np.asarray(elements, dtype=kind).reshape(dims),
                                                     attribute.t.name))
    elif attribute.name == "value_ints":
        attribute.ints[:] = elements
    else:
        attribute.i = elements[0]


def _attribute(node: Any, name: str) -> Any:
    return next(a for a in node.attribute if a.name == name)


# ---- instantiation -------------------------------------------------------------------------------------------

def instantiate(template: Template, sizes: Mapping[str, int]) -> Any:
    """Give the Traced (frontends/traced.py) of the config whose sizes are `sizes` (find_template's): the
    reference's graph with its integers rewritten and its stacks at the config's lengths."""
    import onnx

    from onnxmem.frontends.traced import Traced

    record = template.record
    proto = onnx.load_model_from_string(gzip.decompress(graph_file(template.path).read_bytes()))
    reference_sizes = record["sizes"]
    values = {}
    for address, reference, powers in record["slots"]:
        value = _monomial(reference, powers, reference_sizes, sizes)
        values[tuple(address)] = int(value)
    rewrite(proto, values)
    stacks = {path: sizes[key] for path, key in record["layers"].items()}
    _external_lengths(proto, stacks)
    axes = [{int(axis): name for axis, name in per_input.items()} for per_input in record["axes"]]
    per_layer = record["per_layer"]
    if per_layer:  # (a decode export's per-layer cache inputs: every layer's, once repeated)
        layers = next(iter(stacks.values()))
        axes = [*axes[:2], *(axes[2] for _ in range(2 * layers))]
    properties = _properties(record["properties"], stacks)
    counts = parameter_counts(proto, stacks)
    return Traced(proto, record["model_class"], record["task"], stacks, axes, properties, per_layer, counts)


def layer_copies(name: str, stacks: Mapping[str, int]) -> int:
    """Give how many layers a template's weight stands for: the second layer's, once per layer after the first
    (frontends/layers.py copies it); any other, one."""
    return next((count - 1 for prefix, count in stacks.items() if name.startswith(f"{prefix}.1.")), 1)


class TooLarge(ValueError):
    """The weights a template would write at a config's sizes are more bytes than any file holds."""


def _external_lengths(proto: Any, stacks: Mapping[str, int]) -> None:
    """Set each external weight's length to its bytes at its dims (the reference's before); raise TooLarge where
    the model's weights (every layer's) would be more than LARGEST_BYTES."""
    import onnx

    from onnxmem.ir.dtypes import tensor_bytes

    total = 0
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            length = tensor_bytes(tensor.data_type, math.prod(tensor.dims)) or 0
            total += length * layer_copies(tensor.name, stacks)
            for entry in tensor.external_data:
                if entry.key == "length":
                    entry.value = str(length)
    if total > LARGEST_BYTES:
        raise TooLarge(f"its weights would be {float(total):.3g} bytes")


def graph_file(record_file: Path) -> Path:
    """Give the file of a template's graph (beside its record: NAME.template.onnx.gz)."""
    return record_file.with_name(record_file.name[:-len(SUFFIX)] + GRAPH_SUFFIX)


def _properties(properties: Mapping[str, str], stacks: Mapping[str, int]) -> dict[str, str]:
    """Give a training export's properties with each stack's checkpointed layers listed at its length (the template
    lists the two it traced)."""
    from onnxmem.training.rules import CHECKPOINT_LAYERS_PROPERTY

    out = dict(properties)
    layers = out.get(CHECKPOINT_LAYERS_PROPERTY)
    if layers:
        listed: list[str] = []
        for name in layers.split(","):
            prefix, _, index = name.rpartition(".")
            if prefix in stacks and index.isdigit():
                if index == "0":
                    listed += [f"{prefix}.{i}" for i in range(stacks[prefix])]
                continue
            listed.append(name)
        out[CHECKPOINT_LAYERS_PROPERTY] = ",".join(listed)
    return out


_PARAMETER = re.compile(r": PARAMETER target='([^']+)'")


def parameter_counts(proto: Any, stacks: Mapping[str, int]) -> tuple[int, int, int]:
    """Give HfModel's counts (parameters, their bytes, LoRA's) of a template's graph at its stacks' lengths: each
    parameter the exporter's graph signature lists, by its initializer, the second layer's once per copy."""
    from onnxmem.ir.dtypes import tensor_bytes

    signature = next((p.value for p in proto.graph.metadata_props
                      if p.key == "pkg.torch.export.ExportedProgram.graph_signature"), "")
    listed = _PARAMETER.findall(signature)
    tensors = {t.name: t for t in proto.graph.initializer}
    counts = [0, 0, 0]
    for name in listed:
        tensor = tensors.get(name)
        if tensor is None:
            continue
        elements = math.prod(tensor.dims) * layer_copies(name, stacks)
        counts[0] += elements
        counts[1] += tensor_bytes(tensor.data_type, elements) or 0
        counts[2] += elements if ".lora_" in name else 0
    return counts[0], counts[1], counts[2]
