"""Training memory: hand-worked peaks of one training step on tiny graphs, optimizer states, frozen parameters,
mixed precision, and the what-ifs. Sizes are float32 unless a test says otherwise."""

from __future__ import annotations

import json

import onnx
import onnx.helper as oh
import pytest
from click.testing import CliRunner
from onnx import TensorProto

import onnxmem
from onnxmem.cli.commands import main
from onnxmem.errors import TrainingOptionError
from onnxmem.targets.torch import TorchCpu
from onnxmem.targets.torch.cpu.tables import CPU_AUTOGRAD_BYTES_PER_NODE as NODE
from onnxmem.targets.torch.cpu.tables import CPU_ISAS, MklGemmBuffers
from onnxmem.training.step import TrainingOptions

from . import graphs


def weight(name: str, dims: list[int], dtype: int = TensorProto.FLOAT) -> onnx.TensorProto:
    return graphs.external_header(name, dtype, dims)


def linear(batch: int | str = 4) -> onnx.ModelProto:
    """y = Gemm(x [B,256], W [128,256] transposed, b [128]): one Linear layer."""
    return graphs.model(
        [oh.make_node("Gemm", ["x", "W", "b"], ["y"], name="fc", transB=1)],
        [graphs.value("x", [batch, 256])], [graphs.value("y", [batch, 128])],
        [weight("W", [128, 256]), weight("b", [128])])


def mlp() -> onnx.ModelProto:
    """h = x [4,256] @ W1 [256,512]; r = Relu(h); y = r @ W2 [512,128]."""
    return graphs.model(
        [oh.make_node("MatMul", ["x", "W1"], ["h"], name="/layer1/MatMul"),
         oh.make_node("Relu", ["h"], ["r"], name="/layer1/Relu"),
         oh.make_node("MatMul", ["r", "W2"], ["y"], name="/layer2/MatMul")],
        [graphs.value("x", [4, 256])], [graphs.value("y", [4, 128])],
        [weight("W1", [256, 512]), weight("W2", [512, 128])])


def train(model: onnx.ModelProto, dims: dict[str, int] | None = None, **options: object) -> onnxmem.Report:
    return onnxmem.analyze(model, dims, training=TrainingOptions(**options))  # type: ignore[arg-type]


W, B, X, Y = 128 * 256 * 4, 128 * 4, 4 * 256 * 4, 4 * 128 * 4  # 131072, 512, 4096, 2048 bytes

# MKL's sgemm packing blocks on CPU (targets/torch/cpu/tables.py MklGemmBuffers), for linear(): the forward's GEMM
# (a 4 x 128 output over K = 256: MKL's K block 128) makes one block, with the process's first-use bytes; W's gradient
# (128 x 256 in W's layout, over the batch of 4: K block 128) is larger and makes a second, from Gemm's backward on
G = MklGemmBuffers()
LINEAR_MKL = (G.first_use + G.block + 4 * 128 * (128 + 2 * 4)) + (G.block + 4 * 128 * (256 + 2 * 128))


def test_linear_sgd_peak_is_in_backward_of_the_layer() -> None:
    # Base: weights W + b = 131584, input x = 4096.
    # Forward: y (2048) is kept by the training loop; Gemm keeps x and W, which exist anyway.
    # Loss: log-softmax (2048, kept for backward) and the loss scalar (4).
    # Backward: NLL makes grad lsm (2048); LogSoftmax makes grad y (2048), then frees lsm and grad lsm;
    # Gemm makes grad W (131072) and grad b (512) while grad y is live: y 2048 + loss 4 + grad y 2048 + 131584.
    # Measured in PyTorch 2.13 on CPU for this layer at batch 64: estimate within 4 bytes (nll's total_weight).
    # On CPU the autograd graph is on the heap too: a node per differentiable op (Gemm, LogSoftmax, NLL) and a
    # gradient accumulator per parameter (W, b), from the op's forward to the step's end.
    t = train(linear(), optimizer="sgd", device="cpu").training
    assert t is not None
    assert t.weights_bytes == W + B
    assert t.gradient_bytes == W + B
    assert t.optimizer_state_bytes == 0
    assert t.saved_activation_bytes == Y  # the log-softmax; nothing of the model's own
    assert t.peak_bytes == (W + B) + X + Y + 4 + Y + (W + B) + 5 * NODE + LINEAR_MKL
    assert t.peak_phase == "backward"
    assert t.peak_event == "backward of Gemm fc"
    phases = {p.phase: p for p in t.first_step.phases}
    # Gemm's node, W's and b's accumulators, the forward's MKL block
    assert phases["forward"].end_bytes == (W + B) + X + Y + 3 * NODE + G.first_use + G.block + 4 * 128 * 136
    # live to the step's end
    assert phases["optimizer"].end_bytes == (W + B) + X + Y + 4 + (W + B) + 5 * NODE + LINEAR_MKL
    cuda = train(linear(), optimizer="sgd", device="cuda").training  # host memory there, not the device's
    assert cuda is not None and cuda.peak_bytes == t.peak_bytes - 5 * NODE - LINEAR_MKL


