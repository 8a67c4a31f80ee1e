"""The CUDA truth campaign's driver: every measurement of one GPU window, in one command, inside a time budget.

    python benchmarks/cuda/campaign.py --out DIR [--parts singleop,context,training,fit,ort,memtracker,estimate]
        [--budget-s 450] [--dry-run] [--device cuda|cpu] [--models NAME ...] [--skip-done FILE ...]
        [--cpu-workers N] [--ort-bundle DIR]

Each case (a part and a model) runs in a fresh Python process with its own timeout: a hung or crashed case is a
row with its error, never the end of the campaign. The GPU lane runs one case at a time in the order of
common.PARTS (the most valuable data first); the CPU lane (exports and onnxmem's estimates, no GPU) runs in a pool
of workers beside it. No case starts when less than its minimum is left of the budget. Rows go to DIR/rows.jsonl
as they are made (flush + fsync); small graph-only exports to DIR/exports.zip; a short table is printed last.

The ORT part needs onnxruntime-gpu, which the GPU machine lacks: --ort-bundle (default .ortgpu, ignored by git
through .git/info/exclude) holds the bundle that shared/tools/ort-gpu/ort_bundle.py makes (about 45 MB) with
ort_rebuild.py copied beside it; the run carries it (the device tool's carry: [".ortgpu"]) and the campaign rebuilds
it in the CPU lane from the start. Without it the ORT rows say why they were skipped.

The singleop part (benchmarks/cuda/singleops.py) measures one operator at a time; its "models" are its groups
(--parts singleop --models sdpa allocator), each a case with its own seconds; it comes first while its rows are
not committed.

--skip-done reads earlier rows (files or folders of *.jsonl, e.g. benchmarks/results/cuda) and skips what they
measured, so that several short GPU windows each add new data. --dry-run --device cpu runs the same code paths on
the CPU at the smallest sizes (tests/test_cuda_campaign.py runs it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.cuda.common import (  # noqa: E402
    PARTS,
    ROOT,
    Budget,
    Case,
    RowWriter,
    case_command,
    done_keys,
    estimator_fingerprint,
    fmt_bytes,
    kill_active,
    make_row,
    order_cases,
    outcome_row,
    pending_cases,
    read_rows,
    run_child,
    table,
)

# the models of each part, in the order they run (varied families first; the tiny CNN, an exact reference, last;
# then the held-out architectures added after the 2026-11-27 window, most valuable first: models.NEW_SPECS)
TRAINING_MODELS = ("resnet18", "vit_small", "bert", "gpt2", "llama_gqa", "mixtral_moe", "t5", "wav2vec2",
                   "mobilenet_v3_small", "convnext_atto", "tiny_cnn",
                   "qwen2", "whisper", "efficientnet_b0", "swin_tiny", "densenet121", "phi3", "distilbert")
FIT_MODELS = ("resnet18", "gpt2", "llama_gqa", "vit_small")  # the last two: held out from the allowance
MEMTRACKER_MODELS = ("resnet18", "gpt2", "llama_gqa", "bert", "vit_small", "t5", "mixtral_moe", "wav2vec2",
                     "mobilenet_v3_small", "convnext_atto", "tiny_cnn")
# (then CNNs whose convolutions onnxruntime-gpu's cuDNN workspaces were not measured on: depthwise, squeeze-excitation,
# a timm ConvNeXt's 7x7 depthwise and LayerNorm)
ORT_MODELS = ("tiny_cnn", "resnet18", "bert", "mobilenet_v3_small", "efficientnet_b0", "convnext_atto")
DEFAULT_BUNDLE = ROOT / ".ortgpu"


def _keys(part: str, model: str) -> tuple[str, ...]:
    """Give the row keys a case makes (measure.py's key functions, without importing torch)."""
    from benchmarks.cuda.measure import (
        CONFIGS,
        LIBRARIES,
        MEMTRACKER_CONFIGS,
        OPT_LEVELS,
        ORT_BATCHES,
        estimate_key,
        export_key,
        training_key,
    )

    if part == "context":
        return (f"context/{model}",) if model in LIBRARIES else ()
    if part == "training":
        return tuple(training_key(model, *c) for c in CONFIGS)
    if part == "estimate":
        return (export_key(model, "full"), export_key(model, "lora"),
                *(estimate_key(model, *c) for c in CONFIGS))
    if part == "memtracker":
        return tuple(f"memtracker/{model}/{o}/{p}/{m}" for _, o, p in MEMTRACKER_CONFIGS for m in ("real", "fake"))
    if part == "fit":
        return tuple(f"fit/{model}/{label}" for label in ("answer", "at-answer", "above-answer", "defaults",
                                                                 "measured-max"))
    if part == "ort":
        return tuple(f"ort/{model}/{level}/{run}" for level in OPT_LEVELS
                     for run in (*(f"b{batch}" for batch in ORT_BATCHES), "optimized"))
    if part == "selftest":
        return (f"selftest/{model}",)
    if part == "singleop":
        from benchmarks.cuda import singleops

        return singleops.keys(model) if model in singleops.GROUP_NAMES else ()
    return ()


def plan_cases(parts: list[str], models: list[str] | None, dry_run: bool) -> list[Case]:
    """Give every case of the parts asked for, in the campaign's order, with their timeouts and minimums."""
    from benchmarks.cuda.measure import LIBRARIES

    def chosen(default: tuple[str, ...]) -> list[str]:
        return list(default) if models is None else list(models)

    scale = 0.5 if dry_run else 1.0
    cases: list[Case] = []
    for part in parts:
        if part == "singleop":
            from benchmarks.cuda import singleops

            # a group stops starting configurations after its seconds; the timeout adds the process start and
            # the last configuration's own time
            cases += [Case(part, g.name, singleops.keys(g.name, dry_run), g.seconds + 30, 10 * scale,
                           args={"seconds": g.seconds}) for g in singleops.GROUPS
                      if models is None or g.name in models]
        elif part == "context":
            # the dry run has no libraries to tell apart: "all" takes every code path
            cases += [Case(part, lib, _keys(part, lib), 60, 5 * scale) for lib in LIBRARIES
                      if not dry_run or lib == "all"]
        elif part == "training":
            cases += [Case(part, m, _keys(part, m), 150, 15 * scale) for m in chosen(TRAINING_MODELS)]
        elif part == "fit":
            cases += [Case(part, m, _keys(part, m), 180, 45 * scale) for m in chosen(FIT_MODELS)]
        elif part == "memtracker":
            cases += [Case(part, m, _keys(part, m), 90, 15 * scale) for m in chosen(MEMTRACKER_MODELS)]
        elif part == "ort":
            cases += [Case(part, m, _keys(part, m), 120, 20 * scale) for m in chosen(ORT_MODELS)]
        elif part == "estimate":
            cases += [Case(part, m, _keys(part, m), 300, 30 * scale, lane="cpu") for m in chosen(TRAINING_MODELS)]
        elif part == "selftest":
            # (a hang is cut at 2 s; the others get 15 s: a Python start and its imports on a busy machine)
            cases += [Case(part, m, _keys(part, m), 2 if m == "hang" else 15, 0.5) for m in (models or ("ok",))]
    return order_cases(cases, [*parts])


def git_commit() -> str | None:
    """Give the checkout's commit, if it is a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def nvidia_lib_dirs() -> list[str]:
    """Give the folders of the CUDA 13 and cuDNN libraries that torch's nvidia-* packages installed (for
    onnxruntime-gpu's CUDA provider), without importing torch."""
    found: list[str] = []
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13/lib", "cudnn/lib", "cublas/lib", "cuda_runtime/lib", "curand/lib", "cufft/lib",
                    "cuda_nvrtc/lib", "nvjitlink/lib"):
            folder = Path(base) / sub
            if folder.is_dir():
                found.append(str(folder))
    return found


