"""What-ifs over the simulated step (cheap ops recomputed instead of kept, activation checkpointing in K segments),
the hand formula it is compared with, and the repeated blocks that checkpoint="layers" checkpoints."""

from __future__ import annotations

import fnmatch
import math

from onnxmem.errors import TrainingOptionError
from onnxmem.ir.graph import INPUT, OUTPUT, WEIGHT, module_path
from onnxmem.plan.sharding import numbered_levels, repeated_run
from onnxmem.training.model import StepModel
from onnxmem.training.options import TrainingOptions
from onnxmem.training.rules import CHEAP_TO_RECOMPUTE, OptimizerRule
from onnxmem.training.schedule import aliases
from onnxmem.training.simulate import simulate
from onnxmem.views.report import CheckpointWhatIf, RecomputeRow


def hand_formula(model: StepModel, options: TrainingOptions, rule: OptimizerRule, weights_bytes: int,
                  input_bytes: int, gradient_bytes: int) -> int:
    """Give the CS231n rule of thumb: weights, gradients and states, every activation twice, the inputs."""
    activations = sum(v.nbytes for t, v in enumerate(model.values)
                      if model.root[t] == t and v.kind not in (WEIGHT, INPUT, "loss") and v.producer is not None)
    activations += sum(model.values[t].nbytes for t in model.hidden)  # the graph's own nodes, as exported
    states = rule.states * model.param_bytes
    return weights_bytes + gradient_bytes + states + 2 * activations + input_bytes


def recompute_what_if(model: StepModel, options: TrainingOptions, rule: OptimizerRule,
                       segments: list[tuple[int, int]] | None = None) -> tuple[tuple[RecomputeRow, ...], int | None]:
    """Give the cheap ops whose kept output could be recomputed from inputs kept anyway, and the peak then (None
    where there is none: the peak stays)."""
    checkpointed = {n for start, end in segments or [] for n in range(start, end)}
    # (what only checkpointed blocks keep is recomputed already)
    kept = {r for r, savers in model.saved_by.items() if not checkpointed or not set(savers) <= checkpointed}
    candidates: list[RecomputeRow] = []
    roots: set[int] = set()
    for n, node in enumerate(model.nodes):
        if node.op_type not in CHEAP_TO_RECOMPUTE or not node.outputs or node.outputs[0] < 0:
            continue
        out = model.root[node.outputs[0]]
        if out not in kept or model.values[out].kind in (OUTPUT, "loss"):
            continue
        sources = [model.root[t] for t in node.inputs if t >= 0]
        if not all(s in kept or model.values[s].kind in (WEIGHT, INPUT) for s in sources):
            continue
        if any(model.values[s].producer == n for s in sources):
            continue
        roots.add(out)
        candidates.append(RecomputeRow(node.name, node.op_type, model.values[out].name, model.values[out].nbytes,
                                       model.values[out].numel or 0))
    if not candidates:
        return (), None
    first = simulate(model, options, rule, True, segments, frozenset(roots))
    later = simulate(model, options, rule, False, segments, frozenset(roots))
    candidates.sort(key=lambda r: -r.saved_bytes)
    return tuple(candidates), max(first.peak, later.peak)


def _flops(model: StepModel, n: int) -> int:
    """Give an op's forward FLOPs: 2 per multiply-add for products and convolutions, 1 per output element else."""
    node = model.nodes[n]
    out = model.values[node.outputs[0]] if node.outputs and node.outputs[0] >= 0 else None
    if out is None or out.numel is None:
        return 0
    if node.op_type in ("MatMul", "Gemm") and node.inputs and node.inputs[0] >= 0:
        shape = model.values[node.inputs[0]].shape
        k = shape[-1] if shape and isinstance(shape[-1], int) else 1
        return 2 * out.numel * k
    if node.op_type in ("Conv", "ConvTranspose") and len(node.inputs) > 1 and node.inputs[1] >= 0:
        shape = model.values[node.inputs[1]].shape
        per_output = 1
        for d in (shape or ())[1:]:
            per_output *= d if isinstance(d, int) else 1
        return 2 * out.numel * per_output
    return out.numel


