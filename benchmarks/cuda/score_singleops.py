"""Print the single-op rows of the CUDA campaign (benchmarks/cuda/singleops.py) as tables, without a GPU.

    python benchmarks/cuda/score_singleops.py [ROWS ...] [--group sdpa] [--dry]

ROWS: rows files or folders (default benchmarks/results/cuda). Figures are MiB above the allocated bytes before the
op (see benchmarks/results/cuda/README.md): for attention, each backend alone and the default's choice; for
convolutions, cuDNN's transient bytes (a phase's peak above what it leaves: the workspace); for the other ops,
what the forward keeps besides its output and the backward's peak; for AdamW, each step's temporaries; for the
allocator's scripted sequences, onnxmem's replay (onnxmem/targets/torch/cuda/allocator.py) against the measured
memory_allocated and memory_reserved after every event. --dry includes the CPU dry run's rows (no memory figures).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.cuda.common import ROOT, fmt_bytes, read_rows, table  # noqa: E402

DEFAULT_ROWS = ROOT / "benchmarks" / "results" / "cuda"


def latest(rows: list[dict[str, Any]], dry: bool) -> list[dict[str, Any]]:
    """Give the single-op rows, the last of each key (a later row replaces an earlier), in key order of first
    appearance."""
    found: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: str(r.get("time") or "")):  # the latest by its time, whichever file
        if row.get("kind") == "singleop" and (dry or not row.get("dry_run")):
            found[str(row.get("key"))] = row
    return list(found.values())


def _get(phase: Any, name: str) -> Any:
    return phase.get(name) if isinstance(phase, dict) else None


def _minus(a: Any, b: Any) -> Any:
    return a - b if isinstance(a, int) and isinstance(b, int) else None


def _tail(row: dict[str, Any]) -> str:
    return str(row.get("key")).split("/", 2)[-1]


def op_lines(row: dict[str, Any]) -> list[list[Any]]:
    """Give a table line per run of an op row: forward peak, kept (end minus output), backward peak and end, held."""
    lines = []
    for label, run in (row.get("runs") or {}).items():
        if not run.get("allowed"):
            lines.append([_tail(row), label, "no", "", "", "", "", "", "", "", str(run.get("reason", ""))[:40]])
            continue
        forward, backward = run.get("forward"), run.get("backward")
        kept = _minus(_get(forward, "end_allocated_above"), run.get("output_bytes"))
        transient = _minus(_get(forward, "peak_allocated_above"), _get(forward, "end_allocated_above"))
        lines.append([_tail(row), label, "yes", fmt_bytes(run.get("output_bytes")), fmt_bytes(kept),
                      fmt_bytes(run.get("saved_new_bytes")), fmt_bytes(transient),
                      fmt_bytes(_get(backward, "peak_allocated_above")),
                      fmt_bytes(_get(backward, "end_allocated_above")),
                      fmt_bytes(run.get("held_after_above")), run.get("grad_fn") or run.get("error") or ""])
    return lines


OP_HEADERS = ("config", "run", "ran", "output", "fwd kept", "saved new", "fwd transient", "bwd peak", "bwd end",
              "held", "node / why")


def sdpa_lines(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Give the attention table: per configuration and backend, with the default's choice marked."""
    lines = []
    for row in rows:
        default = row.get("default_backend")
        for line in op_lines(row):
            if line[1] == default:
                line[1] = f"{line[1]} *"
            lines.append(line)
    return lines


