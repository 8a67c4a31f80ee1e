"""How long eager PyTorch code holds a tensor its forward made: a Python variable keeps its tensor alive until the
variable is rebound or the function holding it returns, after the tensor's last reader in the graph.

Read from the Python frames each op ran in (the dynamo exporter's stack traces, where the loaded graph's ops carry
them as `frames`: 'file:line function<TAB>source line', outermost first; without them nothing is read): the ops one
statement of one frame ran, in the file's order (PyTorch's), are a run; a run whose statement assigns plain names
(`h = self.dense(x)`, `q, k, v = self.split(x)`) binds what it made and a later statement reads; that binding lasts
until a later statement of the same frame rebinds every one of those names (the old tensor is released when that
statement completes), else until the frame's last op. A frame is told apart from another call of the same function
by its call sites and its module scope (a module called in a loop: one frame per module). Measured:
benchmarks/training_zoo_single_ops.py --locals (a frozen chain written with variables holds 669 KB more than
written inline); MobileBERT's layers bind the bottleneck's outputs and their output dense's result so.
"""

from __future__ import annotations

import re

from onnxmem.ir.graph import INPUT, WEIGHT, ModelGraph
from onnxmem.training.values import StepNode, StepValue, is_tensor

# a statement that assigns plain names: `x = ...`, `a, b = ...`, `(a, b) = ...`, `x: T = ...` (not `x == y`,
# `x += y`, `self.x = ...`, `x[i] = ...`)
_ASSIGNS = re.compile(r"^\(?\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*,?\s*\)?\s*(?::[^=]+)?=(?!=)")


# one call of a function: the call sites that led to it (the frames above it) and its module scope
Frame = tuple[tuple[str, ...], str]


def _scopes(layer: str) -> list[str]:
    """Give the module calls a dynamo export's namespace holds, outermost first, as scope prefixes."""
    parts = layer.split("/")[:-1] if ":" in layer else []
    return ["/".join(parts[:i + 1]) for i in range(len(parts))]


def held_by_locals(graph: ModelGraph, nodes: list[StepNode], values: list[StepValue], roots: list[int]) \
        -> dict[int, int]:
    """Give, per activation storage a statement binds to Python variables, the last node during which eager code
    still holds it (module docstring); none without the exporter's frames."""
    frames_of: dict[int, tuple[str, ...]] = {}
    for n, node in enumerate(nodes):
        if node.graph_op is not None and not node.restored:
            frames = getattr(graph.ops[node.graph_op], "frames", ())
            if frames:
                frames_of[n] = frames
    if not frames_of:
        return {}
    order = sorted(frames_of, key=lambda n: (nodes[n].graph_op, n))
    position = {n: i for i, n in enumerate(order)}
    runs: list[tuple[Frame, int, int, str]] = []  # (frame, first position, last position, its line)
    # per depth: (frame, its line, first position, the module the statement calls: a loop's next call is a new run)
    open_runs: list[tuple[Frame, str, int, str]] = []
    frame_end: dict[Frame, int] = {}
    for i, n in enumerate(order):
        lines = frames_of[n]
        scopes = _scopes(nodes[n].layer)
        calls = 0
        keys: list[Frame] = []
        for d, line in enumerate(lines):
            calls += line.split("\t", 1)[0].endswith(" forward")
            keys.append((lines[:d], scopes[min(calls, len(scopes)) - 1] if calls and scopes else ""))
        for d, line in enumerate(lines):
            inner = keys[d + 1][1] if d + 1 < len(keys) else ""
            frame_end[keys[d]] = i
            if d < len(open_runs) and open_runs[d][:2] == (keys[d], line) \
                    and not (inner and open_runs[d][3] and inner != open_runs[d][3]):
                if inner:
                    open_runs[d] = (keys[d], line, open_runs[d][2], inner)
                continue
            runs.extend((frame, first, i - 1, text) for frame, text, first, _ in open_runs[d:])
            del open_runs[d:]
            open_runs.append((keys[d], line, i, inner))
        runs.extend((frame, first, i - 1, text) for frame, text, first, _ in open_runs[len(lines):])
        del open_runs[len(lines):]
    runs.extend((frame, first, len(order) - 1, text) for frame, text, first, _ in open_runs)
    runs.sort(key=lambda run: run[1])
    bound: dict[Frame, list[tuple[int, set[str], set[int]]]] = {}
    for frame, first, last, text in runs:
        found = _ASSIGNS.match(text.split("\t", 1)[1])
        if found is None:
            continue
        made = set()
        for i in range(first, last + 1):
            for t in nodes[order[i]].outputs:
                r = roots[t] if t >= 0 else -1
                if r < 0 or values[r].kind in (WEIGHT, INPUT) or not is_tensor(values[r]):
                    continue
                if any(position.get(c, -1) > last for m in (t, r) for c in values[m].consumers):
                    made.add(r)
        names = {name.strip() for name in found.group(1).split(",")}
        bound.setdefault(frame, []).append((last, names, made))
    held: dict[int, int] = {}
    for frame, bindings in bound.items():
        for k, (_, names, made) in enumerate(bindings):
            until = frame_end[frame]
            left = set(names)
            for later, later_names, _ in bindings[k + 1:]:
                left -= later_names
                if not left:
                    until = later
                    break
            for r in made:
                n = order[until]
                if held.get(r, -1) < n:
                    held[r] = n
    return held
