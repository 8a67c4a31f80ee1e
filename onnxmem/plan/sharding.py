"""Sharded training: what one GPU (and one node's CPU) holds when N GPUs divide a training step's model states as
ZeRO (DeepSpeed stages 1-3) or FSDP (FULL_SHARD) divide them, with DeepSpeed's CPU offload.

The model states are the engine's, not autocast's: under mixed precision DeepSpeed keeps 16-bit parameters (2 B
per parameter) and 16-bit gradients (2), and for its optimizer fp32 gradients (4), fp32 master parameters (4) and
the optimizer's states (Adam: 8); in fp32 or pure bf16 the parameters, gradients and states as the report counts
them. Each stage divides some of them (padded partitions: rounded up), as DeepSpeed's estimators count them
(`estimate_zero2_model_states_mem_needs`, `estimate_zero3_model_states_mem_needs`, deepspeed/runtime/zero/
stage_1_and_2.py and stage3.py; tests/test_sharding.py checks them to the byte):

- zero1: the fp32 gradients, master parameters and optimizer states; zero2: and the 16-bit gradients;
- zero3: and the 16-bit parameters; the 16-bit gradients are reduce-scattered into the fp32 partition as backward
  makes them, so only the unit being run holds them: while a unit runs its parameters and gradients are gathered
  (4 B per parameter under mixed precision, DeepSpeed's `4 x largest_layer_params`);
- fsdp (FULL_SHARD; SHARD_GRAD_OP is zero2): PyTorch's own states (fp32 parameters, gradients, optimizer states
  under autocast) divided, and one wrapped unit gathered in the compute precision.

The gathered unit is the real unit of gathering: the repeated block (a decoder layer) found from the parameters'
module scopes or names (`layers.N.`), else from the longest run of identical weight-shape sequences, else the
largest parameter; a parameter outside the blocks that is larger (an embedding) is gathered alone, and the larger
of the two is what one GPU holds.

Offload (`--offload`, DeepSpeed's offload_optimizer and offload_param): `optimizer` moves the fp32 gradients,
master parameters and optimizer states (and the divided 16-bit gradients that feed them) to CPU memory, where the
optimizer runs; `params` (zero3 and fsdp) moves the 16-bit parameters' partition; `both`. The CPU figure is per
node, as DeepSpeed's estimators count it (each process loading the fp32 model at start-up, its 1.5 buffer factor).

Activations stay per GPU. The step's other bytes are read event by event from the training report's timeline
(its model-state series apart), so the per-GPU peak is the worst event of the sharded step, not the unsharded peak
less a saving: the optimizer update's temporaries are divided too (each rank updates its shard only), and none stay
on the GPU when the optimizer runs on the CPU.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from onnxmem.errors import TargetError
from onnxmem.views.report import STATE_SERIES, Sharding, TrainingParameter, TrainingReport

SHARD_STAGES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
OFFLOADS = ("none", "optimizer", "params", "both")
GPUS_PER_NODE = 8  # a node's GPUs: --gpus above it spans ceil(N / 8) nodes (the CPU figure is per node)
DEEPSPEED_BUFFER_FACTOR = Fraction(3, 2)  # DeepSpeed's estimators' additional_buffer_factor default
_GATHERING = ("forward", "loss", "backward")  # the phases where a gathered unit is held


@dataclass(frozen=True)
class StateTerms:
    """A model's states on one GPU, whole, as the engine that shards them keeps them (bytes)."""

    params: int  # trainable parameter elements
    frozen: int  # frozen parameter elements
    params16: int  # the working parameters (16-bit under mixed precision), trainable and frozen
    grads16: int  # the gradients backward makes, in the working precision
    grads32: int  # fp32 gradients the optimizer reads (mixed precision under DeepSpeed; else 0)
    master32: int  # fp32 master parameters (mixed precision under DeepSpeed; else 0)
    optimizer: int  # the optimizer's states
    gathered_per_element: int  # bytes per element of a gathered unit: its parameters and gradients


