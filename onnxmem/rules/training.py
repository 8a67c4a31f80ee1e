"""Training rules as data: what each operator keeps for backward, how its gradients are made, optimizer states.

SAVED_FOR_BACKWARD mirrors what PyTorch's autograd saves (tools/autograd/derivatives.yaml) for the ATen op that
an ONNX operator comes from. One line per operator; an operator missing here gets DEFAULT_SAVES (keep every float
input and output, every gradient a new buffer) and is named in the report's warnings.

Operators of other domains are keyed 'domain::OpType', as in rules/inference.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Saves:
    """What one operator keeps from forward to backward, and which input gradients cost no new buffer."""

    inputs: tuple[int, ...] = ()  # inputs kept whenever the op has a backward
    outputs: tuple[int, ...] = ()  # outputs kept
    # inputs kept only when another input needs a gradient: each operand of a product is needed for the
    # other's gradient (mm saves mat1 only to compute grad of mat2, and the other way round)
    cross: tuple[int, ...] = ()
    # bits per element of output 0 kept besides the tensors above (Dropout's bool mask: 8; MaxPool's int64
    # indices: 64), unless the op's own output `extra_output` carries it in the graph
    extra_bits_per_output_element: int = 0
    extra_output: int | None = None
    extra_like_output_on_cpu: bool = False  # on CPU the extra has output 0's dtype (aten::dropout's float noise)
    # fp32 statistics kept per normalised row or channel: 2 (mean and inverse std) for the norms
    stats: str = ""  # "" | "rows" (LayerNorm: one per row over the normalised axes) | "channels" (BatchNorm)
    stats_values: int = 0
    # inputs whose gradient is the output's gradient itself (a view or the same tensor: Add, Reshape, ...),
    # when the input has the output's shape; any other input gradient is a new buffer
    grad_passthrough: tuple[int, ...] = ()
    # output-sized temporaries in backward when no operand is a weight (batched matmul: bmm's gradient is
    # made contiguous for the reshape it came through)
    batched_backward_temporaries: int = 0
    # on CPU, temporaries while backward runs, in output-sized and input-sized (when input 0 needs a gradient)
    # buffers: oneDNN's convolution backward reorders the output gradient and computes the input's in a scratch
    cpu_backward_temporaries: tuple[int, int] = (0, 0)
    # those CPU temporaries are in oneDNN's blocked layout: channels (axis 1) padded to CPU_CHANNEL_BLOCK
    cpu_blocked_channels: bool = False
    # tensors of input 0's size kept besides (mse_loss keeps its target, as large as the model's output)
    input_sized_extra: int = 0
    # a recurrent op: a key of RECURRENT (what PyTorch's kernel keeps besides its outputs, its backward scratch)
    recurrent: str = ""


NOTHING = Saves()
UNARY_INPUT = Saves(inputs=(0,))
UNARY_OUTPUT = Saves(outputs=(0,))
VIEW = Saves(grad_passthrough=(0,))
PRODUCT = Saves(cross=(0, 1))

SAVED_FOR_BACKWARD: dict[str, Saves] = {
    # products: each operand for the other's gradient (a weight operand costs nothing: it is a parameter)
    "MatMul": Saves(cross=(0, 1), batched_backward_temporaries=1),
    "Gemm": PRODUCT,
    "Einsum": Saves(cross=(0, 1, 2)),
    "Mul": PRODUCT,
    "Div": Saves(inputs=(1,), cross=(0,)),
    "Conv": Saves(inputs=(0, 1), cpu_backward_temporaries=(1, 1), cpu_blocked_channels=True),
    "ConvTranspose": Saves(inputs=(0, 1), cpu_backward_temporaries=(1, 1), cpu_blocked_channels=True),
    # sums, layout and views: nothing but sizes
    "Add": Saves(grad_passthrough=(0, 1)),
    "Sub": Saves(grad_passthrough=(0,)),
    "Neg": NOTHING,
    "Sum": Saves(grad_passthrough=(0, 1, 2, 3)),
    "Reshape": VIEW,
    "Flatten": VIEW,
    "Squeeze": VIEW,
    "Unsqueeze": VIEW,
    "Identity": VIEW,
    "Transpose": VIEW,
    "Concat": Saves(grad_passthrough=tuple(range(8))),  # input gradients are slices of the output's
    "Split": NOTHING,
    "SplitToSequence": NOTHING,  # torch.split exported without the optimizer: a sequence of views
    "SequenceAt": VIEW,
    "SequenceConstruct": NOTHING,
    "ConcatFromSequence": NOTHING,
    "Slice": NOTHING,
    "Expand": NOTHING,
    "Tile": NOTHING,
    "Pad": NOTHING,
    "Resize": NOTHING,
    "Cast": NOTHING,
    "CastLike": NOTHING,  # a cast to the dtype of input 1 (its values are not read)
    "ReduceSum": NOTHING,
    "ReduceMean": NOTHING,
    "GlobalAveragePool": NOTHING,  # adaptive_avg_pool2d to 1x1 is a mean in PyTorch
    "CumSum": NOTHING,
    "Trilu": NOTHING,
    # activations that keep their output
    "Relu": UNARY_OUTPUT,
    "Sigmoid": UNARY_OUTPUT,
    "Tanh": UNARY_OUTPUT,
    "Exp": UNARY_OUTPUT,
    "Sqrt": UNARY_OUTPUT,
    "Reciprocal": UNARY_OUTPUT,
    "Elu": UNARY_OUTPUT,
    "Softmax": UNARY_OUTPUT,
    "LogSoftmax": UNARY_OUTPUT,
    # activations that keep their input
    "Gelu": UNARY_INPUT,
    "com.microsoft::Gelu": UNARY_INPUT,
    "com.microsoft::FastGelu": UNARY_INPUT,
    "LeakyRelu": UNARY_INPUT,
    "HardSigmoid": UNARY_INPUT,
    "HardSwish": UNARY_INPUT,
    "Softplus": UNARY_INPUT,
    "Mish": UNARY_INPUT,
    "Erf": UNARY_INPUT,
    "Log": UNARY_INPUT,
    "Sin": UNARY_INPUT,
    "Cos": UNARY_INPUT,
    "Abs": UNARY_INPUT,
    "Clip": UNARY_INPUT,
    "Pow": UNARY_INPUT,
    "Max": Saves(inputs=(0, 1)),
    "Min": Saves(inputs=(0, 1)),
    "ReduceMax": Saves(inputs=(0,), outputs=(0,)),
    "ReduceMin": Saves(inputs=(0,), outputs=(0,)),
    "Where": Saves(inputs=(0,)),
    "Gather": Saves(inputs=(1,)),
    "GatherElements": Saves(inputs=(1,)),
    "ScatterND": Saves(inputs=(1,)),
    "AveragePool": UNARY_INPUT,
    # keep a mask or indices besides (or instead of) tensors
    "Dropout": Saves(extra_bits_per_output_element=8, extra_output=1, extra_like_output_on_cpu=True),
    "MaxPool": Saves(inputs=(0,), extra_bits_per_output_element=64, extra_output=1),
    "GlobalMaxPool": Saves(inputs=(0,), extra_bits_per_output_element=64),
    # norms: input and weight, and fp32 mean and inverse std per row or channel
    "LayerNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=2),
    "com.microsoft::SimplifiedLayerNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=1),
    "RMSNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=1),
    "BatchNormalization": Saves(inputs=(0, 1), stats="channels", stats_values=2),
    "InstanceNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=2),
    "GroupNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=2),
    # the loss, appended after the model's output (see LOSSES)
    "NegativeLogLikelihoodLoss": UNARY_INPUT,
    "MeanSquaredError": Saves(inputs=(0,), input_sized_extra=1),  # mse_loss(input, target) keeps both
    # recurrent: aten::mkldnn_rnn_layer (CPU) keeps its input, initial states, outputs and a workspace
    "LSTM": Saves(inputs=(0, 5, 6), outputs=(0, 1, 2), recurrent="LSTM"),
    "GRU": Saves(inputs=(0, 5), recurrent="GRU"),  # the cells keep the layer's input; the rest is in RECURRENT
    # F.scaled_dot_product_attention on CPU runs flash attention: it keeps q, k, v, its output and one
    # log-sum-exp per query row, never the [batch, heads, q_len, kv_len] probabilities (see ATEN_AS)
    "ScaledDotProductAttention": Saves(inputs=(0, 1, 2), outputs=(0,), stats="rows", stats_values=1),
}

# oneDNN's blocked layout (nChw16c on AVX-512 CPUs; 8 on AVX2-only ones) pads channels to this multiple.
CPU_CHANNEL_BLOCK = 16


@dataclass(frozen=True)
class Recurrent:
    """What a recurrent op keeps for backward besides its tensors, per direction, from its shapes (T steps,
    B batch, I input and H hidden features; ld(n) is oneDNN's leading dimension: n rounded up to 16 floats, plus
    16 more when that is a multiple of 256).

    CPU (oneDNN's RNN primitive, one call per layer): a workspace of fp32 rows of B x ld floats: T rows of gates
    (ld(gates x H)), state_rows x (T + 1) rows of states (ld(max(I, H))) and diff_rows x (T + 1) - 1 rows of
    state gradients (ld(H)). Its backward holds the weights reordered (I + H rows of ld(gates x H)) and the
    gates' scratch (T x B rows of ld(gates x H)) and four B x H state gradients for a moment.
    CUDA (cuDNN's reserve space): about cuda_values values per step, batch row and hidden unit.
    CPU without oneDNN (cpu_unrolled > 0): PyTorch runs the op as a loop of cells whose autograd keeps
    cpu_unrolled values per step, batch row and hidden unit (new tensors; the cell's inputs are views).
    """

    gates: int
    state_rows: int
    diff_rows: int
    cuda_values: int
    cpu_unrolled: int = 0


RECURRENT: dict[str, Recurrent] = {
    # oneDNN LSTM: states of the layer, iteration and cell (2 layers of T + 1 steps each); the gradients of
    # the layer and iteration states and of the cell; cuDNN: 4 gates, the cell and hidden states per step
    "LSTM": Recurrent(gates=4, state_rows=6, diff_rows=5, cuda_values=6),
    # PyTorch 2.13 runs GRU on CPU as an unrolled cell (aten::gru, no oneDNN): measured with saved-tensor hooks,
    # 7 new values per step, batch row and hidden unit (the gates, the reset product, the new state); cuDNN's
    # reserve space for GRU is not measured: cuda_values as LSTM's
    "GRU": Recurrent(gates=3, state_rows=0, diff_rows=0, cuda_values=6, cpu_unrolled=7),
}

# Operators the TorchScript exporter writes as a chain of elementwise nodes although PyTorch runs (and saves for)
# one op: the chain is simulated as that op. Node i of `chain` reads node i - 1's output (node 0 reads the
# op's input x); the nodes in `reads_input` also read x; every other input is a scalar constant; the
# intermediates have no other reader.
@dataclass(frozen=True)
class Decomposed:
    """One ATen op exported as a chain of ONNX nodes."""

    op_type: str  # the op it stands for, a key of SAVED_FOR_BACKWARD
    chain: tuple[str, ...]
    reads_input: tuple[int, ...] = ()


DECOMPOSED: tuple[Decomposed, ...] = (
    # F.gelu (erf): x * 0.5 * (1 + erf(x / sqrt(2))) exported as Div, Erf, Add, Mul(x, .), Mul(., 0.5);
    # aten::gelu keeps only x
    Decomposed("Gelu", ("Div", "Erf", "Add", "Mul", "Mul"), reads_input=(0, 3)),
    Decomposed("Gelu", ("Mul", "Erf", "Add", "Mul", "Mul"), reads_input=(0, 3)),  # x * (1 / sqrt(2))
)

# ATen ops that the dynamo exporter decomposes into several ONNX nodes, all marked with the op's fx node
# (pkg.torch.onnx.fx_node): the nodes are simulated as the one op PyTorch runs, a key of SAVED_FOR_BACKWARD.
# Its inputs are the fx node's tensor arguments, in order.
ATEN_AS: dict[str, str] = {
    "torch.ops.aten.scaled_dot_product_attention.default": "ScaledDotProductAttention",
    "torch.ops.aten.gelu.default": "Gelu",
}

# An operator missing from the table: keep every float input and output; every gradient a new buffer.
DEFAULT_SAVES = Saves(inputs=tuple(range(16)), outputs=tuple(range(8)))

# Operators whose outputs never carry a gradient (integer-valued, comparisons, shapes); integer outputs of any
# operator carry none either.
NOT_DIFFERENTIABLE: frozenset[str] = frozenset({
    "Shape", "Size", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor",
    "ArgMax", "ArgMin", "NonZero", "Floor", "Ceil", "Round", "Sign", "IsNaN", "IsInf", "Range",
    "ConstantOfShape", "EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
    "Bernoulli", "Multinomial", "OneHot", "TopK",
})

# Views in PyTorch: the output shares the storage of input N (a saved view keeps the whole base alive).
# Transpose, Split and Slice are views in PyTorch, unlike in onnxruntime.
TRAINING_VIEWS: dict[str, int] = {
    "Reshape": 0, "Flatten": 0, "Squeeze": 0, "Unsqueeze": 0, "Identity": 0, "Transpose": 0,
    "Split": 0, "Slice": 0, "Expand": 0, "SplitToSequence": 0, "SequenceAt": 0,
}

# Cheap elementwise operators whose output autograd could recompute from their input in backward instead of
# keeping it: the recompute what-if names those whose input is kept anyway (Swish written as x * sigmoid(x)).
CHEAP_TO_RECOMPUTE: frozenset[str] = frozenset({
    "Sigmoid", "Tanh", "Relu", "Gelu", "Exp", "Erf", "Softplus", "LeakyRelu", "HardSigmoid", "HardSwish",
    "Elu", "Mish", "Neg", "Abs", "Sqrt", "Reciprocal", "Sin", "Cos", "Mul", "Add", "Sub", "Div", "Cast",
})

# Mixed precision (torch.autocast): ops that run in the low precision (their float inputs are cast, weights
# once per step into autocast's cache) and ops that run in fp32; the rest follow their inputs.
AUTOCAST_LOW_PRECISION: frozenset[str] = frozenset({
    "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "com.microsoft::Attention", "Attention",
})
AUTOCAST_FP32: frozenset[str] = frozenset({
    "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization", "Exp", "Log", "Pow", "ReduceSum",
    "ReduceProd", "CumSum", "Reciprocal", "Softplus", "NegativeLogLikelihoodLoss", "MeanSquaredError",
})


@dataclass(frozen=True)
class LossStep:
    """One operator of the loss appended after the model's output: input 0 is the previous value."""

    op_type: str
    output: str  # "same": an output-sized tensor (or storage); "scalar": one value


# What the loss adds after the model (PyTorch's F.cross_entropy is log_softmax then nll_loss).
LOSSES: dict[str, tuple[LossStep, ...]] = {
    "cross_entropy": (LossStep("LogSoftmax", "same"), LossStep("NegativeLogLikelihoodLoss", "scalar")),
    # aten::mse_loss reduces into its unreduced buffer: the 0-dim loss keeps an output-sized storage
    "mse": (LossStep("MeanSquaredError", "same"),),
    "none": (),  # the model's output is the loss
}


@dataclass(frozen=True)
class OptimizerRule:
    """What an optimizer keeps per parameter and what its step allocates for a moment."""

    states: int  # full-size state tensors per parameter, in the parameter's dtype
    step_tensor: bool  # a 0-dim fp32 step count per parameter (PyTorch's Adam family)
    # full-size temporaries live at once while one parameter is updated (for-loop, PyTorch on CPU), and over the
    # whole parameter group (foreach, PyTorch's default on CUDA); fused kernels keep none
    transient_for_loop: int
    transient_foreach: int
    states_created_at_once: bool = True  # zeros_like at the start of the first step; False: cloned per parameter
    factored: bool = False  # Adafactor: row and column statistics for matrices, a full one for vectors
    state_bits: int = 0  # 8: bitsandbytes 8-bit states (with one fp32 absmax per block) for large parameters


OPTIMIZERS: dict[str, OptimizerRule] = {
    "sgd": OptimizerRule(states=0, step_tensor=False, transient_for_loop=0, transient_foreach=0),
    # buf = grad.clone() at the first step, then buf.mul_(m).add_(grad) in place
    "sgd-momentum": OptimizerRule(states=1, step_tensor=False, transient_for_loop=0, transient_foreach=0,
                                  states_created_at_once=False),
    # for-loop: denom = (exp_avg_sq.sqrt() / c).add_(eps) holds sqrt and the quotient at once
    "adam": OptimizerRule(states=2, step_tensor=True, transient_for_loop=2, transient_foreach=1),
    "adamw": OptimizerRule(states=2, step_tensor=True, transient_for_loop=2, transient_foreach=1),
    "adagrad": OptimizerRule(states=1, step_tensor=True, transient_for_loop=1, transient_foreach=1),
    "rmsprop": OptimizerRule(states=1, step_tensor=True, transient_for_loop=1, transient_foreach=1),
    # lion (lucidrains/lion-pytorch): update = exp_avg.clone().lerp_(grad, 1 - beta1).sign_()
    "lion": OptimizerRule(states=1, step_tensor=False, transient_for_loop=1, transient_foreach=1),
    # torch.optim.Adafactor: var_estimate = row_var @ col_var is full size
    "adafactor": OptimizerRule(states=0, step_tensor=True, transient_for_loop=1, transient_foreach=1,
                               factored=True),
    # bitsandbytes Adam8bit: two 8-bit states, fused update
    "adam8bit": OptimizerRule(states=2, step_tensor=False, transient_for_loop=0, transient_foreach=0,
                              state_bits=8),
}
OPTIMIZER_ALIASES: dict[str, str] = {
    "momentum": "sgd-momentum", "sgd+momentum": "sgd-momentum", "sgd_momentum": "sgd-momentum",
    "8bit-adam": "adam8bit", "adam-8bit": "adam8bit", "adamw8bit": "adam8bit", "paged-adam8bit": "adam8bit",
}
# bitsandbytes keeps 8-bit states only for parameters of at least this many elements (min_8bit_size), with
# one fp32 absmax per block of this many elements
EIGHT_BIT_MIN_ELEMENTS = 4096
EIGHT_BIT_BLOCK = 256
