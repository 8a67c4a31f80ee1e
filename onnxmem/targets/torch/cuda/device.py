"""PyTorch training on a CUDA GPU: what the step model asks of the device, answered for CUDA.

What differs from CPU in the step today: scaled_dot_product_attention keeps what the backend PyTorch picks on the GPU
keeps (attention.py: cuDNN, flash, memory-efficient or math), dropout keeps a bool mask (the generic rule's 8 bits per
element), autocast's fp32 list is CUDA's (tables.py AUTOCAST_FP32) and the cross-entropy's log_softmax runs at the
logits' width (tables.py LOSS_AT_INPUT_WIDTH), the optimizer update defaults to foreach (temporaries over all
parameters at once), a recurrent op keeps cuDNN's reserve space (tables.py CUDA_RESERVE_VALUES), and the autograd
graph is host memory, not the GPU's (not counted). No library keeps buffers in the step's count. From the H100
single-op rows (benchmarks/cuda/score_singleops.py): a convolution's cuDNN workspaces, its NHWC copies and its
backward's two calls (convolution.py; convolution_backwards gives them to a replay of the caching allocator), and
each fused attention backend's backward scratch (attention.py backward_scratch); the convolutions those rows do not
cover carry a note. Checked against the H100 rows: benchmarks/cuda/score.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnxmem.targets.torch.cuda.attention as attention
import onnxmem.targets.torch.cuda.convolution as convolution
from onnxmem.targets.torch.base import DeviceOption, HeldPeaks, LibraryBuffer, NodeContext, NodeFacts
from onnxmem.targets.torch.cuda.allocator import replay
from onnxmem.targets.torch.cuda.tables import (
    AUTOCAST_FP32,
    CUDA_RESERVE_VALUES,
    CUDNN_CONVOLUTIONS,
    LOSS_AT_INPUT_WIDTH,
)

if TYPE_CHECKING:
    from onnxmem.training.values import StepNode, StepValue

CAVEAT = ("the CUDA device model is checked against one GPU (H100 80GB, PyTorch 2.11, CUDA 13: "
          "benchmarks/cuda/score.py): it counts the tensors of the step, which scaled_dot_product_attention backend "
          "runs (cuDNN, flash, memory-efficient or math) and what each keeps, cuDNN's recurrent reserve space and the "
          "foreach update, each fused attention backend's backward scratch, and cuDNN's convolution workspaces in "
          "2-D convolutions (cudnn.benchmark off: the NHWC copies, the backward-filter call's scratch); it does not "
          "count the other engines cuDNN takes on some shapes (up to 184 MiB more on a 7x7 one at batch 1, 786 MiB "
          "on a 1x1 one on 224 x 224 positions, on the H100), "
          "cudnn.benchmark's search, the convolutions the rows do not cover (strided, grouped but not "
          "depthwise, transposed, 1-D or 3-D), or autocast's weight cache beyond one 16-bit copy per weight; "
          "held_bytes replays the caching allocator (memory_reserved) but the report does not use it yet")


@dataclass(frozen=True)
class TorchCuda:
    """PyTorch on one CUDA GPU (takes no options)."""

    name: str = "cuda"
    # counted as views, as before the CPU's measurement: the H100 rows disagree with a copy on the fp32 transformers
    # (benchmarks/cuda/score.py: gpt2 -0.0% -> +1.5%, bert -2.5% -> +2.2% with it); no CUDA single-op row measures it
    clone_makes_storage: bool = False
    # an elementwise op over inputs of different float widths casts as it reads (dynamic casting): no copy
    promotes_by_copy: bool = False
    options: Sequence[DeviceOption] = ()
    default_update_impl: str = "foreach"
    autograd_node_bytes: int = 0  # the autograd graph is host memory: not the GPU's
    caveat: str = CAVEAT

    def check(self) -> None:
        """Raise nothing: the device takes no options."""

    def unmodelled(self, nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool],
                   differentiable: list[bool], precision: str) -> tuple[str, ...]:
        """Give a note where the step runs convolutions whose cuDNN buffers the single-op rows do not cover
        (convolution.py: strided, grouped but not depthwise, transposed, not 2-D, 1x1 outside the measured
        shapes, shapes not known), nothing else."""
        uncovered = sum(1 for n, node in enumerate(nodes)
                        if node.op_type in CUDNN_CONVOLUTIONS and _convolution_scratch(node, values, needs_grad,
                                                                                      precision) is None)
        if not uncovered:
            return ()
        return (f"[unmodelled-kernel] {uncovered} convolution(s) run in cuDNN with a shape the H100 rows do not cover "
                "(strided or not padded to the input's size, grouped but not depthwise, transposed, 1-D or 3-D, a 1x1 "
                "one over 256 channels or under 14x14 positions, or a shape not known): their workspaces (taken "
                "through PyTorch's caching allocator while a convolution runs) are not counted; on 2-D ones they "
                "were up to 3x the output's bytes; the estimate may be low by that much",)

    def autocast_fp32(self, key: str, appended_loss: bool) -> bool:
        """Say whether autocast on CUDA runs the op in fp32 (tables.py AUTOCAST_FP32), except the loss's ops that
        run at their input's width (tables.py LOSS_AT_INPUT_WIDTH)."""
        if appended_loss and key in LOSS_AT_INPUT_WIDTH:
            return False
        return key in AUTOCAST_FP32

    def kernel_key(self, context: NodeContext) -> str:
        """Give the attention backend's rule where the op is scaled_dot_product_attention (attention.py: the fused
        kernels keep no probabilities; the math path does), the generic key otherwise."""
        if context.key not in (attention.FUSED, attention.WITH_DROPOUT):
            return context.key
        return attention.rule_key(_attention_call(context))

    def node_facts(self, context: NodeContext) -> NodeFacts:
        """Give a convolution's cuDNN transients (convolution.py), a fused attention backend's backward scratch
        (attention.py backward_scratch), cuDNN's reserve space for a recurrent op (tables.py CUDA_RESERVE_VALUES),
        the math attention's fp32 tensors from 16-bit inputs (PyTorch's math path upcasts them unless
        allow_fp16_bf16_reduction_math_sdp); nothing for other ops."""
        if context.key in CUDNN_CONVOLUTIONS:
            scratch = _convolution_scratch(context.node, context.values, context.needs_grad, context.precision)
            if scratch is None:
                return NodeFacts()
            return NodeFacts(forward_temporaries=scratch.forward, backward_temporaries=scratch.backward)
        if context.key == attention.FUSED:
            out0 = context.node.outputs[0] if context.node.outputs else -1
            query = context.values[context.node.inputs[0]] if context.node.inputs and context.node.inputs[0] >= 0 \
                else None
            if out0 < 0 or query is None or not query.numel:
                return NodeFacts()
            return NodeFacts(backward_temporaries=attention.backward_scratch(
                _attention_call(context), context.values[out0].nbytes, query.numel))
        if context.key in attention.MATH_RULES.values():
            query = context.values[context.node.inputs[0]] if context.node.inputs else None
            low = query is not None and bool(query.numel) and query.nbytes // (query.numel or 1) < 4
            return NodeFacts(math_in_fp32=low)
        values = CUDA_RESERVE_VALUES.get(context.recurrent, 0) if context.recurrent else 0
        if not values or context.recurrent_dims is None:
            return NodeFacts()
        steps, directions, batch, _, hidden = context.recurrent_dims
        return NodeFacts(kept_bytes=4 * directions * steps * batch * hidden * values)

    def library_uses(self, nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool],
                     differentiable: list[bool], precision: str) -> object:
        """Give nothing: no CUDA library's buffers are counted with the step."""
        return None

    def library_buffers(self, uses: object, event: Callable[[int, bool], int]) -> list[LibraryBuffer]:
        """Give no buffers (library_uses gives none)."""
        return []

    def held_bytes(self, events: Sequence[tuple[int, bool]]) -> HeldPeaks:
        """Give PyTorch's CUDA caching allocator's peaks over the events (allocator.py replay): memory_allocated
        and memory_reserved (scored against the H100 rows by benchmarks/cuda/score_reserved.py; no answer uses it
        yet)."""
        peaks = replay(events)
        return HeldPeaks(peaks.allocated, peaks.reserved)


