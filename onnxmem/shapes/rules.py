"""Output types of the operators onnxruntime's optimizers and quantizers write into graphs, which ONNX's shape
inference does not know: com.microsoft (fused, quantized, attention), com.microsoft.nchwc (the NCHWc layout of
`--opt-level all` on CPU), and the contrib operators onnxruntime registers in ONNX's own domain.

SHAPE_RULES: 'domain::OpType' -> a rule, a function of the node's input types ((elem type, shape) or None where
unknown, in input order) and its attributes that gives its output types (None for an output it cannot tell).
A dim is an int, a symbolic name, or None (unknown); a rule keeps a symbolic dim that passes through (batch) and
gives None where arithmetic would need a symbolic value. Each rule follows the operator's schema in onnxruntime
(onnxruntime/core/graph/contrib_ops/*.cc, nchwc_schema_defs.cc, quantization_defs.cc) and is tested on a small
graph (tests/test_shape_rules.py). The rules run before onnxruntime's Python symbolic inference, which is only the
last resort for an operator without one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from onnx import TensorProto

Dim = int | str | None
Shape = tuple[Dim, ...]
Type = tuple[int, Shape]  # (elem type, shape)
Rule = Callable[[Sequence[Type | None], dict[str, Any]], list[Type | None]]


def _nchwc_block() -> int:
    """Give MLAS's NCHWc channel block on this machine (MlasNchwcGetBlockSize: 16 with AVX-512F, else 8)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            return 16 if " avx512f" in info.read(1 << 20) else 8
    except OSError:
        return 8


NCHWC_BLOCK = _nchwc_block()


# --- dims ----------------------------------------------------------------------------------------------------------


def _broadcast_dim(a: Dim, b: Dim) -> Dim:
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and isinstance(b, int):
        return None  # not broadcastable: the model is wrong here; no size
    if isinstance(a, int):
        return a  # a symbolic dim broadcast against a size: the size (the other must be 1)
    if isinstance(b, int):
        return b
    return None


def broadcast(*shapes: Shape) -> Shape:
    """Give numpy's broadcast of shapes (aligned on their last dims)."""
    rank = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    out: list[Dim] = []
    for dims in zip(*padded, strict=True):
        dim: Dim = 1
        for d in dims:
            dim = _broadcast_dim(dim, d)
        out.append(dim)
    return tuple(out)


def matmul(a: Shape, b: Shape, trans_a: bool = False, trans_b: bool = False) -> Shape | None:
    """Give numpy matmul's shape of a x b (each of rank 2 or more transposed on its last two dims where asked)."""
    if len(a) < 1 or len(b) < 1:
        return None
    if trans_a and len(a) >= 2:
        a = (*a[:-2], a[-1], a[-2])
    if trans_b and len(b) >= 2:
        b = (*b[:-2], b[-1], b[-2])
    if len(a) == 1 and len(b) == 1:
        return ()
    if len(a) == 1:
        return (*b[:-2], b[-1])
    if len(b) == 1:
        return a[:-1]
    return (*broadcast(a[:-2], b[:-2]), a[-2], b[-1])


