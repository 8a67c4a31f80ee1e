"""The export a training estimate is exact on, from a PyTorch model (the `torch` extra).

A training estimate reads the forward graph; an export can remove what training keeps. torch.onnx.export's defaults
do: the dynamo exporter's optimizer folds BatchNorm into the Conv before it (in train mode too), and an eval-mode
export drops Dropout. export_for_training writes the graph as PyTorch trains it: train mode, optimize=False
(BatchNorm and Dropout kept), the ATen op marks the estimate reads (pkg.torch.onnx.fx_node) and named symbolic dims.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from onnxmem.errors import OnnxMemError, require_extra
from onnxmem.training.rules import CHECKPOINT_LAYERS_PROPERTY, EXPORT_MODE_PROPERTY

# An axis per dim name: the same axis of every input of higher rank, or one entry per input (None: not there).
DynamicAxes = Mapping[str, int | Sequence[int | None]]


def stderr_line(line: str) -> None:
    """Write one progress line, prefixed `onnxmem:`, to standard error (the default `progress` of the exports)."""
    sys.stderr.write(f"onnxmem: {line}\n")
    sys.stderr.flush()


def export_for_training(model: Any, example_inputs: Any, path: str | Path, dynamic: DynamicAxes | None = None, *,
                        opset_version: int | None = None,
                        progress: Callable[[str], None] | None = stderr_line) -> Path:
    """Give the path of the ONNX file written from `model` as it trains, for `onnxmem report --training`.

    Parameters
    ----------
    model : torch.nn.Module
        Exported in train mode (and put back in its own mode after).
    example_inputs : torch.Tensor or tuple of them
        Inputs to trace with (their sizes along the dynamic axes do not matter).
    path : str or Path
        Where to write the ONNX file.
    dynamic : mapping of dim name to axis, optional
        The symbolic dims, e.g. ``{"batch": 0, "seq": 1}``: the axis of every tensor input of higher rank, or a
        sequence with one axis (or None) per input. The file's dims carry these names (``--dim batch=8``).
    opset_version : int, optional
        The ONNX opset (the exporter's default when None).
    progress : callable taking one line, optional
        Told when the export starts (it can take a minute on a large model) and when it ends, with the seconds it
        took. The default writes each line to standard error; None says nothing.

    Raises
    ------
    MissingExtraError
        torch is not installed.
    OnnxMemError
        The exporter failed (its message is given).
    """
    try:
        import torch
    except ImportError:
        raise require_extra("torch", "torch", "onnxmem.torch.export_for_training") from None
    import onnx

    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    axes = _axes_per_input(inputs, dynamic or {}, torch.Tensor)
    dynamic_shapes = tuple({axis: torch.export.Dim.DYNAMIC for axis in per_input} or None for per_input in axes)
    target = Path(path)
    properties = training_properties(model)
    was_training = model.training
    model.train()
    say = progress or (lambda line: None)
    say(f"exporting {type(model).__name__} as it trains (torch.onnx.export, dynamo; can take a minute) ...")
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Exporting a model while it is in training mode")
            torch.onnx.export(model, inputs, str(target), dynamo=True, optimize=False, opset_version=opset_version,
                              dynamic_shapes=dynamic_shapes if any(axes) else None)
    except Exception as error:  # the exporter raises many types; the user needs its message
        raise OnnxMemError(f"torch.onnx.export failed: {error}") from error
    finally:
        model.train(was_training)
    proto = onnx.load(str(target), load_external_data=False)
    name_dims(proto, axes)
    # the mode the graph was traced in: a train-mode trace writes nn.Dropout(p=0) as a copy (aten.clone), as an
    # eval-mode trace writes every Dropout; the estimate reads which it was here
    onnx.helper.set_model_props(proto, {**{prop.key: prop.value for prop in proto.metadata_props}, **properties})
    onnx.save(proto, str(target))
    say(f"exported {type(model).__name__} in {time.perf_counter() - start:.1f} s: {target}")
    return target


def training_properties(model: Any) -> dict[str, str]:
    """Give the model properties of a train-mode export of `model`: the mode it was traced in and the modules its
    library checkpoints one by one (transformers' GradientCheckpointingLayer instances, outermost, as
    model.named_modules() names them; none for models whose library marks none)."""
    properties = {EXPORT_MODE_PROPERTY: "training"}
    layers: list[str] = []
    for name, module in model.named_modules():
        if name and not any(name.startswith(outer + ".") for outer in layers[-1:]) and any(
                cls.__name__ == "GradientCheckpointingLayer" for cls in type(module).__mro__):
            layers.append(name)
    if layers:
        properties[CHECKPOINT_LAYERS_PROPERTY] = ",".join(layers)
    return properties


def _axes_per_input(inputs: tuple[Any, ...], dynamic: DynamicAxes, tensor_type: type) -> list[dict[int, str]]:
    """Give, per input, its dynamic axes and their names."""
    axes: list[dict[int, str]] = [{} for _ in inputs]
    for name, where in dynamic.items():
        per_input = [where] * len(inputs) if isinstance(where, int) else list(where)
        if len(per_input) != len(inputs):
            raise OnnxMemError(f"dynamic '{name}': {len(per_input)} axes given for {len(inputs)} inputs")
        for i, axis in enumerate(per_input):
            if axis is not None and isinstance(inputs[i], tensor_type) and axis < inputs[i].dim():
                axes[i][axis] = name
    return axes


def name_dims(proto: Any, axes: list[dict[int, str]]) -> None:
    """Rename the exporter's symbolic dims (s0, s1, ...) to the names given, in every dim of the graph."""
    renames: dict[str, str] = {}
    for value, per_input in zip(proto.graph.input, axes, strict=False):
        dims = value.type.tensor_type.shape.dim
        for axis, name in per_input.items():
            if axis < len(dims) and dims[axis].dim_param:
                renames.setdefault(dims[axis].dim_param, name)
    if not renames:
        return
    pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(renames, key=len, reverse=True)) + r")\b")
    for value in (*proto.graph.input, *proto.graph.output, *proto.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = pattern.sub(lambda m: renames[m.group(1)], dim.dim_param)
