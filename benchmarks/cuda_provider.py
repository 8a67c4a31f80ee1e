"""What the CUDA provider's placement (taken from onnxruntime's source, not measured: no GPU) changes in the plain
report: per fixture, the activation peak on `--provider cpu` and on `--provider cuda` (the default), the bytes
kept in host memory, and what moved.

    python benchmarks/cuda_provider.py [--batch 8] [--zoo DIR]

--zoo DIR: also the real models benchmarks/zoo.py cached in DIR (their zoo.json dims).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxmem  # noqa: E402
from benchmarks.fixture_dims import dims_for, fixture_paths  # noqa: E402
from benchmarks.tables import markdown_table  # noqa: E402
from onnxmem.ir.graph import HOST  # noqa: E402
from onnxmem.passes.pipeline import analysis  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--zoo", type=Path, default=None)
    args = parser.parse_args()
    models = [(path, dims_for(path, args.batch)) for path in fixture_paths()]
    if args.zoo is not None:
        index = json.loads((args.zoo / "zoo.json").read_text())
        models += [(args.zoo / m["file"], m["dims"]) for m in index["models"]]
    headers = ("model", "cpu peak B", "cuda peak B", "change", "host B", "CPU nodes", "copies in/out",
               "ops without a CUDA kernel")
    rows = []
    for path, dims in models:
        cpu = onnxmem.analyze(path, dims, provider="cpu").inference
        run = analysis(path, dims, provider="cuda")
        cuda = run.report.inference
        ops = run.graph.ops
        host_nodes = sum(1 for op in ops if op.outputs and not op.op_type.startswith("Memcpy")
                         and op.op_type not in ("Shape", "Size") and run.graph.tensors[op.outputs[0]].kind == HOST)
        copies = [sum(1 for op in ops if op.op_type == kind) for kind in ("MemcpyFromHost", "MemcpyToHost")]
        fallback = next((w.message.split("for their types on the CPU (")[1].split(")")[0] for w in run.report.warnings
                         if w.code == "cuda-host-nodes" and "for their types" in w.message), "-")
        change = cuda.peak_activation_bytes - cpu.peak_activation_bytes
        rows.append((path.stem, f"{cpu.peak_activation_bytes:,}", f"{cuda.peak_activation_bytes:,}",
                     f"{change:+,}", f"{cuda.host_activation_bytes:,}", str(host_nodes), f"{copies[0]}/{copies[1]}",
                     fallback))
    print(f"fixtures at batch {args.batch}, zoo models at their zoo.json dims; plain report, model order")
    print(markdown_table(headers, rows))


if __name__ == "__main__":
    main()
