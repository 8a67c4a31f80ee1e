"""Where the time of one `onnxmem report` goes on a large graph: each pass timed in one process, in the order
analyze runs them, as a table.

    python benchmarks/phases.py [--layers 1850] [--repeat 3]
    python benchmarks/phases.py --instructions [--layers 200] [--against OTHER_CHECKOUT]
    python benchmarks/phases.py --whole --against OTHER_CHECKOUT [--repeat 8] [--provider cpu]

The graph is the Llama-shaped "deep" stack of benchmarks/llm_graphs.py (1850 layers: about 100k nodes), its
weights absent. The passes are those of analyze.analysis, in one process, in its order. The floor's passes
(parsing, ONNX shape inference) are timed the same way for comparison. Medians of --repeat runs, each in a
fresh process.

--instructions counts the instructions each pass executes instead, under valgrind's callgrind (a dump at each
pass's end), once: the same on every run and under any load, so a change of a few percent shows (a timing on a
shared machine moves by 10-20% between runs). Instructions are not time (memory it touches costs more than its
count says), but they order the passes and measure a change in one. --against counts a second checkout of the
source (its onnxmem package) on the same graph, in a column beside. Needs valgrind; about 40 s a run at 200 layers.

--whole times whole `onnxmem report --format json` processes of this checkout and of --against, taking turns with
the floor's process in each of --repeat rounds: the medians, and each one's ratio to the floor and to this
checkout within a round (the median over rounds), as speed.py measures; --provider: the reports' provider.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.tables import markdown_table  # noqa: E402

# One run: prints {phase: seconds} as JSON. Imports are timed from the interpreter's start of this code.
RUN = r"""
import gc, importlib, json, os, sys, time
T = time.perf_counter
start = T()
DUMP = bool(os.environ.get("ONNXMEM_PHASE_DUMPS"))  # --instructions: callgrind dumps its counts at getppid()
gc.disable()  # as the CLI does
import onnx
A = importlib.import_module("onnxmem.passes.pipeline")  # the package's `analyze` is the function
from onnxmem.views import render
from onnxmem.shapes.dims import input_dims
from onnxmem.ir.graph import build_graph
from onnxmem.passes.liveness import liveness
from onnxmem.ir.load import load_model
from onnxmem.passes.orders import execution_order
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES as R
marks = []


def mark(name):
    marks.append((name, T()))
    if DUMP:
        os.getppid()


mark("imports")
path, dims = sys.argv[1], json.loads(sys.argv[2])
if sys.argv[3] == "floor":
    model = onnx.load(path, load_external_data=False); mark("parse")
    onnx.shape_inference.infer_shapes(model); mark("ONNX shape inference")
else:
    loaded = load_model(path); mark("load (parse, node kinds)")
    free = input_dims(loaded.proto)
    graph = build_graph(loaded.proto, metadata=loaded.nodes is None or loaded.nodes.metadata)
    mark("build the graph")
    symbolic = A.planner_types(loaded, R, free, graph); mark("planner types (ONNX inference, rounds)")
    sized = A.size_graph(graph, loaded.proto, dims, None, symbolic, free); mark("sizing")
    plan = A.planner_shapes(graph, symbolic); mark("planner shapes")
    steps = execution_order(graph, "ort", R); mark("onnxruntime's order")
    timeline = liveness(graph, steps, R, plan_shapes=plan); mark("liveness")
    report = A.summarize(loaded, graph, sized.dims, [], timeline, "ort"); mark("summaries")
    render.render(report, "json"); mark("JSON")
times, previous = {}, start
for name, at in marks:
    times[name], previous = at - previous, at
print(json.dumps(times))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=1850)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--instructions", action="store_true",
                        help="count each pass's instructions under callgrind instead of timing it")
    parser.add_argument("--whole", action="store_true",
                        help="time whole report processes of this checkout and of --against, with the floor")
    parser.add_argument("--against", type=Path, default=None, metavar="CHECKOUT",
                        help="--instructions, --whole: also measure the onnxmem package of this checkout")
    parser.add_argument("--provider", default=None, help="--whole: the report's --provider (its default if not given)")
    args = parser.parse_args()
    import onnx

    from benchmarks.llm_graphs import SHAPES, LlamaShape, make_llama

    deep = SHAPES["deep"]
    shape = LlamaShape(args.layers, deep.hidden, deep.heads, deep.kv_heads, deep.ffn, deep.vocab)
    dims = {"batch": 1, "seq": 2048, "past": 1}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deep.onnx"
        model = make_llama(shape, data_file="deep.onnx.data")
        onnx.save(model, str(path))
        if args.instructions:
            print_instructions(path, dims, len(model.graph.node), args.against)
            return
        if args.whole:
            print_whole(path, dims, len(model.graph.node), args.against, args.repeat, args.provider)
            return
        runs: dict[str, list[dict[str, float]]] = {"floor": [], "report": []}
        for _ in range(args.repeat):
            for kind in runs:  # taking turns: the machine's load drifts
                out = subprocess.run([sys.executable, "-c", RUN, str(path), json.dumps(dims), kind],
                                     capture_output=True, text=True, check=True)
                runs[kind].append(json.loads(out.stdout))
    print(f"{len(model.graph.node)} nodes; median of {args.repeat} runs per column, seconds")
    for kind, samples in runs.items():
        print(f"\n| {kind} phase | s |\n|---|---|")
        total = 0.0
        for phase in samples[0]:
            value = statistics.median(s[phase] for s in samples)
            total += value
            print(f"| {phase} | {value:.3f} |")
        print(f"| total (in-process; the interpreter's own start not counted) | {total:.3f} |")


