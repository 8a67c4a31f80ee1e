"""How close the graph build, the largest pass of our own, is to the least work CPython can do for it.

    python benchmarks/floors.py [--layers 1850] [--repeat 5] [--mypyc]

On the Llama-shaped "deep" stack of benchmarks/llm_graphs.py (1850 layers: about 100k nodes; weights absent), one
process times, in turns within each of --repeat rounds (the medians are printed):

- `build_graph`: the build as `report` runs it (no types yet, no node metadata);
- the node fields it reads: op type, domain, name, inputs and outputs of every node, and every initializer's name,
  from the parsed protobuf, kept in a list (the least any pass that reads the wiring must do);
- those reads plus one Op and one Tensor object per op and tensor, wired (each tensor's consumers), as a loop with
  none of the build's checks (no layer names, no subgraphs, no unknown-operator count, no order check): the least a
  build into these objects can do.

--mypyc also compiles a copy of onnxmem (graph.py and liveness.py, with mypyc, which mypy ships) into a temporary
folder and times `build_graph` there, in a fresh process taking turns with one of this checkout (about 30 s to
compile; needs a C compiler).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.tables import markdown_table  # noqa: E402

HERE = Path(__file__).resolve().parent.parent

# One process: the median time of build_graph over `repeat` runs on the model at argv[1] (the package on sys.path).
BUILD_ONLY = r"""
import gc, json, statistics, sys, time
gc.disable()
import onnx
from onnxmem.ir.graph import build_graph
model = onnx.load(sys.argv[1], load_external_data=False)
times = []
for _ in range(int(sys.argv[2])):
    start = time.perf_counter()
    build_graph(model, metadata=False)
    times.append(time.perf_counter() - start)
print(json.dumps(statistics.median(times)))
"""


def field_reads(graph):  # type: ignore[no-untyped-def]
    """The node fields the build reads, and nothing else."""
    names = [t.name for t in graph.initializer]
    return names, [(n.op_type, n.domain, n.name, n.input[:], n.output[:]) for n in graph.node]


def bare_build(graph):  # type: ignore[no-untyped-def]
    """The reads above, into one Op and one Tensor per op and tensor, wired, with no check of any kind."""
    from onnxmem.ir.graph import ACTIVATION, WEIGHT, Op, Tensor

    tensors: list[Tensor] = []
    index: dict[str, int] = {"": -1}
    for init in graph.initializer:
        index[init.name] = len(tensors)
        tensors.append(Tensor(len(tensors), init.name, 0, None, None, WEIGHT, None, []))
    for v in graph.input:
        if v.name not in index:
            index[v.name] = len(tensors)
            tensors.append(Tensor(len(tensors), v.name, 0, None, None, "input", None, []))
    ops: list[Op] = []
    get = index.get
    for position, node in enumerate(graph.node):
        op_index = len(ops)
        inputs = tuple([get(name, -1) for name in node.input])
        for i in inputs:
            if i >= 0:
                tensors[i].consumers.append(op_index)
        outputs = []
        for name in node.output:
            index[name] = len(tensors)
            outputs.append(len(tensors))
            tensors.append(Tensor(len(tensors), name, 0, None, None, ACTIVATION, op_index, []))
        ops.append(Op(op_index, node.name or f"{node.op_type}_{position}", node.op_type, node.domain, inputs,
                      tuple(outputs)))
    return ops, tensors


def in_process(path: Path, repeat: int) -> dict[str, float]:
    import onnx

    from onnxmem.ir.graph import build_graph

    model = onnx.load(str(path), load_external_data=False)
    runs = {"build_graph (as report runs it)": lambda: build_graph(model, metadata=False),
            "the node fields it reads, alone": lambda: field_reads(model.graph),
            "those reads into wired Op and Tensor objects, no checks": lambda: bare_build(model.graph)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    gc.disable()  # as the CLI does
    for _ in range(repeat):
        for name, work in runs.items():  # taking turns: the machine's load drifts
            start = time.perf_counter()
            work()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(samples) for name, samples in times.items()}


def compiled(path: Path, repeat: int) -> dict[str, float]:
    """Time build_graph in a process of this checkout and of a mypyc-compiled copy, taking turns."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(HERE / "onnxmem", copy / "onnxmem", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(HERE / "pyproject.toml", copy / "pyproject.toml")  # (mypy's settings)
        subprocess.run([sys.executable, "-m", "mypyc", "onnxmem/ir/graph.py", "onnxmem/passes/liveness.py"], cwd=copy,
                       check=True, capture_output=True)
        if not list((copy / "onnxmem").glob("graph*.so")):
            raise SystemExit("mypyc made no extension module")
        sources = {"build_graph, this checkout (pure Python)": HERE, "build_graph, compiled with mypyc": copy}
        times: dict[str, list[float]] = {name: [] for name in sources}
        for _ in range(repeat):
            for name, source in sources.items():
                out = subprocess.run([sys.executable, "-c", BUILD_ONLY, str(path), "3"], capture_output=True,
                                     text=True, check=True, env={"PYTHONPATH": str(source), "PATH": "/usr/bin"})
                times[name].append(json.loads(out.stdout))
    return {name: statistics.median(samples) for name, samples in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=1850)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mypyc", action="store_true", help="also time a mypyc-compiled build")
    args = parser.parse_args()
    import onnx

    from benchmarks.llm_graphs import SHAPES, LlamaShape, make_llama

    deep = SHAPES["deep"]
    shape = LlamaShape(args.layers, deep.hidden, deep.heads, deep.kv_heads, deep.ffn, deep.vocab)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deep.onnx"
        model = make_llama(shape, data_file="deep.onnx.data")
        onnx.save(model, str(path))
        nodes = len(model.graph.node)
        del model
        timed = in_process(path, args.repeat)
        if args.mypyc:
            timed.update(compiled(path, args.repeat))
    print(f"{nodes} nodes; medians of {args.repeat} rounds, the runs taking turns within a round")
    base = timed["build_graph (as report runs it)"]
    print(markdown_table(["work", "s", "us per node", "x build_graph"],
                         [[name, f"{s:.3f}", f"{s / nodes * 1e6:.2f}", f"{s / base:.2f}"]
                          for name, s in timed.items()]))


if __name__ == "__main__":
    main()
