"""The optimizer's part of a step: its states per parameter (rules.py OPTIMIZERS: counts, 8-bit blocks, Adafactor's
factored statistics, the step count) and its update's temporaries (for-loop, foreach or fused)."""

from __future__ import annotations

import math

from onnxmem.training.model import StepModel
from onnxmem.training.options import TrainingOptions
from onnxmem.training.rules import EIGHT_BIT_BLOCK, EIGHT_BIT_MIN_ELEMENTS, OptimizerRule
from onnxmem.training.schedule import Buffers, Schedule
from onnxmem.training.values import StepValue


def optimizer_buffers(model: StepModel, options: TrainingOptions, rule: OptimizerRule, step: Schedule,
                       buffers: Buffers, first_step: bool) -> None:
    """Add the optimizer's states (made in the first step, there from the start of a later one) and its update's
    temporaries."""
    values, params, opt_events = model.values, model.params, step.opt_events
    impl = options.update_impl
    states = _state_bytes_per_param(model, rule, options)
    for i, p in enumerate(params):
        at = opt_events[i] if impl == "for-loop" else opt_events[0]
        created = (opt_events[0] if rule.states_created_at_once else at) if first_step else step.data
        buffers.add(f"{values[p].name} (optimizer state)", "optimizer state", states[p], created, step.end)
    transient_factor = {"for-loop": rule.transient_for_loop, "foreach": rule.transient_foreach, "fused": 0}[impl]
    if not transient_factor:
        return
    if impl == "for-loop":
        for i, p in enumerate(params):
            buffers.add(f"{values[p].name} (update temporaries)", "temporaries",
                        transient_factor * values[p].nbytes, opt_events[i], opt_events[i])
            if rule.held_by_loop and i:  # the previous parameter's, kept by the loop's variable through this one
                previous = params[i - 1]
                buffers.add(f"{values[previous].name} (update temporaries, held)", "temporaries",
                            rule.held_by_loop * values[previous].nbytes, opt_events[i], opt_events[i])
    else:
        buffers.add("update temporaries", "temporaries", transient_factor * model.param_bytes, opt_events[0],
                    opt_events[0])


def param_grad_bytes(model: StepModel, options: TrainingOptions) -> int:
    """Give the bytes of the trainable parameters' gradients."""
    return sum(model.values[p].nbytes for p in model.params)


def _state_bytes_per_param(model: StepModel, rule: OptimizerRule, options: TrainingOptions) -> dict[int, int]:
    states: dict[int, int] = {}
    for p in model.params:
        v = model.values[p]
        numel = v.numel or 0
        element = v.nbytes // numel if numel else 4
        size = 0
        if rule.state_bits and numel >= EIGHT_BIT_MIN_ELEMENTS:
            size += rule.states * (numel * rule.state_bits // 8 + 4 * math.ceil(numel / EIGHT_BIT_BLOCK))
        else:
            size += rule.states * numel * (4 if rule.state_bits else element)
        if rule.factored:
            size += _factored_state_elements(v, model) * element
        if rule.step_tensor:
            size += 4
        states[p] = size
    return states


def _factored_state_elements(value: StepValue, model: StepModel) -> int:
    """Give Adafactor's statistics: a row and a column vector for a matrix, a full one for a vector."""
    shape = value.shape
    numel = value.numel or 0
    if shape is None or len(shape) < 2 or not isinstance(shape[-1], int) or not isinstance(shape[-2], int) \
            or not shape[-1] or not shape[-2]:
        return numel
    return numel // shape[-1] + numel // shape[-2]


def optimizer_state_bytes(model: StepModel, rule: OptimizerRule, options: TrainingOptions) -> int:
    """Give the bytes of the optimizer's states over every trainable parameter."""
    return sum(_state_bytes_per_param(model, rule, options).values())
