"""onnxmem: static memory analysis of ONNX models (import onnxmem; onnxmem.analyze("model.onnx", {"batch": 8})).

The names below are imported on first use, so that `import onnxmem` costs nothing until a function is called (and
the `onnxmem` command can answer an interrupt while it starts: see console.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnxmem.errors import (
        ArgumentError,
        DimError,
        MissingExtraError,
        ModelFileError,
        OnnxMemError,
        RuntimeMeasurementError,
        TargetError,
    )
    from onnxmem.measure.validate import Validation, validate
    from onnxmem.passes.pipeline import Analysis, analysis, analyze
    from onnxmem.plan.fit import check, fit, parse_size
    from onnxmem.training.step import TrainingOptions
    from onnxmem.views.report import CheckResult, FitResult, InferenceReport, Report, Warning

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC: dict[str, str] = {
    **dict.fromkeys(("Analysis", "analysis", "analyze"), "passes.pipeline"),
    **dict.fromkeys(("ArgumentError", "DimError", "MissingExtraError", "ModelFileError", "OnnxMemError",
                     "RuntimeMeasurementError", "TargetError"), "errors"),
    **dict.fromkeys(("check", "fit", "parse_size"), "plan.fit"),
    **dict.fromkeys(("CheckResult", "FitResult", "InferenceReport", "Report", "Warning"), "views.report"),
    "TrainingOptions": "training.step",
    **dict.fromkeys(("Validation", "validate"), "measure.validate"),
}

__all__ = [
    "analyze",
    "analysis",
    "Analysis",
    "validate",
    "fit",
    "check",
    "parse_size",
    "FitResult",
    "CheckResult",
    "Report",
    "InferenceReport",
    "TrainingOptions",
    "Validation",
    "Warning",
    "OnnxMemError",
    "ArgumentError",
    "ModelFileError",
    "DimError",
    "MissingExtraError",
    "RuntimeMeasurementError",
    "TargetError",
]


def __getattr__(name: str) -> Any:
    """Give a public name (imported from its module on first use) or a submodule (onnxmem.shapes.sizing, ...)."""
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module 'onnxmem' has no attribute '{name}'") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