class Campaign:
    """One run of the campaign: the cases, the budget, the rows file and the two lanes."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work) if args.work else self.out.parent / (self.out.name + ".work")
        self.work.mkdir(parents=True, exist_ok=True)
        self.rows_path = self.out / "rows.jsonl"
        self.writer = RowWriter(self.rows_path)
        self.budget = Budget(args.budget_s, reserve_s=args.reserve_s)
        self.done = done_keys(read_rows(args.skip_done or []))
        self.lock = threading.Lock()
        self.results: list[tuple[Case, str, float]] = []  # case, outcome, seconds
        self.settings = {"device": args.device, "dry_run": args.dry_run, "small": args.dry_run}
        self.ort_env: dict[str, str] | None = None

    def header(self, cases: list[Case], skipped: list[Case]) -> None:
        """Write the campaign row: arguments, versions known without torch, the cases planned."""
        self.writer.write(make_row(
            "campaign", "campaign", args={k: v for k, v in vars(self.args).items()}, python=sys.version.split()[0],
            git_commit=git_commit(), onnxmem_source_sha=estimator_fingerprint(), planned=[c.id for c in cases],
            already_done=[c.id for c in skipped], done_keys=len(self.done), device=self.args.device,
            dry_run=self.args.dry_run))

    def run_case(self, case: Case, env: dict[str, str] | None = None) -> str:
        """Give the outcome of one case run in a fresh process (or skipped for the budget); its rows written."""
        if not self.budget.may_start(case):
            self.writer.write(make_row(case.part, case.id, error=f"not started: {self.budget.left():.0f} s left, "
                                       f"{case.min_s:.0f} s needed", error_kind="budget", model=case.name))
            self._record(case, "budget", 0.0)
            return "budget"
        timeout = self.budget.timeout_for(case)
        before = self._count_rows(case)
        command = case_command(case, self.rows_path, self.work, self.done, self.settings)
        child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                     "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        if case.lane == "cpu":
            child_env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU lane must hold no CUDA context
            child_env.setdefault("OMP_NUM_THREADS", str(self.args.cpu_threads))
        elif self.args.device == "cpu":
            child_env.setdefault("OMP_NUM_THREADS", "1")  # a dry run's tiny steps: threads only contend
        result = run_child(command, timeout, env=child_env, cwd=ROOT)
        made = self._count_rows(case) - before
        failure = outcome_row(case, result, made)
        if failure is not None:
            self.writer.write(failure)
        outcome = "timeout" if result.timed_out else "ok" if result.returncode == 0 else "crashed"
        if outcome == "ok" and made == 0:
            outcome = "no rows"
        self._record(case, outcome, result.seconds)
        print(f"[{self.budget.elapsed():6.1f}s] {case.id:<32} {outcome:<8} {result.seconds:6.1f}s {made:3d} rows",
              flush=True)
        return outcome

    def _record(self, case: Case, outcome: str, seconds: float) -> None:
        with self.lock:
            self.results.append((case, outcome, seconds))

    def _count_rows(self, case: Case) -> int:
        """Give the rows of the case in the rows file (the CPU lane's children write to it at the same time)."""
        return sum(1 for r in read_rows([self.rows_path]) if r.get("case") == case.id)

    def bundle_missing(self) -> str | None:
        """Give why there is no onnxruntime-gpu bundle to rebuild (None: there is one)."""
        bundle = Path(self.args.ort_bundle)
        if (bundle / "index.json").exists() and (bundle / "ort_rebuild.py").exists():
            return None
        return (f"no onnxruntime-gpu bundle at {bundle} (index.json and ort_rebuild.py): make one with "
                "shared/tools/ort-gpu/ort_bundle.py, copy ort_rebuild.py beside it, carry it with the run")

    def rebuild_ort(self) -> str | None:
        """Give why onnxruntime-gpu could not be rebuilt from the bundle into the work folder (None: it was);
        CPU work, run in the CPU lane from the start so that the GPU lane does not wait for it."""
        missing = self.bundle_missing()
        if missing is not None:
            return missing
        bundle = Path(self.args.ort_bundle)
        case = Case("ort", "rebuild", ("ort/rebuild",), 150, 30)
        if not self.budget.may_start(case):
            return f"rebuild not started: {self.budget.left():.0f} s left"
        command = [sys.executable, str(bundle / "ort_rebuild.py"), str(bundle), str(self.work / "ort_site"),
                   "--jobs", str(max(2, (os.cpu_count() or 4) - 4))]
        result = run_child(command, self.budget.timeout_for(case))
        ok = result.returncode == 0 and '"ok": true' in result.tail
        self.writer.write(make_row("ort", "ort/rebuild", error=None if ok else "rebuild failed",
                                   error_kind=None if ok else "failed", seconds=round(result.seconds, 1),
                                   tail=result.tail[-600:]))
        print(f"[{self.budget.elapsed():6.1f}s] {'ort/rebuild':<32} {'ok' if ok else 'failed':<8} "
              f"{result.seconds:6.1f}s", flush=True)
        return None if ok else "onnxruntime-gpu rebuild failed (see the ort/rebuild row)"

    def prepare_ort(self, rebuilt: Future[str | None] | None) -> str | None:
        """Give why the ORT part cannot run (None: the CUDA provider loaded and self.ort_env is set): wait for the
        rebuild, then check the provider list in a fresh process."""
        if self.args.device != "cuda":
            self.ort_env = {}
            return None  # the dry run validates on the CPU provider of the installed onnxruntime
        reason = rebuilt.result() if rebuilt is not None else self.rebuild_ort()
        if reason is not None:
            return reason
        libs = nvidia_lib_dirs()
        paths = [str(self.work / "ort_site"), str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p),
               "LD_LIBRARY_PATH": os.pathsep.join(p for p in [*libs, os.environ.get("LD_LIBRARY_PATH", "")] if p)}
        self.run_case(Case("ort-check", "provider", ("ort/provider",), 60, 5), env)
        provider_rows = [r for r in read_rows([self.rows_path]) if r.get("key") == "ort/provider"]
        if not provider_rows or not provider_rows[-1].get("cuda"):
            return "onnxruntime's CUDAExecutionProvider did not load (see the ort/provider row)"
        self.ort_env = env
        return None

    def run(self) -> int:
        """Run the campaign; give the exit status (0 unless the driver itself failed)."""
        parts = [p for p in self.args.parts.split(",") if p]
        unknown = [p for p in parts if p not in (*PARTS, "selftest")]
        if unknown:
            raise SystemExit(f"unknown parts: {', '.join(unknown)} (choose from {', '.join(PARTS)})")
        cases = plan_cases(parts, self.args.models, self.args.dry_run)
        todo, skipped = pending_cases(cases, self.done)
        self.header(todo, skipped)
        print(f"campaign: {len(todo)} cases to run, {len(skipped)} already done; budget {self.args.budget_s:.0f} s; "
              f"rows -> {self.rows_path}", flush=True)
        if "selftest" not in parts or len(parts) > 1:
            self.run_case(Case("env", "env", ("env",), 60, 2))
        gpu = [c for c in todo if c.lane == "gpu"]
        cpu = [c for c in todo if c.lane == "cpu"]
        pool = ThreadPoolExecutor(max_workers=max(1, self.args.cpu_workers))
        futures: list[Future[str]] = []
        rebuilt: Future[str | None] | None = None
        if self.args.device == "cuda" and any(c.part == "ort" for c in gpu) and self.bundle_missing() is None:
            rebuilt = pool.submit(self.rebuild_ort)  # first in the CPU lane: ready when the ORT part starts
        if self.args.cpu_workers > 0:
            futures = [pool.submit(self._cpu_case, c) for c in cpu]
        ort_reason: str | None = None
        ort_prepared = False
        for case in gpu:
            if case.part == "ort":
                if not ort_prepared:
                    ort_reason, ort_prepared = self.prepare_ort(rebuilt), True
                if ort_reason is not None:
                    self.writer.write(make_row("ort", case.id, error=ort_reason, error_kind="skipped",
                                               model=case.name))
                    self._record(case, "skipped", 0.0)
                    continue
                self.run_case(case, self.ort_env)
                continue
            self.run_case(case)
        if self.args.cpu_workers <= 0:
            for case in cpu:
                self._cpu_case(case)
        for future in futures:
            future.result()
        pool.shutdown()
        self.pack_exports()
        self.summary()
        return 0

    def _cpu_case(self, case: Case) -> str:
        outcome = self.run_case(case)
        self.pack_exports()
        return outcome

    def pack_exports(self) -> None:
        """Add the small exports made so far to DIR/exports.zip (one file: the device tool returns 8 at most)."""
        folder = self.work / "exports"
        if not folder.is_dir():
            return
        with self.lock:
            target = self.out / "exports.zip"
            names = set()
            if target.exists():
                try:
                    with zipfile.ZipFile(target) as archive:
                        names = set(archive.namelist())
                except zipfile.BadZipFile:
                    target.unlink()
            new = [p for p in sorted(folder.glob("*.onnx")) if p.name not in names]
            if not new:
                return
            with zipfile.ZipFile(target, "a", compression=zipfile.ZIP_DEFLATED) as archive:
                for path in new:
                    archive.write(path, path.name)

    def summary(self) -> None:
        """Write the summary row and print the short table (the device tool keeps the output's last 12,000
        characters)."""
        rows = read_rows([self.rows_path])
        outcomes: dict[str, int] = {}
        for _, outcome, _ in self.results:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        self.writer.write(make_row("summary", "summary", outcomes=outcomes, elapsed_s=round(self.budget.elapsed(), 1),
                                   rows=len(rows)))
        print()
        print(render_table(rows))
        print(f"\ncases: {outcomes}; {len(rows)} rows; {self.budget.elapsed():.0f} s of {self.args.budget_s:.0f} s",
              flush=True)


