"""CPU convolution backward scratch (targets/torch/cpu/tables.py CPU_CONVOLUTION): what PyTorch 2.13's oneDNN and
slow_conv2d backward allocate besides the gradients they return, from the convolution's shapes; worked by hand from the
rule's moments (benchmarks/conv_backward.py measures them), applied at the Conv's backward in the training simulation,
and against PyTorch itself where torch is installed. Sizes are float32."""

from __future__ import annotations

import dataclasses
import gc
import math
from pathlib import Path

import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

import onnxmem
from onnxmem.targets.torch import TorchCpu
from onnxmem.targets.torch.cpu.convolution import cpu_convolution_primitives, cpu_convolution_scratch
from onnxmem.targets.torch.cpu.isa import detect_cpu_isa
from onnxmem.targets.torch.cpu.tables import CPU_AUTOGRAD_BYTES_PER_NODE, CPU_CONVOLUTION, CPU_ISAS, OnednnPrimitives
from onnxmem.training.step import TrainingOptions
from onnxmem.views.report import TrainingReport

from . import graphs

AVX2 = CPU_ISAS["avx2"]  # the instruction set the rule was measured on (the AVX-512 one differs in its block)


def nbytes(shape: tuple[int, ...]) -> int:
    return 4 * math.prod(shape)


def scratch(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], input_grad: bool = True,
            weight_grad: bool = True, threads: int = 1, bias: bool = False) -> int | None:
    return cpu_convolution_scratch(x, w, y, 4, 4 * w[0] if bias else 0, input_grad, weight_grad, threads, isa=AVX2)


def test_3x3_reorders_the_input_and_the_output_gradient_for_the_weight_gradient() -> None:
    # oneDNN: input gradient (grad_out + weight + blocked grad_in, then blocked and dense grad_in), then weight
    # gradient: dense grad_in, the input and grad_out reordered, blocked grad_w: the largest moment, less the
    # gradients (grad_in and grad_w) it returns, leaves the two reorders.
    x, w, y = (8, 64, 16, 16), (64, 64, 3, 3), (8, 64, 16, 16)
    assert scratch(x, w, y) == nbytes(x) + nbytes(y)
    assert scratch(x, w, y, bias=True) == nbytes(x) + nbytes(y)  # the bias gradient is returned too


def test_strided_input_gradient_holds_a_third_input_sized_buffer() -> None:
    # 1x1 stride 2 (a ResNet downsample): blocked grad_in, dense grad_in and one more copy: 3 x input,
    # less the returned grad_in and grad_w.
    x, w, y = (8, 64, 16, 16), (128, 64, 1, 1), (8, 128, 8, 8)
    assert scratch(x, w, y) == 3 * nbytes(x) - nbytes(x) - nbytes(w)


def test_a_kernel_larger_than_the_map_runs_oneDNNs_gemm_weight_gradient() -> None:
    # 512 channels, 3x3 on a 2x2 map (ResNet-18's last stage at 64x64 images): the jit kernel refuses it; the
    # gemm one books 4 weight-sized buffers and an im2col buffer (512 x 9 x 4 floats) per thread, + 256 bytes
    # (37822720, what the profiler sees), and its gemm packs 128 rows of 512 x 9 floats by malloc (2359296).
    x, w, y = (8, 512, 2, 2), (512, 512, 3, 3), (8, 512, 2, 2)
    gemm = CPU_CONVOLUTION.gemm_weight_copies * nbytes(w) + 4 * 512 * 9 * 4 + CPU_CONVOLUTION.gemm_scratch_alignment
    pack = 4 * CPU_CONVOLUTION.gemm_pack_rows * 512 * 9
    assert gemm == 37_822_720 and pack == 2_359_296
    assert scratch(x, w, y) == gemm + pack
    # on two threads oneDNN threads over the batch (4 output positions per thread): one scratchpad per thread
    assert scratch(x, w, y, threads=2) == 2 * (gemm - 256) + 256 + 2 * pack
    # 256 output channels: no packing
    assert scratch((8, 256, 2, 2), (256, 256, 3, 3), (8, 256, 2, 2)) == 4 * nbytes((256, 256, 3, 3)) + 4 * 256 * 9 * 4 \
        + 256
    # the same layer on a 3x3 map is the jit kernel's: its largest moment is the blocked weight gradient and its
    # dense copy (the gradient returned): one weight more, above the two reorders (2 x 147456)
    assert scratch((8, 512, 3, 3), w, (8, 512, 3, 3)) == nbytes(w)


