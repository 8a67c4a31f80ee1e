"""Every answer of the CLI written to files, and two such sets compared: a change that only moves code must leave
every report, fit, check, validate estimate and what-if byte-identical.

    python benchmarks/identical.py write OUT_DIR [--checkout DIR] [--zoo DIR ...] [--quick]
    python benchmarks/identical.py compare BEFORE_DIR AFTER_DIR

`write` runs each case below in this process through the click command (as `onnxmem ...` runs it) and writes its
stdout and exit code to OUT_DIR/<case>.txt. --checkout DIR takes onnxmem from another checkout (e.g. a
`git worktree` of the commit before a change), so both sets come from this one script; the cases are command lines
only, the same before and after. The cases, per fixture (fixtures/*.onnx, its dims from fixture_dims.dims_for at
batch 8): the report as JSON with its timeline on both providers and every order, the table, the training step on
both devices under each precision, optimizer and option the CLI offers (checkpoint, accumulation, freezing), fit
and check on both runtimes with and without training, and validate's estimate (its measured fields are dropped:
they are the runtime's, not ours). --zoo DIR adds the real models a zoo script cached in DIR (its zoo.json dims):
the reports on both providers and the training step on both devices. --quick: the first four fixtures only.

`compare` prints one table: the cases identical, different and missing on either side, and names the different.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tables import markdown_table  # noqa: E402

# Fields of validate's JSON that the runtime measured (and its wall time): not ours, so not compared.
_MEASURED_KEYS = frozenset({"measured", "measurements", "runs", "seconds", "wall_seconds", "elapsed_s",
                            "onnxruntime_version", "version"})

_TRAINING_CASES: dict[str, list[str]] = {
    "train-cuda": ["--training"],
    "train-cuda-sgd-amp16": ["--training", "--optimizer", "sgd-momentum", "--precision", "amp-fp16"],
    "train-cuda-bf16-ckpt": ["--training", "--precision", "bf16", "--checkpoint", "auto"],
    "train-cpu": ["--training", "--device", "cpu"],
    "train-cpu-sgd": ["--training", "--device", "cpu", "--optimizer", "sgd"],
    "train-cpu-ampbf16": ["--training", "--device", "cpu", "--precision", "amp-bf16"],
    "train-cpu-threads": ["--training", "--device", "cpu", "--cpu-threads", "4", "--cpu-isa", "avx2"],
    "train-cpu-ckpt2-accum": ["--training", "--device", "cpu", "--checkpoint", "2", "--grad-accum", "2"],
    "train-cpu-freeze": ["--training", "--device", "cpu", "--freeze", "*weight*", "--optimizer", "adam"],
}


def _dim_args(dims: dict[str, int]) -> list[str]:
    return [a for name, value in sorted(dims.items()) for a in ("--dim", f"{name}={value}")]


def cases(models: list[tuple[str, Path, dict[str, int]]], full: list[bool]) -> Iterator[tuple[str, list[str]]]:
    """Give (case name, command line) for every model: (name, path, dims), full: the fixtures' whole set."""
    for (name, path, dims), whole in zip(models, full, strict=True):
        model, bound = str(path), _dim_args(dims)
        for provider in ("cpu", "cuda"):
            yield f"{name}.report-{provider}", ["report", model, *bound, "--provider", provider, "--format",
                                                 "json", "--timeline", "--top", "50"]
        yield f"{name}.table", ["report", model, *bound, "--top", "5"]
        trainings = _TRAINING_CASES if whole else {k: _TRAINING_CASES[k] for k in ("train-cuda", "train-cpu")}
        for case, flags in trainings.items():
            yield f"{name}.{case}", ["report", model, *bound, *flags, "--format", "json", "--timeline"]
        if not whole:
            continue
        for order in ("model", "memory", "topological"):
            yield f"{name}.order-{order}", ["report", model, *bound, "--order", order, "--provider", "cpu",
                                            "--format", "json"]
        yield f"{name}.markdown", ["report", model, *bound, "--format", "markdown", "--training"]
        others = [a for n, v in sorted(dims.items()) if n != "batch" for a in ("--dim", f"{n}={v}")]
        if "batch" in dims:
            for runtime in ("onnxruntime", "pytorch"):
                yield f"{name}.fit-{runtime}", ["fit", model, *others, "--memory", "3GiB", "--runtime", runtime,
                                                "--format", "json"]
            yield f"{name}.fit-train", ["fit", model, *others, "--memory", "6GiB", "--training", "--format", "json"]
            yield f"{name}.fit-train-cpu", ["fit", model, *others, "--memory", "6GiB", "--training", "--device",
                                            "cpu", "--provider", "cpu", "--format", "json"]
        for runtime in ("onnxruntime", "pytorch"):
            yield f"{name}.check-{runtime}", ["check", model, *bound, "--budget", "1GiB", "--runtime", runtime,
                                              "--format", "json"]
        yield f"{name}.check-reserve", ["check", model, *bound, "--budget", "300MiB", "--reserve", "16MiB",
                                        "--training", "--format", "json"]
        yield f"{name}.check-train-zero", ["check", model, *bound, "--budget", "1GiB", "--training", "--gpus", "4",
                                           "--shard", "zero2", "--format", "json"]
        for level in ("disable", "all"):
            yield f"{name}.validate-{level}", ["validate", model, *bound, "--opt-level", level, "--format", "json"]


