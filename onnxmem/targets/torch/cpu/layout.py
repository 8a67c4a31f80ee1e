"""Which 4-D activations PyTorch holds in channels-last memory on CPU, read from the export's graph: the one
detector of the CPU target (the convolutions' scratch in convolution.py, slow_conv2d's GEMMs in gemm.py and the
GELU primitives in primitives.py all ask it).

A convolution whose input is channels-last (its strides, not its shape) runs oneDNN in the NHWC layout
(ATen's mkldnn_conv_use_channels_last), with other scratch than the NCHW one (convolution.py). The graph keeps
shapes, not strides; the layouts that PyTorch's ops give are followed from where they start:
- a permute of a contiguous [N, H, W, C] tensor to [N, C, H, W] (timm's ConvNeXt and MetaNeXt blocks, LayerNorm2d),
  or a [N, L, C] tensor transposed to [N, C, L] and viewed as [N, C, H, W] (PVT's and SegFormer's token-to-image
  reshapes): channels-last;
- an elementwise op keeps the layout of its first input of the output's shape (TensorIterator orders the dims by
  its first operand's strides: `x.permute(0, 3, 1, 2) + shortcut` is channels-last), and so do a convolution, a
  batch norm and a pool of their input;
- `.contiguous()` (aten.clone, which the exporter writes as an Identity node carrying the clone's mark: PVT's
  patch embeddings call it after their permute) and anything else give a contiguous tensor; but a clone that is
  a Dropout module's copy (p=0 in a train-mode trace: rules.py EVAL_MODULES, its module scope says so) is
  clone()'s preserve_format, which keeps the layout (the exporter writes the contiguous format as clone's keyword,
  which the loaded graph drops: in the zoo's exports every clone with that keyword is outside a Dropout and every
  one without it inside one: timm's ConvNeXt V2 blocks' mlp.drop1/drop2 keep channels-last).

The rule reads a tensor's shape and its producer (LayoutOp) through two small adapters: the loaded graph's
(channels_last, for one tensor) and the step's nodes and values (channels_last_values, for all of them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from onnxmem.ir.graph import ModelGraph
from onnxmem.training.rules import EVAL_MODULES
from onnxmem.training.values import StepNode, StepValue, aten_op, module_classes

# ops whose output has the layout of their first input of the output's full shape
LAYOUT_KEEPING: frozenset[str] = frozenset({
    "Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Gelu", "Erf", "HardSigmoid", "HardSwish",
    "Mish", "Softplus", "Neg", "Abs", "Sqrt", "Pow", "Identity", "Dropout", "Clip", "Cast", "Elu", "Selu", "Exp",
})
# ops whose output has the layout of their input 0 whatever the shapes
LAYOUT_OF_INPUT: frozenset[str] = frozenset({"Conv", "BatchNormalization", "MaxPool", "AveragePool"})
# ATen ops whose result is contiguous whatever their input (x.contiguous() is aten.clone with the contiguous format;
# the exporter drops the keyword, and a plain clone() before a convolution is rarer than .contiguous())
CONTIGUOUS_ATEN: frozenset[str] = frozenset({"clone", "contiguous"})
WALK_LIMIT = 256  # producers followed back from one tensor

Shape = tuple[int | str | None, ...] | None


class LayoutOp(NamedTuple):
    """What the rule reads of the op that makes a tensor: its type, its inputs (tensor indices, -1 for none), the
    ATen op it was exported from ("" where the export does not say) and its module scope."""

    op_type: str
    inputs: tuple[int, ...]
    aten: str
    layer: str


def channels_last(graph: ModelGraph, tensor: int) -> bool:
    """Say whether PyTorch holds graph tensor `tensor` (4-D) in channels-last memory."""

    def producer(t: int) -> LayoutOp | None:
        made_by = graph.tensors[t].producer
        if made_by is None:
            return None
        op = graph.ops[made_by]
        return LayoutOp(op.op_type, op.inputs, aten_op(op.origin), op.layer)

    return _channels_last(tensor, lambda t: graph.tensors[t].shape, producer)


def channels_last_values(nodes: list[StepNode], values: list[StepValue]) -> set[int]:
    """Give the step's 4-D values PyTorch holds in channels-last memory (the rule of channels_last, over the step's
    nodes, whose ATen op StepNode.aten keeps)."""

    def producer(t: int) -> LayoutOp | None:
        made_by = values[t].producer
        if made_by is None:
            return None
        node = nodes[made_by]
        return LayoutOp(node.op_type, node.inputs, node.aten, node.layer)

    return {t for t, v in enumerate(values)
            if v.producer is not None and v.shape is not None and len(v.shape) == 4
            and _channels_last(t, lambda i: values[i].shape, producer)}


def _channels_last(tensor: int, shape_of: Callable[[int], Shape], producer_of: Callable[[int], LayoutOp | None]) \
        -> bool:
    """The rule: follow `tensor` back through the ops that keep their input's layout to where a layout starts."""
    index, steps = tensor, 0
    while steps < WALK_LIMIT:
        steps += 1
        shape = shape_of(index)
        op = producer_of(index)
        if op is None or shape is None or len(shape) != 4:
            return False
        if op.aten in CONTIGUOUS_ATEN and not _module_copy(op.layer):
            return False
        source = op.inputs[0] if op.inputs else -1
        if op.op_type == "Transpose":
            return source >= 0 and _permuted_to_nchw(shape_of(source), shape)
        if op.op_type == "Reshape":
            return source >= 0 and _tokens_viewed_as_image(source, shape, shape_of, producer_of)
        if op.op_type in LAYOUT_OF_INPUT:
            following = source
        elif op.op_type in LAYOUT_KEEPING:
            following = next((t for t in op.inputs if t >= 0 and shape_of(t) == shape), -1)
        else:
            return False
        if following < 0:
            return False
        index = following
    return False


def _module_copy(layer: str) -> bool:
    """Say whether an op is a module's copy of its input (a Dropout with p=0 traced in train mode: a plain clone)."""
    classes = module_classes(layer)
    return bool(classes) and classes[-1] in EVAL_MODULES


def _permuted_to_nchw(before: Shape, shape: tuple[int | str | None, ...]) -> bool:
    """Say whether a Transpose from `before` to `shape` is the permute (0, 3, 1, 2) of [N, H, W, C]."""
    if before is None or len(before) != 4 or tuple(before) == tuple(shape):
        return False
    return (before[0], before[3], before[1], before[2]) == tuple(shape)


def _tokens_viewed_as_image(source: int, shape: tuple[int | str | None, ...], shape_of: Callable[[int], Shape],
                            producer_of: Callable[[int], LayoutOp | None]) -> bool:
    """Say whether a Reshape from `source` to [N, C, H, W] views a [N, L, C] tensor transposed to [N, C, L]."""
    before = shape_of(source)
    op = producer_of(source)
    if op is None or before is None or len(before) != 3:
        return False
    if op.op_type != "Transpose" or not op.inputs or op.inputs[0] < 0:
        return False
    tokens = shape_of(op.inputs[0])
    if tokens is None or len(tokens) != 3 or (tokens[0], tokens[2], tokens[1]) != tuple(before):
        return False
    height, width, length = shape[2], shape[3], before[2]
    # (a square [N, L, L] reads the same transposed: the exporter writes no identity Transpose, so it is one)
    return before[:2] == tuple(shape[:2]) and isinstance(height, int) and isinstance(width, int) \
        and isinstance(length, int) and height * width == length
