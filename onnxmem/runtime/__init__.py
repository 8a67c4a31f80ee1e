"""Validation against a real runtime: build input feeds and measure onnxruntime's allocations on CPU.

Importing this package does not import onnxruntime; `measure_cpu` does, and raises MissingExtraError without it.
"""

from .cpu import CpuMeasurement, RunMeasurement, measure_cpu
from .inputs import make_feeds

__all__ = ["CpuMeasurement", "RunMeasurement", "make_feeds", "measure_cpu"]