def test_adamw_first_step_creates_states_and_its_update_holds_two_temporaries() -> None:
    # States: exp_avg and exp_avg_sq per parameter (2 x 131584) and a 4-byte step each: 263176.
    # For-loop update of W: sqrt(exp_avg_sq) and the quotient live at once: 2 x 131072.
    # Peak: base 135680 + gradients 131584 + y and loss 2052 + states 263176 + 262144 = 794636, in the
    # optimizer step; a later step starts with the states and peaks at the same update.
    t = train(linear(), optimizer="adamw", device="cpu").training
    assert t is not None
    assert t.optimizer_state_bytes == 2 * (W + B) + 2 * 4
    assert t.peak_bytes == (W + B) + X + (W + B) + Y + 4 + t.optimizer_state_bytes + 2 * W + 5 * NODE + LINEAR_MKL
    assert t.peak_phase == "optimizer"
    assert t.first_step.peak_bytes == t.later_step.peak_bytes
    later = {p.phase: p for p in t.later_step.phases}
    assert later["data"].end_bytes == (W + B) + X + t.optimizer_state_bytes + LINEAR_MKL  # MKL's blocks kept
    # foreach (PyTorch's default on CUDA): one sqrt over all parameters at once: 131584 instead of 262144
    cuda = train(linear(), optimizer="adamw").training
    assert cuda is not None and cuda.peak_bytes == t.peak_bytes - 2 * W + (W + B) - 5 * NODE - LINEAR_MKL


def test_the_for_loop_keeps_the_previous_parameters_denom_through_the_next_update() -> None:
    # mlp(): W1 [256, 512] then W2 [512, 128], each 2 x its size at its update; at W2's, Adam's `denom` of W1 is
    # still the loop's variable (benchmarks/training_single_ops.py --adam-loop): + W1 there, not at W1's own
    t = train(mlp(), optimizer="adamw", device="cpu").training
    assert t is not None and t.timeline is not None
    live = dict(zip(t.timeline.events, t.timeline.first_live_bytes, strict=False))
    w1, w2 = 256 * 512 * 4, 512 * 128 * 4
    assert live["update W2"] - live["update W1"] == 2 * w2 + w1 - 2 * w1
    sgd = train(mlp(), optimizer="sgd", device="cpu").training  # (no denom: SGD keeps nothing)
    assert sgd is not None and sgd.timeline is not None
    plain = dict(zip(sgd.timeline.events, sgd.timeline.first_live_bytes, strict=False))
    assert plain["update W2"] == plain["update W1"]


@pytest.mark.parametrize(
    ("optimizer", "state_bytes"),
    [
        ("sgd", 0),
        ("sgd-momentum", 4 * (8192 + 64)),  # one momentum buffer per parameter
        ("adam", 2 * 4 * (8192 + 64) + 2 * 4),  # exp_avg, exp_avg_sq and a 4-byte step per parameter
        ("adamw", 2 * 4 * (8192 + 64) + 2 * 4),
        ("adagrad", 4 * (8192 + 64) + 2 * 4),
        ("rmsprop", 4 * (8192 + 64) + 2 * 4),
        ("lion", 4 * (8192 + 64)),
        # Adafactor: W [128, 64] keeps a row (128) and a column (64) statistic; b [64] a full one; steps
        ("adafactor", 4 * (128 + 64) + 4 * 64 + 2 * 4),
        # 8-bit Adam: W (8192 >= 4096 elements) keeps 2 x (8192 bytes + one fp32 absmax per 256): 2 x 8320;
        # b (64 elements) stays fp32: 2 x 256
        ("adam8bit", 2 * (8192 + 4 * 32) + 2 * 64 * 4),
        ("momentum", 4 * (8192 + 64)),  # an alias
    ],
)
def test_optimizer_state_sizes(optimizer: str, state_bytes: int) -> None:
    model = graphs.model(
        [oh.make_node("MatMul", ["x", "W"], ["h"], name="mm"), oh.make_node("Add", ["h", "b"], ["y"], name="add")],
        [graphs.value("x", [2, 128])], [graphs.value("y", [2, 64])], [weight("W", [128, 64]), weight("b", [64])])
    t = train(model, optimizer=optimizer).training
    assert t is not None
    assert t.optimizer_state_bytes == state_bytes


