"""The errors onnxmem raises: one base class, one subclass per thing a user can fix."""

from __future__ import annotations


class OnnxMemError(Exception):
    """Base of every error onnxmem raises on purpose; its message is one line meant for the user."""


class ModelFileError(OnnxMemError):
    """The model file is missing, unreadable, not ONNX, truncated or otherwise not a valid graph."""


class DimError(OnnxMemError):
    """A symbolic dimension is unbound, unknown, non-positive or malformed."""


class MissingExtraError(OnnxMemError):
    """An optional dependency is needed for this command; the message names the extra to install."""


class TargetError(OnnxMemError):
    """A memory target is malformed or unknown: a size, a GPU name, a runtime, a sharding option."""


class RuntimeMeasurementError(OnnxMemError):
    """onnxruntime could not load or run the model; the message carries onnxruntime's reason."""


def require_extra(module: str, extra: str, purpose: str) -> MissingExtraError:
    """Give the error to raise when an optional module is missing."""
    return MissingExtraError(
        f"{purpose} needs the '{module}' package: pip install \"onnxmem[{extra}]\""
    )
