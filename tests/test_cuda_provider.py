"""The CUDA provider's placement (onnxmem.targets.ort.cuda.placement and tables):
taken from onnxruntime's source, as no GPU is
available; each test checks what one rule does to a small graph, its bytes worked out by hand."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxmem
from onnxmem.ir.graph import HOST
from onnxmem.passes.pipeline import analysis
from onnxmem.training.step import TrainingOptions

F32 = TensorProto.FLOAT


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           initializers: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def shape_subgraph() -> onnx.ModelProto:
    """x [batch, 64] -> Relu -> r; Shape(r) -> Gather(0) -> Unsqueeze -> Concat with [8, 8] -> Reshape(r) -> Sigmoid
    -> y [batch, 8, 8]: the TorchScript exporter's flatten/reshape chain."""
    consts = [numpy_helper.from_array(np.array(0, np.int64), "i0"),
              numpy_helper.from_array(np.array([0], np.int64), "axes"),
              numpy_helper.from_array(np.array([8, 8], np.int64), "tail")]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "i0"], ["b"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["b", "axes"], ["b1"], name="unsqueeze"),
             helper.make_node("Concat", ["b1", "tail"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["r", "target"], ["y0"], name="reshape"),
             helper.make_node("Sigmoid", ["y0"], ["y"], name="sigmoid")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["batch", 64])],
                  [helper.make_tensor_value_info("y", F32, ["batch", 8, 8])], consts)


def test_a_shape_subgraph_stays_in_host_memory_and_is_no_device_bytes() -> None:
    cpu = analysis(shape_subgraph(), {"batch": 4}, provider="cpu")
    cuda = analysis(shape_subgraph(), {"batch": 4})  # cuda is the default
    kinds = {t.name: t.kind for t in cuda.graph.tensors}
    # Shape runs on the device with its output in host memory; Gather, Unsqueeze and Concat read only host tensors
    # and small initializers: GetCpuPreferredNodes puts them on the CPU. Reshape reads its shape in host memory
    # (InputMemoryType CPU): no copy, and it stays on the device with r.
    assert [kinds[n] for n in ("s", "b", "b1", "target")] == [HOST] * 4
    assert kinds["r"] != HOST and kinds["y"] != HOST
    assert not any(op.op_type.startswith("Memcpy") for op in cuda.graph.ops)
    # the shape [2] int64 (16 B), the gathered dim (8 B; Unsqueeze is a view of it) and the target [3] (24 B):
    # counted on the CPU provider, in host memory on the CUDA provider
    host = 16 + 8 + 24
    assert cuda.report.inference.host_activation_bytes == host
    assert cpu.report.inference.sum_activation_bytes - cuda.report.inference.sum_activation_bytes == host
    # from Relu to Reshape the device holds r alone (4 x 64 floats); on the CPU provider the shape tensors add to it
    # (at Concat: the gathered dim and the target, 32 B)
    r = 4 * 64 * 4
    assert [cuda.graph.ops[i].name for i in cuda.order] == [cpu.graph.ops[i].name for i in cpu.order]
    assert list(cuda.timeline.live_bytes[:6]) == [r] * 6
    assert cpu.timeline.live_bytes[4] == r + 8 + 24
    assert [w.code for w in cuda.report.warnings] == ["cuda-host-nodes"] and not cpu.report.warnings


def test_a_float16_input_keeps_a_shape_node_on_the_device() -> None:
    # GetCpuPreferredNodes never moves a node with a float16 input: Mul(Cast(Shape) to float16, a float16 scale)
    # stays on the device, and its host input is copied there (MemcpyFromHost)
    scale = numpy_helper.from_array(np.array([2.0], np.float16), "scale")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Cast", ["s"], ["h"], name="cast", to=TensorProto.FLOAT16),
             helper.make_node("Mul", ["h", "scale"], ["y"], name="mul")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])], [scale])
    cuda = analysis(model, {"batch": 4})
    kinds = {t.name: t.kind for t in cuda.graph.tensors}
    producers = {t.name: cuda.graph.ops[t.producer].op_type for t in cuda.graph.tensors if t.producer is not None}
    assert kinds["h"] == HOST  # Cast's only input is the shape: it moves to the CPU
    assert kinds["y"] != HOST and producers["h_CUDAExecutionProvider"] == "MemcpyFromHost"


def no_cuda_kernel() -> onnx.ModelProto:
    """x [batch, 256] -> Relu -> Celu -> Relu -> y: the CUDA provider has no Celu kernel."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Celu", ["r"], ["c"], name="celu"),
             helper.make_node("Relu", ["c"], ["y"], name="relu2")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["batch", 256])],
                  [helper.make_tensor_value_info("y", F32, ["batch", 256])])


def test_a_node_without_a_cuda_kernel_runs_on_the_cpu_between_copies() -> None:
    cuda = analysis(no_cuda_kernel(), {"batch": 4})
    cpu = analysis(no_cuda_kernel(), {"batch": 4}, provider="cpu")
    t = 4 * 256 * 4  # one [4, 256] float32 tensor
    assert [cuda.graph.ops[i].op_type for i in cuda.order] == ["Relu", "MemcpyToHost", "Celu", "MemcpyFromHost", "Relu"]
    # device bytes at each step: r; r while it is copied out (the host copy is not device memory); while Celu runs
    # on the CPU, r's freed device buffer, which the copy of Celu's output takes next (a freed buffer a later
    # output takes stays held: the planner's reuse, per location); that copy; that copy and y
    assert list(cuda.timeline.live_bytes) == [t, t, t, t, 2 * t]
    assert cuda.report.inference.host_activation_bytes == 2 * t  # r's host copy and Celu's output
    # on the CPU provider Celu runs in place over r (rules.inference.IN_PLACE): r, r, then r and y
    assert list(cpu.timeline.live_bytes) == [t, t, 2 * t]
    note = cuda.report.warnings[0]
    assert note.code == "cuda-host-nodes" and "Celu" in note.message and "MemcpyFromHost" in note.message


def branches(op: str, **attributes: object) -> onnx.ModelProto:
    """x -> Relu -> a, x -> Relu -> b (kept for the end), op(a) -> s, Add(s, b) -> y: `op` is a's last reader."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Relu", ["x"], ["b"], name="b"),
             helper.make_node(op, ["a"], ["s"], name="op", **attributes),
             helper.make_node("Add", ["s", "b"], ["y"], name="add")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["batch", 256])],
                  [helper.make_tensor_value_info("y", F32, ["batch", 256])])