def checkpoint_what_if(model: StepModel, options: TrainingOptions, rule: OptimizerRule,
                        peak: int) -> CheckpointWhatIf | None:
    """Give the peak with activation checkpointing in k segments (the last segment is not checkpointed)."""
    if options.checkpoint is None or options.checkpoints_layers:
        return None
    graph_nodes = [n for n in range(model.n_graph_nodes)]
    differentiable = [n for n in graph_nodes if model.differentiable[n]]
    if options.checkpoint == "auto":
        segments = max(1, math.isqrt(len(differentiable)))
    else:
        segments = int(options.checkpoint)
    ranges = _segment_ranges(model, segments)
    forward_flops = sum(_flops(model, n) for n in graph_nodes)
    extra = sum(_flops(model, n) for start, end in ranges for n in range(start, end))
    first = simulate(model, options, rule, True, segments=ranges)
    later = simulate(model, options, rule, False, segments=ranges)
    return CheckpointWhatIf(
        segments=len(ranges) + 1,
        peak_bytes=max(first.peak, later.peak),
        saved_activation_bytes=first.saved_at_backward_start,
        memory_saved_bytes=peak - max(first.peak, later.peak),
        forward_flops=forward_flops,
        extra_forward_flops=extra,
    )


def _segment_ranges(model: StepModel, segments: int) -> list[tuple[int, int]]:
    """Give the checkpointed ranges: k - 1 segments of about equal kept bytes, cut where little crosses."""
    n = model.n_graph_nodes
    if segments <= 1 or n < 2:
        return []
    kept_at = [0] * n
    for r, savers in model.saved_by.items():
        first = min(savers)
        if first < n:
            kept_at[first] += model.values[r].nbytes
    for node, nbytes in model.extras.items():
        if node < n:
            kept_at[node] += nbytes
    total = sum(kept_at)
    crossing = [0] * (n + 1)  # bytes produced before cut p and read at or after it
    for t, v in enumerate(model.values):
        if model.root[t] != t or v.producer is None or v.producer >= n or v.kind in (WEIGHT, INPUT):
            continue
        last = max((c for a in aliases(model, t) for c in model.values[a].consumers), default=v.producer)
        if last > v.producer:
            crossing[v.producer + 1] += v.nbytes
            crossing[min(last, n - 1) + 1] -= v.nbytes
    for p in range(1, n + 1):
        crossing[p] += crossing[p - 1]
    cuts: list[int] = []
    running = 0
    cumulative = []
    for p in range(n):
        running += kept_at[p]
        cumulative.append(running)
    window = max(1, n // (4 * segments))
    for j in range(1, segments):
        target = total * j / segments
        nearest = min(range(1, n), key=lambda p: abs(cumulative[p - 1] - target))
        lo, hi = max(1, nearest - window), min(n - 1, nearest + window)
        best = min(range(lo, hi + 1), key=lambda p: (crossing[p], abs(p - nearest)))
        if not cuts or best > cuts[-1]:
            cuts.append(best)
    bounds = [0, *cuts]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]




