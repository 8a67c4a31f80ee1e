"""Where the time of one `onnxmem report` goes on a large graph: each pass timed in one process, in the order
analyze runs them, as a table.

    python benchmarks/phases.py [--layers 1850] [--repeat 3]

The graph is the Llama-shaped "deep" stack of benchmarks/llm_graphs.py (1850 layers: about 100k nodes), its
weights absent. The passes are those of analyze.analysis, in one process, in its order. The floor's passes
(parsing, ONNX shape inference) are timed the same way for comparison. Medians of --repeat runs, each in a
fresh process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# One run: prints {phase: seconds} as JSON. Imports are timed from the interpreter's start of this code.
RUN = r"""
import gc, importlib, json, sys, time
T = time.perf_counter
start = T()
gc.disable()  # as the CLI does
import onnx
A = importlib.import_module("onnxmem.analyze")  # the package's `analyze` is the function
from onnxmem import render
from onnxmem.dims import input_dims
from onnxmem.graph import build_graph
from onnxmem.liveness import liveness
from onnxmem.load import load_model
from onnxmem.orders import execution_order
from onnxmem.rules import DEFAULT_INFERENCE_RULES as R
marks = [("imports", T())]
path, dims = sys.argv[1], json.loads(sys.argv[2])
if sys.argv[3] == "floor":
    model = onnx.load(path, load_external_data=False); marks.append(("parse", T()))
    onnx.shape_inference.infer_shapes(model); marks.append(("ONNX shape inference", T()))
else:
    loaded = load_model(path); marks.append(("load (parse, node kinds)", T()))
    free = input_dims(loaded.proto)
    graph = build_graph(loaded.proto, metadata=loaded.nodes is None or loaded.nodes.metadata)
    marks.append(("build the graph", T()))
    symbolic = A.planner_types(loaded, R, free, graph); marks.append(("planner types (ONNX inference, rounds)", T()))
    sized = A.size_graph(graph, loaded.proto, dims, None, symbolic, free); marks.append(("sizing", T()))
    plan = A.planner_shapes(graph, symbolic); marks.append(("planner shapes", T()))
    steps = execution_order(graph, "ort", R); marks.append(("onnxruntime's order", T()))
    timeline = liveness(graph, steps, R, plan_shapes=plan); marks.append(("liveness", T()))
    report = A.summarize(loaded, graph, sized.dims, [], timeline, "ort"); marks.append(("summaries", T()))
    render.render(report, "json"); marks.append(("JSON", T()))
times, previous = {}, start
for name, at in marks:
    times[name], previous = at - previous, at
print(json.dumps(times))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=1850)
    parser.add_argument("--repeat", type=int, default=3)
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


if __name__ == "__main__":
    main()
