"""The training step's cost against the report's, in one process, for one or more checkouts.

    python benchmarks/training_ratio.py [--checkout DIR ...] [--layers 1850] [--repeat 2]

On the Llama-shaped "deep" stack of benchmarks/llm_graphs.py (1850 layers: about 100k nodes; weights absent), each
checkout's onnxmem (a child process per checkout, its package first on sys.path) times `analyze` with and without
`TrainingOptions()` at batch 1, seq 128, past 1, taking turns, the best of --repeat rounds each. The ratio (training
over report) is what a change to the training step costs, free of the process start and the imports that
speed.py's whole-process figures include. Prints one table. Default: this checkout.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tables import markdown_table  # noqa: E402

_CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
import onnxmem
from onnxmem import TrainingOptions
best = {}
for _ in range(int(sys.argv[3])):
    for kind in ("report", "training"):
        start = time.perf_counter()
        onnxmem.analyze(sys.argv[2], {"batch": 1, "seq": 128, "past": 1},
                        training=TrainingOptions() if kind == "training" else None)
        best[kind] = min(best.get(kind, float("inf")), time.perf_counter() - start)
print(best["report"], best["training"], onnxmem.__file__)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", action="append", type=Path, default=[])
    parser.add_argument("--layers", type=int, default=1850)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    checkouts = args.checkout or [HERE.parent]
    import onnx
    from llm_graphs import SHAPES, LlamaShape, make_llama

    deep = SHAPES["deep"]
    shape = LlamaShape(layers=args.layers, hidden=deep.hidden, heads=deep.heads, kv_heads=deep.kv_heads, ffn=deep.ffn,
                       vocab=deep.vocab)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "llama_deep.onnx"
        onnx.save(make_llama(shape, data_file="llama_deep.onnx.data"), str(model))
        for checkout in checkouts:
            out = subprocess.run([sys.executable, "-c", _CHILD, str(checkout.resolve()), str(model), str(args.repeat)],
                                 capture_output=True, text=True, check=True).stdout.split()
            report, training = float(out[0]), float(out[1])
            rows.append([str(checkout), f"{report:.2f} s", f"{training:.2f} s", f"{training / report:.2f}x"])
    print(markdown_table(["checkout", "report", "--training", "training / report"], rows))


if __name__ == "__main__":
    main()
