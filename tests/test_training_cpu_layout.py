"""Channels-last convolutions on CPU: which inputs PyTorch holds channels-last (targets/torch/cpu/layout.py, from the
graph's shapes) and what oneDNN's NHWC convolution allocates then (convolution.py, tables.py CpuConvolution: measured
by benchmarks/training_single_ops.py --conv-channels-last)."""

from __future__ import annotations

import math

import onnx
from onnx import TensorProto, helper

from onnxmem.ir.graph import build_graph
from onnxmem.shapes.sizing import bind_and_infer
from onnxmem.targets.torch.cpu.convolution import cpu_convolution_scratch
from onnxmem.targets.torch.cpu.layout import channels_last, channels_last_values
from onnxmem.targets.torch.cpu.tables import CPU_CONVOLUTION, CPU_ISAS
from onnxmem.training.values import StepNode, StepValue, aten_op

AVX2 = CPU_ISAS["avx2"]


def _graph() -> onnx.ModelProto:
    """NHWC -> permute -> depthwise 7x7 -> + x (channels-last first) -> + x (contiguous first); tokens -> transpose ->
    view as an image -> 3x3 conv; the permute made contiguous -> 3x3 conv."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Transpose", ["nhwc"], ["x"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["x", "dw"], ["y"], group=16, pads=[3, 3, 3, 3]),
        helper.make_node("Add", ["y", "image"], ["cl_first"]),
        helper.make_node("Add", ["image", "y"], ["contiguous_first"]),
        helper.make_node("Transpose", ["tokens"], ["channels_tokens"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["channels_tokens", "image_shape"], ["viewed"]),
        helper.make_node("Conv", ["viewed", "w"], ["z"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["image", "w"], ["plain"], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["square_tokens"], ["square_channels"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["square_channels", "square_shape"], ["square_viewed"]),
        helper.make_node("Identity", ["x"], ["x_contiguous"]),
        helper.make_node("Conv", ["x_contiguous", "w"], ["after_contiguous"], pads=[1, 1, 1, 1]),
        helper.make_node("Identity", ["x"], ["x_dropped"]),
    ]
    # x.contiguous(): the exporter writes aten.clone as an Identity node that keeps the clone's fx node
    clone = nodes[-3].metadata_props.add()
    clone.key, clone.value = "pkg.torch.onnx.fx_node", (
        "%clone : [num_users=1] = call_function[target=torch.ops.aten.clone.default](args = (%permute,), "
        "kwargs = {memory_format: torch.contiguous_format})")
    # nn.Dropout(p=0) traced in train mode: a plain clone (preserve_format) in the Dropout's scope
    for key, value in (("namespace", ": M/drop: torch.nn.modules.dropout.Dropout/clone_1: aten.clone.default"),
                       ("pkg.torch.onnx.fx_node", "%clone_1 : [num_users=1] = call_function[target=torch.ops.aten."
                                                  "clone.default](args = (%permute,), kwargs = {})")):
        prop = nodes[-1].metadata_props.add()
        prop.key, prop.value = key, value
    graph = helper.make_graph(nodes, "layouts", [
        helper.make_tensor_value_info("nhwc", f, [2, 8, 8, 16]),
        helper.make_tensor_value_info("image", f, [2, 16, 8, 8]),
        helper.make_tensor_value_info("tokens", f, [2, 64, 16]),
        helper.make_tensor_value_info("square_tokens", f, [2, 64, 64]),
    ], [helper.make_tensor_value_info(n, f, None) for n in ("cl_first", "contiguous_first", "z", "plain",
                                                                  "after_contiguous", "square_viewed", "x_dropped")], [
        helper.make_tensor("dw", f, [16, 1, 7, 7], [0.0] * 16 * 49),
        helper.make_tensor("w", f, [16, 16, 3, 3], [0.0] * 16 * 16 * 9),
        helper.make_tensor("image_shape", TensorProto.INT64, [4], [2, 16, 8, 8]),
        helper.make_tensor("square_shape", TensorProto.INT64, [4], [2, 64, 8, 8]),
    ])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_channels_last_is_followed_from_a_permute_and_a_token_view() -> None:
    model = _graph()
    graph = build_graph(model, bind_and_infer(model, {}).types)

    def layout(name: str) -> bool:
        return channels_last(graph, graph.tensor_index[name])

    assert layout("x") and layout("y")  # the permute of NHWC, and a convolution of it
    assert layout("cl_first") and not layout("contiguous_first")  # an add follows its first input's strides
    assert layout("viewed") and layout("z")  # [N, L, C] transposed and viewed as [N, C, H, W]
    assert layout("square_viewed")  # 64 tokens of 64 channels: the same shape transposed
    assert not layout("image") and not layout("plain")
    assert not layout("x_contiguous") and not layout("after_contiguous")  # .contiguous() after the permute
    assert layout("x_dropped")  # a Dropout's clone keeps the layout


def test_the_step_and_the_graph_read_the_same_layouts() -> None:
    # one rule behind both: the convolutions' scratch asks the graph, slow_conv2d's GEMMs and the GELU primitives
    # ask the step's nodes and values (whose ATen mark of the clone is StepNode.aten)
    model = _graph()
    graph = build_graph(model, bind_and_infer(model, {}).types)
    nodes = [StepNode(op.op_type, op.domain, op.name, op.layer, op.inputs, op.outputs, i, aten=aten_op(op.origin))
             for i, op in enumerate(graph.ops)]
    values = [StepValue(t.name, t.shape, None, t.nbytes or 0, True, t.kind, producer=t.producer)
              for t in graph.tensors]
    found = {graph.tensors[t].name for t in channels_last_values(nodes, values)}
    assert found == {t.name for i, t in enumerate(graph.tensors) if channels_last(graph, i)}
    assert found == {"x", "y", "cl_first", "viewed", "z", "square_viewed", "x_dropped"}


def _nbytes(shape: tuple[int, ...]) -> int:
    return 4 * math.prod(shape)


def test_a_channels_last_depthwise_weight_gradient_takes_one_column_block() -> None:
    # whatever the batch and image: C x 7 x 7 x 64 positions (measured 501,760 + 26 kB at 40 channels on 8x8 to
    # 32x32 images, batch 4 and 8; 1,003,520 + 28 kB at 80 channels)
    for batch, size in ((4, 16), (8, 16), (4, 32)):
        x, w = (batch, 40, size, size), (40, 1, 7, 7)
        rule = cpu_convolution_scratch(x, w, x, 4, 160, True, True, isa=AVX2, channels_last=True)
        assert rule == 40 * 49 * CPU_CONVOLUTION.channels_last_depthwise_positions * 4 == 501_760
        contiguous = cpu_convolution_scratch(x, w, x, 4, 160, True, True, isa=AVX2)
        assert contiguous is not None and rule != contiguous
    # a 3x3 depthwise runs oneDNN's jit kernel in NHWC: only its weight reordered
    x, w = (4, 64, 16, 16), (64, 1, 3, 3)
    assert cpu_convolution_scratch(x, w, x, 4, 256, True, True, isa=AVX2, channels_last=True) == _nbytes(w)


def test_a_channels_last_dense_convolution_holds_its_weight_two_or_three_times() -> None:
    x, w, y = (4, 160, 4, 4), (320, 160, 2, 2), (4, 320, 2, 2)
    weight = _nbytes(w)
    assert cpu_convolution_scratch(x, w, y, 4, 0, False, False, forward=True, isa=AVX2, channels_last=True) \
        == 2 * weight
    assert cpu_convolution_scratch(x, w, y, 4, 1280, True, True, isa=AVX2, channels_last=True) == 3 * weight
    assert cpu_convolution_scratch(x, w, y, 4, 0, True, False, isa=AVX2, channels_last=True) == 2 * weight
    one_by_one = (128, 160, 1, 1)
    assert cpu_convolution_scratch(x, one_by_one, (4, 128, 4, 4), 4, 0, True, True, isa=AVX2,
                                   channels_last=True) == 0


def test_a_kernel_larger_than_the_image_takes_the_contiguous_rules() -> None:
    x, w = (4, 320, 2, 2), (320, 1, 7, 7)
    assert cpu_convolution_scratch(x, w, x, 4, 1280, True, True, isa=AVX2, channels_last=True) \
        == cpu_convolution_scratch(x, w, x, 4, 1280, True, True, isa=AVX2)
