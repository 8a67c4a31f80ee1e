"""A model's reports over the values of one dim (batch, seq), reusing the work that does not depend on it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import onnx

from .analyze import analyze_loaded
from .load import load_model
from .report import Report


class ModelFamily:
    """Reports of one model at every value of one searched dim, the other dims fixed.

    Loading happens once; each value is then analysed at that binding. Callers (fit, check, plots) ask
    for `report(value)` and never redo the work themselves.
    """

    def __init__(self, model: str | os.PathLike[str] | onnx.ModelProto, search: str,
                 dims: Mapping[str, int] | None = None, **options: Any) -> None:
        self.loaded = load_model(model)
        self.search = search
        self.dims = dict(dims or {})
        self.options = options  # analyze()'s keywords: default_dim, order, rules, training, ...
        self._reports: dict[int, Report] = {}

    def report(self, value: int) -> Report:
        """Give the report with the searched dim bound to `value` (cached per value)."""
        if value not in self._reports:
            self._reports[value] = analyze_loaded(self.loaded, {**self.dims, self.search: value}, **self.options)
        return self._reports[value]
