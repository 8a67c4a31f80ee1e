"""The bytes onnxruntime's CPU arena holds after a first run, measured, against onnxmem.arena's BFC simulation.

    python benchmarks/arena.py [--batches 1 8 32]

For each fixture and batch, onnxruntime (CPU, level disable, one thread, arena on, memory pattern off) runs the model
once with profiling; `mem_arena_held` on its last node event is what the arena holds then (its regions and its
reserved bytes). The simulation, from the model alone: the weights the session puts in the arena, reserved at
their exact size (prepacked weights and copied small initializers: onnxmem.validate.arena_weight_bytes), then the
first run's allocations and frees (onnxmem.arena.first_run_events on the estimate's timeline), through the BFC
arena. Prints one table; "exact" counts the rows that agree to the byte.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnx  # noqa: E402

from benchmarks.fixture_dims import dims_for, fixture_paths  # noqa: E402
from onnxmem.analyze import analysis  # noqa: E402
from onnxmem.arena import first_run_events, held_after  # noqa: E402
from onnxmem.runtime.inputs import make_feeds  # noqa: E402
from onnxmem.validate import arena_weight_bytes  # noqa: E402


def measured_held(path: Path, dims: dict[str, int]) -> tuple[int, int]:
    """Give (the arena's held bytes before the first kernel, after the last kernel) of one first run."""
    import onnxruntime as ort

    model = onnx.load(str(path), load_external_data=False)
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.enable_mem_pattern = False
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "p")
        options.log_severity_level = 4
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        session.run(None, make_feeds(model, dims))
        with open(session.end_profiling()) as profile:
            events = [e["args"] for e in json.load(profile)
                      if e.get("cat") == "Node" and "mem_arena_held" in e.get("args", {})]
    first, last = events[0], events[-1]
    return int(first["mem_arena_held"]) - int(first["mem_arena_held_delta"]), int(last["mem_arena_held"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    rows = []
    exact = 0
    for path in fixture_paths():
        for batch in args.batches:
            dims = dims_for(path, batch)
            before, held = measured_held(path, dims)
            analysed = analysis(path, dims, provider="cpu")
            reserved = arena_weight_bytes(analysed.graph, analysed.loaded.proto)
            simulated = held_after(first_run_events(analysed.graph, analysed.timeline), reserved)
            estimated_before = reserved
            exact += simulated == held
            rows.append((path.stem, str(batch), f"{before:,}", f"{estimated_before - before:+,}", f"{held:,}",
                         f"{simulated:,}", f"{simulated - held:+,}"))
    headers = ("fixture", "batch", "held before run B", "est-meas", "held after run 1 B", "simulated B", "sim-meas")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print(f"\nexact to the byte: {exact} of {len(rows)}")


if __name__ == "__main__":
    main()
