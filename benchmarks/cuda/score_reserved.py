"""Score the PyTorch CUDA caching-allocator replay (onnxmem/targets/torch/cuda/allocator.py) against the committed
H100 rows' max_memory_reserved, without a GPU.

    python benchmarks/cuda/score_reserved.py [ROWS ...]

For each full-model training row with an export beside the rows, the first step is simulated with the current code,
its buffers are turned into allocation and free events in the step's order (at each event: the buffers that start
there are allocated, then those that end there are freed) and replayed through the allocator model. Printed: the
measured allocated and reserved peaks (above the warm-up's), ours (the replay's allocated peak) and the replay's
reserved peak, with their errors. The replay is not yet used by any answer: this measures whether it can be.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.cuda.common import read_rows, table  # noqa: E402
from benchmarks.cuda.score import RESULTS, find_exports, latest_by_key  # noqa: E402

MIB = 2**20


def first_step_events(export: Path, row: dict[str, Any]) -> list[tuple[int, bool]]:
    """Give the (size, is a free) events of the first step onnxmem simulates for a training row."""
    import onnxmem
    from benchmarks.cuda.measure import training_options
    from onnxmem.training import step as step_module

    captured: list[Any] = []
    simulate = step_module.simulate

    def capture(model: Any, options: Any, rule: Any, first_step: bool, *args: Any, **kwargs: Any) -> Any:
        run = simulate(model, options, rule, first_step, *args, **kwargs)
        if first_step and not args and not kwargs and not captured:
            captured.append(run)
        return run

    step_module.simulate = capture  # type: ignore[assignment]
    try:
        onnxmem.analyze(str(export), row.get("dims") or {"batch": row.get("batch")},
                        training=training_options(onnxmem, "cuda", row["optimizer"], row["precision"]),
                        provider="cuda")
    finally:
        step_module.simulate = simulate  # type: ignore[assignment]
    run = captured[0]
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for buffer in run.buffers:
        if buffer.nbytes > 0:
            starts.setdefault(buffer.start, []).append(buffer.nbytes)
            ends.setdefault(buffer.end, []).append(buffer.nbytes)
    events: list[tuple[int, bool]] = []
    for event in range(len(run.live)):
        events.extend((size, False) for size in starts.get(event, ()))
        events.extend((size, True) for size in ends.get(event, ()))
    return events


def main(argv: list[str] | None = None) -> int:
    """Print the table; give the exit status (0, also with no rows)."""
    from onnxmem.targets.torch.cuda.allocator import replay

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="*", type=Path, default=[RESULTS])
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    latest = latest_by_key([r for r in read_rows(args.rows) if r.get("schema", "").startswith("onnxmem.cuda-")])
    exports = find_exports(list(args.rows), [])
    lines = []
    for key, row in sorted(latest.items()):
        if row.get("kind") != "training" or row.get("error") is not None or row.get("variant") != "full":
            continue
        export = exports.get(f"{row.get('model')}.full.onnx")
        steps = row.get("steps") or []
        if export is None or not steps or steps[0].get("peak_reserved") is None:
            continue
        base = row.get("before_model") or {}
        allocated = steps[0]["peak_allocated"] - base.get("allocated", 0)
        reserved = steps[0]["peak_reserved"] - base.get("reserved", 0)
        peaks = replay(first_step_events(export, row))
        lines.append((key.removeprefix("training/"), f"{allocated / MIB:.1f}", f"{peaks.allocated / MIB:.1f}",
                      f"{100 * (peaks.allocated - allocated) / allocated:+.1f}%", f"{reserved / MIB:.1f}",
                      f"{peaks.reserved / MIB:.1f}", f"{100 * (peaks.reserved - reserved) / reserved:+.1f}%"))
    if not lines:
        print("no training rows with exports: run benchmarks/cuda/run_on_gpu.sh on a GPU and commit its rows")
        return 0
    print("first step, MiB above the warm-up's leftovers: measured vs the allocator replay of onnxmem's events")
    print(table(("row", "allocated", "replay allocated", "error", "reserved", "replay reserved", "error"), lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
