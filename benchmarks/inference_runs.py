"""Shape inference runs per report, and the 100k-node report against the floor, for one or more checkouts.

    python benchmarks/inference_runs.py [--checkout DIR ...] [--repeat 3] [--layers 1850] [--no-speed] [--no-runs]

Runs: for each fixture (fixtures/*.onnx at fixture_dims' batch 8, unbound dims 16), `analysis` on both providers,
with and without `TrainingOptions()`, in a child process per checkout (its package first on sys.path) that counts
the calls of ONNX's shape inference entry point (onnx.onnx_cpp2py_export.shape_inference.infer_shapes: every
path, the planner's, the bound inference's and the provider transforms', reaches it), and the same on the
Llama-shaped "deep" stack of benchmarks/llm_graphs.py (--layers 1850: about 100k nodes, float16, weights absent)
at batch 1, seq 128, past 1. Speed: the whole-process `onnxmem report` of that model (`python -m onnxmem`, run in
each checkout, its modules compiled first) and speed.py's floor (onnx.load without the weights plus ONNX shape
inference) take turns over --repeat rounds; a ratio is the median over rounds of the report over the floor of the
same round, with the lowest and highest. Prints two tables (--no-runs, --no-speed: one). Default: this checkout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tables import markdown_table  # noqa: E402

_CHILD = """
import collections, json, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from onnx.onnx_cpp2py_export import shape_inference
from fixture_dims import dims_for, fixture_paths
import onnxmem
from onnxmem import TrainingOptions
from onnxmem.passes.pipeline import analysis
count = [0]
infer = shape_inference.infer_shapes
def counted(*args, **kwargs):
    count[0] += 1
    return infer(*args, **kwargs)
shape_inference.infer_shapes = counted
models = [(p.stem, str(p), dims_for(p, 8)) for p in fixture_paths()]
models.append((f"llama deep ({sys.argv[4]} layers)", sys.argv[3], {"batch": 1, "seq": 128, "past": 1}))
rows = {}
for name, path, dims in models:
    row = []
    for provider in ("cuda", "cpu"):
        for training in (None, TrainingOptions()):
            count[0] = 0
            analysis(path, dims, default_dim=16, provider=provider, training=training)
            row.append(count[0])
    rows[name] = row
print(json.dumps({"file": onnxmem.__file__, "rows": rows}))
"""

FLOOR = ("import onnx, sys; m = onnx.load(sys.argv[1], load_external_data=False); "
         "onnx.shape_inference.infer_shapes(m)")
COLUMNS = ("cuda", "cuda --training", "cpu", "cpu --training")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", action="append", type=Path, default=[])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", type=int, default=1850)
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--no-runs", action="store_true")
    args = parser.parse_args()
    import onnx
    from llm_graphs import SHAPES, LlamaShape, make_llama

    checkouts = [c.resolve() for c in args.checkout] or [HERE.parent]
    names = [c.name for c in checkouts]
    deep = SHAPES["deep"]
    shape = LlamaShape(layers=args.layers, hidden=deep.hidden, heads=deep.heads, kv_heads=deep.kv_heads,
                       ffn=deep.ffn, vocab=deep.vocab)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "llama_deep.onnx"
        onnx.save(make_llama(shape, data_file="llama_deep.onnx.data"), str(model))
        counts = []
        for checkout in [] if args.no_runs else checkouts:
            proc = subprocess.run([sys.executable, "-c", _CHILD, str(checkout), str(HERE), str(model),
                                   str(args.layers)], capture_output=True, text=True, check=True)
            found = json.loads(proc.stdout.strip().splitlines()[-1])
            if not Path(found["file"]).resolve().is_relative_to(checkout):
                sys.exit(f"onnxmem comes from {found['file']}, not from {checkout}")
            counts.append(found["rows"])
        if counts:
            header = ["model", *(f"{column} ({name})" for column in COLUMNS for name in names)]
            rows = [[model_name, *(str(rows_of[model_name][k]) for k in range(len(COLUMNS)) for rows_of in counts)]
                    for model_name in counts[0]]
            print("Shape inference runs per analysis (calls of ONNX's infer_shapes)\n")
            print(markdown_table(header, rows))
        if args.no_speed:
            return
        from speed import take_turns

        for checkout in checkouts:  # (as pip installs a package: its modules compiled to bytecode)
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout / "onnxmem")], check=True)
        report = ["report", str(model), "--dim", "batch=1", "--dim", "seq=128", "--dim", "past=1", "--format", "json"]
        commands = {"floor": [sys.executable, "-c", FLOOR, str(model)]}
        commands.update({name: [sys.executable, "-c", "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
                                "sys.argv = ['onnxmem', *sys.argv[2:]]; runpy.run_module('onnxmem', "
                                "run_name='__main__')", str(checkout), *report]
                         for name, checkout in zip(names, checkouts, strict=True)})
        times, failed = take_turns(commands, args.repeat)
        if failed:
            sys.exit(f"failed: {failed}")
    table = [["floor", f"{statistics.median(times['floor']):.2f}", "", ""]]
    for name in names:
        ratios = [t / f for t, f in zip(times[name], times["floor"], strict=True)]
        table.append([f"report ({name})", f"{statistics.median(times[name]):.2f}",
                      f"{statistics.median(ratios):.2f}x", f"{min(ratios):.2f}-{max(ratios):.2f}x"])
    print(f"\n{args.layers}-layer Llama (about 100k nodes), whole process, median of {args.repeat} rounds taking "
          "turns\n")
    print(markdown_table(["command", "seconds", "ratio to the floor", "lowest-highest"], table))


if __name__ == "__main__":
    main()
