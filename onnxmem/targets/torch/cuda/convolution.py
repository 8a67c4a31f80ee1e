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
- Its backward is two cuDNN calls, each taking its workspace from the caching allocator (PyTorch's
  cudnn_convolution_backward: grad_input is made, the backward-data call's workspace taken and freed; then
  grad_weight is made, the backward-filter call's workspace taken and freed). The backward-data workspace holds
  the NHWC copies of the output gradient, the weight and the input gradient: x + w + y bytes (as the forward's);
  the backward-filter one holds those of the input, the output gradient and the weight gradient and cuDNN's own
  scratch, larger by FILTER_SCRATCH (a fixed part plus a part per output channel, the line through the two channel
  counts measured): for 3x3 kernels 31 KiB per channel (the rows k3-64x64-s56-b64 / -s224-b32 / -s224-b64-fp32:
  1.97 MiB over x + w + y at 64 channels; k3-256x256-s56-b32 / -s56-b64 / -s224-b32-fp32: 7.75 MiB at 256), for
  larger ones 4 MiB + 82 KiB per channel (k7-64x64-s56-b64 / -s224-b32 / -s224-b64-fp32: 9.23 MiB at 64;
  k7-256x256-s56-b32 / -b64-fp32: 24.5 MiB at 256). Over 256 output channels no row measured it: not counted
  (the line would give 15.5 MiB at 512 channels, where the rows show no growth with the channels at small
  positions: k3-256x256-s14-b1-fp32 takes 7.5 MiB on 0.19 MiB tensors). At 16 bits the rows on 14 x 14 positions
  measured none (k3-*-s14-b1/-b32/-b64-autocast-bf16: 0-0.6 MiB; one 49.6 MiB at k7-256x256-s14-b64) and those on
  56 x 56 or more 1.5-50 MiB (k3-64x64: 1.8-2.8, k3-256x256: 15.8-16.6, k7-64x64: 1.5-23.6, k7-256x256: 49.9):
  counted as in fp32 from 56 x 56 positions, not below. The backward's peak above grad_input is the larger of the
  data call's workspace and grad_weight with the filter call's (ConvolutionScratch.of_calls). Checked on the
  sequence (score_singleops.py's last table): k3-64x64-s224-b32-fp32 reserves 786 + 788 MiB for the two
  workspaces (their sizes rounded to 2 MiB: the filter's does not fit the data's freed segment), what the row
  measured; k3-64x64-s56-b32-fp32: 26 (grad_input) + 50 + 52 = 128 MiB, the row's. Other shapes (14 x 14
  positions, batch 1) took other engines, whose workspaces the rule misses by up to 184 MiB
  (k7-256x256-s56-b1-fp32; 61 MiB at k7-256x256-s14-b32).
- A 3x3 (or smaller) kernel on fewer than 8 input channels (the rows' 3-channel stems, k3-3x64-*-b32/b64) runs an
  NCHW kernel: nothing in either direction.
- A 1x1 kernel: nothing in the forward; its weight gradient is summed over the batch from one partial per sample:
  backward-filter workspace = batch x weight bytes where the weight needs a gradient, no backward-data one
  (exact on the fp32 rows at batch 32 and 64, e.g. k1-256x256-s56-b64-fp32: 16 MiB = 64 x 0.25 MiB; batch 1
  measured 0.25-8.5 MiB: taken as 1 x w), on the shapes the rows measured (at most 256 channels, at least 14 x 14
  positions): a split over the batch is an algorithm's choice, so other 1x1 shapes are left to the note. Its input
  gradient needs no transpose (a GEMM).
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
# the backward-filter workspace over x + w + y: (bytes, bytes per output channel), by kernel side (at most 3,
# larger): the module docstring's rows
FILTER_SCRATCH = {3: (0, 31 * 1024), 7: (4 * 2**20, 82 * 1024)}
FILTER_SCRATCH_CHANNELS = 256  # the most output channels a row measured it on; none counted above
FILTER_SCRATCH_POSITIONS_16 = 56 * 56  # at 16 bits, counted from this many output positions on


@dataclass(frozen=True)
class ConvolutionScratch:
    """What a convolution's forward and backward hold a moment besides their tensors, in bytes: `backward` is the
    most the backward holds at once besides its gradients (the step model's one temporary), `backward_data` and
    `backward_filter` the two cuDNN calls' workspaces in the order they are taken (0: that call takes none or
    does not run), each freed before the next tensor is made."""

    forward: int
    backward: int
    backward_data: int = 0
    backward_filter: int = 0

    @classmethod
    def of_calls(cls, forward: int, data: int, filter_: int, grad_weight: int = 0,
                 cast_grad_weight: int = 0) -> ConvolutionScratch:
        """Give the scratch of a backward whose two calls take `data` and `filter_` bytes of workspace, where
        grad_weight (`grad_weight` bytes) is made between them and, under autocast, its fp32 cast
        (`cast_grad_weight` bytes) after them: `backward` is the most held above grad_input less the weight's
        gradients, which the step counts with the node's backward (max(data, grad_weight + filter, grad_weight +
        cast) - grad_weight - cast, at least 0)."""
        held = max(data, grad_weight + filter_, grad_weight + cast_grad_weight)
        return cls(forward, max(held - grad_weight - cast_grad_weight, 0), data, filter_)


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
                        weight_grad: bool, input_grad: bool = True, cast_gradient: bool = False) \
        -> ConvolutionScratch | None:
    """Give cuDNN's transient bytes for a 2-D convolution of input x [N, C, H, W], weight w [M, C/g, kH, kW] and
    output y [N, M, H', W'] run at `element` bytes (the module docstring's rules), or None where the rows do not
    cover it (another group count, another rank, a shape not known). `cast_gradient`: autocast casts the weight's
    gradient to fp32 after the backward (ToCopyBackward)."""
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
    grads = (weight_bytes, weight_bytes * 4 // element if cast_gradient else 0) if weight_grad else (0, 0)
    if kh == kw == 1:
        if not weight_grad:
            return ConvolutionScratch(0, 0)
        if max(channels, out_channels) > POINTWISE_CHANNELS or height * width < POINTWISE_POSITIONS:
            return None  # an algorithm choice the rows do not show outside the shapes they measured
        return ConvolutionScratch.of_calls(0, 0, batch * weight_bytes, *grads)
    if channels < NCHW_STEM_CHANNELS and max(kh, kw) <= NCHW_STEM_KERNEL:
        return ConvolutionScratch(0, 0)
    padded_in, padded_out = _padded(channels, element), _padded(out_channels, element)
    x_bytes = batch * padded_in * height * width * element
    y_bytes = batch * padded_out * ys[2] * ys[3] * element
    w_bytes = padded_out * padded_in * kh * kw * element
    copies = x_bytes + w_bytes + y_bytes
    counted = out_channels <= FILTER_SCRATCH_CHANNELS and (
        element >= 4 or ys[2] * ys[3] >= FILTER_SCRATCH_POSITIONS_16)
    fixed, per_channel = FILTER_SCRATCH[3 if max(kh, kw) <= 3 else 7]
    scratch = fixed + per_channel * out_channels if counted else 0
    return ConvolutionScratch.of_calls(copies, copies if input_grad else 0, copies + scratch if weight_grad else 0,
                                       *grads)
