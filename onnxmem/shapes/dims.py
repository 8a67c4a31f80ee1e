"""Symbolic dims: parsing NAME=VALUE, finding a model's free input dims, binding them (expressions included)."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from onnx import ModelProto

from onnxmem.errors import DimError, listing
from onnxmem.ir.tensor_types import TypeDecoder
from onnxmem.views.report import Warning

_DIM_NAME = re.compile(r"^[^=\s]+$")


class InputDim(NamedTuple):
    """One dimension of a graph input that has no fixed size."""

    name: str  # the dim's symbolic name, or '<input>_dim<axis>' for an unnamed one
    input: str
    axis: int


def parse_dims(items: list[str] | tuple[str, ...]) -> dict[str, int]:
    """Give the dims named by 'NAME=VALUE' strings (as typed after --dim)."""
    dims: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not _DIM_NAME.match(name):
            raise DimError(f"--dim '{item}': expected NAME=VALUE, e.g. --dim batch=8")
        try:
            number = int(value, 0)
        except ValueError:
            raise DimError(f"--dim '{item}': '{value}' is not an integer") from None
        dims[name] = number
    return dims


def input_dims(model: ModelProto) -> list[InputDim]:
    """Give every dim of the graph's inputs that has no fixed size, in input order."""
    initializers = {t.name for t in model.graph.initializer}
    decode = TypeDecoder()  # the inputs of a KV cache repeat one type thousands of times: decode it once
    found: list[InputDim] = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = decode(value.type)[1]
        for axis, dim in enumerate(shape or ()):
            if isinstance(dim, int) and dim > 0:
                continue
            found.append(InputDim(dim if isinstance(dim, str) else f"{value.name}_dim{axis}", value.name, axis))
    return found


def bind_dims(free: list[InputDim], dims: Mapping[str, int],
              default_dim: int | None = None) -> tuple[dict[str, int], tuple[Warning, ...]]:
    """Give the value of every free input dim: given, computed from an expression of given ones, or defaulted."""
    names = {d.name for d in free}
    _check_dim_values(dims, default_dim, names, _cache_lengths(free))
    unknown = sorted(set(dims) - names)
    if unknown:
        known = ", ".join(sorted(names)) or "none (every input dim is fixed)"
        raise DimError(f"unknown dim {', '.join(unknown)}: the model's symbolic dims are {known}")
    bound = dict(dims)
    _bind_expressions(free, bound)
    _bind_cache_totals(names, bound)
    where: dict[str, list[InputDim]] = {}  # each unbound name, where it occurs
    for d in free:
        if d.name not in bound:
            where.setdefault(d.name, []).append(d)
    # a dim named by an expression of other unbound dims ('past + seq') is bound with them: not asked for
    asked = [n for n in where if not (_dim_names(n) - {n}) & where.keys()]
    if asked and default_dim is None:
        ordered = sorted(asked)
        listed = listing([f"{n} (input '{where[n][0].input}' axis {where[n][0].axis}"
                          f"{f', and {len(where[n]) - 1} more inputs' if len(where[n]) > 1 else ''})"
                          for n in ordered])
        example = listing([f"--dim {n}=N" for n in ordered], separator=" ")
        python = listing([f"'{n}': N" for n in ordered])
        raise DimError(f"unbound dims: {listed}; bind them: {example} (or --default-dim N), or dims={{{python}}} "
                       "(or default_dim=N) in Python")
    if not where:
        return bound, ()
    for name in asked:
        bound[name] = int(default_dim)  # type: ignore[arg-type]
    _bind_expressions(free, bound)
    for name in where:  # an expression that does not evaluate (a size of 0 or less) takes the default too
        bound.setdefault(name, int(default_dim))  # type: ignore[arg-type]
    defaulted = ", ".join(sorted(asked))
    return bound, (Warning("default-dim", f"dims {defaulted} were not given and took the default dim {default_dim} "
                                          "(--default-dim, or default_dim= in Python)"),)


def _bind_cache_totals(names: Iterable[str], bound: dict[str, int]) -> None:
    """Bind a decoder's total length, not given, to the sum of the lengths it is made of (the model builder's
    total_sequence_length = past_sequence_length + sequence_length, as onnxruntime-genai feeds it), so that a
    step is asked with its past and its tokens only and fit's search of the past moves the total with it."""
    from onnxmem.shapes.kvcache import TOTAL_LENGTHS

    for name in names:
        parts = TOTAL_LENGTHS.get(name)
        if name not in bound and parts is not None and all(p in bound for p in parts):
            bound[name] = sum(bound[p] for p in parts)


def _bind_expressions(free: list[InputDim], bound: dict[str, int]) -> None:
    """Bind the dims named by an expression of bound dims, as exporters write them ('past + seq')."""
    for d in free:
        if d.name not in bound:
            value = _evaluate_dim(d.name, bound)
            if value is not None:
                bound[d.name] = value


def _dim_names(expression: str) -> set[str]:
    """Give the names a dim's name is written with: itself for a plain name, the operands of 'past + seq'."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return {expression}
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} or {expression}


def _evaluate_dim(expression: str, bound: Mapping[str, int]) -> int | None:
    """Give the value of a dim written as + - * // of bound dims and integers, or None."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return None
    operators = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}

    def value(node: ast.AST) -> int | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in operators:
            left, right = value(node.left), value(node.right)
            if left is None or right is None or (right == 0 and isinstance(node.op, ast.FloorDiv)):
                return None
            return int(operators[type(node.op)](left, right))
        return None

    if isinstance(tree.body, ast.Name):
        return None  # a plain name is a dim of its own, for the user to bind
    result = value(tree.body)
    return result if result is not None and result > 0 else None


def _cache_lengths(free: Iterable[InputDim]) -> set[str]:
    """Give the dims that size only the length axis of a KV cache's past inputs (past_key_values.N.key, ...: axis
    1 or 2 of [batch, heads, length, head] or [batch, length, heads, head]): the model builder's
    past_sequence_length, which its decoders take beside total_sequence_length rather than summed with another
    (its head size, kv_cache_dim, is on axis 3 and stays positive)."""
    from onnxmem.shapes.kvcache import is_past_cache_name

    places: dict[str, set[bool]] = {}
    for d in free:
        places.setdefault(d.name, set()).add(is_past_cache_name(d.input) and d.axis in (1, 2))
    return {name for name, found in places.items() if found == {True}}


def _check_dim_values(dims: Mapping[str, int], default_dim: int | None, names: Iterable[str] = (),
                      cache_lengths: Iterable[str] = ()) -> None:
    # a dim may be 0 where the model's arithmetic allows it: a dim it adds to another ('past + seq': a decoder's
    # prefill with an empty KV cache) or one that sizes only the past cache's inputs (its length); any other dim,
    # and --default-dim, must be positive
    summed = {term for n in names if "+" in n for term in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", n)}
    summed |= set(cache_lengths)
    for name, value in [*dims.items(), *([("--default-dim", default_dim)] if default_dim is not None else [])]:
        least = 0 if name in summed else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise DimError(f"dim {name}={value}: must be " + (
                "a non-negative integer" if not least else
                "a positive integer (0 only for a dim the model adds to another, as past in 'past + seq')"))
        if value >= 2**62:
            raise DimError(f"dim {name}={value}: too large (sizes would overflow 64-bit integers)")
