"""A fuzz run of the CLI over mutated fixtures: every run must exit 0 or 2, with no traceback, within a time and an
address-space limit, its own peak RSS under a limit. Prints a table by mutation kind.

    python benchmarks/fuzz.py [--mutations 3000] [--seed 0] [--timeout 30] [--memory-gib 4] [--rss-gib 2] [--jobs 2]

Each mutation is a pure function of (fixture, kind, seed), so a row of the table can be replayed
(`mutate(name, kind, seed)`); tests/test_fuzz.py draws the same mutations with hypothesis.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, TensorProto

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measured_run import run_measured  # noqa: E402

FIXTURES = ROOT / "fixtures"
# A run's peak RSS past this is a finding ("over memory"), whatever its exit: the fixtures are a few MB, and a run
# that reaches the address-space limit may still answer (ONNX's inference fails inside, and its warning is a line).
RSS_LIMIT = 2 * 2**30
NAMES = sorted(p.name for p in FIXTURES.glob("*.onnx"))
SPECIAL = [2**62, 2**40, 2**31, 2**31 - 1, 4097, -1, -(2**63), 0, 1]  # values a field mutation sets


# --- mutations: each gives the bytes of the mutated model ---------------------------------------------------------

def _flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 4, 16])):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


def _splice(data: bytes, rng: random.Random) -> bytes:
    # insert, delete or duplicate a run of bytes (a length field then points elsewhere)
    start = rng.randrange(len(data))
    length = rng.choice([1, 3, 8, 64])
    choice = rng.randrange(3)
    if choice == 0:
        return data[:start] + bytes(rng.randrange(256) for _ in range(length)) + data[start:]
    if choice == 1:
        return data[:start] + data[start + length:]
    return data[:start] + data[start:start + length] * 2 + data[start + length:]


def _tensors(model: onnx.ModelProto) -> list[TensorProto]:
    found = list(model.graph.initializer)
    found += [a.t for n in model.graph.node for a in n.attribute if a.type == AttributeProto.TENSOR]
    return found


def _field(data: bytes, rng: random.Random) -> bytes:
    """Change one protobuf field to a value a writer would not write (and the model keeps parsing)."""
    model = onnx.ModelProto.FromString(data)
    graph = model.graph
    tensors = _tensors(model)
    values = [*graph.input, *graph.output, *graph.value_info]
    kinds: list[Callable[[], None]] = []
    if tensors:
        def dims() -> None:
            tensor = rng.choice(tensors)
            if not tensor.dims:
                tensor.dims.append(1)
            tensor.dims[rng.randrange(len(tensor.dims))] = rng.choice(SPECIAL)

        def data_type() -> None:
            rng.choice(tensors).data_type = rng.choice([0, 8, 17, 23, 99, 1000, TensorProto.INT64])

        def raw_data() -> None:
            tensor = rng.choice(tensors)
            tensor.raw_data = tensor.raw_data[: rng.randrange(len(tensor.raw_data) + 1)] if tensor.raw_data else b""

        def external() -> None:
            tensor = rng.choice(tensors)
            tensor.data_location = TensorProto.EXTERNAL
            del tensor.external_data[:]
            location = rng.choice(["a" * 5000, "/etc/passwd", "../../x.bin", "missing.bin", "", "x\0y", "dir/"])
            tensor.external_data.add(key="location", value=location)
            tensor.external_data.add(key="offset", value=rng.choice(["0", "-4", "9" * 30, "x"]))

        def duplicate() -> None:
            if graph.initializer:
                graph.initializer.append(rng.choice(graph.initializer))

        kinds += [dims, data_type, raw_data, external, duplicate]
    if values:
        def elem_type() -> None:
            rng.choice(values).type.tensor_type.elem_type = rng.choice([0, 8, 40, 99, TensorProto.INT64])

        def value_dims() -> None:
            value = rng.choice(values)
            shape = value.type.tensor_type.shape
            if rng.random() < 0.3:
                for _ in range(rng.choice([1, 1000, 20000])):
                    shape.dim.add().dim_param = f"d{rng.randrange(10**9)}"
            elif shape.dim:
                shape.dim[rng.randrange(len(shape.dim))].dim_value = rng.choice(SPECIAL)
            else:
                shape.dim.add().dim_value = rng.choice(SPECIAL)
            if rng.random() < 0.3:
                value.type.tensor_type.elem_type = TensorProto.INT64
                del shape.dim[1:]

        kinds += [elem_type, value_dims]
    if graph.node:
        def op_type() -> None:
            rng.choice(graph.node).op_type = rng.choice(["Loop", "If", "Scan", "Slice", "Frobnicate", "Concat",
                                                         "Range", "ConstantOfShape", "Reshape", ""])

        def rewire() -> None:
            node = rng.choice(graph.node)
            names = [o for n in graph.node for o in n.output] + [v.name for v in graph.input] + ["ghost", "", "\n"]
            if node.input:
                node.input[rng.randrange(len(node.input))] = rng.choice(names)
            if rng.random() < 0.3 and node.output:
                node.output[0] = rng.choice(names)

        def attribute() -> None:
            node = rng.choice(graph.node)
            if node.attribute and rng.random() < 0.5:
                attr = rng.choice(node.attribute)
                attr.type = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 13])
            else:
                node.attribute.add(name=rng.choice(["body", "axis", "then_branch", "to", "perm"]),
                                   type=rng.choice([1, 2, 3, 5, 7]), i=rng.choice(SPECIAL))

        def nest() -> None:
            # the graph as the then-branch of an If, nested several deep (the else-branch: the graph itself, so
            # the model grows by one graph a level)
            original = onnx.GraphProto()
            original.CopyFrom(model.graph)
            del original.input[:]
            for _ in range(rng.choice([1, 5, 30])):
                inner = onnx.GraphProto()
                inner.CopyFrom(model.graph)
                del inner.input[:]
                cond = onnx.helper.make_tensor("cond_nest", TensorProto.BOOL, [], [True])
                node = onnx.helper.make_node("If", ["cond_nest"], [o.name for o in inner.output],
                                             then_branch=inner, else_branch=original)
                outer = onnx.GraphProto(name="outer", input=model.graph.input, output=model.graph.output,
                                        initializer=[cond], node=[node])
                model.graph.CopyFrom(outer)

        kinds += [op_type, rewire, attribute, nest]

    def opset() -> None:
        model.opset_import[0].version = rng.choice([0, -1, 99, 10**6, 1])
        if rng.random() < 0.3:
            model.opset_import.add(domain=model.opset_import[0].domain, version=3)

    def function() -> None:
        callee = onnx.helper.make_function("local", "F", ["a"], ["b"],
                                           [onnx.helper.make_node("F", ["a"], ["b"], domain="local")],
                                           [onnx.helper.make_opsetid("", 17)])
        model.functions.append(callee)
        model.opset_import.add(domain="local", version=1)
        if graph.node:
            node = rng.choice(graph.node)
            node.op_type, node.domain = "F", "local"

    kinds += [opset, function]
    try:
        rng.choice(kinds)()
    except (DecodeError, ValueError):  # nested past the depth protobuf builds, or a value it refuses to set
        pass
    return model.SerializeToString()


def _utf8(data: bytes, rng: random.Random) -> bytes:
    """Put bytes that are not UTF-8 into a string: a node name, an op type, a tensor name."""
    model = onnx.ModelProto.FromString(data)
    strings = [n.op_type for n in model.graph.node] + [t.name for t in model.graph.initializer] + \
        [n.name for n in model.graph.node if n.name]
    strings = [s for s in strings if len(s) >= 3]
    if not strings:
        return _flip(data, rng)
    target = rng.choice(strings).encode()
    spot = rng.randrange(len(target))
    bad = target[:spot] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"]) + target[spot + 1:]
    return data.replace(b"\x1a" + bytes([len(target)]) + target, b"\x1a" + bytes([len(bad)]) + bad) \
        .replace(b'"' + bytes([len(target)]) + target, b'"' + bytes([len(bad)]) + bad) \
        .replace(b"B" + bytes([len(target)]) + target, b"B" + bytes([len(bad)]) + bad)


MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "byte flip": _flip, "truncation": _truncate, "splice": _splice, "protobuf field": _field, "utf-8": _utf8,
}


def mutate(name: str, kind: str, seed: int) -> bytes:
    """Give the bytes of fixture `name` mutated by `kind` with `seed`: the same arguments, the same bytes."""
    data = (FIXTURES / name).read_bytes()
    return MUTATIONS[kind](data, random.Random(f"{name}/{kind}/{seed}"))


def command(name: str, kind: str, seed: int) -> list[str]:
    """Give the onnxmem arguments a mutated model is run with (most run `report`; some a training step, check)."""
    rng = random.Random(f"{name}/{kind}/{seed}/command")
    choice = rng.random()
    if choice < 0.7:
        return ["report", "--default-dim", "2", "--format", "json"]
    if choice < 0.85:
        return ["report", "--default-dim", "3", "--training"]
    return ["check", "--default-dim", "2", "--memory", "1GB", "--no-what-if"]


# --- running ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    """One run of the CLI on one mutated model."""

    kind: str
    code: int  # the exit code; -N: killed by signal N; None-like 124: over the time limit
    seconds: float
    max_rss_bytes: int
    stderr: str
    timed_out: bool
    over_memory: bool = False  # its peak RSS over the run's RSS limit (see run_cli)

    @property
    def verdict(self) -> str:
        """answer (0, or check's 1), clean error (2, one line, no traceback), or what went wrong."""
        if self.timed_out:
            return "timeout"
        if self.over_memory:
            return "over memory"
        if self.code < 0:
            return "signal"
        if "Traceback" in self.stderr:
            return "traceback"
        if self.code in (0, 1):
            return "answer"
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        if self.code == 2 and "out of memory" in self.stderr:
            return "out of memory"
        if self.code == 2 and len(lines) >= 1 and lines[-1].startswith(("onnxmem: error:", "Error:")):
            return "clean error"
        return "internal error"


def run_cli(model: Path, arguments: list[str], kind: str, timeout: float, memory_bytes: int,
            rss_bytes: int = RSS_LIMIT) -> Outcome:
    """Run `python -m onnxmem` on a model in a subprocess, under a time and an address-space limit, measuring the
    run's own peak RSS (benchmarks.measured_run); a run whose peak is over `rss_bytes` is "over memory"."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = run_measured([sys.executable, "-m", "onnxmem", arguments[0], str(model), *arguments[1:]], timeout,
                       memory_bytes, env, model.parent)
    return Outcome(kind, run.code, run.seconds, run.max_rss_bytes, run.stderr, run.timed_out,
                   run.max_rss_bytes > rss_bytes)


def fuzz_one(name: str, kind: str, seed: int, folder: Path, timeout: float, memory_bytes: int,
             rss_bytes: int = RSS_LIMIT) -> Outcome:
    """Mutate, write (next to a copy of the fixture's external data, where it has some) and run one case."""
    case = folder
    case.mkdir(parents=True)
    data_file = FIXTURES / f"{name}.data"
    if data_file.exists():
        (case / data_file.name).write_bytes(data_file.read_bytes())
    model = case / name
    model.write_bytes(mutate(name, kind, seed))
    return run_cli(model, command(name, kind, seed), kind, timeout, memory_bytes, rss_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutations", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--memory-gib", type=float, default=4.0)
    parser.add_argument("--rss-gib", type=float, default=RSS_LIMIT / 2**30, help="a run's peak RSS past this is a "
                        "finding (over memory)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--show", type=int, default=5, help="failures to print with their stderr")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    cases = [(rng.choice(NAMES), rng.choice(list(MUTATIONS)), rng.randrange(2**32)) for _ in range(args.mutations)]
    memory, rss = int(args.memory_gib * 2**30), int(args.rss_gib * 2**30)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="onnxmem-fuzz-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(lambda case: (case, fuzz_one(*case, Path(tmp) / f"{case[0]}-{case[1]}-{case[2]}",
                                                                 args.timeout, memory, rss)),
                                 cases))
    elapsed = time.perf_counter() - started
    by_kind: dict[str, list[Outcome]] = defaultdict(list)
    for _, outcome in outcomes:
        by_kind[outcome.kind].append(outcome)
    columns = ["answer", "clean error", "internal error", "traceback", "out of memory", "over memory", "timeout",
               "signal"]
    print(f"{len(outcomes)} mutations of the {len(NAMES)} fixtures, seed {args.seed}, {args.jobs} at a time; limits "
          f"{args.timeout:g} s, {args.memory_gib:g} GiB of address space and {args.rss_gib:g} GiB of peak RSS per "
          f"run (each run's own peak: benchmarks/measured_run.py); {elapsed / 60:.1f} min in all\n")
    print("| mutation | runs | " + " | ".join(columns) + " | median s | max s | max RSS MiB |")
    print("|---|" + "---|" * (len(columns) + 4))
    rows = [*sorted(by_kind.items()), ("all", [o for _, o in outcomes])]
    for kind, group in rows:
        counts = Counter(o.verdict for o in group)
        print(f"| {kind} | {len(group)} | " + " | ".join(str(counts.get(c, 0)) for c in columns)
              + f" | {statistics.median(o.seconds for o in group):.2f} | {max(o.seconds for o in group):.2f} | "
              f"{max(o.max_rss_bytes for o in group) / 2**20:.0f} |")
    bad = [(case, o) for case, o in outcomes if o.verdict not in ("answer", "clean error")]
    for case, outcome in bad[: args.show]:
        print(f"\n{outcome.verdict}: mutate{case!r} {command(*case)} exit {outcome.code}: "
              f"{outcome.stderr.strip()[-600:]}")


if __name__ == "__main__":
    main()