def _scrub(text: str) -> str:
    """Give validate's JSON without the fields the runtime measured (anything else as it is)."""
    try:
        document = json.loads(text)
    except ValueError:
        return text

    def drop(value: object) -> object:
        if isinstance(value, dict):
            return {k: drop(v) for k, v in value.items() if k not in _MEASURED_KEYS and "measured" not in k}
        if isinstance(value, list):
            return [drop(v) for v in value]
        return value

    return json.dumps(drop(document), indent=1, sort_keys=True)


def write(out: Path, zoos: list[Path], quick: bool) -> None:
    """Run every case and write its output to OUT (one file each)."""
    from click.testing import CliRunner
    from fixture_dims import dims_for, fixture_paths

    from onnxmem.cli import main

    out.mkdir(parents=True, exist_ok=True)
    models = [(p.stem, p, dims_for(p, 8)) for p in fixture_paths()]
    if quick:
        models = models[:4]
    full = [True] * len(models)
    for zoo in zoos:
        listing = json.loads((zoo / "zoo.json").read_text())
        for entry in listing["models"] if isinstance(listing, dict) else listing:
            models.append((f"{zoo.name}-{entry['name']}", zoo / entry["file"], dict(entry["dims"])))
            full.append(False)
    runner = CliRunner()
    count = 0
    for name, args in cases(models, full):
        with contextlib.redirect_stderr(io.StringIO()):
            result = runner.invoke(main, args, catch_exceptions=True)
        text = result.stdout
        if args[0] == "validate":
            text = _scrub(text)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            text += f"\nEXCEPTION {type(result.exception).__name__}: {result.exception}\n"
        (out / f"{name}.txt").write_text(f"exit {result.exit_code}\n{text}")
        count += 1
    print(f"{count} cases written to {out}")


def compare(before: Path, after: Path) -> int:
    """Print the table of identical, different and missing cases; give the number not identical."""
    names_before = {p.name for p in before.glob("*.txt")}
    names_after = {p.name for p in after.glob("*.txt")}
    both = sorted(names_before & names_after)
    different = [n for n in both if (before / n).read_bytes() != (after / n).read_bytes()]
    rows = [["identical", str(len(both) - len(different))], ["different", str(len(different))],
            ["only before", str(len(names_before - names_after))], ["only after", str(len(names_after - names_before))]]
    print(markdown_table(["cases", "count"], rows))
    for name in different[:40]:
        print(f"  different: {name[:-4]}")
    return len(different) + len(names_before ^ names_after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("out", type=Path)
    w.add_argument("--checkout", type=Path, default=None)
    w.add_argument("--zoo", type=Path, action="append", default=[])
    w.add_argument("--quick", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "compare":
        sys.exit(1 if compare(args.before, args.after) else 0)
    if args.checkout is not None:
        sys.path.insert(0, str(args.checkout.resolve()))
        import onnxmem

        if not Path(onnxmem.__file__).resolve().is_relative_to(args.checkout.resolve()):
            sys.exit(f"onnxmem comes from {onnxmem.__file__}, not from {args.checkout}")
    write(args.out, args.zoo, args.quick)


if __name__ == "__main__":
    main()
