"""Fit against a report on the 100k-node Llama (speed.py's deep1850 case), per checkout, in one run.

    python benchmarks/fit_ratio.py [--checkout DIR ...] [--repeat 3] [--layers 1850]

Each round runs, for every checkout in turn, `onnxmem report` then `onnxmem fit` (speed.py's command lines, the
whole process timed), so every checkout sees the same load; a ratio is fit's time over the report's within one
round, and the table shows each checkout's median ratio (lowest and highest) and median seconds. Without
--checkout, this tree alone. Prints one table.
"""

from __future__ import annotations

import argparse
import compileall
import statistics
import sys
import tempfile
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.llm_graphs import SHAPES, LlamaShape, make_llama  # noqa: E402
from benchmarks.speed import argv, dim_args, take_turns  # noqa: E402
from benchmarks.tables import markdown_table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", action="append", default=[], help="a source tree to time (repeatable)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", type=int, default=1850)
    args = parser.parse_args()
    trees = [Path(c).resolve() for c in args.checkout] or [Path(__file__).resolve().parent.parent]
    for tree in trees:
        compileall.compile_dir(str(tree / "onnxmem"), quiet=1)
    shape = LlamaShape(layers=args.layers, **{k: getattr(SHAPES["deep"], k) for k in
                                              ("hidden", "heads", "kv_heads", "ffn", "vocab")})
    dims = {"batch": 1, "seq": 2048, "past": 1}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"llama_deep{args.layers}.onnx"
        onnx.save(make_llama(shape, data_file=f"{path.name}.data"), str(path))
        nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
        report = ["m", "onnxmem", "report", str(path), *dim_args(dims), "--format", "json"]
        fit = ["m", "onnxmem", "fit", str(path), *dim_args({"seq": 2048, "past": 1}), "--memory", "80GiB",
               "--format", "json"]
        commands, envs = {}, {}
        for k, tree in enumerate(trees):
            for name, cmd in (("report", report), ("fit", fit)):
                commands[f"{k} {name}"] = argv(cmd)
                envs[f"{k} {name}"] = {"PYTHONPATH": str(tree)}
        times, failed = take_turns(commands, args.repeat, envs, cwd=Path(tmp))
    rows = []
    for k, tree in enumerate(trees):
        if f"{k} report" in failed or f"{k} fit" in failed:
            rows.append((str(tree), "failed", failed.get(f"{k} report") or failed.get(f"{k} fit"), "", ""))
            continue
        ratios = [f / r for f, r in zip(times[f"{k} fit"], times[f"{k} report"], strict=True)]
        seconds = [f"{statistics.median(times[f'{k} {name}']):.1f} s" for name in ("report", "fit")]
        rows.append((str(tree), f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
                     *seconds, str(nodes)))
    print(markdown_table(("checkout", "fit (x report)", "report", "fit", "nodes"), rows))


if __name__ == "__main__":
    main()
