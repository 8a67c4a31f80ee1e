"""Inference peak of `onnxmem report` on the raw graph against what onnxruntime really allocates.

    python benchmarks/accuracy_inference.py [--batch 8]

For every fixture: onnxruntime CPU, optimizations disabled, one thread, first run, activations measured to the
byte by the profiler's allocator statistics (onnxmem.measure.ort_cpu). Estimates: `onnxmem report` as a user runs
it with --provider cpu (the model's own node order) and with --order ort (onnxruntime's order); both on the raw
graph, default rules.
Prints one table; the last column names what explains a difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxmem  # noqa: E402
from benchmarks.fixture_dims import dims_for, fixture_paths  # noqa: E402
from benchmarks.tables import markdown_table  # noqa: E402
from onnxmem.measure.inputs import make_feeds  # noqa: E402
from onnxmem.measure.ort_cpu import measure_cpu  # noqa: E402


def percent(estimate: int, measured: int) -> str:
    return "n/a" if measured == 0 else f"{100 * (estimate - measured) / measured:+.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    rows = []
    errors_model, errors_ort = [], []
    for path in fixture_paths():
        dims = dims_for(path, args.batch)
        model = onnxmem.ir.load.load_model(path).proto
        try:
            measured = measure_cpu(path, make_feeds(model, dims), opt_level="disable", runs=1)
        except onnxmem.OnnxMemError as exc:
            rows.append((path.stem, "-", "-", "-", "-", "-", f"not run: {exc}"[:60]))
            continue
        actual = measured.runs[0].peak_activation_bytes
        in_model_order = onnxmem.analyze(path, dims, provider="cpu").inference.peak_activation_bytes
        in_ort_order = onnxmem.analyze(path, dims, order="ort", provider="cpu").inference.peak_activation_bytes
        if actual:
            errors_model.append(abs(in_model_order - actual) / actual)
            errors_ort.append(abs(in_ort_order - actual) / actual)
        rows.append((path.stem, f"{actual:,}", f"{in_model_order:,}", percent(in_model_order, actual),
                     f"{in_ort_order:,}", percent(in_ort_order, actual), explain(path)))
    headers = ("fixture", "measured B", "report B", "error", "report --order ort B", "error", "note")
    print(f"batch {args.batch}; onnxruntime CPU, opt level disable, 1 thread, first run")
    print(markdown_table(headers, rows))
    if errors_model:
        print(f"\nmean |error|: model order {100 * sum(errors_model) / len(errors_model):.2f}%, "
              f"ort order {100 * sum(errors_ort) / len(errors_ort):.2f}%; "
              f"max: {100 * max(errors_model):.2f}% / {100 * max(errors_ort):.2f}% over {len(errors_model)} fixtures")


def explain(path: Path) -> str:
    """Give the known reason a fixture's estimate can differ, from what its graph contains."""
    model = onnxmem.ir.load.load_model(path).proto
    ops = {n.op_type for n in model.graph.node}
    notes = []
    if "If" in ops:
        notes.append("If: larger branch counted")
    if ops & {"Conv", "ConvTranspose", "LSTM", "GRU"}:
        notes.append("kernel scratch not measured")
    return "; ".join(notes)


if __name__ == "__main__":
    main()