def test_depthwise_kernels_over_3_take_the_gemm_weight_gradient() -> None:
    # depthwise 5x5 on 8x8, 96 channels, batch 4: the input gradient's moment (grad_out + weight + blocked
    # grad_in) is the largest; the gemm scratch (4 x 9600 + 25 x 64 x 4 + 256 = 45056) is below it.
    x, w, y = (4, 96, 8, 8), (96, 1, 5, 5), (4, 96, 8, 8)
    assert scratch(x, w, y) == nbytes(y) + nbytes(w) + nbytes(x) - nbytes(x) - nbytes(w)
    # without an input gradient only the weight gradient's moment is left: the gemm scratch
    assert scratch(x, w, y, input_grad=False) == 4 * nbytes(w) + 4 * 25 * 64 + 256


def test_1x1_at_a_small_batch_on_one_thread_is_slow_conv2d_and_allocates_nothing() -> None:
    x, w, y = (4, 256, 16, 16), (64, 256, 1, 1), (4, 64, 16, 16)
    assert scratch(x, w, y) == 0  # ATen's slow_conv2d: a 1x1 needs no im2col
    assert scratch(x, w, y, threads=2) == nbytes(x) + nbytes(y)  # on 2 threads oneDNN takes it
    big = (CPU_CONVOLUTION.mkldnn_min_batch_1x1, 256, 16, 16)
    assert scratch(big, w, (big[0], 64, 16, 16)) == nbytes(big) + nbytes((big[0], 64, 16, 16))


def test_batch_1_3x3_on_a_small_input_is_slow_conv2d_with_its_im2col_buffer() -> None:
    x, w, y = (1, 8, 8, 8), (16, 8, 3, 3), (1, 16, 8, 8)
    assert scratch(x, w, y) == 4 * 8 * 9 * 64


def test_image_input_of_3_channels_is_read_as_it_is() -> None:
    # the stem: no input gradient, the 3-channel input not reordered: only grad_out's reorder remains
    x, w, y = (8, 3, 64, 64), (64, 3, 7, 7), (8, 64, 32, 32)
    assert scratch(x, w, y, input_grad=False) == nbytes(y)


@pytest.mark.parametrize("isa", sorted(CPU_ISAS))
def test_channels_are_padded_to_the_block_in_the_reorders(isa: str) -> None:
    block = CPU_ISAS[isa].channel_block
    channels, out_channels = block + 4, 2 * block + 4  # 12 and 20 on AVX2 (block 8), 20 and 36 on AVX-512 (16)
    padded_in, padded_out = 2 * block, 3 * block
    x, w, y = (4, channels, 8, 8), (out_channels, channels, 3, 3), (4, out_channels, 8, 8)
    weight_blocked = nbytes(w) * padded_out * padded_in // (out_channels * channels)
    # the weight gradient's moment: dense grad_in + blocked input + blocked grad_out + blocked grad_w
    moment = nbytes(x) + nbytes(x) * padded_in // channels + nbytes(y) * padded_out // out_channels + weight_blocked
    assert cpu_convolution_scratch(x, w, y, 4, 0, True, True, isa=CPU_ISAS[isa]) == moment - nbytes(x) - nbytes(w)


def test_frozen_weight_has_only_the_input_gradients_moments() -> None:
    x, w, y = (4, 64, 16, 16), (64, 64, 3, 3), (4, 64, 16, 16)
    # grad_out + weight + blocked grad_in, less the returned grad_in
    assert scratch(x, w, y, weight_grad=False) == nbytes(y) + nbytes(w)
    assert scratch(x, w, y, input_grad=False, weight_grad=False) == 0


def test_forward_reorders_the_input_and_the_weight_besides_the_output() -> None:
    # oneDNN's forward: input, weight and output blocked at once (then the blocked and the dense output): over
    # the output it returns, the input and the weight (measured: 671744 for this one)
    x, w, y = (8, 64, 16, 16), (64, 64, 3, 3), (8, 64, 16, 16)
    forward = cpu_convolution_scratch(x, w, y, 4, 0, False, False, forward=True, isa=AVX2)
    assert forward == nbytes(x) + nbytes(w) == 671_744
    # the stem's 3-channel image is read as it is: only the blocked output besides the dense one
    x, w, y = (8, 3, 64, 64), (64, 3, 7, 7), (8, 64, 32, 32)
    assert cpu_convolution_scratch(x, w, y, 4, 0, False, False, forward=True, isa=AVX2) == nbytes(y)


