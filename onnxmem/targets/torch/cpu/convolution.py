"""A convolution's backward and forward on PyTorch's CPU: which path runs (oneDNN or ATen's slow_conv2d), what it
allocates besides its results (tables.py CpuConvolution), and the oneDNN primitives it creates
(tables.py OnednnPrimitives), from the shapes alone."""

from __future__ import annotations

import math
from typing import NamedTuple

from onnxmem.targets.torch.cpu.isa import detect_cpu_isa
from onnxmem.targets.torch.cpu.tables import CPU_CONVOLUTION, CPU_ISAS, CpuIsa
from onnxmem.training.rules import AUTOCAST_LOW_PRECISION
from onnxmem.training.values import StepNode, StepValue

# a cache key of a oneDNN primitive, its bytes, and whether the op's backward creates it
Primitive = tuple[tuple[object, ...], int, bool]


class CpuRun(NamedTuple):
    """How the step runs on the CPU: its precision, PyTorch's intra-op threads, the CPU's instruction set facts."""

    precision: str
    threads: int
    isa: CpuIsa


def channel_padded(value: StepValue, nbytes: int, block: int) -> int:
    """Give a tensor's bytes with its channels (axis 1) padded to oneDNN's channel block."""
    shape = value.shape
    if not nbytes or shape is None or len(shape) < 3 or not isinstance(shape[1], int) or shape[1] <= 0:
        return nbytes
    channels = shape[1]
    return nbytes * (-(-channels // block) * block) // channels


def node_convolution_scratch(node: StepNode, values: list[StepValue], needs_grad: list[bool],
                             cpu: CpuRun, channels_last: bool = False) -> tuple[int, int] | None:
    """Give the bytes a Conv's backward and its forward allocate on CPU besides what they return
    (cpu_convolution_scratch), or None where its shapes are not all known (then the op's generic temporaries
    apply). Under autocast it runs in 16 bits; `channels_last`: its input is (layout.py)."""
    known = convolution_shapes(node, values, cpu)
    if known is None:
        return None
    shapes, element = known
    inputs = node.inputs
    bias = values[inputs[2]] if len(inputs) > 2 and inputs[2] >= 0 else None
    bias_bytes = (bias.numel or 0) * element if bias is not None else 0
    isa = cpu.isa
    backward = cpu_convolution_scratch(shapes[0], shapes[1], shapes[2], element, bias_bytes, needs_grad[inputs[0]],
                                       needs_grad[inputs[1]], cpu.threads, isa=isa, channels_last=channels_last)
    forward = cpu_convolution_scratch(shapes[0], shapes[1], shapes[2], element, bias_bytes, False, False,
                                      cpu.threads, forward=True, isa=isa, channels_last=channels_last)
    if backward is None or forward is None:
        return None
    return backward, forward


def convolution_shapes(node: StepNode, values: list[StepValue], cpu: CpuRun) \
        -> tuple[list[tuple[int, ...]], int] | None:
    """Give a Conv's input, weight and output shapes and the element size it runs at (16 bits under autocast), or
    None where a shape is not known."""
    inputs = node.inputs
    if len(inputs) < 2 or inputs[0] < 0 or inputs[1] < 0 or not node.outputs or node.outputs[0] < 0:
        return None
    x, w, y = values[inputs[0]], values[inputs[1]], values[node.outputs[0]]
    shapes = []
    for value in (x, w, y):
        if value.shape is None or not all(isinstance(d, int) and d > 0 for d in value.shape):
            return None
        shapes.append(tuple(int(d) for d in value.shape))  # type: ignore[arg-type]
    if not x.numel or not x.nbytes:
        return None
    low = cpu.precision.startswith("amp-") and node.op_type in AUTOCAST_LOW_PRECISION
    return shapes, 2 if low else x.nbytes // x.numel


def cpu_convolution_scratch(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], element_bytes: int,
                            bias_bytes: int, input_grad: bool, weight_grad: bool, threads: int = 1,
                            forward: bool = False, isa: CpuIsa | None = None,
                            channels_last: bool = False) -> int | None:
    """Give the bytes a 1-D or 2-D convolution's backward allocates on CPU besides the gradients it returns, at its
    peak (the rule in tables.py CPU_CONVOLUTION), from its shapes: X [N, C, *spatial], W [OC, C / groups,
    *kernel], Y [N, OC, *out], on `threads` intra-op threads; None for other ranks. `forward`: what its forward
    allocates besides its output instead. `channels_last`: the input is held channels-last (oneDNN then runs in
    NHWC: tables.py CpuConvolution's channels-last paragraph).

    Kernel and groups come from the shapes (ModelGraph keeps no attributes); a dim is strided when its output is
    shorter than the input less the kernel plus one (what stride 1 gives with no padding).
    """
    isa = CPU_ISAS[detect_cpu_isa()] if isa is None else isa
    rule = CPU_CONVOLUTION
    if not len(x) == len(w) == len(y) or len(x) not in (3, 4) or x[1] % w[1]:
        return None
    if not input_grad and not weight_grad and not forward:
        return 0
    batch, channels, spatial = x[0], x[1], x[2:]
    out_channels, group_channels, kernel, out_spatial = w[0], w[1], w[2:], y[2:]
    groups = channels // group_channels
    in_bytes, out_bytes, weight_bytes = (element_bytes * math.prod(s) for s in (x, y, w))
    if not weight_grad:
        bias_bytes = 0
    strided = any(o < s - k + 1 for o, s, k in zip(out_spatial, spatial, kernel, strict=True))
    one_by_one = all(k == 1 for k in kernel)
    kernel_elements, out_elements = math.prod(kernel), math.prod(out_spatial)
    # slow_conv2d, one group at a time: an im2col buffer (none for a 1x1 unstrided convolution)
    if not runs_onednn(x, w, y, element_bytes, threads, isa):
        unfolded = not (one_by_one and out_spatial == spatial)
        columns = element_bytes * batch * group_channels * kernel_elements * out_elements if unfolded else 0
        if groups == 1:
            return columns
        # the groups' outputs (or input gradients) are made apart, then concatenated
        return max(columns, out_bytes) if forward else columns + (in_bytes if input_grad else 0)

    def padded(nbytes: int, n: int) -> int:
        return nbytes * (-(-n // isa.channel_block) * isa.channel_block) // n

    depthwise = groups > 1 and group_channels == 1
    flat = groups == 1 and channels == rule.flat_channels
    in_blocked = in_bytes if flat else padded(in_bytes, channels)
    out_blocked = padded(out_bytes, out_channels)
    weight_blocked = padded(weight_bytes, out_channels)
    if not depthwise and not flat:
        weight_blocked = padded(weight_blocked, group_channels)
    larger_kernel = any(k > s for k, s in zip(kernel, spatial, strict=True))
    if channels_last and not larger_kernel and (depthwise or groups == 1):
        return _channels_last_scratch(depthwise, one_by_one, weight_bytes, weight_blocked,
                                      element_bytes * channels * kernel_elements, input_grad, weight_grad, forward,
                                      kernel)
    if forward:  # the input and weight reordered and the output blocked, then the blocked and the dense output
        blocked = (0 if flat else in_blocked) + weight_blocked + out_blocked
        return max(blocked, out_blocked + out_bytes) - out_bytes
    gemm = larger_kernel or (max(kernel) > rule.depthwise_jit_max_kernel if depthwise
                             else kernel[-1] >= rule.jit_max_kernel_width)
    moments = []
    if input_grad:
        moments.append(out_blocked + weight_blocked + in_blocked)
        moments.append(in_blocked + in_bytes + (in_bytes if strided and not depthwise else 0))
    if weight_grad:
        made = (in_bytes if input_grad else 0) + bias_bytes
        if gemm:
            columns = element_bytes * group_channels * kernel_elements * out_elements
            # oneDNN threads over the batch (one scratch per thread) where each thread's output is small
            outer = out_elements // threads < rule.gemm_outer_threading_max_spatial and (batch > 1 or groups > 2)
            scratch = (threads if outer else 1) * (rule.gemm_weight_copies * weight_bytes + columns) \
                + rule.gemm_scratch_alignment
            if out_channels >= rule.gemm_pack_min_out_channels and out_elements > 1:
                scratch += (threads if outer else 1) * 4 * rule.gemm_pack_rows * group_channels * kernel_elements
            moments.append(made + weight_bytes + max(scratch, weight_bytes))
        else:
            moments.append(made + (0 if flat else in_blocked) + out_blocked + weight_blocked)
            moments.append(made + weight_blocked + weight_bytes)
    returned = (in_bytes if input_grad else 0) + (weight_bytes + bias_bytes if weight_grad else 0)
    return max(0, max(moments) - returned)


def _channels_last_scratch(depthwise: bool, one_by_one: bool, weight_bytes: int, weight_blocked: int,
                           column_bytes_per_position: int, input_grad: bool, weight_grad: bool, forward: bool,
                           kernel: tuple[int, ...]) -> int:
    """Give what a oneDNN convolution of a channels-last input allocates besides its results (tables.py
    CpuConvolution): a dense one holds the weight in channels-last and reordered (and its gradient blocked), a
    depthwise one its reordered weight, and its weight gradient a column buffer of `channels_last_depthwise_positions`
    output positions where the kernel is larger than `depthwise_jit_max_kernel`; a 1x1 one nothing."""
    rule = CPU_CONVOLUTION
    if not depthwise:
        if one_by_one:
            return 0
        if forward:
            return 2 * weight_bytes
        return (3 if weight_grad else 2) * weight_bytes if input_grad or weight_grad else 0
    if not forward and weight_grad and max(kernel) > rule.depthwise_jit_max_kernel:
        return column_bytes_per_position * rule.channels_last_depthwise_positions
    return weight_blocked if forward or input_grad or weight_grad else 0


def runs_onednn(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], element_bytes: int, threads: int,
                 isa: CpuIsa) -> bool:
    """Say whether PyTorch runs this 1-D or 2-D convolution in oneDNN (ATen's ConvParams::use_mkldnn for a float CPU
    tensor; a 1-D convolution runs as a 2-D one of height 1), else in slow_conv2d (tables.py CPU_CONVOLUTION)."""
    rule = CPU_CONVOLUTION
    batch, groups, kernel = x[0], x[1] // w[1], w[2:]
    strided = any(o < s - k + 1 for o, s, k in zip(y[2:], x[2:], kernel, strict=True))
    one_by_one = all(k == 1 for k in kernel)
    return element_bytes in isa.mkldnn_element_bytes and (
        strided or batch >= rule.mkldnn_min_batch_1x1 or not one_by_one or threads > 1) and (
        groups > 1 or (len(kernel) == 2 and min(kernel) > 3) or batch > 1
        or math.prod(x) >= rule.mkldnn_min_batch1_numel)


def cpu_convolution_primitives(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], element_bytes: int,
                               input_grad: bool, weight_grad: bool, threads: int = 1,
                               isa: CpuIsa | None = None) -> tuple[tuple[tuple[object, ...], int, bool], ...]:
    """Give the oneDNN primitives a 1-D or 2-D convolution's forward and backward create on CPU, each as (its cache
    key, the heap bytes it keeps, whether its backward creates it), from its shapes (tables.py OnednnPrimitives);
    none where PyTorch runs slow_conv2d or for other ranks. Two convolutions give the same key exactly where oneDNN's
    cache would hand the second the first's primitive (by shapes: the graph keeps no strides or pads, and a stride
    or pad shows in the output's shape)."""
    isa = CPU_ISAS[detect_cpu_isa()] if isa is None else isa
    if not len(x) == len(w) == len(y) or len(x) not in (3, 4) or x[1] % w[1] \
            or not runs_onednn(x, w, y, element_bytes, threads, isa):
        return ()
    sizes, rule = isa.primitives, CPU_CONVOLUTION
    channels, group_channels, kernel, spatial = x[1], w[1], w[2:], x[2:]
    groups = channels // group_channels
    depthwise = groups > 1 and group_channels == 1
    flat = groups == 1 and channels == rule.flat_channels  # read as it is: no reorder
    one_by_one = all(k == 1 for k in kernel)
    strided = any(o < s - k + 1 for o, s, k in zip(y[2:], spatial, kernel, strict=True))
    kind = "depthwise" if depthwise else "one_by_one" if one_by_one else "jit"
    conv = (element_bytes, x, w, y)
    made: list[tuple[tuple[object, ...], int, bool]] = []

    def reorder(role: str, shape: tuple[int, ...], backward: bool) -> None:
        made.append((("reorder", role, element_bytes, shape), sizes.reorder, backward))

    forward_kind = "strided_one_by_one" if one_by_one and strided and not depthwise else kind
    made.append((("forward", *conv), getattr(sizes, f"forward_{forward_kind}"), False))
    if not flat:
        reorder("to blocked", x, False)
    reorder("weights" if depthwise else "weights forward", w, False)
    reorder("from blocked", y, False)
    if input_grad:
        if strided and not depthwise:  # brgconv_strided, in the channels-last layout
            data_kind = "strided_one_by_one" if one_by_one else "strided"
            reorder("to channels-last", y, True)
            reorder("weights strided", w, True)
            reorder("channels-last copy", x, True)
        else:
            data_kind = kind
            reorder("to blocked", y, True)
            reorder("weights" if depthwise else "weights backward", w, True)
            reorder("from blocked", x, True)
        made.append((("backward data", *conv), getattr(sizes, f"backward_data_{data_kind}"), True))
    if weight_grad:
        larger_kernel = any(k > s for k, s in zip(kernel, spatial, strict=True))
        gemm = larger_kernel or (max(kernel) > rule.depthwise_jit_max_kernel if depthwise
                                 else kernel[-1] >= rule.jit_max_kernel_width)
        made.append((("backward weights", *conv), getattr(sizes, f"backward_weights_{'gemm' if gemm else kind}"),
                     True))
        if gemm:  # oneDNN's sgemm kernels, JIT-made once per process (the same key for every convolution)
            made.append((("gemm convolution first use",), sizes.gemm_first_use, True))
            if not depthwise:
                made.append((("gemm convolution first use", "dense"), sizes.gemm_dense_first_use, True))
        if not gemm:
            if not flat:
                reorder("to blocked", x, True)
            reorder("to blocked", y, True)
            reorder("weights gradient", w, True)
    return tuple(made)