def _convolution_scratch(node: StepNode, values: list[StepValue], needs_grad: list[bool],
                         precision: str) -> convolution.ConvolutionScratch | None:
    """Give a convolution's cuDNN transients (convolution.py) at the width it runs at (16 bits under autocast or in
    bf16, else its input's), or None where the rows do not cover it."""
    if node.op_type not in convolution.CONVOLUTIONS:
        return None
    inputs = node.inputs
    if len(inputs) < 2 or inputs[0] < 0 or inputs[1] < 0 or not node.outputs or node.outputs[0] < 0:
        return None
    x, w, y = values[inputs[0]], values[inputs[1]], values[node.outputs[0]]
    width = x.nbytes // x.numel if x.numel else 0
    if width <= 0:
        return None
    element = min(width, 2) if precision != "fp32" else width
    return convolution.convolution_scratch(x, w, y, element, needs_grad[inputs[1]], needs_grad[inputs[0]],
                                           precision.startswith("amp-"))


def convolution_backwards(nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool],
                          precision: str) -> dict[int, convolution.ConvolutionScratch]:
    """Give the cuDNN workspaces of each convolution's backward the rows cover (convolution.py), by node: what a
    replay of the caching allocator takes between the backward's gradients (grad_input, the backward-data
    workspace, grad_weight, the backward-filter workspace, each workspace freed before the next tensor)."""
    found = {}
    for n, node in enumerate(nodes):
        if node.op_type in CUDNN_CONVOLUTIONS:
            scratch = _convolution_scratch(node, values, needs_grad, precision)
            if scratch is not None and (scratch.backward_data or scratch.backward_filter):
                found[n] = scratch
    return found