def test_bf16_runs_slow_conv2d_on_a_cpu_without_native_bf16() -> None:
    # autocast's bf16 convolution on an AVX2 CPU: ATen's slow_conv2d, whose forward and backward each unfold the
    # whole batch (8 x 64 x 9 x 256 bf16 elements; measured with the profiler under torch.autocast)
    x, w, y = (8, 64, 16, 16), (64, 64, 3, 3), (8, 64, 16, 16)
    columns = 2 * 8 * 64 * 9 * 16 * 16
    assert 2 not in AVX2.mkldnn_element_bytes and 2 in CPU_ISAS["avx512"].mkldnn_element_bytes
    assert cpu_convolution_scratch(x, w, y, 2, 0, True, True, isa=AVX2) == columns == 2_359_296
    assert cpu_convolution_scratch(x, w, y, 2, 0, False, False, forward=True, isa=AVX2) == columns
    # a depthwise one runs a group at a time: one group's columns (8 x 1 x 49 x 256 for a 7x7 on 16x16, 48
    # channels; measured 200704), beside the groups' outputs, made apart and concatenated
    x, w, y = (8, 48, 16, 16), (48, 1, 7, 7), (8, 48, 16, 16)
    group_columns = 2 * 8 * 49 * 16 * 16
    assert group_columns == 200_704
    forward = cpu_convolution_scratch(x, w, y, 2, 0, False, False, forward=True, isa=AVX2)
    assert forward == max(group_columns, 2 * 8 * 48 * 256)
    assert cpu_convolution_scratch(x, w, y, 2, 0, True, True, isa=AVX2) == group_columns + 2 * 8 * 48 * 256


def test_other_ranks_are_not_given() -> None:
    assert scratch((2, 8, 4, 4, 4), (8, 8, 3, 3, 3), (2, 8, 4, 4, 4)) is None


def conv_chain() -> onnx.ModelProto:
    """x [8,64,16,16] -> Conv a (64->64, 3x3, pad 1) -> Relu -> Conv b (same) -> y."""
    weight = graphs.external_header
    return graphs.model(
        [oh.make_node("Conv", ["x", "Wa"], ["a"], name="a", pads=[1, 1, 1, 1]),
         oh.make_node("Relu", ["a"], ["r"], name="relu"),
         oh.make_node("Conv", ["r", "Wb"], ["y"], name="b", pads=[1, 1, 1, 1])],
        [graphs.value("x", [8, 64, 16, 16])], [graphs.value("y", [8, 64, 16, 16])],
        [weight("Wa", TensorProto.FLOAT, [64, 64, 3, 3]), weight("Wb", TensorProto.FLOAT, [64, 64, 3, 3])])


def conv_chain_of(channels: int) -> onnx.ModelProto:
    """x [8,C,16,16] -> Conv (C->C, 3x3, pad 1) -> y."""
    weight = graphs.external_header
    return graphs.model(
        [oh.make_node("Conv", ["x", "W"], ["y"], name="c", pads=[1, 1, 1, 1])],
        [graphs.value("x", [8, channels, 16, 16])], [graphs.value("y", [8, channels, 16, 16])],
        [weight("W", TensorProto.FLOAT, [channels, channels, 3, 3])])


def test_the_scratch_is_live_at_the_convolutions_backward_on_cpu_only() -> None:
    # sgd, loss 'mean': the devices differ by the convolutions' scratch and, on CPU, the autograd graph on the heap
    # (Conv a, Relu, Conv b and the loss's node; Wa's and Wb's accumulators). Conv b (input gradient needed)
    # peaks with its two reorders (2 x 524288) over its gradients; Conv a (image input) with grad_out's reorder
    # and the input's (64 channels, not 3): the same 2 x 524288, less than b's moment (a has no grad_in).
    model = conv_chain()
    cpu = onnxmem.analyze(model, training=TrainingOptions(optimizer="sgd", device=TorchCpu(isa="avx2"),
                                                          loss="mean")).training
    cuda = onnxmem.analyze(model, training=TrainingOptions(optimizer="sgd", device="cuda", loss="mean")).training
    assert cpu is not None and cuda is not None
    assert cpu.peak_event == "backward of Conv b" == cuda.peak_event
    # and oneDNN's primitives of the two convolutions, which share one descriptor (see the tests below); on CUDA,
    # cuDNN's backward-filter workspace holds NHWC copies of the input, the output gradient and the weight (the same
    # 2 x 524288, and 64 x 64 x 9 x 4 more) and its scratch, 31 KiB per output channel (targets/torch/cuda/
    # convolution.py FILTER_SCRATCH, from the H100's conv rows), so the devices differ by the CPU's heap less those
    assert cpu.peak_bytes - cuda.peak_bytes == 6 * CPU_AUTOGRAD_BYTES_PER_NODE + SAME_SHAPE_3X3_PRIMITIVES \
        - 64 * 64 * 9 * 4 - 64 * 31 * 1024