def test_frozen_first_layer_keeps_nothing_before_the_trained_layer() -> None:
    # Frozen W1: h and r need no gradient, so MatMul 1 and Relu keep nothing for backward.
    # MatMul 2 keeps r (8192 bytes) to compute grad W2; no gradient flows past it.
    # Trained: gradients of W2 only (262144); saved: r (8192) + log-softmax (2048).
    frozen = train(mlp(), optimizer="sgd", freeze=("layer1*",)).training
    full = train(mlp(), optimizer="sgd").training
    assert frozen is not None and full is not None
    assert frozen.gradient_bytes == 512 * 128 * 4
    assert frozen.trainable_parameters == 512 * 128
    assert frozen.parameters == 256 * 512 + 512 * 128
    assert frozen.saved_activation_bytes == 4 * 512 * 4 + Y
    # All trained: Relu keeps r as its output too (the same tensor, counted once): also r + log-softmax.
    assert full.saved_activation_bytes == 4 * 512 * 4 + Y
    assert full.gradient_bytes == (256 * 512 + 512 * 128) * 4
    only = train(mlp(), optimizer="sgd", train=("W2",)).training
    assert only is not None and only.gradient_bytes == frozen.gradient_bytes
    groups = {g.layer: g for g in frozen.parameter_groups}
    assert groups["layer1"].frozen_bytes == 256 * 512 * 4 and groups["layer1"].trainable_bytes == 0


