"""Where the time of one `onnxmem report` goes on a large graph: each pass timed in one process, in the order
analyze runs them, as a table.

    python benchmarks/phases.py [--layers 1850] [--repeat 3]

The graph is the Llama-shaped "deep" stack of benchmarks/llm_graphs.py (1850 layers: about 100k nodes), its
weights absent. ONNX's symbolic inference runs in a child process (onnxmem/child.py), started before the parent
parses the model, which then collects the types, while the parent loads the model, builds the graph and the
size-free part of liveness. "The child's types" is the part of the child's run the parent could not cover, and
the planner rounds the parent runs on the types (see shapes._read_inferred). The floor's passes
(parsing, ONNX shape inference) are timed the same way for comparison. Medians of --repeat runs, each in a
fresh process. Last, whether onnx's shape inference lets another Python thread run meanwhile.
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
from onnxmem import render, shapes
from onnxmem.graph import build_graph
from onnxmem.load import load_model
from onnxmem.rules import DEFAULT_INFERENCE_RULES as R
marks = [("imports", T())]
path, dims = sys.argv[1], json.loads(sys.argv[2])
if sys.argv[3] == "floor":
    model = onnx.load(path, load_external_data=False); marks.append(("parse", T()))
    onnx.shape_inference.infer_shapes(model); marks.append(("ONNX shape inference", T()))
else:
    started = shapes.start_infer_file(path); marks.append(("start the child", T()))
    loaded = load_model(path); marks.append(("load (parse, node kinds; parent)", T()))
    inference = started.for_model(loaded, shapes.input_dims(loaded.proto))
    graph = build_graph(loaded.proto, metadata=loaded.nodes is None or loaded.nodes.metadata)
    marks.append(("build the graph (parent)", T()))
    scheduled = A.order_and_lifetimes(graph, "model", R); marks.append(("order and lifetimes (parent)", T()))
    symbolic = inference.result(graph); marks.append(("the child's types: waiting, then the planner rounds", T()))
    sized = A.size_graph(graph, loaded.proto, dims, None, symbolic); marks.append(("sizing", T()))
    plan = A.planner_shapes(graph, symbolic); marks.append(("planner shapes", T()))
    report = A.report_graph(loaded, graph, sized.dims, [], plan_shapes=plan, scheduled=scheduled)
    marks.append(("liveness and summaries", T()))
    render.render(report, "json"); marks.append(("JSON", T()))
times, previous = {}, start
for name, at in marks:
    times[name], previous = at - previous, at
print(json.dumps(times))
"""


# Whether onnx's shape inference lets another thread run: a Python loop's rate alone, then while infer_shapes
# runs in a second thread (started first, and given the GIL to begin).
GIL = r"""
import json, sys, threading, time
import onnx
model = onnx.load(sys.argv[1], load_external_data=False)
def count(seconds):
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    return n
alone = count(0.5)
started = threading.Event()
def infer():
    started.set()
    onnx.shape_inference.infer_shapes(model)
thread = threading.Thread(target=infer)
thread.start()
started.wait()
begin = time.perf_counter()
beside = count(0.5)
took = time.perf_counter() - begin
thread.join()
print(json.dumps({"alone": alone, "beside": beside, "took": took}))
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
        gil = json.loads(subprocess.run([sys.executable, "-c", GIL, str(path)], capture_output=True, text=True,
                                        check=True).stdout)
    print(f"{len(model.graph.node)} nodes; median of {args.repeat} runs per column, seconds")
    for kind, samples in runs.items():
        print(f"\n| {kind} phase | s |\n|---|---|")
        total = 0.0
        for phase in samples[0]:
            value = statistics.median(s[phase] for s in samples)
            total += value
            print(f"| {phase} | {value:.3f} |")
        print(f"| total (in-process; the interpreter's own start not counted) | {total:.3f} |")
    print(f"\nA Python loop meant to run 0.5 s took {gil['took']:.2f} s while infer_shapes ran in another thread, "
          f"at {gil['beside'] / gil['alone']:.0%} of its rate alone: the inference holds the GIL, so a thread "
          "cannot overlap it (a child process does).")


if __name__ == "__main__":
    main()
