"""Where the seconds of a first --hf call go: one CLI process per row (no export cache, no graph template: the export
itself; benchmarks/hf_templates.py times the templates), its CPU and wall seconds
split at the stages of the export and the analysis, its peak RSS, and the machine's load when it ran.

    python benchmarks/hf_first_call.py [--configs llama3-70b,mixtral-8x7b,whisper-large-v3] [--commands LABEL,...]
                                       [--checkout DIR] [--out DIR]

The configs and commands are benchmarks/hf_config.py's. The stages are marked by wrapping, in the CLI's process,
onnxmem.hf's steps and three functions of torch.onnx's exporter (the registry from onnxscript's torchlib, the
decompositions and type promotion; what lies between is torch.export's capture); CPU seconds are the process's
(time.process_time), robust to the other work on a shared machine where the wall seconds are not. Stages:
  imports (onnxmem)      python and onnxmem's CLI
  imports (torch, ...)   torch, transformers (and what it imports: torchvision where installed), the config read
  build                  the model class's module and the meta-device model
  imports (exporter)     torch.onnx's exporter and onnxscript
  registry               onnxscript's torchlib functions registered (each parsed from its source)
  capture                torch.export.export (non-strict): the model's forward traced with symbolic batch and seq
  decompositions         ExportedProgram.run_decompositions and the type promotion pass: a second trace
  translation            the FX graph to ONNX (onnxscript's torchlib)
  finish                 onnxmem: the layers repeated, names, rewrites, the file saved (frontends/layers.py)
  collect                gc.collect of the exporter's cycles and the parameter counts
  analysis               onnxmem's report / fit on the file and the output
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hf_config import COMMANDS, SHIM_FINDER, write_config  # noqa: E402
from tables import markdown_table  # noqa: E402
from zoo import SHIM_DIR  # noqa: E402

STAGES = ("imports (onnxmem)", "imports (torch, transformers)", "build", "imports (exporter)", "registry", "capture",
          "decompositions", "translation", "finish", "collect", "analysis")
# The CLI run with the stages marked; prints one JSON line on stderr at exit: [[stage, cpu s, wall s], ...].
RUNNER = r'''import sys, time
marks = [("start", time.process_time(), time.perf_counter())]
def mark(label):
    marks.append((label, time.process_time(), time.perf_counter()))
''' + SHIM_FINDER + r'''import onnxmem.cli.commands as commands
import onnxmem.hf as hf
mark("imports (onnxmem)")
def after(function, label):
    def run(*args, **kwargs):
        result = function(*args, **kwargs)
        mark(label)
        return result
    return run
# (the stages are marked in this process: the export runs here, where the CLI forks it, frontends/child.py; the
# peak RSS is then the export's and the analysis's in one process, as before the fork)
hf.in_child = lambda function, *args, **kwargs: function(*args, **kwargs)
hf.load_config = after(hf.load_config, "imports (torch, transformers)")
hf.build = after(hf.build, "build")
hf._finish = after(hf._finish, "finish")
hf.export_config = after(hf.export_config, "collect")
exported_proto = hf._exported_proto
def proto(*args, **kwargs):
    import onnx_ir
    import torch.onnx._internal.exporter._core as core
    import torch.onnx._internal.exporter._registration as registration
    mark("imports (exporter)")
    from_torchlib = registration.ONNXRegistry.from_torchlib.__func__
    registration.ONNXRegistry.from_torchlib = classmethod(after(from_torchlib, "registry"))
    prepare = core._prepare_exported_program_for_export
    def prepared(*a, **k):
        mark("capture")
        return after(prepare, "decompositions")(*a, **k)
    core._prepare_exported_program_for_export = prepared
    serialize = onnx_ir.serde.serialize_model
    def serialized(model):
        mark("translation")
        return serialize(model)
    onnx_ir.serde.serialize_model = serialized
    return exported_proto(*args, **kwargs)
hf._exported_proto = proto
import atexit, json, resource
def show():
    mark("analysis")
    rows = [[label, c - c0, w - w0] for (label, c, w), (_, c0, w0) in zip(marks[1:], marks)]
    sys.stderr.write("STAGES " + json.dumps({{"stages": rows, "cpu": marks[-1][1],
        "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}}) + "\n")
atexit.register(show)
commands.main(sys.argv[1:])
'''


def first_call(root: Path, arguments: list[str]) -> dict[str, object]:
    """Give the stages (CPU s, wall s), total CPU and wall seconds, peak RSS and load of one first CLI call."""
    code = RUNNER.format(shim=str(SHIM_DIR), root=str(root))
    load = os.getloadavg()[0]
    done = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True,
                          env={**os.environ, "ONNXMEM_HF_CACHE": "off", "ONNXMEM_HF_TEMPLATES": "off"})
    line = next((x for x in done.stderr.splitlines() if x.startswith("STAGES ")), None)
    if line is None:
        raise SystemExit(f"{arguments}: no stages ({done.stderr[-400:]})")
    found = json.loads(line[len("STAGES "):])
    stages: dict[str, list[float]] = {}
    for label, cpu, wall in found["stages"]:
        stages.setdefault(label, [0.0, 0.0])
        stages[label][0] += cpu
        stages[label][1] += wall
    return {"stages": stages, "cpu": found["cpu"], "wall": sum(w for _, w in stages.values()), "peak": found["peak"],
            "load": (load + os.getloadavg()[0]) / 2, "exit": done.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="llama3-70b,mixtral-8x7b,whisper-large-v3")
    parser.add_argument("--commands", default="report", help="hf_config.py's labels, comma-separated")
    parser.add_argument("--checkout", type=Path, default=HERE.parent, help="the onnxmem to run (default: this one)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the configs")
    args = parser.parse_args()
    folder = args.out or Path(tempfile.mkdtemp(prefix="onnxmem-hf-first-"))
    commands = dict(COMMANDS)
    rows = []
    for name in args.configs.split(","):
        config, _, dims = write_config(folder, name)
        for label in args.commands.split(","):
            command = commands[label]
            bound = {d: v for d, v in dims.items() if command[0] != "fit" or d != "batch"}
            result = first_call(args.checkout, [*command, "--hf", str(config.parent),
                                                *(a for d, v in bound.items() for a in ("--dim", f"{d}={v}"))])
            stages = result["stages"]
            assert isinstance(stages, dict)
            rows.append([name, label, f"{result['load']:.1f}",
                         *(f"{stages.get(s, [0.0, 0.0])[0]:.2f}" for s in STAGES), f"{result['cpu']:.1f}",
                         f"{result['wall']:.1f}", f"{int(result['peak']) / 2**20:,.0f}"])  # type: ignore[call-overload]
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(markdown_table(["config", "command", "load", *(f"{s} cpu s" for s in STAGES), "total cpu s", "wall s",
                          "peak RSS MiB"], rows))


if __name__ == "__main__":
    main()
