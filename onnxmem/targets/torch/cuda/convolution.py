"""What a 2-D convolution allocates on a CUDA GPU besides its tensors, with cudnn.benchmark off (PyTorch's default):
cuDNN's transient buffers in the forward and the backward, from the H100 single-op rows.

The rows (benchmarks/results/cuda/2026-11-27-h100-80gb-part3.jsonl, group "conv": `singleop/conv/<kernel>-<in>x<out>-
s<side>-b<batch>-<dtype>`, stride 1, same padding; PyTorch 2.11, cuDNN 9.19; score: benchmarks/cuda/
score_singleops.py --group conv) show, for NCHW tensors:

- Its first and later calls allocate the same (all 192 rows: cuDNN's heuristic choice is cached per shape, no
  search). With cudnn.benchmark on (group "conv-bench") the first call's search takes up to tens of GiB: not modelled.
- A kernel larger than 1x1 with one group ("transposing"): cuDNN's tensor-core kernels run in NHWC, so the forward
  holds a transposed copy of the input, the weight and the output at once: forward transient = x + w + y bytes at
  the compute width (fp32, or 16 bits under autocast, whose 16-bit kernels pad channels to a multiple of 8). Exact
  (to the 512-byte block) on 56 of the 66 such rows, e.g. k3-64x64-s224-b32-fp32: 784.14 MiB = 392 + 0.14 + 392,
  k7-3x64-s224-b32-autocast-bf16: 220.55 MiB = x padded 3 -> 8 channels (24.5) + 196 + w padded (0.05). The rest
  took another engine (FFT-like 134.8 MiB at k7-64x64-s56-b1-fp32; only one transpose at k3-64x64-s56-b32-fp32).
- Its backward holds the output gradient's and the input's (or the input gradient's) NHWC copies: backward
  transient = x + y, plus cuDNN's own workspace, which the rows do not tie to a shape (2-10 MiB on 3x3 kernels,
  10-220 MiB on 7x7 ones, e.g. k3-256x256-s56-b32-fp32: 206 MiB = 98 + 98 + 10): that part is not counted.
- A 3x3 (or smaller) kernel on fewer than 8 input channels (the rows' 3-channel stems, k3-3x64-*-b32/b64) runs an
  NCHW kernel: nothing in either direction.
- A 1x1 kernel: nothing in the forward; its weight gradient is summed over the batch from one partial per sample:
  backward transient = batch x weight bytes where the weight needs a gradient (exact on the fp32 rows at batch 32
  and 64, e.g. k1-256x256-s56-b64-fp32: 16 MiB = 64 x 0.25 MiB; batch 1 measured 0.25-8.5 MiB: taken as 1 x w),
  on the shapes the rows measured (at most 256 channels, at least 14 x 14 positions): a split over the batch is an
  algorithm's choice, so other 1x1 shapes are left to the note. Its input gradient needs no transpose (a GEMM).
- Depthwise (groups = input channels = output channels, the rows' dw7-*): PyTorch's own kernel, nothing.
- Strided (or dilated, or not same-padded) convolutions, other grouped ones, ConvTranspose and 1-D/3-D ones have
  no rows (all rows are stride 1, same padding): not counted (the device's unmodelled note names them). The next
  window should measure stride 2 (tiny_cnn's second conv, resnet's downsampling, convnext's stem and patch
  merges).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnxmem.training.values import StepValue

CONVOLUTIONS: frozenset[str] = frozenset({"Conv", "aten::convolution", "aten::conv2d"})
NCHW_STEM_CHANNELS = 8  # fewer input channels than this with a kernel of at most NCHW_STEM_KERNEL: no transposes
NCHW_STEM_KERNEL = 3
PADDED_CHANNELS = 8  # 16-bit NHWC kernels pad channels to a multiple of this
# the 1x1 rule's measured shapes: at most 256 channels, at least 14 x 14 positions (convnext_atto's 1x1 layers, 640
# channels on 8 x 8, are outside: not counted, and named by the device's note)
POINTWISE_CHANNELS = 256
POINTWISE_POSITIONS = 14 * 14


@dataclass(frozen=True)
class ConvolutionScratch:
    """What a convolution's forward and backward hold a moment besides their tensors, in bytes."""

    forward: int
    backward: int


def _dims(value: StepValue | None, rank: int) -> tuple[int, ...] | None:
    shape = value.shape if value is not None else None
    if shape is None or len(shape) != rank or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return tuple(shape)  # type: ignore[arg-type]


def _padded(channels: int, element: int) -> int:
    if element >= 4:
        return channels
    return -(-channels // PADDED_CHANNELS) * PADDED_CHANNELS


def convolution_scratch(x: StepValue | None, w: StepValue | None, y: StepValue | None, element: int,
                        weight_grad: bool) -> ConvolutionScratch | None:
    """Give cuDNN's transient bytes for a 2-D convolution of input x [N, C, H, W], weight w [M, C/g, kH, kW] and
    output y [N, M, H', W'] run at `element` bytes (the module docstring's rules), or None where the rows do not
    cover it (another group count, another rank, a shape not known)."""
    xs, ws, ys = _dims(x, 4), _dims(w, 4), _dims(y, 4)
    if xs is None or ws is None or ys is None:
        return None
    batch, channels, height, width = xs
    out_channels, per_group, kh, kw = ws
    if per_group <= 0 or channels % per_group:
        return None
    groups = channels // per_group
    if groups > 1:
        if groups == channels == out_channels:  # depthwise: PyTorch's own kernel
            return ConvolutionScratch(0, 0)
        return None
    if ys[2:] != (height, width):  # strided, dilated or not padded to the input's size: no rows measured one
        return None
    weight_bytes = out_channels * channels * kh * kw * element
    if kh == kw == 1:
        if not weight_grad:
            return ConvolutionScratch(0, 0)
        if max(channels, out_channels) > POINTWISE_CHANNELS or height * width < POINTWISE_POSITIONS:
            return None  # an algorithm choice the rows do not show outside the shapes they measured
        return ConvolutionScratch(0, batch * weight_bytes)
    if channels < NCHW_STEM_CHANNELS and max(kh, kw) <= NCHW_STEM_KERNEL:
        return ConvolutionScratch(0, 0)
    padded_in, padded_out = _padded(channels, element), _padded(out_channels, element)
    x_bytes = batch * padded_in * height * width * element
    y_bytes = batch * padded_out * ys[2] * ys[3] * element
    w_bytes = padded_out * padded_in * kh * kw * element
    return ConvolutionScratch(forward=x_bytes + w_bytes + y_bytes, backward=x_bytes + y_bytes)
