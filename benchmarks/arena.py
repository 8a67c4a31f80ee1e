"""The bytes onnxruntime's CPU arena holds after each run, measured, against onnxmem.targets.ort.arena's BFC simulation.

    python benchmarks/arena.py [--batches 1 8 32] [--set fixtures|real|real2|real3] [--levels disable ...] [--zoo DIR]
                               [--models NAME ...]

For each fixture and batch, `onnxmem validate` (onnxruntime CPU, level disable, one thread, arena on, memory
pattern on, two runs) reads `mem_arena_held` on each run's last node event: what the arena holds from the system
then (its regions and its reserved bytes). The estimate replays, through the simulated BFC arena
(onnxmem.targets.ort.arena),
the weights the session reserves (validate.arena_weight_bytes) and the first run's allocations and frees on the
estimate's own timeline (arena.first_run_events); for the second run, then the memory pattern's block and the
graph outputs (arena.later_run_events). Prints one table; "exact" counts the runs that agree to the byte.

--set real: the zoo benchmarks/zoo.py built (default ~/.cache/onnxmem-zoo), at the dims its zoo.json gives with the
batch dim taking each --batches value, at each --levels optimization level (default: disable). --set real2: the
second, held-out zoo benchmarks/zoo2.py built (default ~/.cache/onnxmem-zoo2); --set real3: the third, zoo3.py's
(default ~/.cache/onnxmem-zoo3). --models: only these zoo models.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import json  # noqa: E402

from benchmarks.fixture_dims import dims_for, fixture_paths  # noqa: E402
from benchmarks.zoo import DEFAULT_OUT as DEFAULT_ZOO  # noqa: E402
from benchmarks.zoo import INDEX as ZOO_INDEX  # noqa: E402
from benchmarks.zoo2 import DEFAULT_OUT as DEFAULT_ZOO2  # noqa: E402
from benchmarks.zoo3 import DEFAULT_OUT as DEFAULT_ZOO3  # noqa: E402
from onnxmem.measure.validate import validate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--set", choices=("fixtures", "real", "real2", "real3"), default="fixtures")
    parser.add_argument("--levels", nargs="+", default=["disable"])
    parser.add_argument("--zoo", type=Path, default=None)
    parser.add_argument("--models", nargs="+", default=None, help="--set real/real2/real3: only these zoo models")
    args = parser.parse_args()
    if args.zoo is None:
        args.zoo = {"real2": DEFAULT_ZOO2, "real3": DEFAULT_ZOO3}.get(args.set, DEFAULT_ZOO)
    rows = []
    exact = 0
    for name, path, batch, dims in cases(args):
        for level in args.levels:
            try:
                result = validate(path, dims, runs=2, opt_level=level)
            except Exception as exc:  # noqa: BLE001 - one model's failure is a row, never the end of the table
                rows.append((name, level, str(batch), "-", "-", "-", f"{type(exc).__name__}"))
                continue
            for run in result.runs:
                measured, estimated = run.measured.arena_held_bytes, run.estimated.arena_held_bytes
                exact += measured == estimated
                rows.append((name, level, str(batch), f"{run.run_index + 1} ({run.phase})", f"{measured:,}",
                             f"{estimated:,}", f"{estimated - measured:+,}"))
    headers = ("model", "opt level", "batch", "run", "arena held, measured B", "estimated B", "est-meas")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print(f"\nexact to the byte: {exact} of {len(rows)} runs")


def cases(args: argparse.Namespace) -> list[tuple[str, Path, object, dict[str, int]]]:
    """Give (name, path, batch, dims) of every model and batch of the set."""
    if args.set == "fixtures":
        return [(path.stem, path, batch, dims_for(path, batch)) for path in fixture_paths() for batch in args.batches]
    zoo = Path(args.zoo).expanduser()
    found = []
    for entry in json.loads((zoo / ZOO_INDEX).read_text())["models"]:
        if args.models and entry["name"] not in args.models:
            continue
        bindings = [(b, {**entry["dims"], "batch": b}) for b in args.batches] if "batch" in entry["dims"] else \
            [("-", dict(entry["dims"]))]
        found.extend((entry["name"], zoo / entry["file"], batch, dims) for batch, dims in bindings)
    return found


if __name__ == "__main__":
    main()
