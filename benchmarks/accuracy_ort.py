"""`onnxmem validate` on every fixture: the estimate on onnxruntime's graph and order against its allocations.

    python benchmarks/accuracy_ort.py [--batches 1 8 32] [--levels disable basic extended] [--set fixtures|held-out]
                                      [--provider cpu|cuda]

For each fixture, batch and optimization level: onnxruntime CPU runs the model twice (first run: tensor by
tensor; second run: the memory pattern), activations measured to the byte by the profiler's allocator statistics;
onnxmem estimates on the graph onnxruntime saved, in the order its profile lists. Prints one table with the
differences in bytes, the count of exact agreements, and the weights the arena holds (prepacked) against the rule.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fixture_dims import dims_for, fixture_paths  # noqa: E402
from onnxmem import MissingExtraError, OnnxMemError  # noqa: E402
from onnxmem.validate import validate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--levels", nargs="+", default=["disable", "basic", "extended"])
    parser.add_argument("--set", choices=("fixtures", "held-out"), default="fixtures",
                        help="the fixtures, or models outside them exported here (needs torch 2.13.0)")
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: onnxruntime-gpu on an NVIDIA GPU (pip install '.[gpu]')")
    args = parser.parse_args()
    rows: list[tuple[str, ...]] = []
    misses: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        models = fixture_paths() if args.set == "fixtures" else held_out_paths(Path(folder))
        for path in models:
            run_model(path, args, rows, misses)
    headers = ("fixture", "opt level", "batch", "run 1 measured B", "run 1 est-meas", "run 2 measured B",
               "run 2 est-meas", "arena weights B / est-meas", "note")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    total = 2 * sum(1 for r in rows if r[3] != "-")  # two runs per measured row
    exact = total - len(misses)
    print("onnxruntime CPU, 1 thread, sequential, arena on, memory pattern on; activations in bytes"
          if args.provider == "cpu" else
          "onnxruntime CUDA, counting allocator (arena bypassed), memory pattern on; device bytes; run columns: "
          "activations + inputs copied in; weights column: every initializer against what the session holds")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print(f"\nexact to the byte: {exact} of {total} runs")
    for miss in misses:
        print(f"- differs: {miss}")


def held_out_paths(folder: Path) -> list[Path]:
    """Export the training benchmark's held-out and reference models (eval mode, dynamo exporter) into `folder`."""
    import torch

    from benchmarks.accuracy_training import HELD_OUT, REFERENCE, export

    paths = []
    for case in HELD_OUT + REFERENCE:
        torch.manual_seed(0)
        module = case.build()
        module.eval()
        paths.append(export(case, module, folder))
    return paths


def run_model(path: Path, args: argparse.Namespace, rows: list[tuple[str, ...]], misses: list[str]) -> None:
    """Validate one model at every level and batch, adding its rows and its differences."""
    for level in args.levels:
        for batch in args.batches:
            dims = dims_for(path, batch)
            try:
                result = validate(path, dims, opt_level=level, runs=2, provider=args.provider)
            except MissingExtraError as exc:
                raise SystemExit(f"accuracy_ort: {exc}") from None
            except OnnxMemError as exc:
                rows.append((path.stem, level, str(batch), "-", "-", "-", "-", "-", str(exc)[:50]))
                continue
            first, steady = result.runs
            for run in result.runs:
                if run.activation_difference_bytes:
                    misses.append(f"{path.stem} {level} b{batch} {run.phase}: "
                                  f"{run.activation_difference_bytes:+,} B")
            rows.append((path.stem, level, str(batch), f"{first.measured.peak_activation_bytes:,}",
                         f"{first.activation_difference_bytes:+,}", f"{steady.measured.peak_activation_bytes:,}",
                         f"{steady.activation_difference_bytes:+,}",
                         f"{first.measured.weights_bytes:,} / {first.weights_difference_bytes:+,}",
                         "; ".join(n for n in result.notes if n.startswith("If")) or ""))


if __name__ == "__main__":
    main()