def _attention_call(context: NodeContext) -> attention.AttentionCall:
    """Give what the export shows of a scaled_dot_product_attention call (q, k, v [, mask]) as the backend choice
    reads it."""
    inputs, values = context.node.inputs, context.values

    def shape(i: int) -> tuple[object, ...]:
        return tuple(values[inputs[i]].shape or ()) if i < len(inputs) and inputs[i] >= 0 else ()

    def dim(s: tuple[object, ...], axis: int) -> int | None:
        return s[axis] if len(s) >= -axis and isinstance(s[axis], int) else None  # type: ignore[return-value]

    q, k, v = shape(0), shape(1), shape(2)
    query = values[inputs[0]] if inputs and inputs[0] >= 0 else None
    element = query.nbytes // query.numel if query is not None and query.numel else 4
    q_heads, kv_heads, mask = dim(q, -3), dim(k, -3), len(inputs) > 3 and inputs[3] >= 0
    repeated = _repeated_from(context, inputs[1], q_heads) if len(inputs) > 1 and inputs[1] >= 0 else None
    if repeated is not None:
        # k was repeated to the query's heads (transformers' repeat_kv, which it uses while tracing because the
        # trace builds a mask): eagerly, without a padding mask, it calls SDPA with enable_gqa=True and no mask
        kv_heads, mask = repeated, False
    return attention.AttentionCall(
        element_bytes=element, q_heads=q_heads, kv_heads=kv_heads, q_head_dim=dim(q, -1),
        k_head_dim=dim(k, -1), v_head_dim=dim(v, -1), kv_len=dim(k, -2), mask=mask,
        dropout=context.key == attention.WITH_DROPOUT)


def _repeated_from(context: NodeContext, key: int, q_heads: int | None) -> int | None:
    """Give the head count k had before a head repeat (Unsqueeze -> Expand -> Reshape, as repeat_kv exports) where
    the graph shows one, else None."""
    graph = context.graph
    index = graph.tensor_index.get(context.values[key].name)
    if index is None or not q_heads:
        return None
    expanded = False
    for _ in range(attention.REPEAT_WALK):
        tensor = graph.tensors[index]
        shape = tensor.shape or ()
        heads = shape[-3] if len(shape) == 4 else None
        if expanded and isinstance(heads, int) and 0 < heads < q_heads and q_heads % heads == 0:
            return heads
        op = graph.ops[tensor.producer] if tensor.producer is not None else None
        if op is None or op.op_type not in attention.REPEAT_OPS or not op.inputs or op.inputs[0] < 0:
            return None
        expanded = expanded or op.op_type == "Expand"
        index = op.inputs[0]
    return None