def layer_segments(model: StepModel, wanted: tuple[str, ...] = (), declared: tuple[str, ...] = ()) \
        -> tuple[list[tuple[int, int]], str]:
    """Give the node ranges [start, end) of the repeated blocks PyTorch users checkpoint one by one (transformers'
    decoder and encoder layers, timm's blocks), in order, and the words that say which: the modules `declared` by
    the export (the model's library checkpoints them: transformers' GradientCheckpointingLayer instances, the
    CHECKPOINT_LAYERS_PROPERTY of onnxmem.torch's and onnxmem.hf's exports) where the file's module scopes name
    them; else, from the nodes' module scopes, the numbered level ('model.layers.N', 'stages.N.blocks.M') that has
    the most blocks among those covering at least half the nodes the widest covers (a stage holds blocks, a layer
    holds numbered experts); where the file names no modules, from the longest repeated run of ops (op types and
    weight shapes: plan/sharding.py's repeated_run). `wanted`: fnmatch patterns of the levels to take instead
    ('stages', '*.encoder.layers'), every level matching. Raises TrainingOptionError where there is none."""
    n = model.n_graph_nodes
    levels: dict[str, dict[str, list[int]]] = {}  # level ('stages.*.blocks') -> block ('stages.1.blocks.3') -> nodes
    for m in range(n):
        for prefix, index in numbered_levels(module_path(model.nodes[m].layer)):
            level = ".".join("*" if part.isdigit() else part for part in prefix.split("."))
            levels.setdefault(level, {}).setdefault(f"{prefix}.{index}", []).append(m)
    if wanted:
        return _wanted_levels(levels, wanted)
    named = _declared_blocks(model, declared) if declared else None
    if named is not None:
        return named
    repeated = {level: blocks for level, blocks in levels.items() if len(blocks) >= 2}
    if repeated:
        widest = max(sum(map(len, blocks.values())) for blocks in repeated.values())
        level, blocks = max(((k, v) for k, v in repeated.items() if 2 * sum(map(len, v.values())) >= widest),
                            key=lambda kv: (len(kv[1]), sum(map(len, kv[1].values()))))
        ranges = _disjoint(sorted((min(nodes), max(nodes) + 1) for nodes in blocks.values()))
        first, last = min(blocks, key=lambda b: min(blocks[b])), max(blocks, key=lambda b: min(blocks[b]))
        return ranges, f"{len(ranges)} blocks {level}.N ({first} to {last}), from the module scopes"
    found = repeated_run([(model.nodes[m].op_type, tuple(model.values[t].shape for t in model.nodes[m].inputs
                                                         if t >= 0 and model.values[t].kind == WEIGHT))
                          for m in range(n)])
    if found is not None and found[1] >= 2 and 4 * found[1] * found[2] >= n:
        start, period, count = found
        return ([(start + k * period, start + (k + 1) * period) for k in range(count)],
                f"{count} blocks of {period} ops (from {model.nodes[start].op_type} {model.nodes[start].name}), from "
                "a repeated run of ops and weight shapes: the file names no modules")
    raise TrainingOptionError("--checkpoint layers: no repeated block found (no numbered module scope such as "
                              "'model.layers.N' and no repeated run of ops): checkpoint K segments instead")


def _declared_blocks(model: StepModel, declared: tuple[str, ...]) -> tuple[list[tuple[int, int]], str] | None:
    """Give the node ranges of the modules `declared` (module paths) and their words; None where no node's module
    scope is one of them (an export whose scopes name modules otherwise)."""
    wanted = set(declared)
    blocks: dict[str, list[int]] = {}
    for m in range(model.n_graph_nodes):
        path = module_path(model.nodes[m].layer)
        while path and path not in wanted:
            path = path.rpartition(".")[0]
        if path:
            blocks.setdefault(path, []).append(m)
    if not blocks:
        return None
    ranges = _disjoint(sorted((min(nodes), max(nodes) + 1) for nodes in blocks.values()))
    levels = dict.fromkeys(".".join("N" if part.isdigit() else part for part in block.split(".")) for block in blocks)
    return ranges, (f"{len(ranges)} blocks {', '.join(levels)}, as the model's library checkpoints them "
                    "(transformers' GradientCheckpointingLayer, named by the export)")


def _wanted_levels(levels: dict[str, dict[str, list[int]]], wanted: tuple[str, ...]) \
        -> tuple[list[tuple[int, int]], str]:
    """Give the node ranges of the blocks of every level matching one of `wanted` (fnmatch), and their words."""
    taken = [level for level in levels if any(fnmatch.fnmatchcase(level, p) for p in wanted)]
    if not taken:
        known = ", ".join(sorted(levels)[:8]) or "none: the file names no numbered modules"
        raise TrainingOptionError(f"--checkpoint layers:{','.join(wanted)}: no numbered module level matches "
                                  f"(levels: {known})")
    blocks = {block: nodes for level in taken for block, nodes in levels[level].items()}
    ranges = _disjoint(sorted((min(nodes), max(nodes) + 1) for nodes in blocks.values()))
    return ranges, f"{len(ranges)} blocks {', '.join(f'{level}.N' for level in taken)}, from the module scopes"


def _disjoint(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Give sorted ranges with each one starting where the previous ends at the earliest (a block whose nodes
    interleave with the previous one's loses those nodes to it); empty ones left out."""
    out: list[tuple[int, int]] = []
    for start, end in ranges:
        start = max(start, out[-1][1]) if out else start
        if end > start:
            out.append((start, end))
    return out
