"""Making a graph template (frontends/templates.py says what one is and how it is used): offline, with torch and
transformers (the `hf` extra); benchmarks/hf_templates.py makes the shipped ones with it.

The reference config is exported with its layer stacks cut to two (hf.trace_config), then once more per integer key
with that key doubled; the graph's integers are compared position by position (templates.slots): unchanged, a
monomial of the keys that move them (a power of two per doubled key), a layer stack's length, or a key that changes
the graph's structure (kept equal). The template is then checked on other configs of the family: each must be one it
applies to, and its graph for them their own export's, integer for integer.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

from onnxmem.frontends.templates import (
    _ALIASES,
    _IGNORED,
    FORMAT,
    SUFFIX,
    Template,
    _canonical,
    graph_file,
    instantiate,
    sizes_or_reason,
    slots,
)


class TemplateError(Exception):
    """A family's exports are not one graph with monomial sizes: no template."""


def _traced(config: Mapping[str, Any], training: bool, task: str | None) -> Any:
    import tempfile

    from onnxmem import hf

    with tempfile.TemporaryDirectory(prefix="onnxmem-template-") as folder:
        (Path(folder) / hf.CONFIG_FILE).write_text(json.dumps(config))
        return hf.trace_config(folder, training=training, task=task), hf.load_config(folder).to_dict()


def _power(reference: int, varied: int, key: str, address: Any) -> int:
    ratio = Fraction(varied, reference) if reference else None
    if ratio is not None:
        for power in range(-4, 5):
            if ratio == Fraction(2) ** power:
                return power
    raise TemplateError(f"{address}: {reference} -> {varied} when {key} doubles: no monomial of the config's keys")