def _spatial(size: Dim, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int, auto_pad: str,
             ceil_mode: bool) -> Dim:
    """Give a conv's or pool's output size on one spatial axis (ONNX's formulas)."""
    if not isinstance(size, int):
        return None
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return -(-size // stride)
    extent = dilation * (kernel - 1) + 1
    if auto_pad == "VALID":
        return (size - extent) // stride + 1
    span = size + pad_begin + pad_end - extent
    return (-(-span // stride) if ceil_mode else span // stride) + 1


def _window(spatial: Sequence[Dim], kernel: Sequence[int], attrs: dict[str, Any]) -> list[Dim]:
    rank = len(spatial)
    strides = list(attrs.get("strides") or [1] * rank)
    dilations = list(attrs.get("dilations") or [1] * rank)
    pads = list(attrs.get("pads") or [0] * (2 * rank))
    auto_pad = attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    ceil_mode = bool(attrs.get("ceil_mode", 0))
    if len(kernel) != rank or len(strides) != rank or len(pads) != 2 * rank:
        return [None] * rank
    return [_spatial(spatial[i], kernel[i], strides[i], dilations[i], pads[i], pads[rank + i], auto_pad, ceil_mode)
            for i in range(rank)]


# --- rules -----------------------------------------------------------------------------------------------------------


def same_as(index: int = 0, outputs: int = 1) -> Rule:
    """Output(s) with input `index`'s type (an elementwise activation, a bias add)."""
    def rule(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
        source = inputs[index] if index < len(inputs) else None
        return [source] * outputs
    return rule


def _layer_norm(stats_outputs: tuple[int, ...], sum_output: int | None) -> Rule:
    """A (skip) layer normalization: Y like the input; the mean / inverse std outputs at `stats_outputs`, the input
    with its normalized axes reduced to 1, as float; the skip sum at `sum_output`, like the input."""
    def rule(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
        x = inputs[0] if inputs else None
        if x is None:
            return []
        axis = attrs.get("axis", -1)
        axis = axis % len(x[1]) if x[1] else 0
        stats: Type = (TensorProto.FLOAT, (*x[1][:axis], *([1] * (len(x[1]) - axis))))
        count = max((*stats_outputs, sum_output if sum_output is not None else 0), default=0) + 1
        out: list[Type | None] = [x] + [None] * (count - 1)
        for i in stats_outputs:
            out[i] = stats
        if sum_output is not None:
            out[sum_output] = x
        return out
    return rule


def _matmul_rule(a: int, b: int, dtype_from: int | None = None, transposes: bool = False) -> Rule:
    """A fused or quantized MatMul of inputs a and b; the output's elem type from input `dtype_from` (a scale's:
    float) or else from a."""
    def rule(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
        x = inputs[a] if a < len(inputs) else None
        y = inputs[b] if b < len(inputs) else None
        typed = inputs[dtype_from] if dtype_from is not None and dtype_from < len(inputs) else x
        if x is None or y is None or typed is None:
            return []
        shape = matmul(x[1], y[1], transposes and bool(attrs.get("transA", 0)),
                       transposes and bool(attrs.get("transB", 0)))
        return [None if shape is None else (typed[0], shape)]
    return rule


def _matmul_nbits(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    a = inputs[0] if inputs else None
    n = attrs.get("N")
    return [] if a is None or not isinstance(n, int) else [(a[0], (*a[1][:-1], n))]


def _qgemm(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    # QGemm(A, a_scale, a_zp, B, b_scale, b_zp, C, y_scale, y_zp): quantized output where y_scale is given
    a, b = inputs[0], inputs[3] if len(inputs) > 3 else None
    if a is None or b is None or len(a[1]) != 2 or len(b[1]) != 2:
        return []
    m = a[1][1] if attrs.get("transA", 0) else a[1][0]
    n = b[1][0] if attrs.get("transB", 0) else b[1][1]
    y_zp = inputs[8] if len(inputs) > 8 else None
    quantized = len(inputs) > 7 and inputs[7] is not None
    return [((y_zp[0] if y_zp is not None else a[0]) if quantized else TensorProto.FLOAT, (m, n))]


def _qlinear_binary(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    # QLinearAdd / QLinearMul(A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp)
    a, b = inputs[0], inputs[3] if len(inputs) > 3 else None
    return [] if a is None or b is None else [(a[0], broadcast(a[1], b[1]))]


def _global_pool(quantized: bool) -> Rule:
    def rule(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
        x = inputs[0] if inputs else None
        if x is None or len(x[1]) < 3:
            return []
        rank = len(x[1]) - 2
        if quantized and attrs.get("channels_last", 0):  # NHWC
            return [(x[0], (x[1][0], *([1] * rank), x[1][-1]))]
        return [(x[0], (x[1][0], x[1][1], *([1] * rank)))]
    return rule


def _conv(channels_last_attr: bool, weight: int) -> Rule:
    """A conv: NCHW (or NHWC where `channels_last` is set), output channels from the weight's first dim (already
    padded to the NCHWc block in a com.microsoft.nchwc Conv's reordered weight)."""
    def rule(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
        x = inputs[0] if inputs else None
        w = inputs[weight] if weight < len(inputs) else None
        if x is None or w is None or len(x[1]) < 3 or len(w[1]) != len(x[1]):
            return []
        nhwc = channels_last_attr and bool(attrs.get("channels_last", 0))
        spatial = x[1][1:-1] if nhwc else x[1][2:]
        kernel = list(attrs.get("kernel_shape") or [d for d in w[1][2:]])
        if not all(isinstance(k, int) for k in kernel):
            return []
        out = _window(spatial, kernel, attrs)
        channels = w[1][0]
        shape = (x[1][0], *out, channels) if nhwc else (x[1][0], channels, *out)
        return [(x[0], shape)]
    return rule


def _pool(nhwc: bool) -> Rule:
    def rule(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
        x = inputs[0] if inputs else None
        kernel = list(attrs.get("kernel_shape") or [])
        if x is None or len(x[1]) < 3 or len(kernel) != len(x[1]) - 2:
            return []
        spatial = x[1][1:-1] if nhwc else x[1][2:]
        out = _window(spatial, kernel, attrs)
        shape = (x[1][0], *out, x[1][-1]) if nhwc else (x[1][0], x[1][1], *out)
        return [(x[0], shape)]
    return rule


def _qlinear_pool(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    # QLinearAveragePool(X, x_scale, x_zp, y_scale, y_zp): a pool in NCHW, or NHWC where channels_last is set
    return _pool(nhwc=bool(attrs.get("channels_last", 0)))(inputs, attrs)


def _qlinear_concat(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    # QLinearConcat(Y_scale, Y_zero_point, X1, X1_scale, X1_zp, X2, ...): Y of Y_zero_point's type, the Xs joined
    # along `axis` (quantization_defs.cc)
    xs = [inputs[i] for i in range(2, len(inputs), 3)]
    zero = inputs[1] if len(inputs) > 1 else None
    if not xs or any(x is None for x in xs):
        return []
    shapes = [x[1] for x in xs if x is not None]
    rank = len(shapes[0])
    if rank == 0 or any(len(shape) != rank for shape in shapes):
        return []
    axis = int(attrs.get("axis", 0)) % rank
    joined: list[Dim] = []
    for i in range(rank):
        dims = [shape[i] for shape in shapes]
        if i == axis:
            joined.append(sum(d for d in dims if isinstance(d, int)) if all(isinstance(d, int) for d in dims)
                          else None)
        else:
            joined.append(next((d for d in dims if d is not None), None))
    elem = zero[0] if zero is not None else xs[0][0]  # type: ignore[index]
    return [(elem, tuple(joined))]


def _reorder_input(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    # NCHW (or NHWC with channels_last) -> NCHWc: channels padded to the block
    x = inputs[0] if inputs else None
    if x is None or len(x[1]) < 3:
        return []
    channels_last = bool(attrs.get("channels_last", 0))
    c = x[1][-1] if channels_last else x[1][1]
    spatial = x[1][1:-1] if channels_last else x[1][2:]
    padded = -(-c // NCHWC_BLOCK) * NCHWC_BLOCK if isinstance(c, int) else None
    return [(x[0], (x[1][0], padded, *spatial))]


def _reorder_output(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    # NCHWc -> NCHW (or NHWC with channels_last): the channels attribute undoes the padding
    x = inputs[0] if inputs else None
    channels = attrs.get("channels")
    if x is None or len(x[1]) < 3 or not isinstance(channels, int):
        return []
    spatial = x[1][2:]
    return [(x[0], (x[1][0], *spatial, channels) if attrs.get("channels_last", 0) else (x[1][0], channels, *spatial))]


def _nchwc_upsample(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    x = inputs[0] if inputs else None
    scales = list(attrs.get("scales") or [])
    if x is None or len(scales) != len(x[1]):
        return []
    # nchwc_schema_defs.cc sets an output dim only where the input dim has a value: a symbolic dim (the batch),
    # even at scale 1, comes out unknown, and onnxruntime's planner then reuses no freed buffer for the outputs
    # downstream of it (measured: a held-out HRNet at level all)
    return [(x[0], tuple(d * s if isinstance(d, int) else None for d, s in zip(x[1], scales, strict=True)))]


def _attention(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    # Attention(input [B, S, H], weights [H, Q + K + V], bias, mask_index, past, ...): output [B, S, V]
    x = inputs[0] if inputs else None
    w = inputs[1] if len(inputs) > 1 else None
    if x is None or len(x[1]) != 3:
        return []
    sizes = list(attrs.get("qkv_hidden_sizes") or [])
    if len(sizes) == 3:
        v: Dim = sizes[2]
    elif w is not None and len(w[1]) == 2 and isinstance(w[1][1], int):
        v = w[1][1] // 3
    else:
        return []
    return [(x[0], (x[1][0], x[1][1], v))]


def _multi_head_attention(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    # MultiHeadAttention(query [B, S, D], key, value [B, L, D_v] ...): output [B, S, D_v]
    q = inputs[0] if inputs else None
    v = inputs[2] if len(inputs) > 2 else None
    if q is None or len(q[1]) != 3:
        return []
    hidden = v[1][2] if v is not None and len(v[1]) == 3 else q[1][2]
    return [(q[0], (q[1][0], q[1][1], hidden))]


def _embed_layer_norm(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    # EmbedLayerNormalization(input_ids [B, S], segment_ids, word_embedding [V, H], position_embedding,
    # segment_embedding, gamma, beta, mask, position_ids): output [B, S, H], mask_index [B] int32, embedding sum
    ids = inputs[0] if inputs else None
    words = inputs[2] if len(inputs) > 2 else None
    if ids is None or words is None or len(ids[1]) != 2 or len(words[1]) != 2:
        return []
    out: Type = (words[0], (ids[1][0], ids[1][1], words[1][1]))
    return [out, (TensorProto.INT32, (ids[1][0],)), out]


def _dynamic_quantize_linear(inputs: Sequence[Type | None], attrs: dict[str, Any]) -> list[Type | None]:
    x = inputs[0] if inputs else None
    return [] if x is None else [(TensorProto.UINT8, x[1]), (TensorProto.FLOAT, ()), (TensorProto.UINT8, ())]


_MS = "com.microsoft"
_NCHWC = "com.microsoft.nchwc"
SHAPE_RULES: dict[str, Rule] = {
    **{f"{_MS}::{op}": same_as() for op in (
        "BiasGelu", "FastGelu", "Gelu", "QuickGelu", "BiasAdd", "BiasSoftmax", "BiasDropout", "RotaryEmbedding",
        "QLinearLeakyRelu", "QLinearSigmoid", "QLinearSoftmax", "Affine", "ScaledTanh", "ThresholdedRelu",
        "FusedGelu")},
    f"{_MS}::SkipLayerNormalization": _layer_norm((1, 2), 3),
    f"{_MS}::SkipSimplifiedLayerNormalization": _layer_norm((1, 2), 3),
    "::SimplifiedLayerNormalization": _layer_norm((1,), None),
    f"{_MS}::SimplifiedLayerNormalization": _layer_norm((1,), None),
    f"{_MS}::FusedMatMul": _matmul_rule(0, 1, transposes=True),
    f"{_MS}::MatMulIntegerToFloat": _matmul_rule(0, 1, dtype_from=2),
    f"{_MS}::DynamicQuantizeMatMul": _matmul_rule(0, 1),
    f"{_MS}::MatMulNBits": _matmul_nbits,
    f"{_MS}::QGemm": _qgemm,
    f"{_MS}::QLinearAdd": _qlinear_binary,
    f"{_MS}::QLinearMul": _qlinear_binary,
    f"{_MS}::QLinearGlobalAveragePool": _global_pool(quantized=True),
    f"{_MS}::QLinearConv": _conv(channels_last_attr=True, weight=3),
    f"{_MS}::QLinearConcat": _qlinear_concat,
    f"{_MS}::QLinearAveragePool": _qlinear_pool,
    f"{_MS}::NhwcMaxPool": _pool(nhwc=True),
    f"{_MS}::FusedConv": _conv(channels_last_attr=False, weight=1),
    f"{_MS}::Attention": _attention,
    f"{_MS}::MultiHeadAttention": _multi_head_attention,
    f"{_MS}::EmbedLayerNormalization": _embed_layer_norm,
    f"{_MS}::DynamicQuantizeLinear": _dynamic_quantize_linear,
    f"{_NCHWC}::Conv": _conv(channels_last_attr=False, weight=1),
    f"{_NCHWC}::MaxPool": _pool(nhwc=False),
    f"{_NCHWC}::AveragePool": _pool(nhwc=False),
    f"{_NCHWC}::GlobalAveragePool": _global_pool(quantized=False),
    f"{_NCHWC}::GlobalMaxPool": _global_pool(quantized=False),
    f"{_NCHWC}::ReorderInput": _reorder_input,
    f"{_NCHWC}::ReorderOutput": _reorder_output,
    f"{_NCHWC}::Upsample": _nchwc_upsample,
    # the copies between host and device memory onnxruntime's MemcpyTransformer inserts (cuda_placement)
    "::MemcpyFromHost": same_as(),
    "::MemcpyToHost": same_as(),
}


def rule_key(op_type: str, domain: str) -> str:
    """Give an operator's key in SHAPE_RULES ('ai.onnx' is ONNX's domain, '')."""
    return f"{'' if domain == 'ai.onnx' else domain}::{op_type}"


# The operators of ONNX's own domain that have a rule (onnxruntime registers them there; ONNX does not know them).
ONNX_DOMAIN_RULE_OPS = frozenset(key[2:] for key in SHAPE_RULES if key.startswith("::"))
