"""Issue 31's zoo against onnxruntime: the plain report and `validate` on every model of
benchmarks/zoo_inference31.py, the development half and the held-out half printed apart.

    python benchmarks/inference31.py [--zoo DIR] [--batches 1 8] [--levels disable basic extended]
                                     [--half dev|held-out|both] [--models NAME ...]

For each model, batch and optimization level, benchmarks/accuracy_ort.py's --set real measurement: onnxruntime CPU
(1 thread, sequential, arena and memory pattern on) runs the model twice, its activations measured to the byte by
the profiler's allocator statistics, against onnxmem's estimate on the graph onnxruntime saved (validate); then the
plain estimate (`onnxmem report --provider cpu` on the file as exported) against the first run at level disable,
with the codes of the warnings it gave (a data-dependent size is warned with the bound it used). Build the zoo
first: python benchmarks/zoo_inference31.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.accuracy_ort import run_real  # noqa: E402
from benchmarks.zoo import INDEX  # noqa: E402
from benchmarks.zoo_inference31 import DEFAULT_OUT, HELD_OUT  # noqa: E402


def main() -> None:
    """Measure the chosen half (or both, one after the other) and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", type=Path, default=DEFAULT_OUT, help=f"the zoo folder (default {DEFAULT_OUT})")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--levels", nargs="+", default=["disable", "basic", "extended"])
    parser.add_argument("--half", choices=("dev", "held-out", "both"), default="both")
    parser.add_argument("--models", nargs="+", default=None, help="only these models (default: the half's all)")
    args = parser.parse_args()
    index = args.zoo.expanduser() / INDEX
    if not index.exists():
        raise SystemExit(f"inference31: no {index}: build the zoo first (python benchmarks/zoo_inference31.py)")
    names = [entry["name"] for entry in json.loads(index.read_text())["models"]]
    halves = {"dev": [n for n in names if n not in HELD_OUT], "held-out": [n for n in names if n in HELD_OUT]}
    for half in ("dev", "held-out"):
        if args.half not in (half, "both"):
            continue
        chosen = [n for n in halves[half] if not args.models or n in args.models]
        if not chosen:
            continue
        print(f"\n### {half} half ({len(chosen)} models)\n")
        run_real(argparse.Namespace(zoo=args.zoo, models=chosen, batches=args.batches, levels=args.levels,
                                    provider="cpu"))


if __name__ == "__main__":
    main()
