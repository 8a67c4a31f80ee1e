"""onnxmem: static memory analysis of ONNX models (import onnxmem; onnxmem.analyze("model.onnx", {"batch": 8}))."""

from .analyze import analyze
from .errors import DimError, MissingExtraError, ModelFileError, OnnxMemError, RuntimeMeasurementError
from .report import InferenceReport, Report, Warning

__version__ = "0.1.0"

__all__ = [
    "analyze",
    "Report",
    "InferenceReport",
    "Warning",
    "OnnxMemError",
    "ModelFileError",
    "DimError",
    "MissingExtraError",
    "RuntimeMeasurementError",
]
