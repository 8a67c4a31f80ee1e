"""The arguments of the public functions (analyze, analysis, fit, check, validate), checked as they come in: an
argument of a type the function does not take is an ArgumentError (a DimError for dims) naming the argument and
what it takes, instead of an AttributeError or a pathlib TypeError from deep inside. Values are checked where they
are used (a dim's least value depends on the model: shapes.dims), types here, once."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import onnx

from onnxmem.errors import ArgumentError, DimError, quoted
from onnxmem.ir.load import LoadedModel
from onnxmem.shapes.dims import parse_dims as shape_dims
from onnxmem.targets.ort.base import ExecutionProvider


def check_arguments(function: str, model: object, dims: object = None, default_dim: object = None,
                    order: object = "", provider: object = "", training: object = None,
                    accepting: tuple[type, ...] = ()) -> None:
    """Raise where an argument of `function` has a type it does not take (`accepting`: the model types it takes
    besides a path, a ModelProto and a loaded model)."""
    if not isinstance(model, (str, os.PathLike, onnx.ModelProto, LoadedModel, *accepting)):
        taken = ", ".join(["a path (str or os.PathLike)", "an onnx.ModelProto", "a LoadedModel",
                           *(t.__name__ for t in accepting)])
        raise ArgumentError(f"{function}(model=...): {_kind(model)}, where it takes {taken}")
    _check_dims(function, dims)
    if default_dim is not None and not _is_int(default_dim):
        raise DimError(f"{function}(default_dim=...): {_kind(default_dim)}, where it takes a positive int or None")
    if not isinstance(order, str) and not (isinstance(order, Sequence) and all(isinstance(n, str) for n in order)):
        raise ArgumentError(f"{function}(order=...): {_kind(order)}, where it takes an order's name or a sequence of "
                            "node names (str)")
    if not isinstance(provider, (str, ExecutionProvider)):
        raise ArgumentError(f"{function}(provider=...): {_kind(provider)}, where it takes a provider's name (str) "
                            "or an ExecutionProvider")
    if training is None:
        return
    from onnxmem.training.options import TrainingOptions  # (an inference report loads no training module)

    if not isinstance(training, TrainingOptions):
        raise ArgumentError(f"{function}(training=...): {_kind(training)}, where it takes onnxmem.TrainingOptions "
                            "or None")


def parse_dims(items: list[str] | tuple[str, ...]) -> dict[str, int]:
    """Give the dims of the command line's --dim NAME=VALUE options (shapes.dims.parse_dims), refusing a dim given
    twice (which would take the last value silently) with a DimError naming both."""
    seen: dict[str, str] = {}
    for item in items:
        name = item.partition("=")[0].strip()
        if name in seen and "=" in item and seen[name].replace(" ", "") != item.replace(" ", ""):
            raise DimError(f"--dim {quoted(name)} is given twice ({quoted(seen[name])} and {quoted(item)}): give each "
                           "dim once")
        seen[name] = item
    return shape_dims(items)


def _check_dims(function: str, dims: object) -> None:
    if dims is None:
        return
    if not isinstance(dims, Mapping):
        raise ArgumentError(f"{function}(dims=...): {_kind(dims)}, where it takes a mapping of dim names to "
                            "ints, e.g. {'batch': 8}")
    for name, value in dims.items():
        if not isinstance(name, str):
            raise DimError(f"{function}(dims=...): the key {name!r} is {_kind(name)}, where dim names are str")
        if not _is_int(value):
            raise DimError(f"{function}(dims=...): dim {quoted(name)} is {value!r:.80} ({type(value).__name__}), "
                           "where a dim is an int")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    name = type(value).__name__
    return "None" if value is None else f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"