def _first_peak(row: dict[str, Any]) -> Any:
    steps = row.get("steps") or []
    return steps[0].get("peak_allocated") if steps else None


def render_table(rows: list[dict[str, Any]]) -> str:
    """Give the campaign's short table: one line per part/model with its counts and a headline figure."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        kind = str(row.get("kind"))
        if kind in ("campaign", "summary"):
            continue
        model = str(row.get("model") or row.get("library") or row.get("group") or row.get("key", "").split("/")[-1])
        group = groups.setdefault((kind, model), {"ok": 0, "err": 0, "note": ""})
        if row.get("error") is None:
            group["ok"] += 1
        else:
            group["err"] += 1
            group["note"] = str(row.get("error_kind") or "") + ": " + str(row.get("error"))[:50].replace("\n", " ")
            continue
        if kind == "training" and row.get("variant") == "full" and row.get("optimizer") == "adamw" \
                and row.get("precision") == "fp32":
            group["note"] = f"adamw fp32 step1 peak {fmt_bytes(_first_peak(row))} MiB"
        elif kind == "context" and row.get("library") == "all":
            deltas = row.get("nvml_delta") or {}
            group["note"] = "NVML MiB: " + " ".join(f"{k} +{fmt_bytes(v)}" for k, v in deltas.items()) \
                if deltas else "no NVML"
        elif kind == "fit":
            label = str(row.get("key")).rsplit("/", 1)[-1]
            if row.get("expected"):
                ended = "ran" if row.get("ran") else "oom" if row.get("oom") else "?"
                group["note"] += f" {row.get('batch')}: {ended};"
            else:
                group["note"] += f" {label} {row.get('max_value')};"
        elif kind == "env":
            group["note"] = f"{row.get('gpu') or 'no GPU'} torch {(row.get('versions') or {}).get('torch')}"
    lines = [(kind, model, g["ok"], g["err"], g["note"][:70]) for (kind, model), g in groups.items()]
    return table(("part", "model", "ok", "errors", "note"), lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Give the command line's arguments."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the folder of rows.jsonl and exports.zip")
    parser.add_argument("--work", default=None, help="scratch folder (default: OUT.work beside OUT)")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--budget-s", type=float, default=450.0)
    parser.add_argument("--reserve-s", type=float, default=10.0, help="kept back from the budget for the end")
    parser.add_argument("--dry-run", action="store_true", help="the smallest sizes (with --device cpu: no GPU)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--skip-done", nargs="*", default=[], help="rows files or folders already measured")
    parser.add_argument("--cpu-workers", type=int, default=None,
                        help="processes of the CPU lane beside the GPU lane (0: after it, in this thread)")
    parser.add_argument("--cpu-threads", type=int, default=2, help="torch threads of each CPU-lane process")
    parser.add_argument("--ort-bundle", default=str(DEFAULT_BUNDLE))
    args = parser.parse_args(argv)
    if args.cpu_workers is None:
        args.cpu_workers = 1 if args.dry_run else max(1, min(4, (os.cpu_count() or 4) // 4))
    return args


def _stopped(signum: int, frame: Any) -> None:
    """End the running children's process groups, then the driver (timeout's SIGTERM)."""
    killed = kill_active()
    print(f"campaign: stopped by signal {signum}; {killed} running cases killed", flush=True)
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run the campaign from the command line; give the exit status."""
    signal.signal(signal.SIGTERM, _stopped)
    return Campaign(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
