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


class TrainingOptionError(OnnxMemError, ValueError):
    """A training option is unknown or out of range (optimizer, precision, segments, accumulation)."""


def require_extra(module: str, extra: str, purpose: str) -> MissingExtraError:
    """Give the error to raise when an optional module is missing."""
    return MissingExtraError(
        f"{purpose} needs the '{module}' package: pip install \".[{extra}]\" in a clone of onnxmem (its extra "
        f"onnxmem[{extra}])"
    )


# The longest message the CLI prints; a longer one is cut, saying how much was left out.
LONGEST_MESSAGE = 2000


def quoted(value: str | bytes, longest: int = 200) -> str:
    """Give a name (a tensor's, a node's) quoted for a one-line message: control characters escaped (a name may
    hold a newline), bytes that are not UTF-8 shown as escapes, and a very long name cut with its length."""
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value
    if len(text) > longest:
        text = f"{text[:longest]}... ({len(text)} characters)"
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return f"'{text}'"


def listing(items: list[str], shown: int = 10, separator: str = ", ") -> str:
    """Give the first `shown` items joined, and how many more there are (an error may name 200,000 dims)."""
    if len(items) <= shown:
        return separator.join(items)
    return f"{separator.join(items[:shown])}{separator}and {len(items) - shown:,} more"


def one_line(text: str, longest: int = LONGEST_MESSAGE) -> str:
    """Give a message as one line of at most about `longest` characters: line breaks and control characters
    escaped, and a longer message cut, saying how much was left out."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    if len(text) > longest:
        text = f"{text[:longest]}... (cut: {len(text) - longest:,} more characters)"
    return text


class ArgumentError(OnnxMemError, TypeError):
    """An argument given to a library function has a type it does not take; the message names the argument."""
