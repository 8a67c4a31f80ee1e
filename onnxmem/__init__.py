"""onnxmem: static memory analysis of ONNX models (import onnxmem; onnxmem.analyze("model.onnx", {"batch": 8}))."""

from .analyze import Analysis, analysis, analyze
from .errors import DimError, MissingExtraError, ModelFileError, OnnxMemError, RuntimeMeasurementError, TargetError
from .plan import check, fit, parse_size
from .report import CheckResult, FitResult, InferenceReport, Report, Warning
from .training import TrainingOptions
from .validate import Validation, validate

__version__ = "0.1.0"

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
