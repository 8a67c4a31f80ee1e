"""Score the current onnxmem against every committed CUDA row, without a GPU.

    python benchmarks/cuda/score.py [ROWS ...] [--recorded] [--exports DIR_OR_ZIP ...]

ROWS: rows files or folders of *.jsonl (default benchmarks/results/cuda). For each training row measured on a GPU,
onnxmem's first-step and later-step peaks are estimated again from the graph-only export that came back
(exports.zip or *.onnx beside the rows), with the options of the row; --recorded (or a missing export) uses the
estimate computed on the GPU machine during the run. Printed: ours against torch.cuda.max_memory_allocated and
against max_memory_reserved (both above what the libraries' warm-up left allocated), and PyTorch's MemTracker
beside; then the context, fit and onnxruntime rows.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.cuda.common import ROOT, fmt_bytes, read_rows, table  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "cuda"


def by_time(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give the rows in the order they were measured (their "time", UTC ISO text; rows without one first, each set
    in the order read): the row files sort by name, and the first window's file (no -partN) sorts after the later
    windows' files."""
    return sorted(rows, key=lambda row: str(row.get("time") or ""))


def latest_by_key(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Give the latest row of each key by its "time" (a later window's row replaces an earlier one, whichever file
    holds it), errors included; an error row does not replace a measured one."""
    latest: dict[str, dict[str, Any]] = {}
    for row in by_time(rows):
        key = row.get("key")
        if key and (row.get("error") is None or key not in latest or latest[key].get("error") is not None):
            latest[str(key)] = row
    return latest


def measured(row: dict[str, Any]) -> dict[str, int | None]:
    """Give a training row's measured peaks above what was allocated before the model (the libraries' warm-up
    leftovers): first step and later steps, allocated and reserved."""
    base = row.get("before_model") or {}
    steps = row.get("steps") or []

    def above(value: Any, floor: Any) -> int | None:
        return int(value - (floor or 0)) if isinstance(value, (int, float)) else None

    later = [s for s in steps[1:] if s.get("peak_allocated") is not None]
    later_reserved = [s for s in steps[1:] if s.get("peak_reserved") is not None]
    return {
        "first_allocated": above(steps[0].get("peak_allocated"), base.get("allocated")) if steps else None,
        "first_reserved": above(steps[0].get("peak_reserved"), base.get("reserved")) if steps else None,
        "later_allocated": above(max(s["peak_allocated"] for s in later), base.get("allocated")) if later else None,
        "later_reserved": above(max(s["peak_reserved"] for s in later_reserved), base.get("reserved"))
        if later_reserved else None,
    }


def find_exports(paths: list[Path], extra: list[Path]) -> dict[str, Path]:
    """Give the export files by name: *.onnx in the folders given, and the members of exports.zip archives
    (extracted to a temporary folder)."""
    found: dict[str, Path] = {}
    folder = Path(tempfile.mkdtemp(prefix="cuda-score-"))
    for path in [*paths, *extra]:
        candidates = [path] if path.is_file() else list(path.rglob("*")) if path.is_dir() else []
        for candidate in candidates:
            if candidate.suffix == ".onnx":
                found.setdefault(candidate.name, candidate)
            elif candidate.suffix == ".zip":
                with zipfile.ZipFile(candidate) as archive:
                    for name in archive.namelist():
                        if name.endswith(".onnx") and name not in found:
                            archive.extract(name, folder)
                            found[name] = folder / name
    return found


def estimate_now(export: Path, row: dict[str, Any]) -> dict[str, Any]:
    """Give the current onnxmem's estimate of a training row from its export (the row's options)."""
    import onnxmem
    from benchmarks.cuda.measure import estimate_fields, training_options

    train = tuple(row.get("train") or ())
    report = onnxmem.analyze(str(export), row.get("dims") or {"batch": row.get("batch")},
                             training=training_options(onnxmem, "cuda", row["optimizer"], row["precision"], train),
                             provider="cuda")
    return estimate_fields(report)


def error(ours: Any, truth: Any) -> str:
    """Give ours against the truth as a signed percentage ('-' when either is missing)."""
    if not isinstance(ours, (int, float)) or not isinstance(truth, (int, float)) or truth <= 0:
        return "-"
    return f"{100.0 * (ours - truth) / truth:+.1f}%"


def memtracker_peak(latest: dict[str, dict[str, Any]], row: dict[str, Any], mode: str) -> Any:
    """Give MemTracker's first-step total peak (real) or its two-step peak (fake) for a training row's model,
    optimizer and precision, where measured."""
    tracker = latest.get(f"memtracker/{row.get('model')}/{row.get('optimizer')}/{row.get('precision')}/{mode}")
    if not tracker or tracker.get("error") is not None or row.get("variant") != "full":
        return None
    peak = (tracker.get("first") or {}).get("tracker_peak") if mode == "real" else tracker.get("tracker_peak")
    totals = [per.get("Total") for per in (peak or {}).values() if isinstance(per, dict)]
    totals = [t for t in totals if isinstance(t, int)]
    return max(totals) if totals else None


def training_table(latest: dict[str, dict[str, Any]], exports: dict[str, Path], recorded: bool) -> list[tuple]:
    """Give one line per measured training row: the truth, ours (now or recorded) and MemTracker beside."""
    lines = []
    for key, row in sorted(latest.items()):
        if row.get("kind") != "training" or row.get("error") is not None:
            continue
        truth = measured(row)
        if truth["first_allocated"] is None:
            continue  # a dry run on the CPU: nothing measured
        model, variant = row.get("model"), row.get("variant")
        export = exports.get(f"{model}.{'lora' if variant == 'lora' else 'full'}.onnx")
        source = "recorded"
        ours: dict[str, Any] | None = None
        if export is not None and not recorded:
            try:
                ours, source = estimate_now(export, row), "now"
            except Exception as failure:  # noqa: BLE001 - a failing estimate is a line, not the end
                ours, source = None, f"failed: {str(failure)[:40]}"
        if ours is None:
            estimate = latest.get(key.replace("training/", "estimate/", 1))
            ours = estimate if estimate and estimate.get("error") is None else None
            source = source if ours is None and source != "recorded" else "recorded" if ours else "none"
        first = ((ours or {}).get("first_step") or {}).get("peak_bytes")
        later = ((ours or {}).get("later_step") or {}).get("peak_bytes")
        real, fake = memtracker_peak(latest, row, "real"), memtracker_peak(latest, row, "fake")
        lines.append((model, variant, row.get("optimizer"), row.get("precision"), row.get("batch"),
                      fmt_bytes(truth["first_allocated"]), fmt_bytes(truth["first_reserved"]), fmt_bytes(first),
                      error(first, truth["first_allocated"]), error(first, truth["first_reserved"]),
                      error(later, truth["later_allocated"]), error(real, truth["first_allocated"]),
                      error(fake, truth["first_allocated"]), source, row.get("family") or "-"))
    return lines


# the models whose rows were read while the CUDA rules were written (the attention backends, the convolution note):
# the rest are held out, scored only (models.NEW_SPECS too: qwen2, whisper, efficientnet_b0, swin_tiny, densenet121,
# phi3 and distilbert, measured first after the rules; no rule is to be written from their rows)
RULES_WRITTEN_ON = frozenset({"tiny_cnn", "resnet18", "bert", "gpt2", "llama_gqa", "t5"})


def summary_lines(lines: list[tuple]) -> list[tuple]:
    """Give the mean and worst error of ours against max_memory_allocated (and MemTracker's, where it ran), per set
    (rules written on / held out), family (CNN / transformer), variant (full / frozen+lora) and precision (fp32 /
    amp)."""

    def pct(text: Any) -> float | None:
        return float(str(text).rstrip("%")) if isinstance(text, str) and text.endswith("%") else None

    groups: dict[tuple[str, str, str, str], list[tuple[float, float | None]]] = {}
    for line in lines:
        model, variant, precision, ours, tracker = line[0], line[1], line[3], pct(line[8]), pct(line[11])
        if ours is None or line[13] != "now":  # a recorded estimate is the GPU run's code, not the current one
            continue
        family = "CNN" if str(line[14]).startswith("cnn") else "transformer"
        key = ("rules written on" if model in RULES_WRITTEN_ON else "held out", family,
               "full" if variant == "full" else "frozen/lora", "fp32" if precision == "fp32" else "amp")
        groups.setdefault(key, []).append((ours, tracker))
    out = []
    for key in sorted(groups):
        errors = [e for e, _ in groups[key]]
        trackers = [t for _, t in groups[key] if t is not None]
        worst = max(errors, key=abs)
        out.append((*key, len(errors), f"{sum(abs(e) for e in errors) / len(errors):.1f}%", f"{worst:+.1f}%",
                    f"{sum(abs(t) for t in trackers) / len(trackers):.1f}% ({len(trackers)})" if trackers else "-"))
    return out


def other_lines(latest: dict[str, dict[str, Any]]) -> list[str]:
    """Give one line per context, fit and onnxruntime row (and per failed row)."""
    lines = []
    for key, row in sorted(latest.items()):
        kind = row.get("kind")
        if row.get("error") is not None and kind not in ("campaign", "summary"):
            lines.append(f"{key}: {row.get('error_kind')}: {str(row.get('error'))[:90]}")
        elif kind == "context":
            deltas = ", ".join(f"{k} {fmt_bytes(v)} MiB" for k, v in (row.get("nvml_delta") or {}).items())
            lines.append(f"{key}: NVML used grew by {deltas or '- (no NVML)'}")
        elif kind == "fit":
            if "max_value" in row:
                lines.append(f"{key}: batch {row.get('max_value')} for {fmt_bytes(row.get('budget_bytes'))} MiB")
            elif "expected" not in row:
                lines.append(f"{key}: {row.get('note', '-')}")
            else:
                lines.append(f"{key}: batch {row.get('batch')} ran={row.get('ran')} oom={row.get('oom')} "
                             f"(expected {row.get('expected')})")
        elif kind == "ort" and "runs" in row:
            runs = row.get("runs") or []
            diffs = [r.get("activation_difference_bytes") for r in runs if isinstance(r, dict)]
            lines.append(f"{key}: exact={row.get('exact')} activation differences {diffs}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the scores; give the exit status (0, also with no rows yet)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="*", type=Path, default=[RESULTS])
    parser.add_argument("--recorded", action="store_true", help="use the estimates recorded on the GPU machine")
    parser.add_argument("--exports", nargs="*", type=Path, default=[])
    args = parser.parse_args(argv)
    rows = [r for r in read_rows(args.rows) if r.get("schema", "").startswith("onnxmem.cuda-campaign/")]
    if not rows:
        print(f"no CUDA rows yet in {', '.join(str(p) for p in args.rows)}: run benchmarks/cuda/run_on_gpu.sh on "
              "a GPU machine and commit its rows.jsonl there")
        return 0
    latest = latest_by_key(rows)
    exports = {} if args.recorded else find_exports([p for p in args.rows], args.exports)
    envs = [r for r in rows if r.get("kind") == "env" and r.get("error") is None]
    for env in envs[-3:]:
        print(f"env: {env.get('gpu') or 'no GPU'}, torch {(env.get('versions') or {}).get('torch')}, CUDA "
              f"{env.get('torch_cuda')}, {env.get('nvidia_smi')}")
    lines = training_table(latest, exports, args.recorded)
    if lines:
        print("\ntraining: MiB above the warm-up's leftovers; ours = onnxmem's peak (first step; later step against "
              "steps 2-3)")
        print(table(("model", "variant", "opt", "precision", "batch", "alloc", "reserved", "ours", "vs alloc",
                     "vs reserved", "later vs alloc", "MemTracker", "MemTracker fake", "estimate", "family"), lines))
        print("\ntraining summary: ours (estimated now, from the rows' exports) against max_memory_allocated, first "
              "step (mean of |error|, worst)")
        print(table(("set", "family", "variant", "precision", "rows", "mean", "worst", "MemTracker mean (rows)"),
                    summary_lines(lines)))
    else:
        print("\ntraining: no row measured on a GPU yet")
    others = other_lines(latest)
    if others:
        print("\n" + "\n".join(others))
    return 0


if __name__ == "__main__":
    sys.exit(main())