@pytest.mark.parametrize(("op", "attributes"), [("Softmax", {"axis": -1}), ("Clip", {}),
                                                ("Cast", {"to": TensorProto.FLOAT})])
def test_ops_in_place_on_cpu_take_a_new_buffer_on_cuda(op: str, attributes: dict[str, object]) -> None:
    # The CPU kernels of Softmax, Clip and Cast declare MayInplace(0, 0); the CUDA kernels (math/softmax.cc,
    # math/clip.cc, tensor/cast_op.cc) do not: while the op runs, s shares a's buffer on CPU and takes one of its own
    # on CUDA, one [4, 256] float32 tensor more (b is live at that step on both or on neither)
    t = 4 * 256 * 4
    step = {"cpu": None, "cuda": None}
    for provider in step:
        run = analysis(branches(op, **attributes), {"batch": 4}, provider=provider)
        position = run.order.index(next(o.index for o in run.graph.ops if o.name == "op"))
        step[provider] = run.timeline.live_bytes[position]
    assert step["cuda"] == step["cpu"] + t and step["cpu"] in (t, 2 * t)


def test_relu_runs_in_place_on_both_providers() -> None:
    # activations.cc declares MayInplace(0, 0) for Relu, as the CPU kernel does
    live = []
    for provider in ("cpu", "cuda"):
        run = analysis(branches("Relu"), {"batch": 4}, provider=provider)
        position = run.order.index(next(o.index for o in run.graph.ops if o.name == "op"))
        live.append(run.timeline.live_bytes[position])
    assert live[0] == live[1] and live[0] in (4 * 256 * 4, 2 * 4 * 256 * 4)


def test_the_training_step_reads_the_model_as_given() -> None:
    # the placement is onnxruntime's; a training step is PyTorch's, the same on both providers
    options = TrainingOptions(optimizer="sgd")
    cpu = onnxmem.analyze(shape_subgraph(), {"batch": 4}, provider="cpu", training=options).training
    cuda = onnxmem.analyze(shape_subgraph(), {"batch": 4}, training=options).training
    assert cpu is not None and cpu == cuda


def test_the_placement_is_applied_once() -> None:
    # a model the transform made is left as it is (fit and the what-ifs re-run the pipeline on it)
    from onnxmem.ir.load import load_model
    from onnxmem.targets.ort.cuda.placement import on_cuda

    placed, notes = on_cuda(load_model(no_cuda_kernel()))
    again, more = on_cuda(placed)
    assert notes and not more and again is placed
    assert sum(n.op_type.startswith("Memcpy") for n in again.proto.graph.node) == 2


def roi_align(dtype: int) -> onnx.ModelProto:
    """x [1, 4, 8, 8] -> Relu -> RoiAlign (2 boxes, 2x2) -> Relu -> y, in `dtype`."""
    numpy_type = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    rois = numpy_helper.from_array(np.array([[0, 0, 4, 4], [2, 2, 6, 6]], numpy_type), "rois")
    index = numpy_helper.from_array(np.array([0, 0], np.int64), "index")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("RoiAlign", ["r", "rois", "index"], ["p"], name="roi", output_height=2,
                              output_width=2),
             helper.make_node("Relu", ["p"], ["y"], name="relu2")]
    return _model(nodes, [helper.make_tensor_value_info("x", dtype, [1, 4, 8, 8])],
                  [helper.make_tensor_value_info("y", dtype, [2, 4, 2, 2])], [rois, index])


def test_an_op_without_a_float16_cuda_kernel_runs_a_float16_model_on_the_cpu() -> None:
    # the CUDA RoiAlign kernel takes float and double (docs/OperatorKernels.md): float16 data sends it to the CPU
    half = analysis(roi_align(TensorProto.FLOAT16), None)
    kinds = {t.name: t.kind for t in half.graph.tensors}
    assert kinds["p"] == HOST and kinds["r"] == HOST  # RoiAlign's output, and r's host copy
    assert sorted(op.op_type for op in half.graph.ops if op.op_type.startswith("Memcpy")) == \
        ["MemcpyFromHost", "MemcpyToHost"]
    # the float16 pooled output [2, 4, 2, 2] (64 B) and r's copy [1, 4, 8, 8] (512 B) are in host memory
    assert half.report.inference.host_activation_bytes == 64 + 512
    single = analysis(roi_align(TensorProto.FLOAT), None)
    assert not single.report.warnings and all(t.kind != HOST for t in single.graph.tensors)
