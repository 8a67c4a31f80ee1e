"""Score `fit`'s training answer against the batches that ran and ran out of memory on the GPU, without a GPU.

    python benchmarks/cuda/score_fit.py [ROWS ...]

The campaign's fit part (benchmarks/cuda/measure.py part_fit) asks onnxmem.fit for the largest training batch
(adamw, fp32) that fits the free memory of the GPU after PyTorch's warm-up, trains at that batch and one more, and
(fit/*/measured-max) bisects below the answer for the largest batch that ran STEPS steps. This script asks the
current code for the same answer on the same export (the rows' exports.zip), from the free memory the row measured
and from the whole GPU (`--gpu` with its fixed costs), and prints them beside the measured bounds. An answer is
right when it ran (at most the largest batch that ran) and close when it is within 1% of that.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.cuda.common import read_rows, table  # noqa: E402
from benchmarks.cuda.score import RESULTS, find_exports  # noqa: E402

LIMIT = 16384  # the campaign's FIT_LIMIT


def bounds(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Give, by model, the measured bounds: the largest batch that ran and the smallest that ran out of memory,
    over every fit row (the at-answer and above-answer attempts of every window, and the bisections)."""
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("kind") != "fit" or row.get("error") or not row.get("model"):
            continue
        entry = found.setdefault(row["model"], {"ran": [], "oom": [], "free": set(), "answers": set()})
        attempts = row.get("probes") or ([row] if "batch" in row and "ran" in row else [])
        for attempt in attempts:
            if attempt.get("ran"):
                entry["ran"].append(attempt["batch"])
            elif attempt.get("oom"):
                entry["oom"].append(attempt["batch"])
        if row.get("free_bytes"):
            entry["free"].add(row["free_bytes"])
        if row["key"].endswith("/answer") and row.get("max_value"):
            entry["answers"].add((row.get("estimator"), row["max_value"]))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="*", type=Path, default=[RESULTS])
    parser.add_argument("--gpu", default="H100-80GB", help="the catalogue's GPU the rows were measured on")
    args = parser.parse_args()
    import onnxmem

    rows = read_rows(args.rows)
    exports = find_exports(args.rows, [RESULTS])
    options = onnxmem.TrainingOptions(optimizer="adamw", precision="fp32", device="cuda", loss="cross_entropy")
    out = []
    for model, entry in sorted(bounds(rows).items()):
        ran = max(entry["ran"], default=None)
        oom = min((b for b in entry["oom"] if ran is None or b > ran), default=None)
        export = exports.get(f"{model}.full.onnx")
        if export is None or len(entry["free"]) != 1:
            out.append((model, ran, oom, "-", "-", "-", "no export or several free figures"))
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            free = onnxmem.fit(str(export), memory=next(iter(entry["free"])), reserve=0, runtime="pytorch",
                               training=options, search="batch", what_if=False, provider="cuda", limit=LIMIT)
            whole = onnxmem.fit(str(export), gpu=args.gpu, runtime="pytorch", training=options, search="batch",
                                what_if=False, provider="cuda", limit=LIMIT)
        earlier = ", ".join(str(v) for _, v in sorted(entry["answers"], key=lambda a: a[1]))
        verdict = "no run measured" if ran is None else \
            "runs, within 1%" if free.max_value <= ran and free.max_value >= 0.99 * ran else \
            "runs, over 1% below" if free.max_value <= ran else \
            "OOMs" if oom is not None and free.max_value >= oom else "above the largest run"
        out.append((model, ran, oom if oom is not None else "-", earlier, free.max_value, whole.max_value,
                    f"{verdict} ({(free.max_value - ran) / ran:+.2%})" if ran else verdict))
    print("fit (adamw, fp32) on the measured GPU: the largest batch that ran, the smallest that ran out of memory, "
          "the answers the rows recorded (earlier code), and the current code's answer from the row's free memory "
          f"and from the whole {args.gpu} with its fixed costs")
    print(table(("model", "largest ran", "smallest OOM", "answers recorded", "answer now (free)",
                 f"answer now ({args.gpu})", "verdict"), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
