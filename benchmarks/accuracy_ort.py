"""`onnxmem validate` on every fixture: the estimate on onnxruntime's graph and order against its allocations.

    python benchmarks/accuracy_ort.py [--batches 1 8 32] [--levels disable basic extended]
                                      [--set fixtures|held-out|real|real2|real3] [--zoo DIR] [--models NAME ...]
                                      [--provider cpu|cuda]

For each fixture, batch and optimization level: onnxruntime CPU runs the model twice (first run: tensor by
tensor; second run: the memory pattern), activations measured to the byte by the profiler's allocator statistics;
onnxmem estimates on the graph onnxruntime saved, in the order its profile lists. Prints one table with the
differences in bytes, the count of exact agreements, and the weights the arena holds (prepacked) against the rule.

--set real: the models benchmarks/zoo.py built into --zoo DIR (default ~/.cache/onnxmem-zoo), bound at the dims its
zoo.json gives, the batch dim taking each --batches value. Every failure is a row (its exception type in the note)
and the note also counts the warnings of the validation. A second table compares the plain estimate a user gets,
onnxmem.analyze(file, dims, provider="cpu") on the file as exported, with onnxruntime's first run at level disable.
--set real2: the same on the second, held-out zoo benchmarks/zoo2.py built (default ~/.cache/onnxmem-zoo2); --set
real3: on the third, benchmarks/zoo3.py (default ~/.cache/onnxmem-zoo3).
--set fixtures-fp16: the same on the fixtures converted to float16 (keep_io_types), in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxmem  # noqa: E402
from benchmarks.fixture_dims import dims_for, fixture_paths  # noqa: E402
from benchmarks.zoo import DEFAULT_OUT as DEFAULT_ZOO  # noqa: E402
from benchmarks.zoo import INDEX as ZOO_INDEX  # noqa: E402
from benchmarks.zoo2 import DEFAULT_OUT as DEFAULT_ZOO2  # noqa: E402
from benchmarks.zoo3 import DEFAULT_OUT as DEFAULT_ZOO3  # noqa: E402
from onnxmem import (
    MissingExtraError,
    OnnxMemError,  # noqa: E402
)
from onnxmem.measure.validate import Validation, validate  # noqa: E402

HEADERS = ("fixture", "opt level", "batch", "run 1 measured B", "run 1 est-meas", "run 2 measured B",
           "run 2 est-meas", "arena weights B / est-meas", "note")


def main() -> None:
    """Validate the chosen set at every level and batch and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--levels", nargs="+", default=["disable", "basic", "extended"])
    parser.add_argument("--set", choices=("fixtures", "held-out", "real", "real2", "real3", "fixtures-fp16"),
                        default="fixtures",
                        help="the fixtures, models outside them exported here (needs torch 2.13.0), the zoo of "
                             "real exported models benchmarks/zoo.py built, the held-out second or third zoo "
                             "benchmarks/zoo2.py or zoo3.py built, or the fixtures converted to float16 as the "
                             "zoos' fp16 models are (onnxconverter-common's convert_float_to_float16, "
                             "keep_io_types), run as --set real runs a zoo")
    parser.add_argument("--zoo", type=Path, default=None,
                        help=f"--set real/real2/real3: the folder benchmarks/zoo.py, zoo2.py or zoo3.py built "
                             f"(default {DEFAULT_ZOO}, {DEFAULT_ZOO2} or {DEFAULT_ZOO3})")
    parser.add_argument("--models", nargs="+", default=None,
                        help="--set real/real2/real3: only the zoo models of these names (default: all)")
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: onnxruntime-gpu on an NVIDIA GPU (pip install '.[gpu]')")
    args = parser.parse_args()
    if args.set == "fixtures-fp16":
        with tempfile.TemporaryDirectory() as folder:
            args.zoo = fp16_fixture_zoo(Path(folder))
            run_real(args)
        return
    if args.set in ("real", "real2", "real3"):
        if args.zoo is None:
            args.zoo = {"real": DEFAULT_ZOO, "real2": DEFAULT_ZOO2, "real3": DEFAULT_ZOO3}[args.set]
        run_real(args)
        return
    rows: list[tuple[str, ...]] = []
    misses: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        models = fixture_paths() if args.set == "fixtures" else held_out_paths(Path(folder))
        for path in models:
            run_model(path, args, rows, misses)
    total = 2 * sum(1 for r in rows if r[3] != "-")  # two runs per measured row
    exact = total - len(misses)
    print_setting(args.provider)
    print_table(HEADERS, rows)
    print(f"\nexact to the byte: {exact} of {total} runs")
    for miss in misses:
        print(f"- differs: {miss}")


