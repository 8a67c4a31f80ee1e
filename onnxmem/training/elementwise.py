"""The backward of elementwise ops: the gradients each makes at the output's size and dtype before the engine sums
them to their inputs' shapes and casts them to their dtypes (rules.py ELEMENTWISE_GRADIENTS)."""

from __future__ import annotations

from onnxmem.training.rules import ELEMENTWISE_GRADIENTS
from onnxmem.training.values import StepNode, StepValue


def same_tensor_type(value: StepValue, out: StepValue | None) -> bool:
    """Say whether an input's gradient can be the output's gradient itself: the same elements and bytes (a 16-bit
    input of an fp32 output gets its gradient cast: a new tensor)."""
    return out is not None and value.numel == out.numel and value.nbytes == out.nbytes


def elementwise_backward(node: StepNode, values: list[StepValue], needs_grad: list[bool],
                          promotes_by_copy: bool) -> int:
    """Give the bytes an elementwise op's backward holds at its peak besides the output's gradient (rules.py
    ELEMENTWISE_GRADIENTS): each input's gradient made at the output's size and dtype, in the op's order, a narrower
    operand read in a product first copied at the output's width where the device promotes by copying (CPU), then
    each summed to its input's shape and cast to its dtype; 0 for other ops or where a size is not known."""
    how = ELEMENTWISE_GRADIENTS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    out = values[node.outputs[0]] if node.outputs and node.outputs[0] >= 0 else None
    if how is None or out is None or not out.numel or not out.is_float or len(node.inputs) != len(how.kinds):
        return 0
    width = out.nbytes // out.numel
    inputs = node.inputs
    if any(t >= 0 and needs_grad[t] and not values[t].numel for t in inputs):
        return 0
    live = peak = 0
    full: dict[int, int] = {}  # input -> the bytes of its gradient as made (0: the output's gradient itself)
    for i in how.order:
        t = inputs[i]
        if t < 0 or not needs_grad[t]:
            continue
        if how.kinds[i] == "output":
            full[i] = 0
            continue
        copy = 0
        other = inputs[1 - i]
        elements = values[other].numel or 0 if other >= 0 else 0
        if how.kinds[i] == "product" and promotes_by_copy and elements > 1 \
                and values[other].nbytes // elements < width:
            copy = elements * width
        peak = max(peak, live + copy + out.numel * width)
        live += out.numel * width
        full[i] = out.numel * width
    for i in sorted(full):
        value = values[inputs[i]]
        if full[i] == 0 and same_tensor_type(value, out):
            continue  # the output's gradient, handed on
        made = full[i]
        if (value.numel or 0) < out.numel:  # summed over the broadcast dims
            small = (value.numel or 0) * width
            peak = max(peak, live + small)
            live += small - made
            made = small
        if value.nbytes != made:  # cast to the input's dtype
            peak = max(peak, live + value.nbytes)
            live += value.nbytes - made
    return peak
