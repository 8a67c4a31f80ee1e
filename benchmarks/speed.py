"""Speed and memory of onnxmem on LLM-sized graphs, against the parse floor and onnx-tool, in one run.

    python benchmarks/speed.py [--repeat 3] [--quick]

Every figure is a whole process (Python start and imports included), the median of --repeat rounds in which
the commands take turns; a ratio is the median of the ratios within a round (the load of a shared machine
drifts; each round sees the same), followed by the lowest and highest of them. Peak RSS comes from one more
run, sampled every 5 ms over the whole process tree (any child process a command starts counts; onnxmem starts
none). onnxmem's modules are compiled to bytecode first, as pip does when it installs a package (the floor's
onnx is installed so). The floor is what any ONNX tool pays: onnx.load(load_external_data=False) plus ONNX
shape inference. onnx-tool (pip install onnx-tool) profiles the same model where it can run: it reads weight
data, so it cannot run where the weight file is absent (every generated LLM graph here).
Prints one table; ratios compare figures taken in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.llm_graphs import SHAPES, LlamaShape, make_llama, make_wide_cnn  # noqa: E402
from benchmarks.tables import markdown_table  # noqa: E402

FLOOR = ("import onnx, sys; m = onnx.load(sys.argv[1], load_external_data=False); "
         "onnx.shape_inference.infer_shapes(m)")
ONNX_TOOL = ("import onnx_tool, sys, json, tempfile, os; d = json.loads(sys.argv[2]); "
             "onnx_tool.model_profile(sys.argv[1], dynamic_shapes={k: tuple(v) for k, v in d.items()}, "
             "save_profile=os.path.join(tempfile.mkdtemp(), 'p.txt'))")


@dataclass
class Case:
    name: str
    path: Path
    dims: dict[str, int]
    search: str
    onnx_tool_shapes: dict[str, list[int]]


@dataclass
class Timing:
    seconds: float | None
    rss_mb: float | None
    note: str = ""
    ratio: float | None = None  # to the floor (report, training) or to the report (fit): the median over rounds
    spread: tuple[float, float] | None = None  # the lowest and highest of those ratios


def argv(cmd: list[str]) -> list[str]:
    """The command line of ('m', module, args...) or ('c', code, args...)."""
    kind, target, *args = cmd
    return [sys.executable, "-m" if kind == "m" else "-c", target, *args]


def tree_rss_kb(pid: int) -> tuple[int, int]:
    """Give the resident KB of a process and all its descendants (any child it starts included), and the
    process's own high-water mark (VmHWM); (0, 0) once it is gone."""
    total, own_peak, stack = 0, 0, [pid]
    while stack:
        current = stack.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            total += int(fields.get("VmRSS", "0 kB").split()[0])
            if current == pid:
                own_peak = int(fields.get("VmHWM", "0 kB").split()[0])
            for task in os.listdir(f"/proc/{current}/task"):
                stack.extend(int(c) for c in Path(f"/proc/{current}/task/{task}/children").read_text().split())
        except (OSError, ValueError):
            continue  # exited meanwhile
    return total, own_peak