def print_setting(provider: str) -> None:
    """Print the line saying how onnxruntime ran."""
    print("onnxruntime CPU, 1 thread, sequential, arena on, memory pattern on; activations in bytes"
          if provider == "cpu" else
          "onnxruntime CUDA, counting allocator (arena bypassed), memory pattern on; device bytes; run columns: "
          "activations + inputs copied in; weights column: every initializer against what the session holds")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print a markdown table, its columns padded to their widest cell."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")


def held_out_paths(folder: Path) -> list[Path]:
    """Export the training benchmark's held-out and reference models (eval mode, dynamo exporter) into `folder`."""
    import torch

    from benchmarks.accuracy_training import HELD_OUT, REFERENCE, export

    paths = []
    for case in HELD_OUT + REFERENCE:
        torch.manual_seed(0)
        module = case.build()
        module.eval()
        paths.append(export(case, module, folder))
    return paths


def fp16_fixture_zoo(folder: Path) -> Path:
    """Write every fixture converted to float16 (keep_io_types, as zoo.py converts its fp16 models) into `folder`,
    with a zoo index binding the fixture's dims (batch taking --batches), and give the folder."""
    import onnx

    try:
        from onnxconverter_common.float16 import convert_float_to_float16
    except ImportError:
        raise SystemExit("accuracy_ort: --set fixtures-fp16 needs onnxconverter-common "
                         "(pip install onnxconverter-common)") from None
    entries = []
    for path in fixture_paths():
        name = f"{path.stem}-fp16"
        onnx.save(convert_float_to_float16(onnx.load(str(path)), keep_io_types=True), str(folder / f"{name}.onnx"))
        entries.append({"name": name, "file": f"{name}.onnx", "dims": dims_for(path, 1)})
    (folder / ZOO_INDEX).write_text(json.dumps({"models": entries}))
    return folder


def run_model(path: Path, args: argparse.Namespace, rows: list[tuple[str, ...]], misses: list[str]) -> None:
    """Validate one model at every level and batch, adding its rows and its differences."""
    for level in args.levels:
        for batch in args.batches:
            dims = dims_for(path, batch)
            try:
                result = validate(path, dims, opt_level=level, runs=2, provider=args.provider)
            except MissingExtraError as exc:
                raise SystemExit(f"accuracy_ort: {exc}") from None
            except OnnxMemError as exc:
                rows.append((path.stem, level, str(batch), "-", "-", "-", "-", "-", str(exc)[:50]))
                continue
            rows.append(validation_row(path.stem, level, batch, result, misses))


def validation_row(name: str, level: str, batch: int | str, result: Validation, misses: list[str], note: str = "") \
        -> tuple[str, ...]:
    """Give the table row of one validation (its notes on control flow, then `note`); add its differences to
    `misses`."""
    first, steady = result.runs
    for run in result.runs:
        if run.activation_difference_bytes:
            misses.append(f"{name} {level} b{batch} {run.phase}: {run.activation_difference_bytes:+,} B")
    notes = [n for n in result.notes if n.startswith("If")] + ([note] if note else [])
    return (name, level, str(batch), f"{first.measured.peak_activation_bytes:,}",
            f"{first.activation_difference_bytes:+,}", f"{steady.measured.peak_activation_bytes:,}",
            f"{steady.activation_difference_bytes:+,}",
            f"{first.measured.weights_bytes:,} / {first.weights_difference_bytes:+,}", "; ".join(notes))


# ---------------------------------------------------------------------------------------------------------------
# --set real: the zoo of exported models

PLAIN_HEADERS = ("model", "batch", "run 1 measured B (disable)", "plain est B", "plain est-meas B", "plain %",
                 "validate est-meas B", "plain report warnings", "note")