# oneDNN's cached primitives (targets/torch/cpu/tables.py OnednnPrimitives) of a 3x3 convolution whose input and output
# have one shape, made by its forward and a backward with both gradients: the forward, backward-data and
# backward-weights convolutions and five reorders (the activation's shape to and from the blocked layout, the weight's
# for the forward, for the input's gradient and from the blocked weight gradient)
PRIMITIVES = AVX2.primitives
SAME_SHAPE_3X3_PRIMITIVES = PRIMITIVES.forward_jit + PRIMITIVES.backward_data_jit + PRIMITIVES.backward_weights_jit \
    + 5 * PRIMITIVES.reorder


def _without_primitives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every primitive of the AVX2 table cost nothing (the rest of the CPU rules as they are)."""
    zero = OnednnPrimitives(**{f.name: 0 for f in dataclasses.fields(OnednnPrimitives)})
    monkeypatch.setitem(CPU_ISAS, "avx2", dataclasses.replace(AVX2, primitives=zero))


def _cpu_step(model: onnx.ModelProto, **options: object) -> TrainingReport:
    training = onnxmem.analyze(model, training=TrainingOptions(optimizer="sgd", device=TorchCpu(isa="avx2"),
                                                               loss="mean", **options)).training  # type: ignore
    assert training is not None
    return training


def test_identical_convolutions_share_their_primitives(monkeypatch: pytest.MonkeyPatch) -> None:
    # Conv a (an image input: no input gradient) and Conv b, both 64 -> 64 3x3 on 16x16 at batch 8: one forward,
    # one backward-weights primitive for both (oneDNN's cache hands b a's), b's backward-data one, five reorders;
    # all made by the time b's backward, the peak, runs
    with_primitives = _cpu_step(conv_chain())
    _without_primitives(monkeypatch)
    without = _cpu_step(conv_chain())
    assert with_primitives.peak_event == without.peak_event == "backward of Conv b"
    assert with_primitives.peak_bytes - without.peak_bytes == SAME_SHAPE_3X3_PRIMITIVES == 162_400


def test_a_later_step_starts_with_the_primitives_the_first_made() -> None:
    # sgd keeps no state: what a later step has live before its data beyond the first's is the cached primitives
    training = _cpu_step(conv_chain())
    assert training.timeline is not None
    assert training.timeline.later_live_bytes[0] - training.timeline.first_live_bytes[0] == SAME_SHAPE_3X3_PRIMITIVES


def _two_convs(second_channels: int, stride: int = 1) -> onnx.ModelProto:
    """x [4,32,16,16] (needs no gradient) -> Conv a (32->32, 3x3, pad 1) -> Relu -> Conv b (32->C, 3x3, pad 1,
    stride s) -> y."""
    weight = graphs.external_header
    side = 16 // stride
    return graphs.model(
        [oh.make_node("Conv", ["x", "Wa"], ["a"], name="a", pads=[1, 1, 1, 1]),
         oh.make_node("Relu", ["a"], ["r"], name="relu"),
         oh.make_node("Conv", ["r", "Wb"], ["y"], name="b", pads=[1, 1, 1, 1], strides=[stride, stride])],
        [graphs.value("x", [4, 32, 16, 16])], [graphs.value("y", [4, second_channels, side, side])],
        [weight("Wa", TensorProto.FLOAT, [32, 32, 3, 3]),
         weight("Wb", TensorProto.FLOAT, [second_channels, 32, 3, 3])])


def test_each_distinct_convolution_adds_its_own_primitives(monkeypatch: pytest.MonkeyPatch) -> None:
    same, wider, strided = _cpu_step(_two_convs(32)), _cpu_step(_two_convs(48)), _cpu_step(_two_convs(32, 2))
    _without_primitives(monkeypatch)
    same_0, wider_0, strided_0 = _cpu_step(_two_convs(32)), _cpu_step(_two_convs(48)), _cpu_step(_two_convs(32, 2))
    p = PRIMITIVES
    assert same.peak_bytes - same_0.peak_bytes == SAME_SHAPE_3X3_PRIMITIVES
    # b 32 -> 48: its own forward, backward-data and backward-weights primitives besides a's forward and
    # backward-weights; reorders: the 32-channel map to and from blocked, a's weight forward and gradient, b's weight
    # forward, backward and gradient, the 48-channel map from and to blocked
    assert wider.peak_bytes - wider_0.peak_bytes == 2 * p.forward_jit + p.backward_data_jit \
        + 2 * p.backward_weights_jit + 9 * p.reorder
    # b with stride 2: its input gradient by the strided (brgconv) kernel, in the channels-last layout (the output
    # gradient to channels-last, the weight for it, the input gradient copied out); the 8x8 map to and from blocked
    assert strided.peak_bytes - strided_0.peak_bytes == 2 * p.forward_jit + p.backward_data_strided \
        + 2 * p.backward_weights_jit + 3 * p.reorder + 3 * p.reorder + 2 * p.reorder + p.reorder


def test_no_primitives_where_pytorch_does_not_run_onednn() -> None:
    # a 1x1 unstrided convolution at batch 4 on one thread runs slow_conv2d; bf16 runs it on an AVX2 CPU; CUDA has
    # no oneDNN; a 3-D convolution is outside the rule
    x, w, y = (4, 64, 8, 8), (128, 64, 1, 1), (4, 128, 8, 8)
    assert cpu_convolution_primitives(x, w, y, 4, True, True, 1, AVX2) == ()
    assert cpu_convolution_primitives(x, w, y, 4, True, True, 2, AVX2) != ()  # more threads: oneDNN
    x, w, y = (4, 64, 8, 8), (64, 64, 3, 3), (4, 64, 8, 8)
    assert cpu_convolution_primitives(x, w, y, 2, True, True, 1, AVX2) == ()
    assert cpu_convolution_primitives((2, 8, 4, 4, 4), (8, 8, 3, 3, 3), (2, 8, 4, 4, 4), 4, True, True) == ()
    cuda = onnxmem.analyze(conv_chain(), training=TrainingOptions(optimizer="sgd", device="cuda")).training
    assert cuda is not None and cuda.timeline is not None
    assert cuda.timeline.later_live_bytes[0] == cuda.timeline.first_live_bytes[0]


def test_depthwise_and_1x1_convolutions_take_their_kernels_primitives() -> None:
    p = PRIMITIVES

    def made(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], input_grad: bool = True) -> list[int]:
        return [size for key, size, _ in cpu_convolution_primitives(x, w, y, 4, input_grad, True, 1, AVX2)
                if key[0] not in ("reorder", "gemm convolution first use")]

    # depthwise 3x3: jit_dw throughout; 5x5: the weights' gradient by oneDNN's gemm convolution
    assert made((4, 32, 8, 8), (32, 1, 3, 3), (4, 32, 8, 8)) == [
        p.forward_depthwise, p.backward_data_depthwise, p.backward_weights_depthwise]
    assert made((4, 32, 8, 8), (32, 1, 5, 5), (4, 32, 8, 8))[-1] == p.backward_weights_gemm
    # 1x1 at batch 16, and strided at batch 4 (its input gradient by the strided kernel)
    assert made((16, 32, 8, 8), (64, 32, 1, 1), (16, 64, 8, 8)) == [
        p.forward_one_by_one, p.backward_data_one_by_one, p.backward_weights_one_by_one]
    assert made((4, 32, 8, 8), (64, 32, 1, 1), (4, 64, 4, 4)) == [
        p.forward_strided_one_by_one, p.backward_data_strided_one_by_one, p.backward_weights_one_by_one]
    # an image input (3 channels) needs no gradient: no backward-data primitive
    assert made((4, 3, 32, 32), (16, 3, 3, 3), (4, 16, 32, 32), input_grad=False) == [
        p.forward_jit, p.backward_weights_jit]


def test_the_first_gemm_convolution_of_a_process_makes_onednns_sgemm_kernels_once() -> None:
    # tables.py OnednnPrimitives.gemm_first_use / gemm_dense_first_use (training_single_ops.py
    # --gemm-conv-first-use): one key for every convolution, so a step counts them once, at the first
    p = PRIMITIVES

    def first_use(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], weight_grad: bool = True) \
            -> dict[tuple[object, ...], int]:
        return {key: size for key, size, backward in cpu_convolution_primitives(x, w, y, 4, True, weight_grad, 1, AVX2)
                if key[0] == "gemm convolution first use" and backward}

    dense = first_use((4, 128, 2, 2), (128, 128, 3, 3), (4, 128, 2, 2))  # a kernel larger than the input
    assert sum(dense.values()) == p.gemm_first_use + p.gemm_dense_first_use
    assert first_use((8, 32, 2, 2), (32, 32, 3, 3), (8, 32, 2, 2)) == dense  # another shape: the same keys
    depthwise = first_use((4, 64, 4, 4), (64, 1, 7, 7), (4, 64, 4, 4))
    assert list(depthwise.values()) == [p.gemm_first_use] and set(depthwise) < set(dense)
    # no weight gradient, or a jit kernel (3x3 on 8x8): no gemm convolution
    assert first_use((4, 128, 2, 2), (128, 128, 3, 3), (4, 128, 2, 2), weight_grad=False) == {}
    assert first_use((4, 64, 8, 8), (64, 64, 3, 3), (4, 64, 8, 8)) == {}


def test_the_cpu_instruction_set_is_read_from_the_cpu_flags(tmp_path: Path) -> None:
    def detected(flags: str) -> str:
        path = tmp_path / f"cpuinfo_{len(flags)}"
        path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
        return detect_cpu_isa(str(path))

    assert detected("fpu sse2 avx avx2 fma") == "avx2"
    assert detected("fpu avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16") == "avx512"
    assert detected("fpu avx2 avx512f avx512cd") == "avx2"  # (no BW/VL/DQ: oneDNN's AVX-512 kernels need them)
    assert detect_cpu_isa(str(tmp_path / "absent")) == "avx2"  # not Linux: the flags cannot be read
    assert TorchCpu().instruction_set == CPU_ISAS[detect_cpu_isa()]


def test_the_instruction_set_changes_the_channel_block_of_a_cpu_step() -> None:
    # a 20-channel convolution's blocked reorders: channels padded to 24 on AVX2 (block 8), to 32 on AVX-512 (16)
    model = conv_chain_of(20)
    steps = {isa: onnxmem.analyze(model, training=TrainingOptions(optimizer="sgd", device=TorchCpu(isa=isa),
                                                                   loss="mean")).training for isa in CPU_ISAS}
    assert steps["avx2"] is not None and steps["avx512"] is not None
    assert steps["avx512"].peak_bytes > steps["avx2"].peak_bytes
    with pytest.raises(onnxmem.OnnxMemError, match="instruction set 'sse'"):
        onnxmem.analyze(model, training=TrainingOptions(device=TorchCpu(isa="sse")))


def test_cpu_threads_must_be_positive() -> None:
    with pytest.raises(onnxmem.OnnxMemError, match="cpu_threads"):
        onnxmem.analyze(conv_chain(), training=TrainingOptions(device=TorchCpu(threads=0)))


@pytest.mark.parametrize(("x", "w", "stride", "groups"), [
    ((4, 32, 8, 8), (32, 32, 3, 3), 1, 1),  # jit kernels
    ((4, 32, 8, 8), (64, 32, 3, 3), 2, 1),  # strided: a third input-sized buffer
    ((4, 64, 2, 2), (64, 64, 3, 3), 1, 1),  # kernel larger than the map: gemm weight gradient
    ((4, 32, 8, 8), (32, 1, 5, 5), 1, 32),  # depthwise 5x5
])
def test_rule_matches_pytorchs_backward(x: tuple[int, ...], w: tuple[int, ...], stride: int, groups: int) -> None:
    torch = pytest.importorskip("torch")
    from benchmarks.torch_memory import c10_peak
    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        pytest.skip("the rule's kernels and channel block are those oneDNN picks on an AVX2 CPU")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        conv = torch.nn.Conv2d(x[1], w[0], w[2], stride=stride, padding=w[2] // 2, groups=groups, bias=False)
        inputs = torch.randn(x, requires_grad=True)
        out = conv(inputs)
        grad = torch.randn_like(out)
        out.backward(grad)  # oneDNN makes and caches its primitives
        conv.zero_grad(set_to_none=True)
        inputs.grad = None
        out = conv(inputs)
        gc.collect()
        measured = c10_peak(lambda: out.backward(grad)) - nbytes(x) - nbytes(w)  # less the gradients it returns
        # the profiler sees PyTorch's allocator: the rule's malloc-only gemm packing (none at 64 channels) aside
        assert scratch(x, w, tuple(out.shape)) == measured
    finally:
        torch.set_num_threads(threads)


def _gru(relaid: bool, marked: bool = True) -> onnx.ModelProto:
    """x [T=5, B=2, I=4] -> GRU(hidden 8) -> Y [5, 1, 2, 8], the weights either parameters read directly
    (W [1, 24, 4], R [1, 24, 8], B [1, 48]) or, as the dynamo exporter writes nn.GRU, laid out at run time from
    PyTorch's parameters (w_ih [24, 4], w_hh [24, 8], b_ih [24], b_hh [24]) by Slice, Concat and Unsqueeze nodes
    that carry the aten.gru fx node."""
    weight = graphs.external_header
    fx = ("%gru : [num_users=1] = call_function[target=torch.ops.aten.gru.input](args = (%x, %h, [%w_ih, %w_hh, "
          "%b_ih, %b_hh], True, 1, 0.0, True, False, False), kwargs = {})")
    gru = oh.make_node("GRU", ["x", "W", "R", "B"], ["y", "y_h"], name="gru", hidden_size=8)
    nodes = [gru]
    ints = [oh.make_tensor(name, TensorProto.INT64, [1], [v]) for name, v in
            (("zero", 0), ("eight", 8), ("sixteen", 16), ("big", 1 << 30))]
    if relaid:
        nodes = []
        for param, out in (("w_ih", "W"), ("w_hh", "R")):
            nodes += [oh.make_node("Slice", [param, lo, hi], [f"{param}_{lo}"], name=f"{param}_{lo}")
                      for lo, hi in (("zero", "eight"), ("eight", "sixteen"), ("sixteen", "big"))]
            nodes += [oh.make_node("Concat", [f"{param}_eight", f"{param}_zero", f"{param}_sixteen"],
                                   [f"{out}_2d"], name=f"{out}_concat", axis=0),
                      oh.make_node("Unsqueeze", [f"{out}_2d", "zero"], [out], name=f"{out}_unsqueeze")]
        nodes += [oh.make_node("Concat", ["b_ih", "b_hh"], ["B_1d"], name="B_concat", axis=0),
                  oh.make_node("Unsqueeze", ["B_1d", "zero"], ["B"], name="B_unsqueeze"), gru]
        for n in nodes if marked else [gru]:
            entry = n.metadata_props.add()
            entry.key, entry.value = "pkg.torch.onnx.fx_node", fx
        params = [weight("w_ih", TensorProto.FLOAT, [24, 4]), weight("w_hh", TensorProto.FLOAT, [24, 8]),
                  weight("b_ih", TensorProto.FLOAT, [24]), weight("b_hh", TensorProto.FLOAT, [24]), *ints]
    else:
        params = [weight("W", TensorProto.FLOAT, [1, 24, 4]), weight("R", TensorProto.FLOAT, [1, 24, 8]),
                  weight("B", TensorProto.FLOAT, [1, 48])]
    return graphs.model(nodes, [graphs.value("x", [5, 2, 4])], [graphs.value("y", [5, 1, 2, 8])], params)


def test_a_recurrent_ops_weights_laid_out_by_the_exporter_cost_what_its_parameters_cost() -> None:
    # PyTorch's aten::gru reads its parameters: the exporter's Slice/Concat copies and their gradients do not
    # exist in the step. Same parameter bytes (1 x 24 x 4 + 1 x 24 x 8 + 48 floats) either way: same peak.
    options = TrainingOptions(optimizer="sgd", device="cpu", loss="mean")
    direct = onnxmem.analyze(_gru(relaid=False), training=options).training
    relaid = onnxmem.analyze(_gru(relaid=True), training=options).training
    assert direct is not None and relaid is not None
    bounds = 4 * 8  # the relaid graph's four int64 slice bounds
    assert direct.weights_bytes == 4 * (96 + 192 + 48) and relaid.weights_bytes == direct.weights_bytes + bounds
    assert relaid.gradient_bytes == direct.gradient_bytes
    # on CPU the relaid graph's parameters are PyTorch's four (w_ih, w_hh, b_ih, b_hh): one gradient accumulator
    # more than W, R and B in the autograd graph
    assert relaid.peak_bytes == direct.peak_bytes + bounds + CPU_AUTOGRAD_BYTES_PER_NODE
    # without the fx marks nothing says the copies are the exporter's: they are simulated as exported
    unmarked = onnxmem.analyze(_gru(relaid=True, marked=False), training=options).training
    assert unmarked is not None and unmarked.peak_bytes > direct.peak_bytes + bounds


def _lstm(batch_first: bool) -> onnx.ModelProto:
    """An LSTM (hidden 16) over 6 steps of 8 features, batch 4; batch_first: x [4, 6, 8] transposed to the op's
    [6, 4, 8] and its output [6, 1, 4, 16] squeezed and transposed back to [4, 6, 16] (as nn.LSTM(batch_first=True)
    exports); else x [6, 4, 8] in and the squeezed [6, 4, 16] out."""
    weight = graphs.external_header
    x = "x_t" if batch_first else "x"
    nodes = [oh.make_node("LSTM", [x, "W", "R"], ["y"], name="lstm", hidden_size=16),
             oh.make_node("Squeeze", ["y", "axis"], ["y3" if batch_first else "out"], name="squeeze")]
    if batch_first:
        nodes = [oh.make_node("Transpose", ["x"], ["x_t"], name="in", perm=[1, 0, 2]), *nodes,
                 oh.make_node("Transpose", ["y3"], ["out"], name="out", perm=[1, 0, 2])]
    shape_in, shape_out = ([4, 6, 8], [4, 6, 16]) if batch_first else ([6, 4, 8], [6, 4, 16])
    return graphs.model(nodes, [graphs.value("x", shape_in)], [graphs.value("out", shape_out)],
                        [weight("W", TensorProto.FLOAT, [1, 64, 8]), weight("R", TensorProto.FLOAT, [1, 64, 16]),
                         oh.make_tensor("axis", TensorProto.INT64, [1], [1])])


def test_batch_first_lstm_keeps_a_copy_of_its_input_and_copies_its_output_gradient_on_cpu() -> None:
    # PyTorch clones the transposed input for mkldnn_rnn_layer and keeps the clone (4 x 6 x 8 floats), and its
    # backward makes the transposed output gradient contiguous (6 x 4 x 16 floats) for a moment: the LSTM's
    # backward, the peak either way, holds both more.
    options = TrainingOptions(optimizer="sgd", device="cpu", loss="mean")
    plain = onnxmem.analyze(_lstm(batch_first=False), training=options).training
    first = onnxmem.analyze(_lstm(batch_first=True), training=options).training
    assert plain is not None and first is not None
    assert plain.peak_event == "backward of LSTM lstm" == first.peak_event
    # (and the output Transpose's autograd node; the input's needs no gradient)
    assert first.peak_bytes - plain.peak_bytes == 4 * (4 * 6 * 8) + 4 * (6 * 4 * 16) + CPU_AUTOGRAD_BYTES_PER_NODE
    # on CUDA neither copy is made
    cuda = TrainingOptions(optimizer="sgd", device="cuda", loss="mean")
    plain_cuda = onnxmem.analyze(_lstm(batch_first=False), training=cuda).training
    first_cuda = onnxmem.analyze(_lstm(batch_first=True), training=cuda).training
    assert plain_cuda is not None and first_cuda is not None
    assert first_cuda.peak_bytes == plain_cuda.peak_bytes


def test_the_command_line_takes_the_cpu_threads_and_instruction_set(tmp_path: Path) -> None:
    import json

    from .cli import run, save

    path = save(conv_chain_of(20), tmp_path / "conv.onnx")
    peaks = {}
    for isa in CPU_ISAS:
        code, out, err = run("report", path, "--training", "--device", "cpu", "--optimizer", "sgd", "--loss", "mean",
                             "--cpu-isa", isa, "--cpu-threads", "2", "--format", "json")
        assert code == 0, err
        peaks[isa] = json.loads(out)["training"]["peak_bytes"]
        expected = onnxmem.analyze(conv_chain_of(20), training=TrainingOptions(
            optimizer="sgd", device=TorchCpu(threads=2, isa=isa), loss="mean")).training
        assert expected is not None and peaks[isa] == expected.peak_bytes
    assert peaks["avx512"] > peaks["avx2"]
    code, _, err = run("report", path, "--cpu-isa", "avx512")
    assert code == 2 and "--cpu-isa is a training option" in err
    code, _, err = run("report", path, "--training", "--cpu-isa", "sse")
    assert code == 2 and "Invalid value for '--cpu-isa'" in err


def test_an_unrolled_gru_s_autograd_graph_is_counted_per_step_on_cpu() -> None:
    # PyTorch's CPU GRU is a loop of cells: 14 autograd nodes a step and 7 a layer (counted from grad_fn on nn.GRU),
    # besides the 4 parameters' accumulators; the ONNX graph's one GRU node stands for all of them. _gru runs 5
    # steps of one layer: live at the peak (backward) are 14 x 5 + 7 nodes for it, 3 accumulators (W, R, B) and the
    # loss's node.
    options = TrainingOptions(optimizer="sgd", device="cpu", loss="mean")
    t = onnxmem.analyze(_gru(relaid=False), training=options).training
    assert t is not None
    graph_rows = [row for row in t.live_at_peak if row.category == "autograd graph"]
    assert len(graph_rows) == 1
    assert graph_rows[0].bytes == (14 * 5 + 7 + 3 + 1) * CPU_AUTOGRAD_BYTES_PER_NODE
