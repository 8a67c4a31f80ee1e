"""Measurements of the real runtimes, and validate: the only place that runs onnxruntime (or torch) to measure.

ort_cpu and ort_cuda measure onnxruntime's allocations on each provider, inputs builds the feeds, validate compares
an estimate with a measurement. Importing this package imports no runtime: a measurement function does, and raises
MissingExtraError without it.
"""
