"""Training estimates from what the export says: ops folded away (BatchNorm into Conv) simulated again and warned
about, eval-mode exports warned about, ATen ops of the dynamo exporter simulated as PyTorch runs them, decomposed
activations of a TorchScript export, and the mean loss. Sizes are float32."""

from __future__ import annotations

import onnx
import onnx.helper as oh
from onnx import TensorProto

import onnxmem
from onnxmem.targets.torch.cpu.tables import CPU_AUTOGRAD_BYTES_PER_NODE as NODE
from onnxmem.targets.torch.cpu.tables import MklGemmBuffers
from onnxmem.training.step import TrainingOptions

from . import graphs

# Conv 3 -> 8 channels, 3x3, on x [2, 3, 8, 8]: its output is 2 x 8 x 8 x 8 x 4 = 4096 bytes.
ACT = 2 * 8 * 8 * 8 * 4


def weight(name: str, dims: list[int]) -> onnx.TensorProto:
    return graphs.external_header(name, TensorProto.FLOAT, dims)


def mark(node: onnx.NodeProto, target: str, fx_name: str, args: str, scope: str = "") -> onnx.NodeProto:
    """Give the node with the dynamo exporter's metadata: the ATen op it comes from and its module scope."""
    entry = node.metadata_props.add()
    entry.key = "pkg.torch.onnx.fx_node"
    entry.value = f"%{fx_name} : [num_users=1] = call_function[target=torch.ops.aten.{target}](args = ({args}), " \
                  "kwargs = {})"
    if scope:
        entry = node.metadata_props.add()
        entry.key, entry.value = "namespace", scope
    return node


def conv_relu_fc(conv_weight: str, nodes_before_relu: list[onnx.NodeProto], extra: list[onnx.TensorProto],
                 ) -> onnx.ModelProto:
    """x [2,3,8,8] -> (Conv with `conv_weight`, then `nodes_before_relu`) -> c -> Relu -> mean -> Gemm -> y [2,10]."""
    return graphs.model(
        [oh.make_node("Conv", ["x", conv_weight], ["conv_out"], name="/conv/Conv", pads=[1, 1, 1, 1]),
         *nodes_before_relu,
         oh.make_node("Relu", ["c"], ["r"], name="/relu/Relu"),
         oh.make_node("GlobalAveragePool", ["r"], ["p"], name="/pool/GlobalAveragePool"),
         oh.make_node("Flatten", ["p"], ["f"], name="/Flatten"),
         oh.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], name="/fc/Gemm", transB=1)],
        [graphs.value("x", [2, 3, 8, 8])], [graphs.value("y", [2, 10])],
        [weight(conv_weight, [8, 3, 3, 3]), weight("fc.weight", [10, 8]), weight("fc.bias", [10]), *extra])


