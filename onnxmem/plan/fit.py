"""Plan: the largest batch (or any dim) whose peak fits a GPU, budget checks, ZeRO sharding, and what-ifs.

Memory is not always linear in the batch (padding, attention in the sequence, a conv's floor division), so `fit`
never extrapolates: it evaluates the estimator at 1, 2, 4, ... until a value does not fit, then bisects between
the last power of two that fits and the first that does not. The answer b is always evaluated together with b + 1
(b fits, b + 1 does not), and the result says whether the evaluated peaks were monotonic and, where the peak is
linear in the dim, the formula and whether every evaluated point agrees with it exactly.

Targets are tables: GPUS (gpus.py: name, memory), RUNTIMES (the fixed costs a process pays before the model gets
anything, and the allocator's rounding). Every figure carries where it comes from; `--reserve` overrides the fixed
costs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import onnx

from onnxmem.arguments import check_arguments
from onnxmem.errors import DimError, TargetError
from onnxmem.ir.graph import ModelGraph
from onnxmem.ir.load import LoadedModel
from onnxmem.passes.half_precision import half_precision, half_precision_sizing
from onnxmem.passes.liveness import Timeline
from onnxmem.passes.orders import DEFAULT_ORDER
from onnxmem.passes.pipeline import (
    Analysis,
    PipelineRun,
    Schedules,
    Sizing,
    analysis,
    inference_peak,
    run_stages,
    sizing,
)
from onnxmem.plan.family import ModelFamily
from onnxmem.plan.gpus import find_gpu
from onnxmem.plan.kv import kv_growth_note, kv_what_ifs
from onnxmem.plan.sharding import SHARD_STAGES, check_sharding, sharded_step, smallest_gpus
from onnxmem.plan.sizes import GiB, KiB, MiB, parse_size, size_source  # noqa: F401 - fit's names
from onnxmem.shapes.dims import input_dims
from onnxmem.targets.ort import DEFAULT_PROVIDER, ExecutionProvider
from onnxmem.targets.ort.arena import session_held_bytes
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES
from onnxmem.views.report import (
    CheckResult,
    FitPoint,
    FitResult,
    LinearFit,
    Report,
    ReserveItem,
    Sharding,
    Target,
    TrainingReport,
    WhatIf,
)

if TYPE_CHECKING:
    from onnxmem.training.step import TrainingOptions

SEARCH_LIMIT = 2**31  # a dim that still fits here barely moves memory: the search stops and says so


# --- targets: GPUs, runtimes, allocators ------------------------------------------------------------------------


def _round_up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


def _exact(requests: list[int]) -> int:
    return sum(requests)


# The caching allocator's fragmentation, as a share of the bytes it hands out: at the edge of an H100's memory, a
# training step whose allocated peak onnxmem gives to within 0.1% OOMs when that peak is 0.9930-0.9954 (resnet18)
# and 0.9907-0.9930 (gpt2, a 10 GiB logits block that needs one free range) of the free memory
# (benchmarks/results/cuda/2026-11-27-h100-80gb-part5.jsonl, fit/*/measured-max: the bisection's runs and OOMs).
# Blocks split and cached in segments that cannot be released leave that much unusable; requiring 1/99 of the held
# bytes on top (the peak at most 99% of the budget) keeps both models' answers on the running side, 0.3% and 0.1%
# under the largest batch that ran. Checked on two models only: the next GPU window re-runs fit on them.
FRAGMENTATION_PARTS = 99  # 1 byte more per 99 held


def _pytorch_caching(requests: list[int]) -> int:
    # CUDACachingAllocator: a block is a multiple of 512 B; a request over 10 MiB gets its own segment rounded up
    # to 2 MiB (kRoundLarge), smaller ones share 2 MiB or 20 MiB segments. Each part is rounded to 2 MiB, and the
    # sum gets the fragmentation allowance above.
    rounded = sum(_round_up(_round_up(r, 512), 2 * MiB) for r in requests if r > 0)
    return rounded + -(-rounded // FRAGMENTATION_PARTS)


def _onnxruntime_arena(requests: list[int]) -> int:
    # BFCArena with kNextPowerOfTwo (the default): a request is rounded to 256 B; when no free chunk holds it the
    # arena adds a region of the current region size (starting at 1 MiB), doubling that size until it holds the
    # request, and doubles it again after a region that needed no doubling. Free space is assumed perfectly packed.
    held, free, region = 0, 0, MiB
    for request in requests:
        need = _round_up(request, 256)
        if need <= free:
            free -= need
            continue
        grown = False
        while need > region:
            region *= 2
            grown = True
        held += region
        free += region - need
        if not grown:
            region *= 2
    return held


@dataclass(frozen=True)
class Allocator:
    """How an allocator turns the bytes the model needs into bytes it holds from the device."""

    name: str
    rule: str
    held: Callable[[list[int]], int]  # requests in order (persistent state first, then the peak's transient part)


ALLOCATORS: dict[str, Allocator] = {a.name: a for a in (
    Allocator("exact", "no rounding: the estimate's bytes", _exact),
    Allocator("pytorch-caching", "PyTorch's CUDA caching allocator: 512 B blocks; the persistent state and the "
              "rest of the peak each rounded up to 2 MiB segments, and 1/99 of that on top for the fragmentation "
              "measured at the edge of an H100's memory (blocks split in cached segments)", _pytorch_caching),
    Allocator("onnxruntime-arena", "onnxruntime's BFC arena (kNextPowerOfTwo), simulated for inference "
              "(onnxmem.arena, as validate checks it on CPU): weights held from session creation, a first run's "
              "allocations and kernel scratch, then the memory pattern's block, in 256 B chunks and regions that "
              "double from 1 MiB; training: weights, then the peak as one block", _onnxruntime_arena),
)}

_CONTEXT_SOURCE = "stated default (not measured here): CUDA context with lazy module loading (CUDA >= 11.7) is " \
                  "typically 300-600 MiB; measure yours (nvidia-smi after creating a session) and pass --reserve"


_TORCH_MEASURED = "measured on an H100 80GB (PyTorch 2.11, CUDA 13.0, cuDNN 9.19, driver 580.159.04, lazy module " \
                  "loading): {}; pass --reserve for another GPU or build"


@dataclass(frozen=True)
class Runtime:
    """What a runtime costs before the model gets anything, and how its allocator rounds."""

    name: str
    fixed_costs: tuple[ReserveItem, ...]
    allocator: str


RUNTIMES: dict[str, Runtime] = {r.name: r for r in (
    Runtime("onnxruntime", (
        ReserveItem("cuda-context", 512 * MiB, _CONTEXT_SOURCE),
        ReserveItem("workspaces", 64 * MiB, "stated default (not measured here): cuBLAS and cuDNN handles and "
                    "workspaces of the CUDA execution provider; cuDNN conv workspaces can be larger with "
                    "cudnn_conv_use_max_workspace=1"),
    ), "onnxruntime-arena"),
    Runtime("pytorch", (
        # measured on the H100 rows (benchmarks/results/cuda/2026-11-27-h100-80gb.jsonl, context/* and the training
        # harness's warm-up): other GPUs, drivers and PyTorch builds differ by tens of MiB
        ReserveItem("cuda-context", 648_871_936, _TORCH_MEASURED.format(
            "the CUDA context PyTorch creates (cudaMemGetInfo's total less its free, less PyTorch's own 2 MiB)")),
        # the fit rows (2026-11-27-h100-80gb-part3.jsonl fit/*/answer): after a first matmul and convolution,
        # cudaMemGetInfo's total less its free is 873,267,200 B, of which the context and PyTorch's reserved
        # workspaces are the other two items; NVML's per-library growth (context/* rows, 84-158 MiB by library
        # and order) is not the figure a training process sees
        ReserveItem("libraries", 155_189_248, _TORCH_MEASURED.format(
            "cuBLAS, cuBLASLt and cuDNN loaded by a first matmul and convolution (cudaMemGetInfo's total less its "
            "free, less the context and PyTorch's reserved bytes)")),
        ReserveItem("workspaces", 69_206_016, _TORCH_MEASURED.format(
            "cuBLAS and cuBLASLt workspaces held in PyTorch's caching allocator after a first matmul and "
            "convolution (memory_reserved)")),
    ), "pytorch-caching"),
)}


def resolve_target(memory: str | int | None = None, gpu: str | None = None, runtime: str | None = None,
                   reserve: str | int | None = None) -> Target:
    """Give the target: memory from --memory or the GPU catalog, fixed costs, and the allocator's rounding.

    Fixed costs (CUDA context, the runtime's workspaces) are counted when a GPU or a runtime is named; with a bare
    --memory they are not (the memory given is what the model may use). --reserve replaces them all.
    """
    if (memory is None) == (gpu is None):
        raise TargetError("give exactly one of a memory size (--memory SIZE or --budget SIZE; memory= in Python) "
                          "and a GPU of the catalog (--gpu NAME; gpu= in Python)")
    if gpu is not None:
        entry = find_gpu(gpu)
        memory_bytes, memory_source, gpu_name = entry.memory_bytes, f"{entry.name}: {entry.source}", entry.name
    else:
        assert memory is not None
        memory_bytes, memory_source, gpu_name = parse_size(memory), size_source(memory), ""
    rt = None
    if runtime:
        if runtime not in RUNTIMES:
            raise TargetError(f"runtime '{runtime}' is unknown: choose one of {', '.join(RUNTIMES)}")
        rt = RUNTIMES[runtime]
    if reserve is not None:
        items: tuple[ReserveItem, ...] = (ReserveItem("reserve", parse_size(reserve), size_source(reserve)),)
    elif rt is not None:
        items = rt.fixed_costs
    elif gpu_name:
        items = (RUNTIMES["onnxruntime"].fixed_costs[0],)  # a GPU process pays for its CUDA context
    else:
        items = ()
    reserved = sum(i.bytes for i in items)
    if reserved >= memory_bytes:
        taken = " + ".join(f"{i.name} {i.bytes:,} B" for i in items)
        raise TargetError(f"the fixed costs ({taken}) take all of the memory ({memory_bytes:,} B), leaving nothing "
                          "for the model: give a smaller reserve (--reserve SIZE, or reserve= in Python) or more "
                          "memory")
    allocator = ALLOCATORS[rt.allocator if rt else "exact"]
    return Target(memory_bytes=memory_bytes, memory_source=memory_source, gpu=gpu_name, runtime=runtime or "",
                  reserve=items, reserve_bytes=reserved, allocator=allocator.name,
                  allocator_rule=allocator.rule)


def budget_bytes(target: Target) -> int:
    """Give the bytes the model may hold: the memory less the fixed costs (0 when they take it all)."""
    return max(0, target.memory_bytes - target.reserve_bytes)


def check_parallelism(gpus: int, shard: str | None, training: bool, offload: str = "none") -> None:
    """Raise TargetError where GPUs or sharding are asked for without what they need: more than one GPU needs a
    stage (ddp: each GPU holds everything), a stage needs training (it divides training state), offload a stage."""
    if offload != "none" and not shard:
        raise TargetError(f"--offload {offload} moves sharded states to CPU memory: give a stage with --shard "
                          "zero1|zero2|zero3|fsdp (shard= in Python)")
    if shard:
        check_sharding(shard, gpus, offload)
    if gpus < 1:
        raise TargetError(f"gpus {gpus}: must be a positive integer")
    if gpus > 1 and not shard:
        stages = "|".join(SHARD_STAGES)
        raise TargetError(f"{gpus} GPUs but no sharding stage: say how they share the model with --shard {stages} "
                          "(shard= in Python; ddp: each GPU holds everything)"
                          + ("" if training else ", and add --training (training= in Python)"))
    if shard and not training:
        raise TargetError("sharding divides training state across GPUs: it needs --training (training= in Python)")


# --- one evaluation: the peak that must fit ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Need:
    peak_bytes: int  # per GPU
    persistent_bytes: int  # weights (and, training, gradients and optimizer state) live at the peak
    where: str
    sharding: Sharding | None


_STATE_CATEGORIES = ("weights", "parameter gradients", "optimizer state")


def _need(report: Report, gpus: int, shard: str | None, offload: str = "none") -> _Need:
    training = report.training
    if training is None:
        inf = report.inference
        if shard:
            raise TargetError("sharding divides training state across GPUs: it needs --training (training= in "
                              "Python)")
        return _Need(inf.peak_bytes, inf.weights_bytes, f"{inf.peak_op_type} node '{inf.peak_node}'", None)
    live = {row.category: row.bytes for row in training.live_at_peak}
    weights, gradients, optimizer_states = (live.get(c, 0) for c in _STATE_CATEGORIES)
    where = f"{training.peak_step} step, {training.peak_phase}: {training.peak_event}"
    if not shard:
        return _Need(training.peak_bytes, weights + gradients + optimizer_states, where, None)
    sharding = sharded_step(training, shard, gpus, offload)
    return _Need(sharding.peak_bytes, sharding.per_gpu_bytes - sharding.gathered_bytes, sharding.peak_event,
                 sharding)


def _required(need: _Need, target: Target) -> int:
    return ALLOCATORS[target.allocator].held([need.persistent_bytes, need.peak_bytes - need.persistent_bytes])


def _family_arena_required(family: ModelFamily, value: int) -> int:
    """arena_required_bytes at a value of a family's searched dim (with no inference where its template serves)."""
    graph, timeline, sizes, shape_of = family.arena_inputs(value)
    return arena_required_bytes(graph, timeline, family.loaded.proto, family.provider, sizes, shape_of)


def _simulates_arena(target: Target, training: TrainingOptions | None, shard: str | None) -> bool:
    """Say whether the bytes required are the arena simulation's (onnxruntime's allocator, inference)."""
    return target.allocator == "onnxruntime-arena" and training is None and not shard


def arena_required_bytes(graph: ModelGraph, timeline: Timeline, model: onnx.ModelProto,
                         provider: ExecutionProvider, sizes: Sequence[int | None] | None = None,
                         shape_of: Callable[[int], tuple[int, ...] | None] | None = None) -> int:
    """Give the bytes an onnxruntime session holds for inference from the second run on: what its arena holds
    (arena.session_held_bytes: `validate`'s estimate on CPU) and what the provider holds outside it (its
    outside_arena_bytes: on the CPU provider, the initializers it uses in place from the model). `sizes`,
    `shape_of`: as session_held_bytes."""
    _, held = session_held_bytes(graph, timeline, model, provider, sizes=sizes, shape_of=shape_of)
    return held + provider.outside_arena_bytes(graph, model)


def _options(order: str, default_dim: int | None, training: TrainingOptions | None,
             provider: str | ExecutionProvider = DEFAULT_PROVIDER) -> dict[str, Any]:
    options: dict[str, Any] = {"order": order, "default_dim": default_dim, "provider": provider}
    if training is not None:
        options["training"] = training
    return options


# --- fit --------------------------------------------------------------------------------------------------------


def fit(model: str | os.PathLike[str] | onnx.ModelProto, *, memory: str | int | None = None,
        gpu: str | None = None, runtime: str | None = None, reserve: str | int | None = None,
        search: str = "batch", dims: Mapping[str, int] | None = None, default_dim: int | None = None,
        order: str = DEFAULT_ORDER, training: TrainingOptions | None = None, gpus: int = 1,
        shard: str | None = None, what_if: bool = True, limit: int = SEARCH_LIMIT,
        provider: str | ExecutionProvider = DEFAULT_PROVIDER,
        progress: Callable[[str], None] | None = None, offload: str = "none") -> FitResult:
    """Give the largest value of dim `search` whose peak fits the target, with the curve it was found on.

    Evaluates the estimator at 1, 2, 4, ... then bisects; the answer b fits and b + 1 does not, both evaluated.
    A budget too small for 1 is an answer (max_value 0), not an error.

    Parameters
    ----------
    model
        A path to an ONNX file or a ModelProto.
    memory, gpu
        The target: a size ("24GiB", "16GB", bytes as an int) or a GPU of the catalog (plan.gpus.GPUS); exactly one.
    runtime
        "onnxruntime" or "pytorch": count that runtime's fixed costs and its allocator's rounding.
    reserve
        Fixed costs taken off the memory (replaces the runtime's stated defaults).
    search
        The dim to search (batch, seq, ...); the model's other symbolic dims are bound by `dims`.
    dims, default_dim, order, training, provider
        As analyze.analysis.
    gpus, shard, offload
        Training: data-parallel GPUs, the ZeRO/FSDP stage that divides the model states across them, and what of
        them lives in CPU memory (none, optimizer, params, both: DeepSpeed's offload). search="gpus" finds the
        fewest GPUs that fit (max_value is that count: memory falls as GPUs are added).
    what_if
        Also evaluate the single changes that would let the next value fit.
    limit
        The largest value searched.
    progress
        Called with a few words before each phase and each value evaluated (the CLI shows them on a terminal).

    With gradient accumulation (training.grad_accum or training.micro_batch) over the searched batch dim, the values
    searched are its multiples: the micro-steps or the micro-batch, times 1, 2, 4, ...

    Returns
    -------
    FitResult
        The answer, the curve, the notes; `report`: the report at the answer (what its pictures draw).

    Raises
    ------
    TargetError
        The target is missing, ambiguous or malformed.
    DimError
        `search` is no dim of the model, or is also bound in `dims`.
    """
    check_arguments("fit", model, dims, default_dim, order, provider, training)
    target = resolve_target(memory, gpu, runtime, reserve)
    budget = budget_bytes(target)
    check_parallelism(gpus, shard, training is not None, offload)
    say = progress or _quiet
    if search == "gpus":
        return _fit_gpus(model, target, budget, dims, default_dim, order, training, shard, offload, what_if,
                         provider, say)
    say("loading and sizing the model")
    family = ModelFamily(model, search, dims, **_options(order, default_dim, training, provider))
    loaded = family.loaded
    _check_search(loaded, search, dims or {})
    # gradient accumulation divides the batch into micro-steps: the batch searched is a multiple of the steps
    # (--grad-accum N) or of the micro-batch (--micro-batch M), so the search runs over the multiplier k
    step = _accumulation_step(loaded, search, training)
    needs: dict[int, _Need] = {}
    points: dict[int, FitPoint] = {}

    def evaluate(multiple: int) -> FitPoint:
        value = multiple * step
        if value not in points:
            say(f"evaluating {search}={value}")
            if training is None and not shard:  # the cheap path: no summaries for the points of a search
                peak, weights = family.inference_peak_bytes(value)
                need = needs[value] = _Need(peak, weights, "", None)
            else:
                need = needs[value] = _need(family.report(value), gpus, shard, offload)
            required = _family_arena_required(family, value) \
                if _simulates_arena(target, training, shard) else _required(need, target)
            points[value] = FitPoint(value, need.peak_bytes, required, required <= budget)
        return points[value]

    for multiple in (1, 2, 3):  # enough for the linear formula and one point to check it
        evaluate(multiple)
    largest_pow2, first_fail = 0, 0
    probe, top = 1, max(limit // step, 1)
    while probe <= top:
        if not evaluate(probe).fits:
            first_fail = probe
            break
        largest_pow2 = probe
        probe *= 2
    bounded = first_fail > 0
    if not bounded:
        best = largest_pow2
    elif largest_pow2 == 0:
        best = 0
    else:
        low, high = largest_pow2, first_fail  # low fits, high does not
        while high - low > 1:
            middle = (low + high) // 2
            if evaluate(middle).fits:
                low = middle
            else:
                high = middle
        best = low
    if bounded and best > 0:
        evaluate(best + 1)
    curve = tuple(points[v] for v in sorted(points))
    monotonic = all(a.peak_bytes <= b.peak_bytes for a, b in zip(curve, curve[1:], strict=False))
    linear = _linear(curve)
    answer, answer_pow2, shown = best * step, largest_pow2 * step, max(best, 1) * step
    name, bound, warnings = family.header(shown)
    notes = _fit_notes(search, answer, answer_pow2, bounded, top * step, monotonic, linear, curve, step, training)
    kv = kv_growth_note(search, shown, step, family) if training is None else None
    notes = (*notes, kv) if kv is not None else notes
    if any(a.required_bytes > b.required_bytes for a, b in zip(curve, curve[1:], strict=False)):
        notes = (*notes, f"the bytes required are not monotonic in {search} (the arena's regions double as its "
                         f"requests grow, not with the peak): a {search} above the answer, not evaluated, may fit too")
    what_ifs: tuple[WhatIf, ...] = ()
    if what_if and bounded:
        at = (best + 1) * step
        say("evaluating what-ifs")
        # the curve already shows a smaller value: the what-ifs are the other changes that would let `at` fit
        answer_at = family.report(at) if training is not None else None
        what_ifs = _what_ifs(family.sizing(at), answer_at, needs[at], "", 0, order, training, gpus, shard, target,
                             budget, offload)
    return FitResult(
        model=name, dim=search, dims={k: v for k, v in bound.items() if k != search},
        mode="training" if training is not None else "inference", target=target, budget_bytes=budget,
        max_value=answer, max_power_of_two=answer_pow2, bounded=bounded, search_limit=top * step,
        monotonic=monotonic, evaluations=len(points), curve=curve, linear=linear, sharding=needs[shown].sharding,
        what_ifs=what_ifs, notes=notes, warnings=warnings, step=step,
        report_at_answer=functools.cache(lambda: family.report(shown)),
    )


def _quiet(message: str) -> None:
    """The progress callback that says nothing (the library's default)."""


def _accumulation_step(loaded: LoadedModel, search: str, training: TrainingOptions | None) -> int:
    """Give the multiple the searched dim must be: the micro-steps (grad_accum) or the micro-batch where gradient
    accumulation divides the searched dim (the batch dim: training.batch_dim, else axis 0 of the first input), else
    1."""
    if training is None or not training.accumulates:
        return 1
    batch = training.batch_dim
    if batch is None:
        batch = next((d.name for d in input_dims(loaded.proto) if d.axis == 0), None)
    if batch != search:
        return 1
    return training.micro_batch if training.micro_batch is not None else training.grad_accum


def _check_search(loaded: LoadedModel, search: str, dims: Mapping[str, int]) -> None:
    names = list(dict.fromkeys(d.name for d in input_dims(loaded.proto)))
    if search not in names:
        listed = ", ".join(names) if names else "none: every input dim is fixed"
        raise DimError(f"the model has no dim named {search} to search (its dims: {listed}); choose one: "
                       "--search NAME, or search= in Python")
    if search in dims:
        raise DimError(f"{search}={dims[search]} binds the dim that fit searches: drop it from the dims, or search "
                       "another dim (--search NAME, or search= in Python)")


def _linear(curve: tuple[FitPoint, ...]) -> LinearFit | None:
    by_value = {p.value: p.peak_bytes for p in curve}
    if len(by_value) < 2:
        return None
    first, second = sorted(by_value)[:2]  # 1 and 2 (or the first two multiples searched)
    rise, run = by_value[second] - by_value[first], second - first
    if rise % run:
        return None
    slope = rise // run
    intercept = by_value[first] - slope * first
    checked = tuple(v for v in sorted(by_value) if v not in (first, second))
    if any(by_value[v] != intercept + slope * v for v in checked):
        return None
    return LinearFit(intercept, slope, verified=bool(checked), checked_values=checked)


def _fit_notes(search: str, best: int, largest_pow2: int, bounded: bool, limit: int, monotonic: bool,
               linear: LinearFit | None, curve: tuple[FitPoint, ...], step: int = 1,
               training: TrainingOptions | None = None) -> tuple[str, ...]:
    notes = []
    if not bounded:
        notes.append(f"even {search}={limit} fits: the peak barely grows with {search}; the search stopped there")
    elif best == 0:
        notes.append(f"nothing fits: {search}={step} needs more than the budget")
    else:
        notes.append(f"verified: {search}={best} fits and {search}={best + step} does not (both evaluated)")
    if step > 1 and training is not None:
        how = (f"micro-batches of {training.micro_batch}" if training.micro_batch is not None else
               f"{training.grad_accum} micro-steps of {search}/{training.grad_accum}")
        notes.append(f"gradient accumulation ({how}): {search} searched in multiples of {step}")
    if largest_pow2 and largest_pow2 != best:
        kind = "power of two" if step & (step - 1) == 0 else f"value {step} x 2^k"
        notes.append(f"largest {kind} that fits: {largest_pow2}")
    if not monotonic:
        notes.append(f"the peak is not monotonic in {search} over the evaluated values: a value above the answer "
                     "may fit again; see the curve")
    if linear is None:
        notes.append(f"the peak is not linear in {search}: no formula (the answer comes from evaluation)")
    elif not linear.verified:
        notes.append("the linear formula comes from two points and could not be checked at a third")
    return tuple(notes)


# --- check ------------------------------------------------------------------------------------------------------


def check(model: str | os.PathLike[str] | onnx.ModelProto, dims: Mapping[str, int] | None = None, *,
          memory: str | int | None = None, gpu: str | None = None, runtime: str | None = None,
          reserve: str | int | None = None, default_dim: int | None = None, order: str = DEFAULT_ORDER,
          training: TrainingOptions | None = None, gpus: int = 1, shard: str | None = None,
          what_if: bool = True, provider: str | ExecutionProvider = DEFAULT_PROVIDER,
          progress: Callable[[str], None] | None = None, offload: str = "none") -> CheckResult:
    """Say whether the model at its bound dims fits the target (a budget gate: `onnxmem check` exits 0 or 1).

    Parameters
    ----------
    model, dims, default_dim, order, training, provider
        As analyze.analysis.
    memory, gpu, runtime, reserve, gpus, shard, offload, what_if, progress
        As fit.

    Returns
    -------
    CheckResult
        The verdict, the peak against the budget, the what-ifs; `report`: the report checked.

    Raises
    ------
    TargetError
        The target is missing, ambiguous or malformed.
    """
    check_arguments("check", model, dims, default_dim, order, provider, training)
    target = resolve_target(memory, gpu, runtime, reserve)
    budget = budget_bytes(target)
    check_parallelism(gpus, shard, training is not None, offload)
    analysed = analysis(model, dims, progress=progress, **_options(order, default_dim, training, provider))
    report = analysed.report
    need = _need(report, gpus, shard, offload)
    required = arena_required_bytes(analysed.graph, analysed.timeline, analysed.loaded.proto,
                                    analysed.sizing.provider) \
        if _simulates_arena(target, training, shard) else _required(need, target)
    fits = required <= budget
    what_ifs: tuple[WhatIf, ...] = ()
    if what_if:
        if progress is not None:
            progress("evaluating what-ifs")
        search = "batch" if "batch" in report.dims else ""
        what_ifs = _what_ifs(analysed.sizing, report, need, search, report.dims.get(search, 0), order, training,
                             gpus, shard, target, budget, offload)
    return CheckResult(
        model=report.model, dims=dict(report.dims), mode="training" if training is not None else "inference",
        target=target, budget_bytes=budget, peak_bytes=need.peak_bytes, required_bytes=required,
        headroom_bytes=budget - required, fits=fits, peak_where=need.where, sharding=need.sharding,
        what_ifs=what_ifs, warnings=report.warnings, report=report,
    )


# --- what-ifs ---------------------------------------------------------------------------------------------------


def _what_ifs(at: Sizing, base: Report | None, need: _Need, search: str, value: int,
              order: str, training: TrainingOptions | None, gpus: int, shard: str | None,
              target: Target | None = None, budget: int | None = None, offload: str = "none") -> tuple[WhatIf, ...]:
    """Give the single changes that lower the peak at a binding (`at`: its Sizing), the one that saves most first.
    Each is the analysis of the changed model or options (analyze.analysis): the passes after sizing run again on
    the same Sizing (another order, other training options), on the half-precision Sizing, or all of them at
    another binding; its peak is what `report` says of that change. `base`: the report at that binding (its training
    part's parameter groups; sharded, what offload or more GPUs would give). With a target and its budget, each
    says whether that change alone makes it fit (the allocator's rounding applied to the changed peak)."""
    if at.schedules is None:  # (the what-ifs that re-run the passes on `at` share one order and its lifetimes)
        at = dataclasses.replace(at, schedules=Schedules(at.graph.ops))
    found: list[WhatIf] = []

    def add(change: str, peak: int, detail: str, persistent: int | None = None, required: int | None = None) -> None:
        if peak < need.peak_bytes:
            fits = None
            if target is not None and budget is not None:
                held = min(need.persistent_bytes if persistent is None else persistent, peak)
                fits = (_required(_Need(peak, held, "", None), target) if required is None else required) <= budget
            found.append(WhatIf(change, peak, need.peak_bytes - peak, detail, fits))

    def add_report(change: str, analysed: Analysis, detail: str) -> None:
        changed = _need(analysed.report, gpus, shard, offload)
        required = arena_required_bytes(analysed.graph, analysed.timeline, analysed.loaded.proto, at.provider) \
            if target is not None and _simulates_arena(target, training, shard) else None
        add(change, changed.peak_bytes, detail, changed.persistent_bytes, required)

    def report_of(model: Sizing | LoadedModel = at, dims: Mapping[str, int] | None = None, run_order: str = order,
                  options: TrainingOptions | None = training) -> Analysis:
        return analysis(model, dims, **_options(run_order, at.default_dim, options, at.provider))

    def add_changed(change: str, detail: str, model: Sizing | LoadedModel = at, dims: Mapping[str, int] | None = None,
                    run_order: str = order) -> None:
        """Add the what-if of a changed model or order: its report's peak, where a report is read (training,
        sharding); else the declared stages up to its timeline, whose peak is the report's (pipeline.inference_peak),
        without the summaries nobody reads (a what-if's rows and timeline)."""
        if training is not None or shard:
            add_report(change, report_of(model, dims, run_order), detail)
            return
        graph, timeline, loaded = _timeline_of(model, dims, run_order, at)
        peak, weights = inference_peak(graph, timeline)
        required = arena_required_bytes(graph, timeline, loaded.proto, at.provider) \
            if target is not None and _simulates_arena(target, training, shard) else None
        add(change, peak, detail, weights, required)

    if search and value >= 2:
        try:
            # (the model as given: the analysis makes onnxruntime's changes again, and the training step reads it)
            add_changed(f"{search} {value} -> {value // 2}", f"halve {search}", at.given or at.loaded,
                        {**at.dims, search: value // 2})
        except (ValueError, DimError):  # half the batch is not a multiple of the micro-steps
            pass
    if order != "memory":
        add_changed("memory-aware execution order",
                    "greedy least-peak-first order (--order memory)" if training is None else
                    "forward ops in the greedy least-peak-first order (--order memory)", run_order="memory")
    if training is None:
        # (where the provider's changes depend on element types, the converted model is analysed whole)
        halved = half_precision_sizing(at) if at.provider.float16_keeps_graph else None
        detail = "every float32 tensor stored as float16 (the model converted, then analysed)"
        if halved is not None:
            add_changed("float32 -> float16 (weights and activations)", detail, halved)
        else:
            add_changed("float32 -> float16 (weights and activations)", detail, half_precision(at.loaded), at.dims)
        for change, resized, detail in kv_what_ifs(at):  # a decoder's KV cache, its tensors re-sized
            add_changed(change, detail, resized)
        found.sort(key=lambda w: -w.saved_bytes)
        return tuple(found)
    changes: list[tuple[str, TrainingOptions, str]] = []
    if training.precision == "fp32":
        changes.append(("mixed precision (amp-bf16)", dataclasses.replace(training, precision="amp-bf16"),
                        "autocast: matmuls and convs in bf16, fp32 master weights"))
    if training.checkpoint is None:
        changes.append(("activation checkpointing", dataclasses.replace(training, checkpoint="auto"),
                        "sqrt(n) segments keep only their inputs and run forward twice"))
    if training.optimizer_impl != "fused":
        changes.append(("fused optimizer", dataclasses.replace(training, optimizer_impl="fused"),
                        "a fused update keeps no full-size temporaries"))
    groups = base.training.parameter_groups if base is not None and base.training is not None else ()
    if shard and base is not None and base.training is not None:
        for change, detail, persistent, peak in _sharded_what_ifs(base.training, shard, gpus, offload, target,
                                                                  budget):
            add(change, peak, detail, persistent)
    if groups:
        largest = max(groups, key=lambda g: g.trainable_bytes)
        if largest.trainable_bytes > 0:
            changes.append((f"freeze {largest.layer}",
                            dataclasses.replace(training, freeze=(*training.freeze, largest.layer)),
                            "its weights get no gradient and no optimizer state"))
    for change, options, detail in changes:
        try:
            analysed = report_of(options=options)
        except (ValueError, DimError, TargetError):
            continue
        result = analysed.report
        if options.checkpoint is not None and result.training and result.training.checkpoint:
            peak = result.training.checkpoint.peak_bytes
            if shard and need.sharding:  # per GPU: the activations checkpointing does not keep, off the step's peak
                dropped = result.training.saved_activation_bytes - result.training.checkpoint.saved_activation_bytes
                peak = max(need.sharding.per_gpu_bytes, need.peak_bytes - max(0, dropped))
                detail += "; per GPU: the kept activations it drops, off the sharded peak"
                if base is not None and base.training is not None:  # with each sharded change too
                    for both, words, persistent, changed in _sharded_what_ifs(base.training, shard, gpus, offload,
                                                                              target, budget, dropped) \
                            if dropped > 0 else ():
                        add(f"{change} + {both}", changed, words, persistent)
            add(change, peak, detail)
        else:
            add_report(change, analysed, detail)
    found.sort(key=lambda w: -w.saved_bytes)
    return tuple(found)


def _timeline_of(model: Sizing | LoadedModel, dims: Mapping[str, int] | None, order: str,
                 at: Sizing) -> tuple[ModelGraph, Timeline, LoadedModel]:
    """Give the graph, the inference timeline and the model of analysis(model, dims, order=order, ...)'s run with
    `at`'s default dim and provider: the same declared stages (pipeline.STAGES), stopped after liveness."""
    sized = model if isinstance(model, Sizing) else \
        sizing(model, dims, default_dim=at.default_dim, rules=DEFAULT_INFERENCE_RULES, provider=at.provider)
    run = run_stages(PipelineRun(sized.provider, DEFAULT_INFERENCE_RULES, sized.dims, sized.default_dim, order,
                                 sized=sized), "order", "liveness")
    assert run.timeline is not None
    return sized.graph, run.timeline, sized.loaded


def _sharded_what_ifs(training: TrainingReport, shard: str, gpus: int, offload: str, target: Target | None,
                      budget: int | None, dropped: int = 0) -> list[tuple[str, str, int, int]]:
    """Give (change, detail, persistent bytes, peak) per GPU for sharded training: offloading to CPU memory (what
    DeepSpeed can move at this stage) and the fewest GPUs that fit (fit --search gpus); `dropped`: activation bytes
    checkpointing would not keep (off each peak, not below the model states)."""
    def sharded(n: int, moved: str) -> Sharding:
        s = sharded_step(training, shard, n, moved)
        return dataclasses.replace(s, peak_bytes=max(s.per_gpu_bytes, s.peak_bytes - dropped))

    found = []
    offloads = ["optimizer"] if offload in ("none", "params") and shard != "fsdp" else []
    if shard in ("zero3", "fsdp") and offload != "both":
        offloads.append("both")
    for other in offloads:
        s = sharded(gpus, other)
        what = "optimizer states" if other == "optimizer" else "optimizer states and parameters"
        found.append((f"offload {what} to CPU (--offload {other})",
                      f"CPU memory per node: {s.cpu_bytes / GiB:,.2f} GiB (DeepSpeed's estimate); the update "
                      "runs on the CPU", s.per_gpu_bytes, s.peak_bytes))
    if target is not None and budget is not None and shard != "ddp":
        def fits(n: int) -> bool:
            s = sharded(n, offload)
            return _required(_Need(s.peak_bytes, min(s.per_gpu_bytes, s.peak_bytes), "", s), target) <= budget

        fewest, _ = smallest_gpus(fits, limit=2**16)
        if fewest > gpus:
            s = sharded(fewest, offload)
            found.append((f"{fewest} GPUs (--gpus {fewest})", "the fewest that fit at this stage (fit --search "
                          "gpus): the states divide further, activations do not", s.per_gpu_bytes, s.peak_bytes))
    return found


def _fit_gpus(model: str | os.PathLike[str] | onnx.ModelProto, target: Target, budget: int,
              dims: Mapping[str, int] | None, default_dim: int | None, order: str,
              training: TrainingOptions | None, shard: str | None, offload: str, what_if: bool,
              provider: str | ExecutionProvider, say: Callable[[str], None]) -> FitResult:
    """Give the fewest GPUs whose per-GPU peak fits (fit --search gpus): the step analysed once, the sharding
    evaluated at 1, 2, 4, ... GPUs, then bisected; max_value is that count (0: none up to the limit fits)."""
    if training is None or not shard or shard == "ddp":
        raise TargetError("--search gpus finds how many GPUs divide the training state enough to fit: it needs "
                          "--training and --shard zero1|zero2|zero3|fsdp (ddp holds everything on each GPU)")
    say("analysing the model")
    analysed = analysis(model, dims, **_options(order, default_dim, training, provider))
    report = analysed.report
    assert report.training is not None
    limit = 2**16
    points: dict[int, FitPoint] = {}
    needs: dict[int, _Need] = {}

    def fits(n: int) -> bool:
        if n not in points:
            need = needs[n] = _need(report, n, shard, offload)
            required = _required(need, target)
            points[n] = FitPoint(n, need.peak_bytes, required, required <= budget)
        return points[n].fits

    fewest, _ = smallest_gpus(fits, limit)
    if fewest > 1:
        fits(fewest - 1)
    curve = tuple(points[n] for n in sorted(points))
    pow2 = next((p.value for p in curve if p.fits and p.value & (p.value - 1) == 0), 0)
    if fewest:
        notes = [f"verified: {fewest} GPU(s) fit" + (f" and {fewest - 1} do not (both evaluated)" if fewest > 1
                                                      else ""),
                 "for --search gpus, max_value is the fewest GPUs that fit and max_power_of_two the fewest power "
                 "of two: per-GPU memory falls as GPUs are added"]
    else:
        notes = [f"nothing fits: even {limit} GPUs leave more per GPU than the budget (what does not divide: "
                 "activations, replicated states)"]
    shown = fewest or limit
    what_ifs: tuple[WhatIf, ...] = ()
    if what_if and not fewest:
        what_ifs = _what_ifs(analysed.sizing, report, needs[limit], "", 0, order, training, limit, shard, target,
                             budget, offload)
    return FitResult(
        model=report.model, dim="gpus", dims=dict(report.dims), mode="training", target=target, budget_bytes=budget,
        max_value=fewest, max_power_of_two=pow2, bounded=bool(fewest), search_limit=limit,
        monotonic=all(a.peak_bytes >= b.peak_bytes for a, b in zip(curve, curve[1:], strict=False)),
        evaluations=len(points), curve=curve, linear=None, sharding=needs[shown].sharding, what_ifs=what_ifs,
        notes=tuple(notes), warnings=report.warnings, report_at_answer=lambda: report,
    )
