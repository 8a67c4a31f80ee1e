"""Which 4-D activations PyTorch holds in channels-last memory on CPU, read from the export's graph.

A convolution whose input is channels-last (its strides, not its shape) runs oneDNN in the NHWC layout
(ATen's mkldnn_conv_use_channels_last), with other scratch than the NCHW one (convolution.py). The graph keeps
shapes, not strides; the layouts that PyTorch's ops give are followed from where they start:
- a permute of a contiguous [N, H, W, C] tensor to [N, C, H, W] (timm's ConvNeXt and MetaNeXt blocks, LayerNorm2d),
  or a [N, L, C] tensor transposed to [N, C, L] and viewed as [N, C, H, W] (PVT's and SegFormer's token-to-image
  reshapes): channels-last;
- an elementwise op keeps the layout of its first input of the output's shape (TensorIterator orders the dims by
  its first operand's strides: `x.permute(0, 3, 1, 2) + shortcut` is channels-last), and so do a convolution and a
  batch norm of their input;
- `.contiguous()` (aten.clone, which the exporter writes as an Identity node carrying the clone's mark: PVT's
  patch embeddings call it after their permute) and anything else give a contiguous tensor.
"""

from __future__ import annotations

from onnxmem.ir.graph import ModelGraph
from onnxmem.training.values import aten_op

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


def channels_last(graph: ModelGraph, tensor: int) -> bool:
    """Say whether PyTorch holds graph tensor `tensor` (4-D) in channels-last memory."""
    index, steps = tensor, 0
    while steps < WALK_LIMIT:
        steps += 1
        value = graph.tensors[index]
        shape = value.shape
        if value.producer is None or shape is None or len(shape) != 4:
            return False
        op = graph.ops[value.producer]
        if aten_op(op.origin) in CONTIGUOUS_ATEN:
            return False
        if op.op_type == "Transpose":
            return _permuted_to_nchw(graph, op.inputs[0], shape) if op.inputs and op.inputs[0] >= 0 else False
        if op.op_type == "Reshape":
            return _tokens_viewed_as_image(graph, op.inputs[0], shape) if op.inputs and op.inputs[0] >= 0 else False
        if op.op_type in LAYOUT_OF_INPUT:
            following = op.inputs[0] if op.inputs else -1
        elif op.op_type in LAYOUT_KEEPING:
            following = next((t for t in op.inputs if t >= 0 and graph.tensors[t].shape == shape), -1)
        else:
            return False
        if following < 0:
            return False
        index = following
    return False


def _permuted_to_nchw(graph: ModelGraph, source: int, shape: tuple[object, ...]) -> bool:
    """Say whether a Transpose from `source` to `shape` is the permute (0, 3, 1, 2) of [N, H, W, C]."""
    before = graph.tensors[source].shape
    if before is None or len(before) != 4 or tuple(before) == tuple(shape):
        return False
    return (before[0], before[3], before[1], before[2]) == tuple(shape)


def _tokens_viewed_as_image(graph: ModelGraph, source: int, shape: tuple[object, ...]) -> bool:
    """Say whether a Reshape from `source` to [N, C, H, W] views a [N, L, C] tensor transposed to [N, C, L]."""
    transposed = graph.tensors[source]
    before = transposed.shape
    if transposed.producer is None or before is None or len(before) != 3:
        return False
    op = graph.ops[transposed.producer]
    if op.op_type != "Transpose" or not op.inputs or op.inputs[0] < 0:
        return False
    tokens = graph.tensors[op.inputs[0]].shape
    if tokens is None or len(tokens) != 3 or (tokens[0], tokens[2], tokens[1]) != tuple(before):
        return False
    height, width, length = shape[2], shape[3], before[2]
    # (a square [N, L, L] reads the same transposed: the exporter writes no identity Transpose, so it is one)
    return before[:2] == tuple(shape[:2]) and isinstance(height, int) and isinstance(width, int) \
        and isinstance(length, int) and height * width == length