def run_real(args: argparse.Namespace) -> None:
    """Validate every zoo model at every level and batch; print the validation table, the plain-estimate table
    (level disable, run 1) and the count of exact models at each level."""
    zoo = Path(args.zoo).expanduser()
    index = zoo / ZOO_INDEX
    if not index.exists():
        raise SystemExit(f"accuracy_ort: no {index}: build the zoo first (python benchmarks/zoo.py --out {zoo})")
    entries = [e for e in json.loads(index.read_text())["models"] if not args.models or e["name"] in args.models]
    rows: list[tuple[str, ...]] = []
    misses: list[str] = []
    plain_rows: list[tuple[str, ...]] = []
    exact: dict[str, list[int]] = {level: [0, 0, 0] for level in args.levels}  # run 1, run 2, rows
    inexact: dict[str, set[str]] = {level: set() for level in args.levels}  # models with a run that differs
    plain_exact = 0
    started = time.perf_counter()
    for entry in entries:
        path = zoo / entry["file"]
        for batch, dims in zoo_bindings(entry["dims"], args.batches):
            for level in args.levels:
                result = None
                try:
                    result = validate(path, dims, opt_level=level, runs=2, provider=args.provider)
                    rows.append(validation_row(entry["name"], level, batch, result, misses,
                                               warning_counts(result.warnings)))
                    first, steady = result.runs
                    exact[level][0] += first.activation_difference_bytes == 0
                    exact[level][1] += steady.activation_difference_bytes == 0
                    if not result.exact:
                        inexact[level].add(entry["name"])
                except MissingExtraError as exc:
                    raise SystemExit(f"accuracy_ort: {exc}") from None
                except Exception as exc:  # noqa: BLE001 - one model's failure is a row, never the end of the table
                    rows.append((entry["name"], level, batch, "-", "-", "-", "-", "-", failure(exc)))
                    inexact[level].add(entry["name"])
                exact[level][2] += 1
                if level == "disable":
                    row = plain_row(entry["name"], path, batch, dims, result)
                    plain_rows.append(row)
                    plain_exact += row[4] == "+0"
    print_setting(args.provider)
    print(f"zoo: {index} ({len(entries)} models); the batch dim takes each of {args.batches}")
    print_table(("model", *HEADERS[1:]), rows)
    print()
    for level, (first_exact, steady_exact, total) in exact.items():
        print(f"level {level}: run 1 exact {first_exact} of {total}, run 2 exact {steady_exact} of {total}; "
              f"models exact in every run: {len(entries) - len(inexact[level])} of {len(entries)}")
    if plain_rows:
        print("\nThe plain estimate (onnxmem.analyze(file, dims, provider='cpu'): `onnxmem report --provider cpu` on "
              "the file as exported) against "
              "onnxruntime's first run at level disable")
        print_table(PLAIN_HEADERS, plain_rows)
        print(f"\nplain estimate exact to the byte: {plain_exact} of {len(plain_rows)}")
        print_largest_misses(plain_rows)
    else:
        print("\n(no plain-estimate table: it compares with level disable; add it to --levels)")
    print(f"\n{time.perf_counter() - started:.0f} s")


def zoo_bindings(dims: dict[str, int], batches: Sequence[int]) -> list[tuple[str, dict[str, int]]]:
    """Give (batch, dims) for each batch: zoo.json's dims with the batch dim set to it (once, batch "-", where
    there is none)."""
    if "batch" not in dims:
        return [("-", dict(dims))]
    return [(str(batch), {**dims, "batch": batch}) for batch in batches]


def plain_row(name: str, path: Path, batch: str, dims: dict[str, int], result: Validation | None) \
        -> tuple[str, ...]:
    """Give the plain-estimate row: analyze's peak on the file against onnxruntime's first run at level disable."""
    if result is None:
        return (name, str(batch), "-", "-", "-", "-", "-", "-", "validation failed (see the table above)")
    first = result.runs[0]
    measured = first.measured.peak_activation_bytes
    try:
        report = onnxmem.analyze(path, dims, provider="cpu")  # the plain report, as `report --provider cpu`
    except Exception as exc:  # noqa: BLE001 - one model's failure is a row, never the end of the table
        return (name, str(batch), f"{measured:,}", "-", "-", "-", f"{first.activation_difference_bytes:+,}", "-",
                failure(exc))
    estimate = report.inference.peak_activation_bytes
    difference = estimate - measured
    percent = f"{100 * difference / measured:+.1f}%" if measured else "-"
    return (name, str(batch), f"{measured:,}", f"{estimate:,}", f"{difference:+,}", percent,
            f"{first.activation_difference_bytes:+,}", warning_counts(report.warnings) or "-", "")


def print_largest_misses(plain_rows: Sequence[tuple[str, ...]], count: int = 10) -> None:
    """Print the plain-estimate rows furthest from the measurement, by percent."""
    def size(row: tuple[str, ...]) -> float:
        return abs(float(row[5].rstrip("%"))) if row[5] not in ("-", "") else -1.0

    worst = sorted((r for r in plain_rows if size(r) > 0), key=size, reverse=True)[:count]
    if worst:
        print("\nlargest plain misses:")
    for row in worst:
        print(f"- {row[0]} b{row[1]}: {row[4]} B ({row[5]}); warnings: {row[7]}")


def warning_counts(warnings: Sequence[onnxmem.Warning]) -> str:
    """Give the warnings' codes with their counts, most frequent first ("unknown-shape x12, default-dim")."""
    counts = Counter(w.code for w in warnings)
    return ", ".join(code if n == 1 else f"{code} x{n}" for code, n in counts.most_common())


def failure(exc: BaseException) -> str:
    """Give the note of a failure: the exception's type and the start of its first line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:70] if lines else ''}".rstrip(": ")


if __name__ == "__main__":
    main()
