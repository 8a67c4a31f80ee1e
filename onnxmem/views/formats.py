"""The registry of output formats: each format's name, what it is, and how it writes each command's result.

The CLI's --format choices and its dispatch both come from FORMATS: a new format is one entry here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from onnxmem.errors import (
    DimError,
    MissingExtraError,
    ModelFileError,
    OnnxMemError,
    RuntimeMeasurementError,
    TargetError,
    TrainingOptionError,
)
from onnxmem.errors import one_line as _one_line
from onnxmem.views.render import json_text, render_check, render_fit, render_markdown, render_table, render_validation
from onnxmem.views.report import CheckResult, FitResult, Report, plain
from onnxmem.views.series import series_of


@dataclass(frozen=True)
class OutputFormat:
    """How one format writes a report, a fit, a check and a validation (None: the format does not write it)."""

    name: str
    help: str
    report: Callable[[Report, int, bool], str]  # (report, rows per table, with the timelines)
    fit: Callable[[FitResult], str]
    check: Callable[[CheckResult], str]
    validation: bool = True  # whether `validate` writes in this format (render_validation)


def _report_html(report: Report, top: int, timeline: bool) -> str:
    from onnxmem.views.html import report_page

    return report_page(report, series_of(report))


def _fit_html(result: FitResult) -> str:
    from onnxmem.views.html import fit_page

    return fit_page(result, series_of(result.report) if result.report is not None else None)


def _check_html(result: CheckResult) -> str:
    from onnxmem.views.html import check_page

    return check_page(result, series_of(result.report) if result.report is not None else None)


def json_line(value: object) -> str:
    """Give a result as one line of JSON (the jsonl format: one object per line, per model)."""
    return json.dumps(plain(value), separators=(",", ":"))


def _report_jsonl(report: Report, top: int, timeline: bool) -> str:
    return json_line(report.to_dict(timeline=True) if timeline else report)


FORMATS: dict[str, OutputFormat] = {f.name: f for f in (
    OutputFormat("table", "plain text tables (the default)", lambda r, top, _: render_table(r, top),
                 lambda f: render_fit(f, "table"), lambda c: render_check(c, "table")),
    OutputFormat("json", "one versioned JSON document (README: JSON schema)",
                 lambda r, _, timeline: json_text(r.to_dict(timeline=True)) if timeline else json_text(r),
                 lambda f: render_fit(f, "json"), lambda c: render_check(c, "json")),
    OutputFormat("jsonl", "the JSON document on one line; with several models, one line per model (errors as "
                 "onnxmem.error/1 objects)", _report_jsonl, json_line, json_line, validation=False),
    OutputFormat("markdown", "the tables as Markdown", lambda r, top, _: render_markdown(r, top),
                 lambda f: render_fit(f, "markdown"), lambda c: render_check(c, "markdown")),
    OutputFormat("html", "one self-contained page with the timeline as SVG (no script, no network)", _report_html,
                 _fit_html, _check_html, validation=False),
)}


JSON_FORMATS = frozenset({"json", "jsonl"})  # formats whose errors are JSON objects on stdout too
ERROR_SCHEMA = "onnxmem.error/1"
# The code of an error document, by the exception's class (the first that matches, most specific first).
_ERROR_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (TrainingOptionError, "training-option"), (ModelFileError, "model-file"), (DimError, "dim"),
    (TargetError, "target"), (MissingExtraError, "missing-extra"),
    (RuntimeMeasurementError, "runtime"), (OnnxMemError, "bad-input"), (MemoryError, "out-of-memory"),
    (click.UsageError, "usage"),
)


def error_code(exc: BaseException) -> str:
    """Give the stable code an error document names an exception by: model-file, dim, target, missing-extra,
    runtime, training-option, bad-input (another OnnxMemError), out-of-memory, usage (an option click refused),
    internal (a bug)."""
    return next((code for kind, code in _ERROR_CODES if isinstance(exc, kind)), "internal")


def error_document(model: str, exc: BaseException, message: str | None = None) -> dict[str, Any]:
    """Give the JSON object of an error (schema onnxmem.error/1): the model, a stable code and the one-line
    message (`message`, else the exception's)."""
    return {"schema": ERROR_SCHEMA, "model": model, "code": error_code(exc),
            "message": _one_line(message if message is not None else str(exc))}


def formats_help() -> str:
    """Give every format's name and what it is, for --help."""
    return "; ".join(f"{f.name}: {f.help}" for f in FORMATS.values())


def validation_formats() -> list[str]:
    """Give the formats `validate` writes."""
    return [f.name for f in FORMATS.values() if f.validation]


__all__ = ["ERROR_SCHEMA", "FORMATS", "JSON_FORMATS", "OutputFormat", "error_code", "error_document", "formats_help",
           "json_line", "render_validation", "validation_formats"]