def instructions(path: Path, dims: dict[str, int], kind: str, source: Path) -> dict[str, int]:
    """Give the instructions of each pass of one run (RUN, on the onnxmem package of `source`) under callgrind:
    the counts of the dumps made at each pass's end (the first: the interpreter's start and the imports)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--dump-before=getppid", f"--callgrind-out-file={tmp}/cg",
             sys.executable, "-c", RUN, str(path), json.dumps(dims), kind], capture_output=True, text=True,
            check=True, cwd=tmp, env={**os.environ, "ONNXMEM_PHASE_DUMPS": "1", "PYTHONPATH": str(source),
                                      "OPENBLAS_NUM_THREADS": "1"})
        names = list(json.loads(out.stdout.strip().splitlines()[-1]))
        counts = []
        for k in range(1, len(names) + 1):
            summary = next(line for line in Path(f"{tmp}/cg.{k}").read_text().splitlines()
                           if line.startswith("summary:"))
            counts.append(int(summary.split()[1]))
    return dict(zip(names, counts, strict=True))


def print_instructions(path: Path, dims: dict[str, int], nodes: int, against: Path | None) -> None:
    here = Path(__file__).resolve().parent.parent
    columns = {"this checkout": here, **({f"{against}": against.resolve()} if against is not None else {})}
    counted = {name: {kind: instructions(path, dims, kind, source) for kind in ("floor", "report")}
               for name, source in columns.items()}
    print(f"{nodes} nodes; instructions (millions) per pass, one run under callgrind")
    for kind in ("floor", "report"):
        headers = [f"{kind} phase", *columns] + (["this / other"] if against is not None else [])
        rows = []
        passes = list(counted["this checkout"][kind])
        for phase in [*passes, "total"]:
            values = [sum(c[kind].values()) if phase == "total" else c[kind].get(phase, 0) for c in counted.values()]
            row = [phase, *(f"{v / 1e6:,.0f}" for v in values)]
            if against is not None:
                row.append(f"{values[0] / values[1]:.3f}" if values[1] else "-")
            rows.append(row)
        print()
        print(markdown_table(headers, rows))


def print_whole(path: Path, dims: dict[str, int], nodes: int, against: Path | None, repeat: int,
                provider: str | None = None) -> None:
    import compileall

    from benchmarks.speed import FLOOR, take_turns

    here = Path(__file__).resolve().parent.parent
    sources = {"this checkout": here, **({f"{against}": against.resolve()} if against is not None else {})}
    for source in sources.values():  # bytecode first, as an installed package has it
        compileall.compile_dir(str(source / "onnxmem"), quiet=1)
    report = [sys.executable, "-m", "onnxmem", "report", str(path), "--format", "json",
              *(a for name, value in dims.items() for a in ("--dim", f"{name}={value}")),
              *(("--provider", provider) if provider else ())]
    # (run beside the model, not in a checkout: `-m onnxmem` reads the package PYTHONPATH names)
    times, failed = take_turns({"floor": [sys.executable, "-c", FLOOR, str(path)], **dict.fromkeys(sources, report)},
                               repeat, {name: {"PYTHONPATH": str(source)} for name, source in sources.items()},
                               path.parent)
    if failed:
        raise SystemExit(f"failed: {failed}")
    print(f"{nodes} nodes; whole processes, {repeat} rounds: the median, and the median of the ratios within a round")
    rows = []
    for name, samples in times.items():
        ratio_floor = statistics.median(t / f for t, f in zip(samples, times["floor"], strict=True))
        ratio_here = statistics.median(t / h for t, h in zip(samples, times["this checkout"], strict=True))
        label = "floor (onnx.load + infer_shapes)" if name == "floor" else f"report, {name}"
        rows.append([label, f"{statistics.median(samples):.2f} s", f"{ratio_floor:.2f}x", f"{ratio_here:.3f}x"])
    print(markdown_table(["process", "time", "x floor", "x this checkout"], rows))


if __name__ == "__main__":
    main()