def make_template(reference: Mapping[str, Any], folder: Path, name: str, *, training: bool = False,
                  task: str | None = None, validate: tuple[Mapping[str, Any], ...] = (),
                  progress: Any = None) -> Path:
    """Make the template of `reference`'s family for this mode in `folder` (NAME.template.json and its graph),
    checked on the `validate` configs (each must be one the template applies to, and its instantiated graph equal
    its own export's, integer for integer); give the record's path. Raises TemplateError."""

    from onnxmem.frontends.hfcache import _version
    from onnxmem.frontends.layers import KEPT_LAYERS

    say = progress or (lambda line: None)
    base, loaded = _traced(reference, training, task)
    structure, values = slots(base.proto)
    aliases = {k: v for k, v in (getattr(_config_class(reference), "attribute_map", None) or {}).items()}
    canonical = _canonical(reference, aliases)
    keys = [k for k, v in canonical.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    powers: dict[tuple[Any, ...], dict[str, int]] = {}
    layers: dict[str, str] = {}
    sized: list[str] = []
    free: list[str] = []
    fixed: list[str] = []
    variants: list[tuple[str, dict[str, Any]]] = []
    for key in keys:
        varied_config = {**{k: v for k, v in reference.items() if _ALIASES.get(k, aliases.get(k, k)) != key},
                         key: canonical[key] * 2}
        try:
            traced, full = _traced(varied_config, training, task)
        except Exception as error:  # noqa: BLE001 (the class or the exporter refuses it doubled: kept as it is)
            say(f"{key}: fixed ({type(error).__name__})")
            fixed.append(key)
            continue
        variants.append((key, full))
        grown = [p for p in base.stacks if traced.stacks.get(p) != base.stacks[p]]
        varied_structure, varied_values = slots(traced.proto)
        if varied_structure != structure or set(traced.stacks) != set(base.stacks):
            say(f"{key}: fixed (the graph changes)")
            fixed.append(key)
            continue
        if grown:
            if len(grown) != 1 or traced.stacks[grown[0]] != 2 * base.stacks[grown[0]] or \
                    base.stacks[grown[0]] <= KEPT_LAYERS or varied_values != values:
                raise TemplateError(f"{key}: changes the layer stacks {grown} and more")
            layers[grown[0]] = key
            say(f"{key}: the length of {grown[0]}")
            continue
        changed = {a for a, v in values.items() if varied_values[a] != v}
        for address in changed:
            powers.setdefault(address, {})[key] = _power(values[address], varied_values[address], key, address)
        (sized if changed else free).append(key)
        say(f"{key}: {len(changed)} integers" if changed else f"{key}: changes nothing")
    moved_shapes = [a for a in powers if a[0] == "cdim"]
    if moved_shapes:
        raise TemplateError(f"a constant's shape changes with the sizes: {moved_shapes[0]}")
    if set(layers) != set(base.stacks):
        raise TemplateError(f"no layer count found for the stacks {sorted(set(base.stacks) - set(layers))}")
    sizes = {k: canonical[k] for k in (*sized, *layers.values())}
    derived = _derived(loaded, variants, canonical, sizes)
    record = {
        "format": FORMAT, "model_type": reference["model_type"], "model_class": base.model_class,
        "task": base.task, "asked": task, "training": training, "reference": dict(reference),
        "aliases": aliases, "defaults": _defaults(reference), "sizes": sizes, "sized": sized, "free": free,
        "fixed": fixed, "derived": derived, "layers": layers,
        "axes": [{str(a): n for a, n in per_input.items()} for per_input in
                 (base.axes[:3] if base.per_layer else base.axes)],
        "per_layer": base.per_layer, "properties": base.properties,
        "slots": [[list(a), values[a], powers[a]] for a in sorted(powers, key=str)],
        "versions": {p: _version(p) for p in ("torch", "transformers", "onnxscript", "onnx")},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}{SUFFIX}"
    graph = base.proto
    graph_file(path).write_bytes(gzip.compress(graph.SerializeToString(), mtime=0))
    path.write_text(json.dumps(record, indent=None, sort_keys=True))
    template = Template(path, record)
    for config in validate:
        check_template(template, config)
        say(f"checked on {config.get('_name', 'a config')}")
    return path


def check_template(template: Template, config: Mapping[str, Any]) -> None:
    """Raise TemplateError where `template` does not apply to `config` or its graph for it is not the config's own
    export (its structure, every integer, its stacks, inputs' axes, properties and parameter counts)."""
    record = template.record
    sizes = sizes_or_reason(record, config)
    if isinstance(sizes, str):
        raise TemplateError(f"{config.get('_name', 'the config')}: the template does not apply ({sizes})")
    made = instantiate(template, sizes)
    real, _ = _traced({k: v for k, v in config.items() if k != "_name"}, record["training"], record["asked"])
    for field in ("model_class", "task", "stacks", "axes", "properties", "per_layer", "counts"):
        if getattr(made, field) != getattr(real, field):
            raise TemplateError(f"{config.get('_name')}: {field} {getattr(made, field)} != {getattr(real, field)}")
    mine, theirs = slots(made.proto), slots(real.proto)
    if mine[0] != theirs[0]:
        raise TemplateError(f"{config.get('_name')}: the graph's structure differs from its export")
    differ = [a for a in theirs[1] if mine[1].get(a) != theirs[1][a]]
    if differ:
        raise TemplateError(f"{config.get('_name')}: {len(differ)} integers differ from its export, first "
                            f"{differ[0]}: {mine[1].get(differ[0])} != {theirs[1][differ[0]]}")


def _config_class(reference: Mapping[str, Any]) -> Any:
    from onnxmem import hf

    tf = hf._transformers()
    return type(tf.AutoConfig.for_model(reference["model_type"]))


def _defaults(reference: Mapping[str, Any]) -> dict[str, Any]:
    """Give the config class's defaults (its to_dict without arguments), JSON values only."""
    out = {}
    for key, value in _config_class(reference)().to_dict().items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[key] = value
    return out


def _derived(loaded: Mapping[str, Any], variants: list[tuple[str, dict[str, Any]]],
             canonical: Mapping[str, Any], sizes: Mapping[str, int]) -> dict[str, Any]:
    """Give the keys the config class derives from the sized ones (head_dim from hidden_size and the head count
    where the config gives none): per key, its reference value and powers, or None where it is no monomial."""
    derived: dict[str, Any] = {}
    for key, value in loaded.items():
        if key in canonical or _IGNORED.search(key):
            continue
        moved = [(varied, full.get(key)) for varied, full in variants if full.get(key) != value]
        if not moved:
            continue
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            derived[key] = None
            continue
        try:
            derived[key] = [value, {k: _power(value, v, k, key) for k, v in moved if isinstance(v, int)}]
        except TemplateError:
            derived[key] = None
        if derived[key] is not None and any(k not in sizes for k in derived[key][1]):
            derived[key] = None  # (moved by a key that changes the graph, or a layer count)
    return derived