def deepspeed_terms(params: int, optimizer_bytes_per_param: int = 8, frozen: int = 0) -> StateTerms:
    """Give the states of mixed-precision training under DeepSpeed for `params` trainable elements: 16-bit
    parameters and gradients, fp32 gradients and master parameters, `optimizer_bytes_per_param` (Adam: 8)."""
    return StateTerms(params, frozen, 2 * (params + frozen), 2 * params, 4 * params, 4 * params,
                      optimizer_bytes_per_param * params, 4)


def engine_terms(training: TrainingReport, stage: str) -> StateTerms:
    """Give the model states of a training report as the stage's engine keeps them (see the module's docstring)."""
    trainable = training.trainable_parameters
    frozen = training.parameters - trainable
    param_bytes = sum(g.trainable_bytes + g.frozen_bytes for g in training.parameter_groups)
    master = sum(g.trainable_bytes for g in training.parameter_groups)
    amp = training.precision.startswith("amp-")
    if amp and stage.startswith("zero"):
        return StateTerms(trainable, frozen, 2 * (trainable + frozen), 2 * trainable, training.gradient_bytes,
                          master, training.optimizer_state_bytes, 4)
    per_element = -(-param_bytes // max(1, trainable + frozen))
    gathered = 4 if amp else 2 * per_element  # fsdp's MixedPrecision gathers in the compute precision
    return StateTerms(trainable, frozen, param_bytes, training.gradient_bytes, 0, 0, training.optimizer_state_bytes,
                      gathered)


def check_sharding(stage: str, gpus: int, offload: str = "none") -> None:
    """Raise TargetError for a stage, GPU count or offload that does not exist or does not combine."""
    if stage not in SHARD_STAGES:
        raise TargetError(f"sharding stage '{stage}' is unknown: choose one of {', '.join(SHARD_STAGES)}")
    if gpus < 1:
        raise TargetError(f"gpus {gpus}: must be a positive integer")
    if offload not in OFFLOADS:
        raise TargetError(f"offload '{offload}' is unknown: choose one of {', '.join(OFFLOADS)}")
    if offload != "none" and stage == "ddp":
        raise TargetError("offload moves sharded states to CPU memory: it needs a ZeRO stage or fsdp "
                          "(--shard zero1|zero2|zero3|fsdp)")
    if offload == "params" and stage not in ("zero3", "fsdp"):
        raise TargetError(f"parameter offload needs parameters that are partitioned: --shard zero3 or fsdp, not "
                          f"{stage} (DeepSpeed's offload_param is a stage-3 option); --offload optimizer offloads "
                          "the optimizer states at any ZeRO stage")


def _part(nbytes: int, gpus: int) -> int:
    return -(-nbytes // gpus)


def model_states(terms: StateTerms, stage: str, gpus: int, offload: str = "none", unit_elements: int = 0,
                 gpus_per_node: int = GPUS_PER_NODE, zero_init: bool = True) -> Sharding:
    """Give the model states per GPU (and per node's CPU) when `gpus` GPUs divide `terms` as `stage` does.

    zero3 and fsdp hold one gathered unit of `unit_elements` parameters and their gradients while it runs (none on
    one GPU, where nothing is divided). The CPU figure is DeepSpeed's (estimate_zero2/3_model_states_mem_needs):
    the offloaded states of the node's GPUs, or each process's fp32 model at start-up, whichever is larger, times
    1.5; `zero_init`: zero.Init builds the model partitioned (stage 3), so no process loads it whole.
    """
    check_sharding(stage, gpus, offload)
    t = terms
    nodes = -(-gpus // gpus_per_node)
    per_node = min(gpus, gpus_per_node)
    divided = gpus > 1 and stage != "ddp"
    moves_optimizer = offload in ("optimizer", "both")
    moves_params = offload in ("params", "both")

    def part(nbytes: int) -> int:
        return _part(nbytes, gpus) if divided else nbytes

    # the fp32 gradients, master parameters and states: divided from zero1 on; the optimizer offload moves them
    grads32, fp32 = part(t.grads32), part(t.master32) + part(t.optimizer)
    # 16-bit gradients: whole (ddp, zero1), divided (zero2; fsdp and zero3 without an fp32 copy to feed), or only in
    # the gathered unit (zero3 with an fp32 partition: reduce-scattered straight into it)
    if stage in ("ddp", "zero1"):
        grads16 = t.grads16
    elif stage == "zero3" and t.grads32 and divided:
        grads16 = 0
    else:
        grads16 = part(t.grads16)
    grads16_moves = stage not in ("ddp", "zero1")  # with the optimizer offloaded, reduced into CPU memory
    params16 = part(t.params16) if stage in ("zero3", "fsdp") else t.params16
    gpu_w = 0 if moves_params else params16
    gpu_g = (0 if moves_optimizer and grads16_moves else grads16) + (0 if moves_optimizer else grads32)
    gpu_o = 0 if moves_optimizer else fp32
    gathered = unit_elements * t.gathered_per_element if stage in ("zero3", "fsdp") and divided else 0
    if stage == "fsdp" and moves_params:  # FSDP's CPUOffload: parameters, gradients and the update on the CPU
        gpu_g, gpu_o = 0, 0
    unsharded = t.params16 + t.grads16 + t.grads32 + t.master32 + t.optimizer
    per_gpu = gpu_w + gpu_g + gpu_o + gathered
    cpu = _cpu_bytes(t, stage, gpus, nodes, per_node, offload, unit_elements, zero_init)
    return Sharding(stage=stage, gpus=gpus, weights_bytes=gpu_w, gradient_bytes=gpu_g, optimizer_state_bytes=gpu_o,
                    gathered_bytes=gathered, unsharded_bytes=unsharded, per_gpu_bytes=per_gpu,
                    saved_bytes=unsharded - per_gpu, offload=offload, cpu_bytes=cpu)


def _cpu_bytes(t: StateTerms, stage: str, gpus: int, nodes: int, per_node: int, offload: str, unit_elements: int,
               zero_init: bool) -> int:
    """Give one node's CPU memory as DeepSpeed's estimators count it (0 for ddp and fsdp without offload)."""
    if stage == "ddp" or (stage == "fsdp" and offload == "none"):
        return 0
    elements = t.params + t.frozen
    offloaded = 0
    if offload in ("optimizer", "both"):
        offloaded += t.grads32 + t.master32 + t.optimizer + (0 if t.grads32 else t.grads16)
    if offload in ("params", "both"):
        offloaded += t.params16
    if stage == "fsdp":
        return int(Fraction(offloaded + (t.grads16 if offload != "none" else 0), nodes))
    factor = DEEPSPEED_BUFFER_FACTOR
    if stage != "zero3":
        # stage_1_and_2.py: total_params x max(4 x total_gpus, 16) with offload (the states of every GPU, counted
        # on each node), else total_params x 4 x num_gpus_per_node (each process loads the fp32 model)
        if offload == "none":
            return int(4 * elements * per_node * factor)
        return int(max(4 * elements * gpus, offloaded) * factor)
    if offload == "none":
        loaded = 4 * unit_elements if zero_init else 4 * elements  # zero.Init: one layer at a time
        return int(loaded * per_node * factor)
    share = Fraction(offloaded, nodes)
    return int((share if zero_init else max(Fraction(4 * elements * per_node), share)) * factor)


# --- the gathered unit ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GatheredUnit:
    """What ZeRO-3 or FSDP gathers at once: its description and its parameters' elements."""

    description: str
    elements: int


_SEPARATORS = re.compile(r"[./]")


def numbered_levels(text: str) -> list[tuple[str, int]]:
    """Give (prefix, index) of every numbered component of a dotted or slashed path, outermost first:
    'stages.1.blocks.3.mlp' -> [('stages', 1), ('stages.1.blocks', 3)]; [] where there is none."""
    parts = _SEPARATORS.split(text)
    return [(".".join(p for p in parts[:i] if p), int(part)) for i, part in enumerate(parts)
            if i > 0 and part.isdigit() and parts[i - 1]]


def _block_of(text: str) -> tuple[str, int] | None:
    """Give (prefix, index) of the first numbered component of a dotted or slashed path: 'model.layers.3.mlp' ->
    ('model.layers', 3); None where there is none."""
    levels = numbered_levels(text)
    return levels[0] if levels else None


def gathered_unit(parameters: Sequence[TrainingParameter]) -> GatheredUnit:
    """Give the unit gathered at once: the largest repeated block (by module scope, by name, by shape sequence), or
    a larger parameter outside the blocks; the largest parameter where nothing repeats."""
    if not parameters:
        return GatheredUnit("no parameters", 0)
    largest = max(parameters, key=lambda p: p.elements)
    for source, key in (("module scopes", lambda p: p.module), ("parameter names", lambda p: p.name)):
        blocks: dict[str, dict[int, int]] = {}
        member: set[int] = set()
        for i, p in enumerate(parameters):
            found = _block_of(key(p))
            if found is not None:
                prefix, index = found
                blocks.setdefault(prefix, {})
                blocks[prefix][index] = blocks[prefix].get(index, 0) + p.elements
                member.add(i)
        repeated = {k: v for k, v in blocks.items() if len(v) >= 2}
        if repeated:
            prefix = max(repeated, key=lambda k: sum(repeated[k].values()))
            index, elements = max(repeated[prefix].items(), key=lambda kv: kv[1])
            words = f"{prefix}.{index}: the largest of {len(repeated[prefix])} blocks {prefix}.N, from the {source}"
            member = {i for i, p in enumerate(parameters) if (_block_of(key(p)) or ("",))[0] == prefix}
            return _with_outside(words, elements, parameters, member)
    found_shapes = repeated_run([p.shape for p in parameters])
    if found_shapes is not None:
        start, period, count = found_shapes
        elements = max(sum(p.elements for p in parameters[start + k * period:start + (k + 1) * period])
                       for k in range(count))
        words = (f"a block of {period} parameters repeated {count} times (from '{parameters[start].name}'), from "
                 "identical weight shapes: the file names no modules")
        return _with_outside(words, elements, parameters, set(range(start, start + count * period)))
    return GatheredUnit(f"{largest.name}: the largest parameter (no repeated block found)", largest.elements)


def _with_outside(words: str, elements: int, parameters: Sequence[TrainingParameter],
                  member: set[int]) -> GatheredUnit:
    outside = [p for i, p in enumerate(parameters) if i not in member]
    biggest = max(outside, key=lambda p: p.elements, default=None)
    if biggest is not None and biggest.elements > elements:
        return GatheredUnit(f"{biggest.name}, gathered alone, larger than one block ({words})", biggest.elements)
    return GatheredUnit(words, elements)


_LONGEST_BLOCK = 256  # parameters in one repeated block at most (a decoder layer has about 10)


def repeated_run(shapes: Sequence[object]) -> tuple[int, int, int] | None:
    """Give (start, period, repeats) of the run of identical sequences (parameters' shapes; nodes' op types) that
    covers most items (the shortest period among equals), or None where nothing repeats twice."""
    n = len(shapes)
    best: tuple[int, int, int, int] | None = None  # (-covered, period, start, repeats)
    for period in range(1, min(n // 2, _LONGEST_BLOCK) + 1):
        run = 0
        for i in range(n - period + 1):
            if i < n - period and shapes[i] == shapes[i + period]:
                run += 1
                continue
            repeats = (run + period) // period
            if repeats >= 2:
                start = i - run
                candidate = (-(repeats * period), period, start, repeats)
                if best is None or candidate < best:
                    best = candidate
            run = 0
    if best is None:
        return None
    return best[2], best[1], best[3]


# --- the sharded step -------------------------------------------------------------------------------------------


def sharded_step(training: TrainingReport, stage: str, gpus: int, offload: str = "none",
                 gpus_per_node: int = GPUS_PER_NODE) -> Sharding:
    """Give one GPU's model states and its peak over the training step when `gpus` GPUs run it as `stage` does.

    Every event of the first and a later step: the report's live bytes less its model states (the parameters, and
    the series of gradients, optimizer states, autocast's weight copies and update temporaries), plus the states
    one GPU keeps (persistent partitions, as the engines allocate them), the gathered unit in forward and backward,
    and the update's temporaries over the GPU's shard (none when the optimizer runs on the CPU)."""
    check_sharding(stage, gpus, offload)
    timeline = training.timeline
    unit = gathered_unit(timeline.parameters if timeline is not None else ())
    terms = engine_terms(training, stage)
    states = model_states(terms, stage, gpus, offload, unit.elements, gpus_per_node)
    sharding = _replace(states, gathered_unit=unit.description, gathered_parameters=unit.elements)
    if stage == "ddp" or timeline is None or not timeline.first_states:
        temporaries = next((r.bytes for r in training.live_at_peak if r.category == "temporaries"), 0)
        return _replace(sharding, update_temporary_bytes=temporaries, peak_bytes=training.peak_bytes,
                        activation_bytes=training.peak_bytes - (training.weights_bytes + training.gradient_bytes
                                                                + training.optimizer_state_bytes),
                        peak_event=f"{training.peak_step} step, {training.peak_phase}: {training.peak_event}")
    param_bytes = sum(g.trainable_bytes + g.frozen_bytes for g in training.parameter_groups)
    persistent = sharding.per_gpu_bytes - sharding.gathered_bytes
    on_cpu = offload in ("optimizer", "both") or (stage == "fsdp" and offload != "none")
    best = (-1, 0, "")
    for which, live, series in (("first", timeline.first_live_bytes, timeline.first_states),
                                ("later", timeline.later_live_bytes, timeline.later_states)):
        update = series["update temporaries"]
        for e, total in enumerate(live):
            other = total - param_bytes - sum(series[c][e] for c in STATE_SERIES)
            temporaries = 0 if on_cpu else _part(update[e], gpus)
            gathered = sharding.gathered_bytes if timeline.phases[e] in _GATHERING else 0
            peak = persistent + gathered + other + temporaries
            if peak > best[0]:
                best = (peak, other + temporaries, f"{which} step, {timeline.phases[e]}: {timeline.events[e]}")
    peak, activations, where = best
    top_update = max((max(s["update temporaries"], default=0) for s in (timeline.first_states,
                                                                         timeline.later_states)), default=0)
    return _replace(sharding, update_temporary_bytes=0 if on_cpu else _part(top_update, gpus),
                    activation_bytes=activations, peak_bytes=peak, peak_event=where)


def _replace(sharding: Sharding, **changes: object) -> Sharding:
    return dataclasses.replace(sharding, **changes)  # type: ignore[arg-type]


def smallest_gpus(fits: Callable[[int], bool], limit: int = 2**20) -> tuple[int, list[int]]:
    """Give the fewest GPUs n (1 <= n <= limit) for which fits(n) holds, and every n evaluated: 1, 2, 4, ... until
    one fits, then bisection (per-GPU memory never grows with n); 0 where even `limit` does not fit."""
    tried: list[int] = []
    low, high = 0, 0  # low does not fit, high fits
    n = 1
    while n <= limit:
        tried.append(n)
        if fits(n):
            high = n
            break
        low = n
        n *= 2
    if high == 0:
        if low < limit:
            tried.append(limit)
            if fits(limit):
                low, high = low, limit
        if high == 0:
            return 0, tried
    while high - low > 1:
        middle = (low + high) // 2
        tried.append(middle)
        if fits(middle):
            high = middle
        else:
            low = middle
    return high, tried
