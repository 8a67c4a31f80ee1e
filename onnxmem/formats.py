"""The registry of output formats: each format's name, what it is, and how it writes each command's result.

The CLI's --format choices and its dispatch both come from FORMATS: a new format is one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .render import json_text, render_check, render_fit, render_markdown, render_table, render_validation
from .report import CheckResult, FitResult, Report
from .series import series_of


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
    from .html import report_page

    return report_page(report, series_of(report))


def _fit_html(result: FitResult) -> str:
    from .html import fit_page

    return fit_page(result, series_of(result.report) if result.report is not None else None)


def _check_html(result: CheckResult) -> str:
    from .html import check_page

    return check_page(result, series_of(result.report) if result.report is not None else None)


FORMATS: dict[str, OutputFormat] = {f.name: f for f in (
    OutputFormat("table", "plain text tables (the default)", lambda r, top, _: render_table(r, top),
                 lambda f: render_fit(f, "table"), lambda c: render_check(c, "table")),
    OutputFormat("json", "one versioned JSON document (README: JSON schema)",
                 lambda r, _, timeline: json_text(r.to_dict(timeline=True)) if timeline else json_text(r),
                 lambda f: render_fit(f, "json"), lambda c: render_check(c, "json")),
    OutputFormat("markdown", "the tables as Markdown", lambda r, top, _: render_markdown(r, top),
                 lambda f: render_fit(f, "markdown"), lambda c: render_check(c, "markdown")),
    OutputFormat("html", "one self-contained page with the timeline as SVG (no script, no network)", _report_html,
                 _fit_html, _check_html, validation=False),
)}


def formats_help() -> str:
    """Give every format's name and what it is, for --help."""
    return "; ".join(f"{f.name}: {f.help}" for f in FORMATS.values())


def validation_formats() -> list[str]:
    """Give the formats `validate` writes."""
    return [f.name for f in FORMATS.values() if f.validation]


__all__ = ["FORMATS", "OutputFormat", "formats_help", "render_validation", "validation_formats"]