def adamw_lines(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Give the optimizer table: each step's peak and end above the parameters and gradients."""
    lines = []
    for row in rows:
        steps = row.get("steps") or []
        cells = [_tail(row), fmt_bytes(row.get("parameter_bytes")), fmt_bytes(row.get("state_bytes"))]
        for step in steps[:2]:
            phase = step.get("phase")
            cells += [fmt_bytes(_get(phase, "peak_allocated_above")), fmt_bytes(_get(phase, "end_allocated_above"))]
        lines.append(cells + [""] * (7 - len(cells)))
    return lines


def parse_settings(settings: str | None) -> dict[str, int | None]:
    """Give the replay's arguments from an allocator settings string ('max_split_size_mb:64,...')."""
    found: dict[str, int | None] = {"max_split_size": None, "roundup_power2_divisions": 0}
    for item in (settings or "").split(","):
        name, _, value = item.partition(":")
        if name.strip() == "max_split_size_mb" and value.strip().isdigit():
            found["max_split_size"] = int(value) * 2**20
        elif name.strip() == "roundup_power2_divisions" and value.strip().isdigit():
            found["roundup_power2_divisions"] = int(value)
    return found


def replay_compare(row: dict[str, Any]) -> dict[str, Any]:
    """Give the replay of an allocator row's events against its measured figures: the peaks of both, the events
    where allocated or reserved differ, and the first of them."""
    from onnxmem.targets.torch.cuda.allocator import CachingAllocator

    settings = parse_settings(row.get("settings"))
    allocator = CachingAllocator(settings["max_split_size"], int(settings["roundup_power2_divisions"] or 0))
    start = row.get("start") or {}
    measured = row.get("after") or []
    live: dict[int, list[Any]] = {}
    differences = {"allocated": 0, "reserved": 0}
    first: int | None = None
    peaks = {"allocated": 0, "reserved": 0}
    for index, (size, is_free) in enumerate(row.get("events") or []):
        if is_free:
            allocator.free(live[size].pop())
        else:
            live.setdefault(size, []).append(allocator.malloc(size))
        if index >= len(measured):
            continue
        allocated = measured[index][0] - start.get("allocated", 0)
        reserved = measured[index][1] - start.get("reserved", 0)
        peaks["allocated"], peaks["reserved"] = max(peaks["allocated"], allocated), max(peaks["reserved"], reserved)
        wrong = [name for name, ours, theirs in (("allocated", allocator.allocated, allocated),
                                                  ("reserved", allocator.reserved, reserved)) if ours != theirs]
        for name in wrong:
            differences[name] += 1
        if wrong and first is None:
            first = index
    return {"events": len(row.get("events") or []), "measured": peaks if measured else None,
            "replay": {"allocated": allocator.peak_allocated, "reserved": allocator.peak_reserved},
            "final": {"replay_reserved": allocator.reserved,
                      "measured_reserved": measured[-1][1] - start.get("reserved", 0) if measured else None},
            "differences": differences, "first_difference": first}


def allocator_lines(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Give the allocator table: the replay's peaks and last reserved against the measured, per sequence."""
    lines = []
    for row in rows:
        result = replay_compare(row)
        measured = result["measured"] or {}
        lines.append([_tail(row), row.get("settings") or "default", result["events"],
                      fmt_bytes(measured.get("allocated")), fmt_bytes(result["replay"]["allocated"]),
                      fmt_bytes(measured.get("reserved")), fmt_bytes(result["replay"]["reserved"]),
                      fmt_bytes(result["final"]["measured_reserved"]), fmt_bytes(result["final"]["replay_reserved"]),
                      result["differences"]["allocated"], result["differences"]["reserved"],
                      "-" if result["first_difference"] is None else result["first_difference"]])
    return lines


MIB = 2**20
TOLERANCE = 0.01  # a prediction within 1% (or EXACT_BYTES) of the measured bytes counts as exact
EXACT_BYTES = 64 * 1024


def _value(name: str, shape: tuple[int, ...], element: int) -> Any:
    from onnxmem.training.values import StepValue

    numel = 1
    for dim in shape:
        numel *= dim
    return StepValue(name, shape, numel, numel * element, True, "activation")


def conv_prediction(row: dict[str, Any]) -> dict[str, Any] | None:
    """Give onnxmem's CUDA device's transients for a conv row (TorchCuda.node_facts on the row's shapes, at the
    step's precision: fp32 tensors, autocast's 16-bit kernels), and as "scratch" its backward's two cuDNN
    workspaces (device.convolution_backwards; None: none), or None where its rules do not cover the shape."""
    from onnxmem.targets.torch.base import NodeContext
    from onnxmem.targets.torch.cuda import TorchCuda
    from onnxmem.targets.torch.cuda.device import convolution_backwards
    from onnxmem.training.values import StepNode

    s = row.get("sizes") or {}
    if not s:
        return None
    batch, cin, cout, side, size, groups = (int(s[k]) for k in ("batch", "in", "out", "side", "size", "groups"))
    values = [_value("x", (batch, cin, side, side), 4), _value("w", (cout, cin // groups, size, size), 4),
              _value("y", (batch, cout, side, side), 4)]
    node = StepNode("Conv", "", "conv", "", (0, 1), (2,), 0)
    precision = "fp32" if (row.get("config") or {}).get("dtype") == "fp32" else "amp-bf16"
    context = NodeContext(None, 0, node, values, [cin != 3, True, True], precision, "Conv")  # type: ignore[arg-type]
    device = TorchCuda()
    if device.unmodelled([node], values, [cin != 3, True, True], [True], precision):
        return None
    facts = device.node_facts(context)
    return {"forward": facts.forward_temporaries, "backward": facts.backward_temporaries,
            "scratch": convolution_backwards([node], values, [cin != 3, True, True], precision).get(0)}


CLEAN_SLACK = 3 * MIB  # a row whose forward starts with at most this much cached room (the warm-up's 1 MiB and the
# inputs' segments rounded to 2 MiB): its allocator state is the replay's; a larger room is an earlier row's segment


def conv_sequence(row: dict[str, Any]) -> dict[str, Any] | None:
    """Replay an fp32 conv row's allocations through onnxmem's CachingAllocator and give the backward's peak reserved
    above its start, measured and replayed: the warm-up's 1 MiB small-pool leftover, the inputs x and w, the
    forward (y, and the measured forward transient taken and freed), the ones-like output gradient, then the
    backward as cuDNN allocates it by the device's rules (grad_input where x needs one, the backward-data
    workspace freed, grad_weight, the backward-filter workspace freed); `one_temporary`: the same with the step
    model's one temporary (the sequence's peak above the gradients) taken after both gradients, as a replay of its
    buffers without the workspaces would. `clean`: the row's forward started with no earlier row's cached segment
    (at most CLEAN_SLACK of room), so its allocator state is the replay's. None for a row the rules do not cover,
    or not fp32."""
    from onnxmem.targets.torch.cuda.allocator import CachingAllocator

    s, c, run = row.get("sizes") or {}, row.get("config") or {}, (row.get("runs") or {}).get("first") or {}
    forward, backward = run.get("forward"), run.get("backward")
    ours = conv_prediction(row)
    if c.get("dtype") != "fp32" or ours is None or not isinstance(forward, dict) or not isinstance(backward, dict):
        return None
    batch, cin, cout, side, size, groups = (int(s[k]) for k in ("batch", "in", "out", "side", "size", "groups"))
    x, y, w = batch * cin * side * side * 4, batch * cout * side * side * 4, cout * cin // groups * size * size * 4
    scratch = ours["scratch"]
    data, filter_ = (scratch.backward_data, scratch.backward_filter) if scratch is not None else (0, 0)

    def backward_reserved(sequence: list[tuple[int, bool]]) -> int:
        allocator = CachingAllocator()
        for nbytes in (MIB, x, w):
            allocator.malloc(nbytes)
        allocator.malloc(y)
        transient = forward["peak_allocated_above"] - forward["end_allocated_above"]
        if transient > 0:
            allocator.free(allocator.malloc(transient))
        allocator.malloc(y)  # the ones-like output gradient
        start = allocator.reserved
        allocator.reset_peaks()
        for nbytes, freed in sequence:
            if nbytes:
                block = allocator.malloc(nbytes)
                if freed:
                    allocator.free(block)
        return allocator.peak_reserved - start

    grad_input = x if cin != 3 else 0  # the rows' stems take no input gradient
    return {"config": _tail(row), "clean": forward["base_reserved"] - forward["base_allocated"] <= CLEAN_SLACK,
            "ruled": batch >= 32 and side >= 56, "measured": backward["peak_reserved_above"],
            "replay": backward_reserved([(grad_input, False), (data, True), (w, False), (filter_, True)]),
            "one_temporary": backward_reserved([(grad_input, False), (w, False), (ours["backward"], True)])}


def conv_sequence_summary(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Give, for the fp32 conv rows the rules cover: all, the clean ones (their allocator state is the replay's),
    and the clean ones on the shapes the workspace rules are written for (batch 32 or more, 56 x 56 positions or
    more): rows, rows whose backward peak reserved the replay gives to the byte, and the largest miss in MiB; the
    same two for one temporary in place of the two workspaces."""
    found = [r for r in (conv_sequence(row) for row in rows if row.get("group") == "conv"
                         and row.get("error") is None) if r is not None]
    out = []
    for label, members in (("all", found), ("clean", [r for r in found if r["clean"]]),
                           ("clean, batch >= 32, >= 56x56", [r for r in found if r["clean"] and r["ruled"]])):
        line: list[Any] = [label, len(members)]
        for field in ("replay", "one_temporary"):
            misses = [(r[field] - r["measured"]) / MIB for r in members]
            line += [sum(1 for r in members if r[field] == r["measured"]),
                     f"{max(misses, key=abs):+.0f}" if misses else "-"]
        out.append(line)
    return out


def sdpa_prediction(row: dict[str, Any], backend_name: str) -> int | None:
    """Give onnxmem's CUDA device's backward scratch for an attention row run on one backend (attention.py
    backward_scratch), or None for math (its backward is the generic ops')."""
    from onnxmem.targets.torch.cuda.attention import AttentionCall, backward_scratch

    s, c = row.get("sizes") or {}, row.get("config") or {}
    if backend_name == "math" or not s:
        return None
    element = 4 if c.get("dtype") == "fp32" else 2
    heads, dim, seq, batch = int(s["heads"]), int(s["head_dim"]), int(s["seq"]), int(s["batch"])
    kv_heads = int(s["kv_heads"]) if c.get("gqa") == "enable" else heads  # repeat_kv's copies reach q's heads
    call = AttentionCall(element, heads, kv_heads, dim, dim, dim, seq, c.get("mask") is not None,
                         bool(c.get("dropout_p")))
    numel = batch * heads * seq * dim
    return backward_scratch(call, numel * element, numel, backend_name)


def _verdict(ours: int | None, measured: int | None) -> str:
    if ours is None or measured is None:
        return "-"
    return "exact" if abs(ours - measured) <= max(EXACT_BYTES, TOLERANCE * abs(measured)) else "differs"


def prediction_lines(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Give one line per measured phase of a conv or attention row that onnxmem predicts: group, config, run,
    phase, measured and ours (bytes), and whether they agree. Conv: the forward's transient (peak minus end) and,
    in fp32, the backward's (peak minus end: the gradients stay); autocast's backward peak mixes its fp32 casts,
    so it is not compared. Attention: the backward's peak minus the gradients of q, k and v."""
    lines: list[list[Any]] = []
    for row in rows:
        if row.get("error") is not None:
            continue
        group, runs = str(row.get("group")), row.get("runs") or {}
        if group == "conv":
            ours = conv_prediction(row)
            run = runs.get("first") or {}
            forward, backward = run.get("forward"), run.get("backward")
            if not run.get("allowed") or not isinstance(forward, dict):
                continue
            measured_forward = forward["peak_allocated_above"] - forward["end_allocated_above"]
            lines.append([group, _tail(row), "first", "forward", measured_forward,
                          ours["forward"] if ours else None])
            if (row.get("config") or {}).get("dtype") == "fp32" and isinstance(backward, dict):
                measured_backward = backward["peak_allocated_above"] - backward["end_allocated_above"]
                lines.append([group, _tail(row), "first", "backward", measured_backward,
                              ours["backward"] if ours else None])
        elif group in ("sdpa", "sdpa-variants"):
            for label, run in runs.items():
                backward = run.get("backward")
                if label == "default" or not run.get("allowed") or not isinstance(backward, dict):
                    continue
                predicted = sdpa_prediction(row, label)
                if predicted is None:
                    continue
                measured = backward["peak_allocated_above"] - int(run.get("grad_bytes") or 0)
                lines.append([group, _tail(row), label, "backward", measured, predicted])
        elif group == "lm" and (row.get("config") or {}).get("op") in ("mul_broadcast", "sub_broadcast"):
            run = runs.get("first") or {}
            backward = run.get("backward")
            if run.get("allowed") and isinstance(backward, dict):
                lines.append([group, _tail(row), "first", "backward", backward["peak_allocated_above"],
                              elementwise_prediction(row)])
    for line in lines:
        line.append(_verdict(line[5], line[4]))
    return lines


def elementwise_prediction(row: dict[str, Any]) -> int | None:
    """Give onnxmem's backward peak of an elementwise op over a broadcast fp32 scale on CUDA (training/elementwise.py,
    no copy of the 16-bit operand): the bytes besides the output's gradient, the final gradients included."""
    from onnxmem.training.elementwise import elementwise_backward
    from onnxmem.training.values import StepNode, StepValue

    config, sizes = row.get("config") or {}, row.get("sizes") or {}
    rows, width = sizes.get("rows"), sizes.get("width")
    if not isinstance(rows, int) or not isinstance(width, int):
        return None
    element = 2 if config.get("dtype") in ("bf16", "fp16") else 4
    x = StepValue("x", (rows, width), rows * width, rows * width * element, True, "activation")
    scale = StepValue("scale", (width,), width, width * 4, True, "weight")
    out = StepValue("y", (rows, width), rows * width, rows * width * 4, True, "activation")
    op = "Mul" if config.get("op") == "mul_broadcast" else "Sub"
    node = StepNode(op, "", "op", "", (1, 0) if config.get("order") == "sx" else (0, 1), (2,), 0)
    return elementwise_backward(node, [x, scale, out], [True, True, False], False)


def prediction_summary(lines: list[list[Any]]) -> list[list[Any]]:
    """Give per group and phase: lines, lines onnxmem covers, exact ones, and the mean and worst miss in MiB."""
    groups: dict[tuple[str, str], list[list[Any]]] = {}
    for line in lines:
        groups.setdefault((line[0], line[3]), []).append(line)
    out = []
    for (group, phase), members in sorted(groups.items()):
        covered = [m for m in members if m[5] is not None]
        misses = [(m[5] - m[4]) / MIB for m in covered]
        out.append([group, phase, len(members), len(covered), sum(1 for m in covered if m[6] == "exact"),
                    f"{sum(abs(x) for x in misses) / len(misses):.2f}" if misses else "-",
                    f"{max(misses, key=abs):+.2f}" if misses else "-"])
    return out


def render_predictions(rows: list[dict[str, Any]], group: str | None = None, every: bool = False) -> str:
    """Give the table of onnxmem's per-op predictions against the rows (only the lines that differ or are not
    covered unless `every`) and its summary."""
    lines = prediction_lines([r for r in rows if not group or r.get("group") == group])
    if not lines:
        return ""
    shown = [[g, c, r, p, fmt_bytes(m), fmt_bytes(o) if o is not None else "-", v]
             for g, c, r, p, m, o, v in lines if every or v != "exact"]
    return ("ours vs measured: MiB a phase holds besides its tensors (conv: cuDNN's transients; attention: the "
            "backward's scratch), onnxmem's CUDA device (onnxmem/targets/torch/cuda) against the row; "
            f"exact = within {TOLERANCE:.0%} or {EXACT_BYTES // 1024} KiB; '-' = not covered (the device's note)\n"
            + (table(("group", "config", "run", "phase", "measured", "ours", ""), shown) + "\n\n" if shown else "")
            + "summary:\n" + table(("group", "phase", "lines", "covered", "exact", "mean |miss| MiB",
                                     "worst MiB"), prediction_summary(lines)))


def render(rows: list[dict[str, Any]], group: str | None = None) -> str:
    """Give the tables of the single-op rows (one group's with `group`)."""
    by_group: dict[str, list[dict[str, Any]]] = {}
    failures = []
    for row in rows:
        if group and row.get("group") != group:
            continue
        if row.get("error") is not None:
            failures.append(f"{row.get('key')}: {row.get('error_kind')}: {str(row.get('error'))[:100]}")
            continue
        by_group.setdefault(str(row.get("group")), []).append(row)
    if not by_group and not failures:
        return "no single-op rows yet: run the campaign's singleop part on a GPU (bash benchmarks/cuda/run_on_gpu.sh)"
    parts = []
    for name, members in by_group.items():
        if name == "allocator":
            parts.append("allocator: MiB above the sequence's start; replay = onnxmem's CachingAllocator; "
                         "differences = events whose allocated / reserved differ\n" + table(
                             ("sequence", "settings", "events", "peak alloc", "replay", "peak reserved", "replay",
                              "last reserved", "replay", "alloc diffs", "reserved diffs", "first diff"),
                             allocator_lines(members)))
        elif name == "adamw":
            parts.append("adamw: MiB above the parameters and gradients; step 1 makes the states\n" + table(
                ("impl", "params", "states", "step1 peak", "step1 end", "step2 peak", "step2 end"),
                adamw_lines(members)))
        else:
            lines = sdpa_lines(members) if name.startswith("sdpa") else [line for r in members for line in op_lines(r)]
            note = " (* the default's choice)" if name.startswith("sdpa") else ""
            parts.append(f"{name}: MiB above the allocated bytes before the op; kept = forward's end minus its "
                         f"output; transient = forward's peak minus its end{note}\n" + table(OP_HEADERS, lines))
    if failures:
        parts.append("errors:\n" + "\n".join(failures))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Print the tables; give the exit status (0)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="*", default=[str(DEFAULT_ROWS)])
    parser.add_argument("--group", default=None, help="one group only (sdpa, allocator, conv, ...)")
    parser.add_argument("--dry", action="store_true", help="include the CPU dry run's rows")
    parser.add_argument("--every", action="store_true", help="print every prediction line, the exact ones too")
    args = parser.parse_args(argv)
    rows = latest(read_rows(args.rows), args.dry)
    print(render(rows, args.group))
    predictions = render_predictions(rows, args.group, args.every)
    if predictions:
        print("\n" + predictions)
    if args.group in (None, "conv"):
        sequences = conv_sequence_summary(rows)
        if sequences[0][1]:
            print("\nconv backward, fp32: the row's allocations replayed through the caching allocator with cuDNN's "
                  "two workspaces (onnxmem/targets/torch/cuda/convolution.py) against the backward's "
                  "peak reserved (and with the step model's one temporary in their place)\n"
                  + table(("rows", "lines", "reserved exact", "worst MiB", "one temporary: exact", "worst MiB"),
                          sequences))
    return 0


if __name__ == "__main__":
    sys.exit(main())