def with_batchnorm() -> onnx.ModelProto:
    """The train-mode export that keeps BatchNorm (Conv, BatchNormalization with its running statistics)."""
    bn = oh.make_node("BatchNormalization", ["conv_out", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
                      ["c"], name="/bn/BatchNormalization")
    return conv_relu_fc("conv.weight", [bn], [weight(f"bn.{n}", [8]) for n in
                                               ("weight", "bias", "running_mean", "running_var")])


def folded_with_marks(target: str) -> onnx.ModelProto:
    """The dynamo exporter's default (optimized) export: BatchNorm folded into the Conv, which carries its fx node."""
    model = conv_relu_fc("val_16", [oh.make_node("Identity", ["conv_out"], ["c"], name="/bn/Identity")], [])
    for node in model.graph.node:
        if node.name == "/conv/Conv":
            mark(node, target, "bn", "%conv2d, %p_bn_weight, %p_bn_bias, %b_bn_running_mean, %b_bn_running_var")
    return model


def test_batchnorm_folded_by_the_dynamo_optimizer_is_restored_and_warned() -> None:
    options = TrainingOptions(optimizer="sgd", device="cpu")
    kept = onnxmem.analyze(with_batchnorm(), training=options)
    folded = onnxmem.analyze(folded_with_marks("_native_batch_norm_legit_functional.default"), training=options)
    assert kept.training is not None and folded.training is not None
    # BatchNorm keeps its input (the Conv's output, 4096) and 2 x 8 fp32 statistics (64), Relu its output (4096):
    # the same on the graph that kept BatchNorm and on the one whose BatchNorm was folded into the Conv.
    assert folded.training.saved_activation_bytes == kept.training.saved_activation_bytes
    assert dict(folded.training.saved_by_op_type)["BatchNormalization"] == ACT + 64
    codes = {w.code: w.message for w in folded.warnings}
    assert "folded-normalization" in codes
    assert "/conv/Conv" in codes["folded-normalization"] and "4,096 bytes" in codes["folded-normalization"]
    assert "optimize=False" in codes["folded-normalization"]
    assert "folded-normalization" not in {w.code for w in kept.warnings}
    # the peaks differ only by BatchNorm's four vectors of 8 (weight, bias, running statistics: 128 bytes),
    # folded into the Conv's weights (its parameter gradients are not live at the peak, in Conv's backward), and
    # on CPU by one autograd node: BatchNorm's weight and bias accumulators against the folded graph's Identity
    assert kept.training.peak_bytes - folded.training.peak_bytes == 4 * 8 * 4 + NODE


def test_eval_mode_export_folding_batchnorm_says_dropout_is_gone_too() -> None:
    report = onnxmem.analyze(folded_with_marks("_native_batch_norm_legit_no_training.default"),
                             training=TrainingOptions(optimizer="sgd", device="cpu"))
    assert report.training is not None and report.training.export_mode == "eval"
    message = {w.code: w.message for w in report.warnings}["folded-normalization"]
    assert "eval mode" in message and "Dropout" in message


def test_torchscript_conv_weight_without_a_parameter_name_is_a_folded_batchnorm() -> None:
    # TorchScript's eval export folds BatchNorm into the Conv's weights, which get names like 'onnx::Conv_18'
    # while the other weights keep their parameter names ('fc.weight').
    folded = conv_relu_fc("onnx::Conv_18", [oh.make_node("Identity", ["conv_out"], ["c"], name="/Identity")], [])
    report = onnxmem.analyze(folded, training=TrainingOptions(optimizer="sgd", device="cpu"))
    assert report.training is not None
    assert "folded-normalization" in {w.code for w in report.warnings}
    assert dict(report.training.saved_by_op_type)["BatchNormalization"] == ACT + 64
    plain = conv_relu_fc("conv.weight", [oh.make_node("Identity", ["conv_out"], ["c"], name="/Identity")], [])
    clean = onnxmem.analyze(plain, training=TrainingOptions(optimizer="sgd", device="cpu"))
    assert not {"folded-normalization", "eval-export"} & {w.code for w in clean.warnings}


def test_eval_export_keeping_batchnorm_warns_that_dropout_is_not_counted() -> None:
    # One BatchNormalization output: an eval-mode export (TorchScript), which removes Dropout.
    report = onnxmem.analyze(with_batchnorm(), training=TrainingOptions(optimizer="sgd", device="cpu"))
    assert report.training is not None and report.training.export_mode == "eval"
    assert "Dropout" in {w.code: w.message for w in report.warnings}["eval-export"]


def test_dropout_module_copied_by_an_eval_export_is_simulated_as_dropout() -> None:
    # An eval-mode dynamo export without the optimizer keeps nn.Dropout as aten.clone (an Identity) in the
    # Dropout module's scope: on CPU, train-mode dropout makes a new output and keeps a float noise tensor.
    scope = ": __main__.M/drop: torch.nn.modules.dropout.Dropout/clone: aten.clone.default"
    model = graphs.model(
        [oh.make_node("MatMul", ["x", "W"], ["h"], name="fc"),
         mark(oh.make_node("Identity", ["h"], ["d"], name="node_clone"), "clone.default", "clone", "%h", scope),
         oh.make_node("MatMul", ["d", "W2"], ["y"], name="fc2")],
        [graphs.value("x", [4, 256])], [graphs.value("y", [4, 128])], [weight("W", [256, 512]),
                                                                         weight("W2", [512, 128])])
    report = onnxmem.analyze(model, training=TrainingOptions(optimizer="sgd", device="cpu", loss="none"))
    assert report.training is not None
    saved = dict(report.training.saved_by_op_type)
    assert saved["Dropout"] == 4 * 512 * 4  # the noise tensor; fc2 keeps d, a new tensor (MatMul: 8192)
    assert saved["MatMul"] == 4 * 512 * 4
    assert "eval-export" in {w.code for w in report.warnings}


def silu_mlp(marked: bool, scope: str) -> onnx.ModelProto:
    """h = x [4,256] @ W [256,512]; y = h * sigmoid(h) (Sigmoid, Mul), as exported from nn.SiLU."""
    sigmoid = oh.make_node("Sigmoid", ["h"], ["s"], name=f"{scope}/Sigmoid")
    mul = oh.make_node("Mul", ["h", "s"], ["y"], name=f"{scope}/Mul")
    if marked:
        for node in (sigmoid, mul):
            mark(node, "silu.default", "silu", "%h")
    return graphs.model([oh.make_node("MatMul", ["x", "W"], ["h"], name="/fc/MatMul"), sigmoid, mul],
                        [graphs.value("x", [4, 256])], [graphs.value("y", [4, 512])], [weight("W", [256, 512])])


def test_silu_marked_by_its_aten_op_keeps_only_its_input() -> None:
    # aten::silu keeps h (4 x 512 x 4 = 8192), not sigmoid(h); the loss's log-softmax of y keeps 8192.
    t = onnxmem.analyze(silu_mlp(True, "/act"), training=TrainingOptions(optimizer="sgd")).training
    assert t is not None
    assert dict(t.saved_by_op_type) == {"aten::silu": 8192, "LogSoftmax": 8192}


def test_unmarked_sigmoid_mul_alone_in_a_module_scope_is_assumed_silu() -> None:
    alone = onnxmem.analyze(silu_mlp(False, "/act"), training=TrainingOptions(optimizer="sgd")).training
    assert alone is not None
    assert dict(alone.saved_by_op_type)["aten::silu"] == 8192
    assert any("nn.SiLU" in a for a in alone.assumptions)
    # written inside a forward (the scope holds other nodes): Mul keeps h and s, Sigmoid s
    inline = onnxmem.analyze(silu_mlp(False, "/fc"), training=TrainingOptions(optimizer="sgd")).training
    assert inline is not None
    assert inline.saved_activation_bytes == 3 * 8192
    assert not any("nn.SiLU" in a for a in inline.assumptions)


def test_mean_loss_makes_an_output_sized_gradient() -> None:
    # y = x [4,256] @ W [256,512] (8192 bytes). output.mean(): backward expands the scalar gradient into a new
    # y-sized one (8192); then MatMul makes grad W (524288) while y and its gradient are live.
    model = graphs.model([oh.make_node("MatMul", ["x", "W"], ["y"], name="fc")], [graphs.value("x", [4, 256])],
                         [graphs.value("y", [4, 512])], [weight("W", [256, 512])])
    mean = onnxmem.analyze(model, training=TrainingOptions(optimizer="sgd", device="cpu", loss="mean")).training
    none = onnxmem.analyze(model, training=TrainingOptions(optimizer="sgd", device="cpu", loss="none")).training
    assert mean is not None and none is not None
    base = 256 * 512 * 4 + 4 * 256 * 4
    # and on CPU the autograd graph: MatMul's and the mean's nodes, W's accumulator; MKL's sgemm blocks
    # (targets/torch/cpu/tables.py MklGemmBuffers): the forward's (4 x 512 over 256: K block 128) and grad W's
    # (256 x 512 over 4)
    g = MklGemmBuffers()
    mkl = g.first_use + g.block + 4 * 128 * (512 + 2 * 4) + g.block + 4 * 128 * (512 + 2 * 256)
    assert mean.peak_bytes == base + 8192 + 4 + 8192 + 256 * 512 * 4 + 3 * NODE + mkl
    assert mean.peak_bytes > none.peak_bytes
