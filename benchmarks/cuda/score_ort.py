"""Score onnxmem's CUDA-provider estimate against every committed onnxruntime-gpu row, without a GPU.

    python benchmarks/cuda/score_ort.py [ROWS ...] [--graphs DIR]

ROWS: rows files or folders of *.jsonl (default benchmarks/results/cuda). Each `ort/<model>/<level>/b<batch>` row
is onnxmem.validate(provider="cuda") run on the GPU (onnxmem/measure/ort_cuda.py: every device allocation counted
through gpu_external_alloc): per run, the peak of live device bytes above the session's (the graph inputs copied
in, activations, kernel scratch) and the session's bytes (the weights). Ours, from the model as given (the eval
export benchmarks/cuda/measure.export_eval makes, rebuilt here with the CPU torch into --graphs, or taken from it):
- first run: the liveness peak (`onnxmem report --provider cuda`'s activations), which counts each Conv's cuDNN
  workspace while it runs (the CUDA provider's op_scratch, from targets/ort/cuda/tables.CUDNN_CONV_WORKSPACE), with
  the graph inputs;
- later run: validate's figure, the memory pattern's block held all run, graph outputs from their producer on and
  the workspace on top;
- weights: the initializers read in device memory (provider.host_weights).
Printed per row: measured, ours and the difference (bytes), both runs, weights; then the Conv ops whose workspace
is not measured (the report's cuda-conv-workspace warning: counted as none, below every peak of these rows).

The single-op measurement the next GPU window needs, to turn the workspace table into a rule: for each Conv shape
of a model (x per sample, weight, strides, pads, dilations, group, dtype) at batch 1 and 8, one session of a
one-node Conv model on the CUDA provider with the counting allocator (measure_cuda(..., runs=2)), recording every
allocation's size in order (AllocationCounter's events, not only phase peaks): the workspace is the allocation made
and freed inside the Conv's Compute besides its output; with it, cuDNN's plan name (CUDNN_LOGINFO_DBG=1 or the
cudnn_frontend graph's plan tag) to tie the size to the engine heuristics mode A picked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.cuda.common import ROOT, read_rows, table  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "cuda"
GRAPHS = Path("/tmp/onnxmem-ort-cuda-graphs")


def ort_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """Give the measured ort rows (the last of each key), in file order."""
    latest: dict[str, dict[str, Any]] = {}
    for row in read_rows(paths):
        if row.get("kind") == "ort" and row.get("error") is None and row.get("runs") and row.get("device") == "cuda":
            latest[str(row["key"])] = row
    return list(latest.values())


def eval_graph(model: str, folder: Path) -> tuple[Path, str]:
    """Give the eval export of a campaign model and its batch dim's name: from a committed *-ort-graphs.zip
    beside the rows (graph-only: weights' dtypes and shapes, no data), else made once into `folder` with the CPU
    torch (torchvision and transformers needed)."""
    import zipfile

    import onnx

    path = folder / f"{model}.eval.onnx"
    for archive in sorted(RESULTS.glob("*-ort-graphs.zip")) if not path.exists() else ():
        with zipfile.ZipFile(archive) as members:
            if path.name in members.namelist():
                members.extract(path.name, folder)
                break
    if not path.exists():
        from benchmarks.cuda import models
        from benchmarks.cuda.measure import export_eval

        return export_eval(models.SPECS[model], False, folder)
    proto = onnx.load(str(path), load_external_data=False)
    return path, proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param


def ours(path: Path, dims: dict[str, int]) -> dict[str, Any]:
    """Give the product's first-run and later-run peaks (as validate's estimate: the report's timeline, which counts
    each Conv's cuDNN workspace while it runs, ExecutionProvider.op_scratch), weights and the cuda-conv-workspace
    warning's convolutions."""
    from onnxmem.measure.validate import _outside_pattern_peak
    from onnxmem.passes.liveness import pattern_block_bytes
    from onnxmem.passes.pipeline import analysis
    from onnxmem.targets.ort.cuda.provider import CUDA

    run = analysis(str(path), dims, provider="cuda")
    graph, timeline, model = run.graph, run.timeline, run.loaded.proto
    session = CUDA.session_weights(graph, model, model)
    inputs = sum(session.inputs_per_run)
    # validate's steady figure (measure/validate.py): the pattern's block, graph outputs and each step's transient
    # bytes (bodies, kernel scratch) outside it
    later = pattern_block_bytes(graph, timeline) + _outside_pattern_peak(graph, timeline)
    unknown = [w.message for w in run.report.warnings if w.code == "cuda-conv-workspace"]
    return {"first": timeline.peak_bytes + inputs, "later": later + inputs, "weights": session.reserved,
            "unknown": unknown}


def score(paths: list[Path], folder: Path) -> tuple[list[tuple[Any, ...]], dict[str, tuple[str, ...]]]:
    """Give one line per ort row (measured, ours, difference per run; weights) and the unmeasured convs per
    model."""
    folder.mkdir(parents=True, exist_ok=True)
    graphs: dict[str, tuple[Path, str]] = {}
    cache: dict[tuple[str, int], dict[str, Any]] = {}
    lines, unknown = [], {}
    for row in ort_rows(paths):
        model, batch = row["model"], int(row["batch"])
        if model not in graphs:
            graphs[model] = eval_graph(model, folder)
        path, dim = graphs[model]
        if (model, batch) not in cache:
            cache[(model, batch)] = ours(path, {dim: batch})
        mine = cache[(model, batch)]
        unknown[model] = mine["unknown"]
        runs = {r["phase"]: r["measured"] for r in row["runs"]}
        first, later = runs["first"]["peak_activation_bytes"], runs["steady"]["peak_activation_bytes"]
        weights = runs["first"]["weights_bytes"]
        lines.append((model, row["opt_level"], batch, first, mine["first"], mine["first"] - first, later,
                      mine["later"], mine["later"] - later, weights, mine["weights"], mine["weights"] - weights,
                      row["runs"][0]["activation_difference_bytes"]))
    return lines, unknown


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 0 (also with no rows)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="*", type=Path, default=[RESULTS])
    parser.add_argument("--graphs", type=Path, default=GRAPHS, help="where the eval exports are made or found")
    args = parser.parse_args(argv)
    lines, unknown = score(args.rows, args.graphs)
    if not lines:
        print("no measured ort rows")
        return 0
    print("onnxruntime-gpu rows (bytes): measured against ours, first run, later run (memory pattern) and weights; "
          "'validate then' = the row's own activation difference (first run) when it was measured")
    print(table(("model", "level", "batch", "first", "ours", "diff", "later", "ours", "diff", "weights", "ours",
                 "diff", "validate then"), lines))
    exact = sum(1 for line in lines if line[5] == 0 and line[8] == 0 and line[11] == 0)
    print(f"\n{exact}/{len(lines)} rows exact (both runs and weights)")
    for model, warned in unknown.items():
        for message in warned:
            print(f"{model}: [cuda-conv-workspace] {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