def test_batchnorm_running_statistics_are_buffers_not_parameters() -> None:
    # Parameters: conv weight 16x3x3x3 and bias 16, BN scale and bias (16 each); mean and var are buffers.
    init = [weight("w", [16, 3, 3, 3]), weight("cb", [16]), weight("scale", [16]), weight("bias", [16]),
            weight("bn.running_mean", [16]), weight("bn.running_var", [16])]
    model = graphs.model(
        [oh.make_node("Conv", ["x", "w", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         oh.make_node("BatchNormalization", ["c", "scale", "bias", "bn.running_mean", "bn.running_var"], ["n"],
                      name="bn"),
         oh.make_node("Relu", ["n"], ["r"], name="relu"),
         oh.make_node("ReduceMean", ["r"], ["y"], name="pool", keepdims=0)],
        [graphs.value("x", [2, 3, 8, 8])], [graphs.value("y", [])], init)
    t = train(model, optimizer="sgd", loss="none").training
    assert t is not None
    assert t.trainable_parameters == 16 * 27 + 16 + 16 + 16
    assert t.gradient_bytes == (16 * 27 + 16 + 16 + 16) * 4
    # Kept: BN keeps its input c (2x16x8x8x4 = 8192) and 2 x 16 fp32 statistics (128); Relu keeps r (8192);
    # Conv keeps x and w, which exist anyway. The graph's output is already the loss (a scalar).
    assert t.saved_activation_bytes == 8192 + 128 + 8192
    assert t.export_mode == "eval"


def test_swish_written_as_x_times_sigmoid_is_a_recompute_candidate() -> None:
    # h = x @ W; s = Sigmoid(h); y = h * s. Mul keeps h and s; Sigmoid keeps s: 2 tensors of 8192 bytes.
    # A fused Swish keeps only h: recomputing s from h in backward frees 8192 kept bytes.
    model = graphs.model(
        [oh.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
         oh.make_node("Sigmoid", ["h"], ["s"], name="sigmoid"),
         oh.make_node("Mul", ["h", "s"], ["y"], name="swish")],
        [graphs.value("x", [4, 256])], [graphs.value("y", [4, 512])], [weight("W", [256, 512])])
    t = train(model, optimizer="sgd").training
    assert t is not None
    assert t.saved_activation_bytes == 2 * 8192 + 8192  # h, s and the log-softmax of y
    assert [(r.node, r.tensor, r.saved_bytes) for r in t.recompute] == [("sigmoid", "s", 8192)]
    assert t.recompute_peak_bytes <= t.peak_bytes


def test_mixed_precision_keeps_16_bit_copies_and_fp32_master_state() -> None:
    # amp-fp16: MatMul runs on a 16-bit copy of x (4x256x2 = 2048 bytes, kept for backward) and of W (cached:
    # 256x128x2); its output is 16-bit (4x128x2). On CUDA F.cross_entropy's log_softmax runs at the logits' width
    # (1024 bytes kept) and nll_loss keeps an fp32 copy of the log-probabilities (2048; the H100 rows' loss phase);
    # on CPU autocast runs the whole loss in fp32 (LogSoftmax keeps 2048). Weights, gradients and AdamW states stay
    # fp32.
    model = graphs.model(
        [oh.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        [graphs.value("x", [4, 256])], [graphs.value("y", [4, 128])], [weight("W", [256, 128])])
    amp = train(model, optimizer="adamw", precision="amp-fp16").training
    assert amp is not None
    assert amp.weights_bytes == 256 * 128 * 4
    assert amp.gradient_bytes == 256 * 128 * 4
    assert amp.optimizer_state_bytes == 2 * 256 * 128 * 4 + 4
    assert amp.saved_activation_bytes == 4 * 256 * 2 + 4 * 128 * 2 + 4 * 128 * 4
    cpu = train(model, optimizer="adamw", precision="amp-fp16", device="cpu").training
    assert cpu is not None and cpu.saved_activation_bytes == 4 * 256 * 2 + 4 * 128 * 4
    assert any(r.category == "low-precision weight copies" for r in amp.live_at_peak) or amp.peak_phase == "optimizer"
    # Pure bf16: everything in 2 bytes, states too.
    bf16 = train(model, optimizer="adamw", precision="bf16").training
    assert bf16 is not None
    assert bf16.weights_bytes == bf16.gradient_bytes == 256 * 128 * 2
    assert bf16.optimizer_state_bytes == 2 * 256 * 128 * 2 + 4
    assert bf16.input_bytes == 4 * 256 * 2


def test_dropout_mask_makes_a_training_mode_export() -> None:
    # h = x @ W (8192 bytes); d = Dropout(h): keeps a 1-byte mask per element on CUDA (2048), the output's
    # dtype on CPU (aten::dropout keeps a float noise tensor: 8192).
    model = graphs.model(
        [oh.make_node("MatMul", ["x", "W"], ["h"], name="mm"), oh.make_node("Dropout", ["h"], ["d"], name="drop"),
         oh.make_node("Relu", ["d"], ["y"], name="relu")],
        [graphs.value("x", [4, 256])], [graphs.value("y", [4, 512])], [weight("W", [256, 512])])
    cuda = train(model, optimizer="sgd").training
    cpu = train(model, optimizer="sgd", device="cpu").training
    assert cuda is not None and cpu is not None
    assert cuda.export_mode == "training"
    assert any("training-mode export" in a for a in cuda.assumptions)
    relu_output, log_softmax = 8192, 8192
    assert cuda.saved_activation_bytes == 2048 + relu_output + log_softmax
    assert cpu.saved_activation_bytes == 8192 + relu_output + log_softmax


def test_unknown_operator_keeps_everything_and_is_named() -> None:
    model = graphs.model(
        [oh.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
         oh.make_node("Hardmax", ["h"], ["y"], name="mystery")],
        [graphs.value("x", [4, 256])], [graphs.value("y", [4, 512])], [weight("W", [256, 512])])
    report = train(model, optimizer="sgd")
    t = report.training
    assert t is not None
    assert t.unknown_backward_ops == ("Hardmax",)
    assert any(w.code == "unknown-backward" and "Hardmax" in w.message for w in report.warnings)
    # The default keeps its input h and output y (8192 each) besides the log-softmax.
    assert t.saved_activation_bytes == 3 * 8192


def test_gradient_accumulation_runs_at_the_micro_batch_with_gradients_live() -> None:
    # batch 8 in 2 micro-steps: activations of batch 4; from the second micro-step on, gradients (131584)
    # are live through forward.
    single = train(linear("batch"), {"batch": 4}, optimizer="sgd").training
    accum = train(linear("batch"), {"batch": 8}, optimizer="sgd", grad_accum=2).training
    assert single is not None and accum is not None
    assert accum.saved_activation_bytes == single.saved_activation_bytes
    forward = {p.phase: p for p in accum.first_step.phases}["forward"]
    single_forward = {p.phase: p for p in single.first_step.phases}["forward"]
    assert forward.end_bytes == single_forward.end_bytes + (W + B)
    with pytest.raises(TrainingOptionError):
        train(linear("batch"), {"batch": 9}, optimizer="sgd", grad_accum=2)


def test_checkpointing_keeps_only_segment_inputs() -> None:
    # A chain of 8 MatMul + Relu pairs, each [4, 512]: without checkpointing every Relu output is kept
    # (8 x 8192 bytes, and the last feeds the loss); with 4 segments, the first 3 keep only their inputs.
    nodes, inits, previous = [], [], "x"
    for i in range(8):
        inits.append(weight(f"W{i}", [512, 512]))
        nodes += [oh.make_node("MatMul", [previous, f"W{i}"], [f"h{i}"], name=f"/l{i}/mm"),
                  oh.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"/l{i}/relu")]
        previous = f"r{i}"
    model = graphs.model(nodes, [graphs.value("x", [4, 512])], [graphs.value("r7", [4, 512])], inits)
    plain = train(model, optimizer="sgd").training
    ckpt = train(model, optimizer="sgd", checkpoint=4).training
    assert plain is not None and ckpt is not None and ckpt.checkpoint is not None
    assert plain.saved_activation_bytes == 8 * 8192 + 8192
    c = ckpt.checkpoint
    assert c.segments == 4
    assert c.saved_activation_bytes < plain.saved_activation_bytes
    assert c.memory_saved_bytes == plain.peak_bytes - c.peak_bytes
    assert 0 < c.extra_forward_flops < c.forward_flops
    auto = train(model, optimizer="sgd", checkpoint="auto").training
    assert auto is not None and auto.checkpoint is not None and auto.checkpoint.segments == 4  # sqrt(16 ops)


def test_bad_training_options_are_user_errors() -> None:
    for options in ({"optimizer": "adamax2"}, {"precision": "fp8"}, {"checkpoint": 0}, {"grad_accum": 0}):
        with pytest.raises(onnxmem.OnnxMemError):
            train(linear(), **options)


def test_cli_training_json_has_the_documented_keys(tmp_path: object) -> None:
    path = f"{tmp_path}/linear.onnx"
    onnx.save(linear("batch"), path)
    result = CliRunner().invoke(main, ["report", path, "--dim", "batch=8", "--training", "--optimizer", "adamw",
                                       "--format", "json", "--checkpoint", "auto"])
    assert result.exit_code == 0, result.output
    training = json.loads(result.output)["training"]
    for key in ("weights_bytes", "gradient_bytes", "optimizer_state_bytes", "saved_activation_bytes",
                "peak_bytes", "peak_phase"):
        assert isinstance(training[key], (int, str))
    assert training["peak_phase"] in ("forward", "loss", "backward", "optimizer")
    table = CliRunner().invoke(main, ["report", path, "--dim", "batch=8", "--training", "--freeze", "W"])
    assert table.exit_code == 0 and "Training memory" in table.output
    bad = CliRunner().invoke(main, ["report", path, "--dim", "batch=8", "--training", "--checkpoint", "many"])
    assert bad.exit_code == 2 and "checkpoint" in bad.output


def test_without_training_the_report_has_none() -> None:
    report = onnxmem.analyze(linear())
    assert report.training is None
    assert report.to_dict()["training"] is None


def scalar(name: str, value: float) -> onnx.TensorProto:
    return oh.make_tensor(name, TensorProto.FLOAT, [], [value])


def erf_gelu_mlp() -> onnx.ModelProto:
    """h = x [4,256] @ W1 [256,512]; g = GELU(h) as the TorchScript exporter writes it (Div, Erf, Add, Mul, Mul);
    y = g @ W2 [512,128]."""
    return graphs.model(
        [oh.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
         oh.make_node("Div", ["h", "sqrt2"], ["d"], name="Div"),
         oh.make_node("Erf", ["d"], ["e"], name="Erf"),
         oh.make_node("Add", ["e", "one"], ["a"], name="Add"),
         oh.make_node("Mul", ["h", "a"], ["m"], name="Mul"),
         oh.make_node("Mul", ["m", "half"], ["g"], name="Mul_1"),
         oh.make_node("MatMul", ["g", "W2"], ["y"], name="fc2")],
        [graphs.value("x", [4, 256])], [graphs.value("y", [4, 128])],
        [weight("W1", [256, 512]), weight("W2", [512, 128]), scalar("sqrt2", 2 ** 0.5), scalar("one", 1.0),
         scalar("half", 0.5)])


def test_erf_gelu_chain_keeps_only_its_input_like_aten_gelu() -> None:
    # aten::gelu keeps its input h (4 x 512 x 4 = 8192); fc2 keeps g (8192); the loss's log-softmax 4 x 128 x 4
    # = 2048. The chain's own nodes would keep d (Erf), h and a (Mul): 3 x 8192 more.
    t = train(erf_gelu_mlp(), optimizer="sgd", device="cpu").training
    assert t is not None
    assert t.saved_activation_bytes == 8192 + 8192 + 2048
    assert dict(t.saved_by_op_type)["aten::gelu"] == 8192
    assert "Erf" not in dict(t.saved_by_op_type)


def test_mse_loss_keeps_its_target_and_an_output_sized_loss() -> None:
    # Linear: y [4,128] = 2048 bytes. mse_loss keeps y and its target (2048) until its backward, and its 0-dim
    # loss lives in the unreduced buffer (2048), held to the end of the step. Peak in Gemm's backward: y 2048 +
    # loss 2048 + grad y 2048 + grad W and b 131584 (the target is freed by the loss's backward).
    t = train(linear(), optimizer="sgd", device="cpu", loss="mse").training
    assert t is not None
    assert t.saved_activation_bytes == Y + Y
    # and the autograd graph: Gemm's and the loss's nodes, W's and b's accumulators
    assert t.peak_bytes == (W + B) + X + Y + Y + Y + (W + B) + 4 * NODE + LINEAR_MKL


def lstm(steps: int = 16, batch: int = 8, features: int = 32, hidden: int = 64) -> onnx.ModelProto:
    """One LSTM layer: X [T,B,I], W [1,4H,I], R [1,4H,H], B [1,8H], initial states [1,B,H] as inputs."""
    return graphs.model(
        [oh.make_node("LSTM", ["X", "W", "R", "B", "", "h0", "c0"], ["Y", "Y_h", "Y_c"], name="lstm",
                      hidden_size=hidden)],
        [graphs.value("X", [steps, batch, features]), graphs.value("h0", [1, batch, hidden]),
         graphs.value("c0", [1, batch, hidden])],
        [graphs.value("Y", [steps, 1, batch, hidden]), graphs.value("Y_h", [1, batch, hidden]),
         graphs.value("Y_c", [1, batch, hidden])],
        [weight("W", [1, 4 * hidden, features]), weight("R", [1, 4 * hidden, hidden]),
         weight("B", [1, 8 * hidden])])


def test_lstm_on_cpu_keeps_onednn_workspace() -> None:
    # T 16, B 8, I 32, H 64. Leading dims: gates ld(256) = 272 (a multiple of 256 gets 16 more), states
    # ld(max(32, 64)) = 64, state gradients ld(64) = 64. Workspace: 4 x B x (T x 272 + 6 x 17 x 64 + (5 x 17 - 1)
    # x 64) = 32 x (4352 + 6528 + 5376) = 520,192 bytes (what aten::mkldnn_rnn_layer saves in PyTorch 2.13).
    # Kept besides: Y 16 x 8 x 64 x 4 = 32768, Y_h and Y_c 2048 each (X and the initial states are inputs).
    t = train(lstm(), optimizer="sgd", device="cpu", loss="mse").training
    assert t is not None
    assert dict(t.saved_by_op_type)["LSTM"] == 520192 + 32768 + 2048 + 2048
    assert not t.unknown_backward_ops


def conv_1x1(channels_out: int) -> onnx.ModelProto:
    """y = Conv(x [2,8,16,16], w [C,8,1,1]): a 1x1 convolution to C channels; x needs no gradient."""
    return graphs.model(
        [oh.make_node("Conv", ["x", "w"], ["y"], name="conv")],
        [graphs.value("x", [2, 8, 16, 16])], [graphs.value("y", [2, channels_out, 16, 16])],
        [weight("w", [channels_out, 8, 1, 1])])


@pytest.mark.parametrize("isa", sorted(CPU_ISAS))
def test_cpu_conv_backward_reorders_gradients_with_channels_padded_to_the_block(isa: str) -> None:
    # On 2 threads oneDNN runs the 1x1 convolution (on one thread at batch 2, ATen's slow_conv2d: no scratch).
    # Its weight gradient reorders x and grad y and makes grad w in the blocked layout, channels padded to
    # CPU_CHANNEL_BLOCK (8 on AVX2, 16 on AVX-512), then returns the dense grad w.
    # Peak in Conv's backward (mse): y + loss (output-sized) + grad y + grad w + the blocked tensors, and the
    # autograd graph (Conv's and the loss's nodes, w's accumulator).
    block = CPU_ISAS[isa].channel_block

    def pad(channels: int) -> int:
        return -(-channels // block) * block

    x = 2 * 8 * 16 * 16 * 4
    for out in (1, 16):
        y, w = 2 * out * 16 * 16 * 4, out * 8 * 4
        blocked = x * pad(8) // 8 + y * pad(out) // out + 4 * pad(out) * pad(8)
        t = train(conv_1x1(out), optimizer="sgd", device=TorchCpu(threads=2, isa=isa), loss="mse").training
        assert t is not None
        # and oneDNN's cached primitives, made by then: the 1x1 forward and weight-gradient kernels and five
        # reorders (x to blocked, w for the forward, y from blocked, grad y to blocked, grad w from blocked)
        made = CPU_ISAS[isa].primitives
        primitives = made.forward_one_by_one + made.backward_weights_one_by_one + 5 * made.reorder
        assert t.peak_bytes == x + w + 3 * y + blocked + 3 * NODE + primitives
        # one thread: no scratch; the peak is mse's backward: y, the target it keeps, its output-sized unreduced
        # loss, the loss gradient (4) and grad y; slow_conv2d's forward GEMM (out x 256 positions over 8 channels,
        # one sample at a time: MKL's K block 128) made an MKL block, none for one output channel (a
        # matrix-vector product)
        one = train(conv_1x1(out), optimizer="sgd", device=TorchCpu(isa=isa), loss="mse").training
        assert one is not None
        mkl = G.first_use + G.block + 4 * 128 * (256 + 2 * out) if out > 1 else 0
        assert one.peak_bytes == x + w + 4 * y + 4 + 3 * NODE + mkl
        assert one.peak_event.startswith("backward of MeanSquaredError")


def _attention(marked: bool, *, dropout: bool = False, shared_constant: bool = False) -> onnx.ModelProto:
    """q, k, v [2, 4, 64, 16] -> softmax(q k^T * s) v, as the dynamo exporter writes F.scaled_dot_product_attention:
    every node carries the fx node it came from (marked) or nothing (an attention written out by hand); with a
    Dropout of the probabilities, or with the scale made by a Constant node that a node after the op reads too
    (the exporter shares constants between ops)."""
    b, h, n, e = 2, 4, 64, 16
    fx = ("%sdpa : [num_users=1] = call_function[target=torch.ops.aten.scaled_dot_product_attention.default]"
          "(args = (%q, %k, %v), kwargs = {})")
    scale = "scale_c" if shared_constant else "scale"
    nodes = [*([oh.make_node("Constant", [], ["scale_c"], name="scale_c", value=oh.make_tensor(
                 "s", TensorProto.FLOAT, [], [0.25]))] if shared_constant else []),
             oh.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
             oh.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
             oh.make_node("Mul", ["scores", scale], ["scaled"], name="scale"),
             oh.make_node("Softmax", ["scaled"], ["probs"] if not dropout else ["p0"], name="softmax", axis=-1),
             *([oh.make_node("Dropout", ["p0", "ratio", "on"], ["probs"], name="drop")] if dropout else []),
             oh.make_node("MatMul", ["probs", "v"], ["out0" if shared_constant else "out"], name="sdpa")]
    if marked:
        for node in nodes:
            entry = node.metadata_props.add()
            entry.key, entry.value = "pkg.torch.onnx.fx_node", fx
    # q, k, v are projections of x by weights, so that they need gradients
    proj = [oh.make_node("MatMul", ["x", f"w{name}"], [f"{name}0"], name=f"proj_{name}") for name in "qkv"]
    heads = [oh.make_node("Reshape", [f"{name}0", "heads"], [name], name=f"heads_{name}") for name in "qkv"]
    weights = [oh.make_tensor(f"w{name}", TensorProto.FLOAT, [h * e, h * e], [0.0] * (h * e) ** 2) for name in "qkv"]
    after = [oh.make_node("Mul", ["out0", "scale_c"], ["out"], name="after")] if shared_constant else []
    graph = oh.make_graph(
        [*proj, *heads, *nodes, *after], "attention",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [b, n, h * e])],
        [oh.make_tensor_value_info("out", TensorProto.FLOAT, [b, h, n, e])],
        initializer=[*weights, oh.make_tensor("scale", TensorProto.FLOAT, [], [0.25]),
                     oh.make_tensor("heads", TensorProto.INT64, [4], [b, h, n, e]),
                     oh.make_tensor("ratio", TensorProto.FLOAT, [], [0.1]),
                     oh.make_tensor("on", TensorProto.BOOL, [], [True])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_scaled_dot_product_attention_keeps_no_probabilities() -> None:
    # Marked as one aten::scaled_dot_product_attention, the nodes are simulated as PyTorch's CPU flash
    # attention: q, k, v, the output and one log-sum-exp per query row are kept, not the softmax probabilities.
    options = TrainingOptions(optimizer="sgd", loss="none")
    fused = onnxmem.analyze(_attention(True), training=options).training
    by_hand = onnxmem.analyze(_attention(False), training=options).training
    assert fused is not None and by_hand is not None
    probabilities = 2 * 4 * 64 * 64 * 4
    rows = 2 * 4 * 64 * 4  # log-sum-exp, float32
    saved = dict(fused.saved_by_op_type)
    assert saved["aten::scaled_dot_product_attention"] == 4 * (2 * 4 * 64 * 16 * 4) + rows  # q, k, v, output
    assert "Softmax" not in saved
    assert dict(by_hand.saved_by_op_type)["Softmax"] == probabilities


def test_attention_sharing_a_constant_with_a_later_op_is_still_one_op() -> None:
    # The scale's Constant node is marked as part of the sdpa but read after it too: the op is still fused (its
    # probabilities are not kept), the Constant's node stays outside it.
    training = onnxmem.analyze(_attention(True, shared_constant=True),
                               training=TrainingOptions(optimizer="sgd", loss="none")).training
    assert training is not None
    saved = dict(training.saved_by_op_type)
    assert "aten::scaled_dot_product_attention" in saved and "Softmax" not in saved


def test_attention_with_dropout_runs_the_math_path() -> None:
    # With a Dropout among its nodes the sdpa is PyTorch's math path (_scaled_dot_product_attention_math), measured
    # with saved-tensor hooks on torch 2.13 CPU: q * scale and k^T * scale (new, q- and k-sized), v (a copy: here v
    # is a view, made by Reshape from its projection) and three [2, 4, 64, 64] tensors (the probabilities, the
    # dropout's float noise on CPU, the dropped probabilities).
    training = onnxmem.analyze(_attention(True, dropout=True),
                               training=TrainingOptions(optimizer="sgd", loss="none", device="cpu")).training
    assert training is not None
    operand, probabilities = 2 * 4 * 64 * 16 * 4, 2 * 4 * 64 * 64 * 4
    assert dict(training.saved_by_op_type)["aten::scaled_dot_product_attention(dropout)"] == \
        3 * operand + 3 * probabilities
    # under bf16 autocast on CPU the math path computes in fp32 from its 16-bit q, k, v: the same fp32 bytes
    amp = onnxmem.analyze(_attention(True, dropout=True), training=TrainingOptions(
        optimizer="sgd", loss="none", device="cpu", precision="amp-bf16")).training
    assert amp is not None
    assert dict(amp.saved_by_op_type)["aten::scaled_dot_product_attention(dropout)"] == \
        3 * operand + 3 * probabilities


def test_a_graph_that_does_not_say_its_mode_is_warned() -> None:
    # Without Dropout or BatchNorm, an eval-mode export (which removes Dropout) and a model without Dropout look the
    # same: the report says so with a warning; a Dropout node makes it a training-mode export, not warned.
    plain = train(linear(), optimizer="sgd")
    assert "export-mode-unknown" in {w.code for w in plain.warnings}
    dropped = graphs.model(
        [oh.make_node("MatMul", ["x", "W"], ["h"], name="mm"), oh.make_node("Dropout", ["h"], ["y"], name="drop")],
        [graphs.value("x", [4, 256])], [graphs.value("y", [4, 512])], [weight("W", [256, 512])])
    assert "export-mode-unknown" not in {w.code for w in train(dropped, optimizer="sgd").warnings}


def test_gru_on_cpu_keeps_the_unrolled_cells_values() -> None:
    # PyTorch runs a CPU GRU as a loop of cells: 7 new values per step, batch row and hidden unit are kept for
    # backward (measured with saved-tensor hooks), besides the layer's input.
    steps, batch, features, hidden = 16, 8, 24, 64
    w = oh.make_tensor("W", TensorProto.FLOAT, [1, 3 * hidden, features], [0.0] * (3 * hidden * features))
    r = oh.make_tensor("R", TensorProto.FLOAT, [1, 3 * hidden, hidden], [0.0] * (3 * hidden * hidden))
    graph = oh.make_graph(
        [oh.make_node("Add", ["x", "x"], ["a"], name="a"),
         oh.make_node("GRU", ["a", "W", "R"], ["y", "h"], name="gru", hidden_size=hidden, linear_before_reset=1),
         oh.make_node("ReduceSum", ["y"], ["loss"], name="loss", keepdims=0)], "gru",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [steps, batch, features])],
        [oh.make_tensor_value_info("loss", TensorProto.FLOAT, [])], initializer=[w, r])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    training = onnxmem.analyze(model, training=TrainingOptions(optimizer="sgd", loss="none", device="cpu")).training
    assert training is not None and "GRU" not in training.unknown_backward_ops
    cells = 7 * 4 * steps * batch * hidden
    assert dict(training.saved_by_op_type)["GRU"] == cells + 4 * steps * batch * features  # + its input a
