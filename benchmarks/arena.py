"""The bytes onnxruntime's CPU arena holds after each run, measured, against onnxmem.arena's BFC simulation.

    python benchmarks/arena.py [--batches 1 8 32]

For each fixture and batch, `onnxmem validate` (onnxruntime CPU, level disable, one thread, arena on, memory
pattern on, two runs) reads `mem_arena_held` on each run's last node event: what the arena holds from the system
then (its regions and its reserved bytes). The estimate replays, through the simulated BFC arena (onnxmem.arena),
the weights the session reserves (validate.arena_weight_bytes) and the first run's allocations and frees on the
estimate's own timeline (arena.first_run_events); for the second run, then the memory pattern's block and the
graph outputs (arena.later_run_events). Prints one table; "exact" counts the runs that agree to the byte.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fixture_dims import dims_for, fixture_paths  # noqa: E402
from onnxmem.validate import validate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    rows = []
    exact = 0
    for path in fixture_paths():
        for batch in args.batches:
            result = validate(path, dims_for(path, batch), runs=2)
            for run in result.runs:
                measured, estimated = run.measured.arena_held_bytes, run.estimated.arena_held_bytes
                exact += measured == estimated
                rows.append((path.stem, str(batch), f"{run.run_index + 1} ({run.phase})", f"{measured:,}",
                             f"{estimated:,}", f"{estimated - measured:+,}"))
    headers = ("fixture", "batch", "run", "arena held, measured B", "estimated B", "est-meas")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print(f"\nexact to the byte: {exact} of {len(rows)} runs")


if __name__ == "__main__":
    main()
