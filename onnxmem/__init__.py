"""onnxmem: static memory analysis of ONNX models (import onnxmem; onnxmem.analyze("model.onnx", {"batch": 8})).

The names below are imported on first use, so that `import onnxmem` costs nothing until a function is called (and
the `onnxmem` command can answer an interrupt while it starts: see console.py).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .analyze import Analysis, analysis, analyze
    from .errors import (
        DimError,
        MissingExtraError,
        ModelFileError,
        OnnxMemError,
        RuntimeMeasurementError,
        TargetError,
    )
    from .plan import check, fit, parse_size
    from .report import CheckResult, FitResult, InferenceReport, Report, Warning
    from .training import TrainingOptions
    from .validate import Validation, validate

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC: dict[str, str] = {
    **dict.fromkeys(("Analysis", "analysis", "analyze"), "analyze"),
    **dict.fromkeys(("DimError", "MissingExtraError", "ModelFileError", "OnnxMemError", "RuntimeMeasurementError",
                     "TargetError"), "errors"),
    **dict.fromkeys(("check", "fit", "parse_size"), "plan"),
    **dict.fromkeys(("CheckResult", "FitResult", "InferenceReport", "Report", "Warning"), "report"),
    "TrainingOptions": "training",
    **dict.fromkeys(("Validation", "validate"), "validate"),
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
    "ModelFileError",
    "DimError",
    "MissingExtraError",
    "RuntimeMeasurementError",
    "TargetError",
]


def _function(name: str) -> property:
    """Give the package attribute `name` that is a function of the submodule of the same name (analyze, validate):
    the import system binds the submodule to the package when it is imported, and the function wins, as the
    package's own `from .analyze import analyze` made it win."""
    def get(package: types.ModuleType) -> Any:
        return getattr(importlib.import_module(f".{name}", __name__), name)

    def bind(package: types.ModuleType, value: Any) -> None:
        pass  # the submodule, bound by the import system: sys.modules keeps it

    return property(get, bind)


class _Package(types.ModuleType):
    analyze = _function("analyze")
    validate = _function("validate")


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    """Give a public name (imported from its module on first use) or a submodule (onnxmem.shapes, ...)."""
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