def peak_rss_mb(cmd: list[str]) -> float | None:
    """Give the peak RSS of one more run of the command: the largest sum over its process tree, sampled every
    5 ms, or the main process's own high-water mark where that is larger. A run of its own: sampling costs CPU
    that the timed runs must not pay."""
    proc = subprocess.Popen(argv(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        total, own = tree_rss_kb(proc.pid)
        peak = max(peak, total, own)
        time.sleep(0.005)
    return peak / 1024 if peak else None


def take_turns(argvs: dict[str, list[str]], repeat: int, envs: dict[str, dict[str, str]] | None = None,
               cwd: Path | None = None) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Give each command line's wall times over `repeat` rounds, the commands taking turns within a round (load on a
    shared machine drifts: each round sees the same), and for each that failed the last line it wrote to stderr (it
    is not run again). `envs`: per command, variables added to the environment; `cwd`: where they run."""
    times: dict[str, list[float]] = {name: [] for name in argvs}
    failed: dict[str, str] = {}
    for _ in range(repeat):
        for name, command in argvs.items():
            if name in failed:
                continue
            env = {**os.environ, **(envs or {}).get(name, {})}
            start = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
            elapsed = time.perf_counter() - start
            if proc.returncode not in (0, 1):  # fit/check exit 1 for "does not fit", which is an answer
                last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
                failed[name] = last[:60]
                continue
            times[name].append(elapsed)
    return times, failed


def run(cmds: dict[str, list[str]], repeat: int, bases: dict[str, str] | None = None) -> dict[str, Timing]:
    """Give each command's ('m' module or 'c' code, args) median wall time over `repeat` rounds (take_turns), its
    median ratio to its base command (`bases`: name -> name) within a round, and its peak RSS (peak_rss_mb)."""
    times, failed = take_turns({name: argv(cmd) for name, cmd in cmds.items()}, repeat)
    result = {}
    for name, cmd in cmds.items():
        if name in failed:
            result[name] = Timing(None, None, failed[name])
            continue
        base = (bases or {}).get(name)
        ratios = [t / b for t, b in zip(times[name], times[base], strict=True)] \
            if base is not None and base not in failed else []
        result[name] = Timing(statistics.median(times[name]), peak_rss_mb(cmd),
                              ratio=statistics.median(ratios) if ratios else None,
                              spread=(min(ratios), max(ratios)) if ratios else None)
    return result


def help_text(*args: str) -> str | None:
    proc = subprocess.run([sys.executable, "-m", "onnxmem", *args, "--help"], capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None


def dim_args(dims: dict[str, int]) -> list[str]:
    return [a for k, v in dims.items() for a in ("--dim", f"{k}={v}")]


def cases(tmp: Path, quick: bool) -> list[Case]:
    llm_dims = {"batch": 1, "seq": 2048, "past": 1}
    found = []
    shapes: dict[str, LlamaShape] = {"7b": SHAPES["7b"], "70b": SHAPES["70b"]}
    for layers in (20, 200) if quick else (20, 200, 1850):  # about 1k, 10k and 100k nodes
        shapes[f"deep{layers}"] = LlamaShape(layers=layers, **{k: getattr(SHAPES["deep"], k) for k in
                                                             ("hidden", "heads", "kv_heads", "ffn", "vocab")})
    for name, shape in shapes.items():
        path = tmp / f"llama_{name}.onnx"
        onnx.save(make_llama(shape, data_file=f"llama_{name}.onnx.data"), str(path))
        found.append(Case(f"llama-{name}", path, llm_dims, "batch", {}))
    cnn = tmp / "wide_cnn.onnx"
    onnx.save(make_wide_cnn(data_file="wide_cnn.onnx.data"), str(cnn))
    found.append(Case("wide-cnn", cnn, {"batch": 32}, "batch", {}))
    fixtures = Path(__file__).resolve().parent.parent / "fixtures"
    for name, dims in (("gpt_decoder", {"batch": 8, "seq": 128}), ("cnn_bn_residual", {"batch": 32})):
        path = fixtures / f"{name}.onnx"
        if path.exists():
            model = onnx.load(str(path), load_external_data=False)
            tool_shapes = {}
            for value in model.graph.input:
                dims_of = [d.dim_value if d.dim_value else dims.get(d.dim_param, 1)
                           for d in value.type.tensor_type.shape.dim]
                tool_shapes[value.name] = dims_of
            found.append(Case(f"fixture {name}", path, dims, "batch", tool_shapes))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="skip the 100k-node graph")
    args = parser.parse_args()
    import compileall

    import onnxmem

    compileall.compile_dir(str(Path(onnxmem.__file__).parent), quiet=1)
    training = "--training" in (help_text("report") or "")
    fit = help_text("fit") is not None
    try:
        import onnx_tool  # noqa: F401
        tool = True
    except ImportError:
        tool = False
    onnxmem_cmd = ["m", "onnxmem"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases(Path(tmp), args.quick):
            nodes = len(onnx.load(str(case.path), load_external_data=False).graph.node)
            report_cmd = [*onnxmem_cmd, "report", str(case.path), *dim_args(case.dims), "--format", "json"]
            fixed = {k: v for k, v in case.dims.items() if k != case.search}
            cmds = {"floor": ["c", FLOOR, str(case.path)], "report": report_cmd}
            if training:
                cmds["train"] = [*report_cmd, "--training", "--optimizer", "adamw"]
            if fit:
                cmds["fit"] = [*onnxmem_cmd, "fit", str(case.path), *dim_args(fixed), "--memory", "80GiB",
                               "--format", "json"]
            timed = run(cmds, args.repeat, {"report": "floor", "train": "floor", "fit": "report"})
            floor, report = timed["floor"], timed["report"]
            train = timed.get("train", Timing(None, None, "n/a"))
            fitted = timed.get("fit", Timing(None, None, "n/a"))
            if tool and case.onnx_tool_shapes:
                import json

                other = run({"tool": ["c", ONNX_TOOL, str(case.path), json.dumps(case.onnx_tool_shapes)]}, 1)["tool"]
            else:
                other = Timing(None, None, "weights absent" if tool else "not installed")
            rows.append((case, nodes, floor, report, train, fitted, other))
    print_table(rows)


def fmt(t: Timing, base: Timing | None = None) -> str:
    if t.seconds is None:
        return t.note or "failed"
    text = f"{t.seconds:.2f}s"
    if base is not None and t.ratio is not None:
        spread = f", {t.spread[0]:.2f}-{t.spread[1]:.2f}" if t.spread is not None and len(set(t.spread)) > 1 else ""
        text += f" ({t.ratio:.2f}x{spread})"
    return text


def print_table(rows: list[tuple[Case, int, Timing, Timing, Timing, Timing, Timing]]) -> None:
    headers = ("model", "nodes", "floor", "report (x floor)", "--training (x floor)", "fit (x report)",
               "onnx-tool", "RSS floor", "RSS report (x)", "report - floor, us/node")
    table = []
    for case, nodes, floor, report, train, fitted, other in rows:
        rss_ratio = f" ({report.rss_mb / floor.rss_mb:.2f}x)" if report.rss_mb and floor.rss_mb else ""
        # the work beyond the floor, per node: flat when the passes are linear in the graph
        per_node = f"{(report.seconds - floor.seconds) / nodes * 1e6:.1f}" if report.seconds and floor.seconds \
            else "-"
        table.append((case.name, str(nodes), fmt(floor), fmt(report, floor), fmt(train, floor),
                      fmt(fitted, report), fmt(other),
                      f"{floor.rss_mb:.0f} MB" if floor.rss_mb else "-",
                      f"{report.rss_mb:.0f} MB{rss_ratio}" if report.rss_mb else "-", per_node))
    print(markdown_table(headers, table))


if __name__ == "__main__":
    main()
