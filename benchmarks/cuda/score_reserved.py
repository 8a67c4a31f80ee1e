"""Score the PyTorch CUDA caching-allocator replay (onnxmem/targets/torch/cuda/allocator.py) against the committed
H100 rows' max_memory_reserved, without a GPU.

    python benchmarks/cuda/score_reserved.py [ROWS ...] [--phases] [--as-emitted]

For each full-model training row with an export beside the rows, the first step is simulated with the current code,
its buffers are turned into the allocations and frees PyTorch makes (`torch_events`: at each event the buffers that
start there are allocated, then those that end there are freed, each free naming its own buffer) and replayed
through the allocator model from the state the campaign's warm-up left (`HELD_BEFORE_MODEL`). Printed: the measured
allocated and reserved peaks (above the warm-up's), the replay's, and their errors; --phases adds each phase's
(forward, loss, backward, optimizer: the rows reset the peaks between phases); --as-emitted replays the step
model's buffers as they are (the optimizer's states and update temporaries one allocation per parameter and per
step, the way the step model emits them) to show what the rewrite in `torch_events` is worth. The replay is not yet
used by any answer: this measures whether it can be.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Hashable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.cuda.common import read_rows, table  # noqa: E402
from benchmarks.cuda.score import RESULTS, find_exports, latest_by_key  # noqa: E402

MIB = 2**20
PHASES = ("forward", "loss", "backward", "optimizer")

# What the campaign's warm-up (benchmarks/cuda/measure.py warm_up: cuBLAS, cuBLASLt and cuDNN first use, then
# empty_cache) leaves allocated before the model: every training row's before_model is 65 MiB allocated in 66 MiB
# reserved, so 1 MiB of cached room is all the step can find there. Replayed as one request of kSmallSize (1 MiB)
# in a 2 MiB small-pool segment, whose other MiB serves the step's first small requests: with it the replay's
# baseline (parameters and inputs allocated) matches the rows' on every model (without it, 2 MiB more reserved on
# bert, convnext, llama_gqa, t5 and tiny_cnn). The other 64 MiB are whole segments allocated to the end.
HELD_BEFORE_MODEL = (MIB,)

# The device tensors PyTorch's optimizers keep per parameter (torch/optim/adam.py _init_group: exp_avg and
# exp_avg_sq made by zeros_like, one parameter after the other; the step count is a CPU tensor when neither
# capturable nor fused is set, as the campaign's foreach optimizers are) and the tensors their foreach update makes
# per parameter (_multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs), one tensor per parameter
# made in order, freed when the update returns: the list's items in reverse).
DEVICE_STATES = {"adamw": 2, "adam": 2}
CPU_STEP_BYTES = 4
STATE_SUFFIX = " (optimizer state)"
TEMPORARIES_SUFFIX = " (backward temporaries)"
# the buffers of a parameter's gradient a node's backward makes: the gradient, or under autocast the 16-bit one
# (the fp32 gradient follows from its cast, after the node)
GRADIENT_NAMES = ("{} (low-precision gradient)", "grad {}")
FOREACH_TEMPORARIES = "update temporaries"

Event = tuple[str, Hashable, int, bool]  # phase, name, bytes, is a free


def first_step_run(export: Path, row: dict[str, Any]) -> Any:
    """Give the first step onnxmem simulates for a training row (its events and buffers), with `convolutions`
    set on it: the cuDNN workspaces of each convolution's backward, by the name of its temporaries' buffer
    (TorchCuda's convolution_backwards)."""
    import onnxmem
    from benchmarks.cuda.measure import training_options
    from onnxmem.targets.torch.cuda.device import convolution_backwards
    from onnxmem.training import step as step_module

    captured: list[Any] = []
    simulate = step_module.simulate

    def capture(model: Any, options: Any, rule: Any, first_step: bool, *args: Any, **kwargs: Any) -> Any:
        run = simulate(model, options, rule, first_step, *args, **kwargs)
        if first_step and not any(args) and not any(kwargs.values()) and not captured:  # (no checkpoint segments)
            found = convolution_backwards(model.nodes, model.values, model.needs_grad, options.precision)
            run.convolutions = {f"{model.nodes[n].name}{TEMPORARIES_SUFFIX}": (
                scratch, tuple(model.values[t].name for t in model.nodes[n].inputs[1:]
                               if t >= 0 and t in set(model.params))) for n, scratch in found.items()}
            captured.append(run)
        return run

    step_module.simulate = capture  # type: ignore[assignment]
    try:
        onnxmem.analyze(str(export), row.get("dims") or {"batch": row.get("batch")},
                        training=training_options(onnxmem, "cuda", row["optimizer"], row["precision"]),
                        provider="cuda")
    finally:
        step_module.simulate = simulate  # type: ignore[assignment]
    return captured[0]


def torch_events(run: Any, optimizer: str, as_emitted: bool = False) -> list[Event]:
    """Give the allocations and frees of a simulated step as PyTorch makes them: at each event the buffers that
    start there in the step model's order, then the frees of those that end there; each free names its buffer.

    The step model emits an optimizer's states as one buffer per parameter and its foreach update's temporaries as
    one buffer of all the parameters' bytes: PyTorch allocates each state tensor of each parameter on its own
    (DEVICE_STATES), keeps the step count on the CPU, and makes one temporary per parameter (the update's
    exp_avg_sq_sqrt list), freed in reverse. Replayed as one buffer, 82 MiB of temporaries need an 82 MiB segment
    that the per-parameter tensors do not (they fit the blocks the backward's activations left cached), and a
    parameter's two states of 9 MiB (kLargeBuffer segments) become one request of 18 MiB (a segment of its own).
    With as_emitted, the buffers are replayed as the step model emits them."""
    phase, buffers = run.events.phase, run.buffers
    convolutions = {} if as_emitted else getattr(run, "convolutions", {})
    weight_bytes = {b.name: b.nbytes for b in buffers if b.category == "weights"}
    states_per_param = 0 if as_emitted else DEVICE_STATES.get(optimizer, 0)
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for index, buffer in enumerate(buffers):
        if buffer.nbytes > 0:
            starts.setdefault(buffer.start, []).append(index)
            ends.setdefault(buffer.end, []).append(index)
    split_states: dict[int, int] = {}  # buffer -> the parameter's bytes, for the state buffers allocated per tensor
    split_temporaries: set[int] = set()
    made_early: set[int] = set()  # weight gradients allocated between a convolution's two workspaces
    events: list[Event] = []
    for event in range(len(phase)):
        at = phase[event]
        parameters: list[int] = []  # the bytes of the parameters whose states start here, in order
        for index in starts.get(event, ()):
            buffer = buffers[index]
            if index in made_early:
                continue
            if buffer.name in convolutions and buffer.start == buffer.end:
                scratch, weights = convolutions[buffer.name]
                # cuDNN's order: grad_input (made before), the backward-data workspace, grad_weight, the
                # backward-filter workspace; each workspace freed at once
                made_here = {buffers[i].name: i for i in starts.get(event, ()) if i > index}
                grads = [next(made_here[p.format(w)] for p in GRADIENT_NAMES if p.format(w) in made_here)
                         for w in weights if any(p.format(w) in made_here for p in GRADIENT_NAMES)]
                rest = buffer.nbytes - scratch.backward
                if scratch.backward_data:
                    events.extend([(at, (index, "data"), scratch.backward_data, False),
                                   (at, (index, "data"), scratch.backward_data, True)])
                events.extend((at, i, buffers[i].nbytes, False) for i in grads)
                made_early.update(grads)
                if scratch.backward_filter:
                    events.extend([(at, (index, "filter"), scratch.backward_filter, False),
                                   (at, (index, "filter"), scratch.backward_filter, True)])
                if rest > 0:
                    events.append((at, index, rest, False))
                else:
                    split_temporaries.add(index)
                continue
            param = weight_bytes.get(buffer.name.removesuffix(STATE_SUFFIX), 0) \
                if buffer.category == "optimizer state" and buffer.name.endswith(STATE_SUFFIX) else 0
            if states_per_param and param and buffer.nbytes == states_per_param * param + CPU_STEP_BYTES:
                split_states[index] = param
                parameters.append(param)
                events.extend((at, (index, state), param, False) for state in range(states_per_param))
                continue
            if states_per_param and buffer.name == FOREACH_TEMPORARIES and buffer.start == buffer.end \
                    and parameters and buffer.nbytes % sum(parameters) == 0:
                per_param = buffer.nbytes // sum(parameters)
                made = [((index, k, copy), param) for k, param in enumerate(parameters) for copy in range(per_param)]
                events.extend((at, name, nbytes, False) for name, nbytes in made)
                events.extend((at, name, nbytes, True) for name, nbytes in reversed(made))
                split_temporaries.add(index)
                continue
            events.append((at, index, buffer.nbytes, False))
        for index in ends.get(event, ()):
            if index in split_temporaries:
                continue
            if index in split_states:
                events.extend((at, (index, state), split_states[index], True) for state in range(states_per_param))
                continue
            events.append((at, index, buffers[index].nbytes, True))
    return events


def step_phases(events: list[Event]) -> dict[str, Any]:
    """Give the replay's peaks per phase of a step's events, above the warm-up's leftovers."""
    from onnxmem.targets.torch.cuda.allocator import replay_phases

    return replay_phases(events, HELD_BEFORE_MODEL)


def measured_phases(row: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Give a training row's first-step (peak allocated, peak reserved) per phase, above its before_model."""
    base = row.get("before_model") or {}
    phases = (row.get("steps") or [{}])[0].get("phases") or {}
    return {name: (figures["peak_allocated"] - base.get("allocated", 0),
                   figures["peak_reserved"] - base.get("reserved", 0))
            for name, figures in phases.items() if figures.get("peak_reserved") is not None}


def score_rows(paths: list[Path], as_emitted: bool = False, models: set[str] | None = None) -> list[dict[str, Any]]:
    """Give, per full-model training row with an export (of `models` only, when given), the measured first-step
    peaks and the replay's, overall and per phase (bytes above the warm-up's leftovers), and the row's end-of-step
    memory_stats."""
    latest = latest_by_key([r for r in read_rows(paths) if r.get("schema", "").startswith("onnxmem.cuda-")])
    exports = find_exports(list(paths), [])
    scored = []
    for key, row in sorted(latest.items()):
        if row.get("kind") != "training" or row.get("error") is not None or row.get("variant") != "full" \
                or (models is not None and row.get("model") not in models):
            continue
        export = exports.get(f"{row.get('model')}.full.onnx")
        steps = row.get("steps") or []
        if export is None or not steps or steps[0].get("peak_reserved") is None:
            continue
        base = row.get("before_model") or {}
        phases = step_phases(torch_events(first_step_run(export, row), row["optimizer"], as_emitted))
        scored.append({
            "row": key.removeprefix("training/"), "stats": steps[0].get("stats") or {},
            "measured_phases": measured_phases(row), "phases": phases,
            "allocated": steps[0]["peak_allocated"] - base.get("allocated", 0),
            "reserved": steps[0]["peak_reserved"] - base.get("reserved", 0),
            "replay_allocated": max(p.allocated for p in phases.values()),
            "replay_reserved": max(p.reserved for p in phases.values())})
    return scored


def error(ours: int, theirs: int) -> str:
    return f"{100 * (ours - theirs) / theirs:+.1f}%" if theirs else "-"


def main(argv: list[str] | None = None) -> int:
    """Print the table; give the exit status (0, also with no rows)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="*", type=Path, default=[RESULTS])
    parser.add_argument("--phases", action="store_true", help="each phase's peaks too")
    parser.add_argument("--as-emitted", action="store_true",
                        help="replay the step model's optimizer buffers as emitted (not as PyTorch allocates them)")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    scored = score_rows(args.rows, args.as_emitted)
    if not scored:
        print("no training rows with exports: run benchmarks/cuda/run_on_gpu.sh on a GPU and commit its rows")
        return 0
    lines = [(s["row"], f"{s['allocated'] / MIB:.1f}", f"{s['replay_allocated'] / MIB:.1f}",
              error(s["replay_allocated"], s["allocated"]), f"{s['reserved'] / MIB:.1f}",
              f"{s['replay_reserved'] / MIB:.1f}", error(s["replay_reserved"], s["reserved"])) for s in scored]
    errors = [abs(s["replay_reserved"] - s["reserved"]) / s["reserved"] for s in scored]
    print("first step, MiB above the warm-up's leftovers: measured vs the allocator replay of onnxmem's events"
          + (" (optimizer buffers as the step model emits them)" if args.as_emitted else ""))
    print(table(("row", "allocated", "replay allocated", "error", "reserved", "replay reserved", "error"), lines))
    print(f"reserved: {len(errors)} rows, mean |error| {100 * sum(errors) / len(errors):.1f}%, max "
          f"{100 * max(errors):.1f}%, within 5%: {sum(e <= 0.05 for e in errors)}")
    if args.phases:
        phase_lines = []
        for s in scored:
            cells = [s["row"]]
            for name in PHASES:
                theirs, ours = s["measured_phases"].get(name), s["phases"].get(name)
                cells += ["-", "-"] if theirs is None or ours is None else \
                    [f"{theirs[1] / MIB:.0f}/{ours.reserved / MIB:.0f}", error(ours.reserved, theirs[1])]
            phase_lines.append(tuple(cells))
        print("\nper phase, reserved peak MiB measured/replay (each phase's peak; reserved includes the phases before)")
        print(table(("row", *(f"{n} {c}" for n in PHASES for c in ("reserved", "error"))), phase_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
