"""Training rules as data: what each operator keeps for backward, how its gradients are made, optimizer states.

SAVED_FOR_BACKWARD mirrors what PyTorch's autograd saves (tools/autograd/derivatives.yaml) for the ATen op that
an ONNX operator comes from. One line per operator; an operator missing here gets DEFAULT_SAVES (keep every float
input and output, every gradient a new buffer) and is named in the report's warnings.

Operators of other domains are keyed 'domain::OpType', as in shapes/rules.py. What a device's kernels keep or
allocate besides (a convolution's scratch, a recurrent op's workspace) is in that device's tables
(onnxmem/targets/torch/).
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
    # fp32 statistics kept per normalised row or channel: 2 (mean and inverse std) for the norms
    stats: str = ""  # "" | "rows" (LayerNorm: one per row over the normalised axes) | "channels" (BatchNorm)
    stats_values: int = 0
    # inputs whose gradient is the output's gradient itself (a view or the same tensor: Add, Reshape, ...),
    # when the input has the output's shape; any other input gradient is a new buffer
    grad_passthrough: tuple[int, ...] = ()
    # output-sized temporaries in backward when no operand is a weight (batched matmul: bmm's gradient is
    # made contiguous for the reshape it came through)
    batched_backward_temporaries: int = 0
    # tensors of input 0's size kept besides (mse_loss keeps its target, as large as the model's output)
    input_sized_extra: int = 0
    # "rows" statistics are per row of the axes before this one (LayerNorm: -1; Instance/GroupNorm: 2, an upper
    # bound on group_norm's one per (batch, group))
    stats_axis: int = -1
    # attention computed by PyTorch's math path (sdpa with dropout on CPU): tensors of [..., q_len, kv_len] kept
    # (inputs 0 and 1 are q [..., q_len, E] and k [..., kv_len, E])
    attention_probabilities: int = 0
    # new tensors the size of these inputs that the op makes and keeps (the math path's q * scale, k^T * scale)
    copies: tuple[int, ...] = ()
    # inputs kept as a matmul operand: a new contiguous copy where the input is a view of another storage (at::matmul
    # reshapes a strided [..., L, E] operand to [batch, L, E], which copies it), else the input's own storage
    copies_when_view: tuple[int, ...] = ()
    # bool [..., q_len, kv_len] tensors kept besides (a math attention's dropout mask on CUDA)
    attention_masks: int = 0
    # the copies of inputs 1 and 2 (k and v) have the query's head count: grouped-query key/values repeated to it
    repeated_kv: bool = False
    # a recurrent op's kind: what its kernel keeps besides its outputs and its backward's scratch are the device's
    # (targets/torch/cpu/tables.py CPU_RECURRENT, targets/torch/cuda/tables.py CUDA_RESERVE_VALUES)
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
    "Conv": Saves(inputs=(0, 1)),  # (its CPU kernel's scratch: targets/torch/cpu/tables.py CPU_KERNELS)
    "ConvTranspose": Saves(inputs=(0, 1)),
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
    "Elu": UNARY_INPUT,  # aten::elu keeps its input (measured with saved-tensor hooks)
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
    # torch.norm / linalg_vector_norm (ConvNeXt-V2's GRN): the input and the norm (derivatives.yaml
    # linalg_vector_norm_backward(grad, self, ord, result, ...); saved-tensor hooks on [4,8,8,16] over dims (1, 2)
    # show exactly those two)
    "ReduceL2": Saves(inputs=(0,), outputs=(0,)),
    "Where": Saves(inputs=(0,)),
    "Gather": Saves(inputs=(1,)),
    "GatherElements": Saves(inputs=(1,)),
    # advanced indexing (w[idx], aten.index.Tensor, which the dynamo exporter writes as GatherND) keeps its indices
    # only, not the indexed tensor nor the gathered one (saved-tensor hooks: benchmarks/training_single_ops.py
    # --gathernd); Qwen2-MoE's batched_mm gathers each token's expert weights so
    "GatherND": Saves(inputs=(1,)),
    "ScatterND": Saves(inputs=(1,)),
    "AveragePool": UNARY_INPUT,
    # keep a mask or indices besides (or instead of) tensors
    "Dropout": Saves(extra_bits_per_output_element=8, extra_output=1),  # (a float mask on CPU: CPU_KERNELS)
    "MaxPool": Saves(inputs=(0,), extra_bits_per_output_element=64, extra_output=1),
    "GlobalMaxPool": Saves(inputs=(0,), extra_bits_per_output_element=64),
    # norms: input and weight, and fp32 mean and inverse std per row or channel
    "LayerNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=2),
    "com.microsoft::SimplifiedLayerNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=1),
    "RMSNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=1),
    "BatchNormalization": Saves(inputs=(0, 1), stats="channels", stats_values=2),
    "InstanceNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=2, stats_axis=2),
    "GroupNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=2, stats_axis=2),
    # the loss, appended after the model's output (see LOSSES)
    "NegativeLogLikelihoodLoss": UNARY_INPUT,
    # output.mean() is ReduceMean: nothing kept; its backward expands the gradient into a new output-sized one
    "MeanSquaredError": Saves(inputs=(0,), input_sized_extra=1),  # mse_loss(input, target) keeps both
    # recurrent: aten::mkldnn_rnn_layer (CPU) keeps its input, initial states, outputs and a workspace
    "LSTM": Saves(inputs=(0, 5, 6), outputs=(0, 1, 2), recurrent="LSTM"),
    "GRU": Saves(inputs=(0, 5), recurrent="GRU"),  # the cells keep the layer's input; the rest is the device's
}

# Recurrent ops whose weights the dynamo exporter re-lays out at run time (aten.gru/lstm/rnn to the ONNX op: gate
# order, layers and directions sliced and concatenated from the parameters): PyTorch's kernel reads the parameters
# themselves, so those copies (and their gradients) do not exist in the step. Ops of these types that carry the
# recurrent op's fx node and compute only from parameters are dropped, the recurrent op reading the parameters.
RECURRENT_WEIGHT_RELAYOUT: frozenset[str] = frozenset({
    "Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Transpose", "Split", "Gather", "Identity",
})

# What PyTorch's ATen ops keep for backward, keyed by ATen op (after derivatives.yaml). The dynamo exporter marks
# every node with the ATen op it comes from (pkg.torch.onnx.fx_node); the nodes of an op exported as several are
# simulated as that one op, reported as 'aten::<op>', with this rule; its inputs are the op's tensor arguments,
# in order. Measured on torch 2.13 CPU with torch.autograd.graph.saved_tensors_hooks: which tensors autograd
# packs, and whether each is the op's input, its output or a new tensor.
ATEN_SAVED_FOR_BACKWARD: dict[str, Saves] = {
    # activations that keep only their input (silu is exported as Sigmoid and Mul, whose own rules would keep
    # sigmoid's output too; gelu(tanh) as nine nodes; mish as Softplus, Tanh, Mul)
    "silu": UNARY_INPUT,
    "hardswish": UNARY_INPUT,
    "hardsigmoid": UNARY_INPUT,
    "mish": UNARY_INPUT,
    "gelu": UNARY_INPUT,  # erf and tanh alike
    "softplus": UNARY_INPUT,
    "elu": UNARY_INPUT,
    "leaky_relu": UNARY_INPUT,
    "hardtanh": UNARY_INPUT,  # relu6
    # activations that keep their output
    "log_softmax": UNARY_OUTPUT,
    "_log_softmax": UNARY_OUTPUT,
    "softmax": UNARY_OUTPUT,
    "_softmax": UNARY_OUTPUT,
    # norms: the input, the weight and fp32 statistics (layer_norm: mean and rstd per row; group_norm: per
    # (batch, group), bounded here by one per (batch, channel); batch_norm: per channel)
    "layer_norm": Saves(inputs=(0, 1), stats="rows", stats_values=2),
    "native_layer_norm": Saves(inputs=(0, 1), stats="rows", stats_values=2),
    "group_norm": Saves(inputs=(0, 1), stats="rows", stats_values=2, stats_axis=2),
    "native_group_norm": Saves(inputs=(0, 1), stats="rows", stats_values=2, stats_axis=2),
    "batch_norm": Saves(inputs=(0, 1), stats="channels", stats_values=2),
    "native_batch_norm": Saves(inputs=(0, 1), stats="channels", stats_values=2),
    "_native_batch_norm_legit": Saves(inputs=(0, 1), stats="channels", stats_values=2),
    "_native_batch_norm_legit_functional": Saves(inputs=(0, 1), stats="channels", stats_values=2),
    "_native_batch_norm_legit_no_training": Saves(inputs=(0, 1), stats="channels", stats_values=2),
    # rms_norm (a composite): x, one rstd per row, the weight, and x * rstd (input-sized)
    "rms_norm": Saves(inputs=(0, 1), stats="rows", stats_values=1, input_sized_extra=1),
    # F.scaled_dot_product_attention on CPU runs flash attention: it keeps q, k, v, its output and one
    # log-sum-exp per query row, never the [batch, heads, q_len, kv_len] probabilities (with a mask: the mask too)
    "scaled_dot_product_attention": Saves(inputs=(0, 1, 2, 3), outputs=(0,), stats="rows", stats_values=1),
    # ... unless it drops out (a Dropout node among its nodes, see ATEN_WITH_DROPOUT): then the math path
    # (_scaled_dot_product_attention_math) keeps q * scale and k^T * scale (new), v (copied by matmul's reshape
    # where it is a strided view, as after a head split) and three [..., q_len, kv_len] tensors (the
    # probabilities, the dropout mask, float on CPU, and the dropped probabilities), in fp32 on CPU (measured under
    # autocast to bf16: BmmBackward keeps fp32 tensors)
    "scaled_dot_product_attention(dropout)": Saves(copies=(0, 1), copies_when_view=(2,), attention_probabilities=3),
    # the math path where a device's kernel choice sends it (targets/torch/cuda/attention.py): q * scale, k^T * scale,
    # v and the probabilities (kept by softmax and by the matmul with v: one tensor); with dropout the bool mask
    # and the dropped probabilities besides; grouped-query k and v repeated to the query's heads first (new tensors)
    "scaled_dot_product_attention(math)": Saves(copies=(0, 1), copies_when_view=(2,), attention_probabilities=1),
    "scaled_dot_product_attention(math-dropout)": Saves(copies=(0, 1), copies_when_view=(2,),
                                                        attention_probabilities=2, attention_masks=1),
    "scaled_dot_product_attention(math-gqa)": Saves(copies=(0, 1, 2), attention_probabilities=1, repeated_kv=True),
    # CPU's math path with dropout and k, v repeated or broadcast to the query's heads (targets/torch/cpu/attention.py):
    # as "(dropout)" (its dropout mask float), with k and v copied at the query's heads
    "scaled_dot_product_attention(dropout-gqa)": Saves(copies=(0, 1, 2), attention_probabilities=3, repeated_kv=True),
    "scaled_dot_product_attention(math-dropout-gqa)": Saves(copies=(0, 1, 2), attention_probabilities=2,
                                                            attention_masks=1, repeated_kv=True),
}

# modules whose forward makes its input require a gradient in train mode, whatever their parameters' requires_grad:
# transformers' speech feature encoders (`if self._requires_grad and self.training: hidden_states.requires_grad =
# True`, unless model.freeze_feature_encoder() cleared _requires_grad), so a frozen encoder keeps its activations
GRAD_REENABLING_MODULES: frozenset[str] = frozenset({
    "Wav2Vec2FeatureEncoder", "Wav2Vec2ConformerFeatureEncoder", "Data2VecAudioFeatureEncoder", "HubertFeatureEncoder",
    "SEWFeatureEncoder", "SEWDFeatureEncoder", "SpeechT5FeatureEncoder", "UniSpeechFeatureEncoder",
    "UniSpeechSatFeatureEncoder", "WavLMFeatureEncoder",
})

# ATen ops whose rule changes when the export shows dropout inside them (a Dropout node among the op's nodes).
ATEN_WITH_DROPOUT: dict[str, str] = {"scaled_dot_product_attention": "scaled_dot_product_attention(dropout)"}


@dataclass(frozen=True)
class Folded:
    """A PyTorch op that the export folded into the node before it: simulated again after that node."""

    restores: str  # the op to simulate, a key of SAVED_FOR_BACKWARD
    module: str  # what the user calls it, for the warning
    eval: bool = False  # the ATen op says the model was exported in eval mode


# Found by the ATen op that still marks the node it was folded into: the dynamo exporter's optimizer folds
# BatchNorm into the Conv before it in train and eval mode alike (the Conv then carries BatchNorm's fx node).
FOLDED_ATEN: dict[str, Folded] = {
    "batch_norm": Folded("BatchNormalization", "BatchNorm"),
    "native_batch_norm": Folded("BatchNormalization", "BatchNorm"),
    "_native_batch_norm_legit": Folded("BatchNormalization", "BatchNorm"),
    "_native_batch_norm_legit_functional": Folded("BatchNormalization", "BatchNorm"),
    "_native_batch_norm_legit_no_training": Folded("BatchNormalization", "BatchNorm", eval=True),
}
# Without ATen marks (TorchScript): a Conv whose weight is an initializer with an exporter's name, not a
# parameter's ('onnx::Conv_18'), in a graph whose other weights have parameter names ('fc.weight'), had a
# BatchNorm folded into it (the constant folding of an eval-mode export).
FOLDS_INTO: dict[str, Folded] = {
    "Conv": Folded("BatchNormalization", "BatchNorm", eval=True),
    "ConvTranspose": Folded("BatchNormalization", "BatchNorm", eval=True),
}
EXPORTER_WEIGHT_NAME = r"^(onnx::|val_\d|_val_\d|_v_\d|const_fold|/)"
# Module classes that an eval-mode export keeps as a copy (aten.clone: an Identity) or removes: the copy is
# simulated as the op PyTorch runs in train mode.
# A train-mode trace writes nn.Dropout(p=0) as such a copy too (F.dropout with p=0 returns its input: nothing is
# kept, measured on torch 2.13 CPU): in a graph known to be a train-mode export (a Dropout node, a BatchNorm that
# updates its running statistics, or this model property, which onnxmem.torch.export_for_training writes) the copy
# is the alias it is.
EXPORT_MODE_PROPERTY = "onnxmem.export_mode"
# The modules the model's library checkpoints one by one when its checkpointing is on (transformers'
# GradientCheckpointingLayer instances: what gradient_checkpointing_enable() wraps), comma-separated as
# model.named_modules() names them; written by the exports that hold the model object (onnxmem.torch, onnxmem.hf),
# read by --checkpoint layers.
CHECKPOINT_LAYERS_PROPERTY = "onnxmem.checkpoint_layers"
EVAL_MODULES: dict[str, str] = {
    "torch.nn.modules.dropout.Dropout": "Dropout",
    "torch.nn.modules.dropout.Dropout1d": "Dropout",
    "torch.nn.modules.dropout.Dropout2d": "Dropout",
    "torch.nn.modules.dropout.Dropout3d": "Dropout",
    "torch.nn.modules.dropout.AlphaDropout": "Dropout",
}


# Operators the TorchScript exporter writes as a chain of elementwise nodes although PyTorch runs (and saves for)
# one op: the chain is simulated as that op. Node i of `chain` reads node i - 1's output (node 0 reads the
# op's input x); the nodes in `reads_input` also read x; every other input is a scalar constant; the
# intermediates have no other reader. Only nodes without ATen marks are matched (a dynamo export says which op
# each node comes from: x * torch.sigmoid(x) written in a forward is aten.sigmoid and aten.mul).
@dataclass(frozen=True)
class Decomposed:
    """One ATen op exported as a chain of ONNX nodes."""

    op_type: str  # the op it stands for: 'aten::<op>' (a key of ATEN_SAVED_FOR_BACKWARD) or an ONNX op type
    chain: tuple[str, ...]
    reads_input: tuple[int, ...] = ()
    # only when the chain's nodes are all the nodes of their module scope (an activation module: nn.SiLU); the
    # same chain written inside a forward keeps what its nodes keep
    own_scope: bool = False
    assumption: str = ""  # said in the report's assumptions where the chain was matched


DECOMPOSED: tuple[Decomposed, ...] = (
    # F.gelu (erf): x * 0.5 * (1 + erf(x / sqrt(2))) exported as Div, Erf, Add, Mul(x, .), Mul(., 0.5);
    # aten::gelu keeps only x
    Decomposed("aten::gelu", ("Div", "Erf", "Add", "Mul", "Mul"), reads_input=(0, 3),
               assumption="the erf chain x * 0.5 * (1 + erf(x / sqrt 2)) taken as one gelu (keeps its input only)"),
    Decomposed("aten::gelu", ("Mul", "Erf", "Add", "Mul", "Mul"), reads_input=(0, 3),  # x * (1 / sqrt(2))
               assumption="the erf chain x * 0.5 * (1 + erf(x / sqrt 2)) taken as one gelu (keeps its input only)"),
    # nn.SiLU exported as Sigmoid, Mul(x, .): aten::silu keeps only x
    Decomposed("aten::silu", ("Sigmoid", "Mul"), reads_input=(1,), own_scope=True,
               assumption="Sigmoid then Mul alone in a module scope taken as nn.SiLU (keeps its input only; "
                          "x * sigmoid(x) written in a forward keeps sigmoid(x) too)"),
)

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

# Float inputs that carry no gradient: read for their type or as a setting, never for their values' part in the
# output. The dynamo exporter writes a bias-less Conv's zero bias as Expand(CastLike(0, x)): x is read for its
# dtype, and without this entry the CastLike would seem to send x an x-sized gradient.
NON_DIFFERENTIABLE_INPUTS: dict[str, tuple[int, ...]] = {
    "CastLike": (1,), "Dropout": (1, 2), "Resize": (1, 2), "Pad": (1, 2),
}

# Views in PyTorch: the output shares the storage of input N (a saved view keeps the whole base alive).
# Transpose, Split and Slice are views in PyTorch, unlike in onnxruntime.
TRAINING_VIEWS: dict[str, int] = {
    "Reshape": 0, "Flatten": 0, "Squeeze": 0, "Unsqueeze": 0, "Identity": 0, "Transpose": 0,
    "Split": 0, "Slice": 0, "Expand": 0, "SplitToSequence": 0, "SequenceAt": 0,
}

# ATen ops the dynamo exporter writes as a product and then an op on its result, where PyTorch's kernel writes one
# output: that op writes into the product's storage (its output shares it; nothing more is kept for backward).
# aten.linear with a bias on 3-D (or any N-D) input is exported as Transpose, MatMul, Add; PyTorch runs addmm on the
# flattened view of a contiguous input, matmul then add_ in place otherwise: one output either way, and it keeps the
# input and the weight, not the product before the bias (measured: benchmarks/training_single_ops.py --linear-bias).
ATEN_IN_PLACE_TAIL: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "linear": (frozenset({"MatMul"}), frozenset({"Add"})),  # aten op -> (the product's op types, the tail's)
}

# ATen ops that are views in PyTorch (their result shares its input's storage), whatever ONNX op the exporter
# writes for them: aten.select is a Gather, aten.unbind a Split and Squeezes. A node marked with one of these, reading
# one float tensor, makes a view of it (a saved view keeps the whole base alive, as in PyTorch).
ATEN_VIEWS: frozenset[str] = frozenset({
    "select", "slice", "narrow", "unbind", "split", "split_with_sizes", "chunk", "view", "_unsafe_view", "permute",
    "transpose", "t", "expand", "squeeze", "unsqueeze", "alias", "as_strided", "diagonal", "unfold", "detach",
    "view_as", "expand_as", "movedim", "swapaxes", "flatten", "unflatten",
})

# The dynamo exporter's graph signature (a graph property) names what each weight was in the module: a weight it
# lists as a buffer or a constant ('b_rotary_inv_freq: BUFFER target='rotary.inv_freq'') gets no gradient, whatever
# its name.
GRAPH_SIGNATURE_PROPERTY = "pkg.torch.export.ExportedProgram.graph_signature"
NOT_PARAMETER_KINDS = ("BUFFER", "CONSTANT_TENSOR")

# Cheap elementwise operators whose output autograd could recompute from their input in backward instead of
# keeping it: the recompute what-if names those whose input is kept anyway (Swish written as x * sigmoid(x)).
CHEAP_TO_RECOMPUTE: frozenset[str] = frozenset({
    "Sigmoid", "Tanh", "Relu", "Gelu", "Exp", "Erf", "Softplus", "LeakyRelu", "HardSigmoid", "HardSwish",
    "Elu", "Mish", "Neg", "Abs", "Sqrt", "Reciprocal", "Sin", "Cos", "Mul", "Add", "Sub", "Div", "Cast",
})

# Mixed precision (torch.autocast): ops that run in the low precision (their float inputs are cast, weights
# once per step into autocast's cache); which run in fp32 is the device's (DeviceModel.autocast_fp32); the rest
# follow their inputs.
AUTOCAST_LOW_PRECISION: frozenset[str] = frozenset({
    "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "com.microsoft::Attention", "Attention",
    "aten::scaled_dot_product_attention",
})

# Elementwise ops whose output takes PyTorch's promoted dtype of their inputs with dims (TensorIterator's common
# dtype): under autocast a 16-bit activation times an fp32 parameter or buffer gives fp32. Normalizations (BatchNorm,
# LayerNorm) are not among them: their 16-bit input keeps its dtype with fp32 weights.
TYPE_PROMOTING: frozenset[str] = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Where", "Max", "Min", "Mod",
})



@dataclass(frozen=True)
class ElementwiseGradients:
    """How an elementwise op's backward makes its inputs' gradients (derivatives.yaml): per input, "product" (the
    output's gradient times the other operand: a new tensor of the output's size and dtype), "negated" (-grad: the
    same) or "output" (the output's gradient itself); made in `order`, each held until the engine, in input order,
    sums it over the broadcast dims to its input's shape and casts it to its input's dtype (validate_outputs)."""

    kinds: tuple[str, ...]
    order: tuple[int, ...]


# Measured (benchmarks/training_single_ops.py --elementwise: torch 2.13 CPU, malloc counter, a [512, 256] tensor and
# a broadcast [256] one, fp32 and bf16): x * s holds 1,054,184 B (fp32: both gradients, the product for s before
# its sum), bf16 x * s 1,315,304 and s * x 1,577,448 (s's gradient first where s is input 1, after x's where it is
# input 0), bf16 x - s 792,072 (-grad, then x's gradient cast to bf16), bf16 x + s 268,280 (the cast only).
ELEMENTWISE_GRADIENTS: dict[str, ElementwiseGradients] = {
    "Mul": ElementwiseGradients(("product", "product"), (1, 0)),
    "Sub": ElementwiseGradients(("output", "negated"), (1, 0)),
    "Add": ElementwiseGradients(("output", "output"), (1, 0)),
}


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
    # output.mean(): its backward makes an output-sized gradient (measured: 16.4 MB for 8 x 64 x 8000 logits)
    "mean": (LossStep("ReduceMean", "scalar"),),
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
    # full-size temporaries of a parameter's update that a variable of the for-loop keeps until the next
    # parameter's update makes its own (Adam's `denom`): held through the next parameter's peak
    held_by_loop: int = 0
    states_created_at_once: bool = True  # zeros_like at the start of the first step; False: cloned per parameter
    factored: bool = False  # Adafactor: row and column statistics for matrices, a full one for vectors
    state_bits: int = 0  # 8: bitsandbytes 8-bit states (with one fp32 absmax per block) for large parameters


OPTIMIZERS: dict[str, OptimizerRule] = {
    "sgd": OptimizerRule(states=0, step_tensor=False, transient_for_loop=0, transient_foreach=0),
    # buf = grad.clone() at the first step, then buf.mul_(m).add_(grad) in place
    "sgd-momentum": OptimizerRule(states=1, step_tensor=False, transient_for_loop=0, transient_foreach=0,
                                  states_created_at_once=False),
    # for-loop: denom = (exp_avg_sq.sqrt() / c).add_(eps) holds sqrt and the quotient at once, and the variable
    # `denom` keeps the previous parameter's until the new one is assigned (measured, torch 2.13 CPU, AdamW: one
    # [256, 256] parameter 523,952 B of temporaries, 2x; an LSTM's eight [256, 64] ones 198,872 B, 3x;
    # benchmarks/training_single_ops.py --adam-loop; and on the H100, singleop/adamw/forloop's second step: 48.0
    # MiB over 24 [2048, 2048] fp32 parameters, 3 x 16 MiB)
    "adam": OptimizerRule(states=2, step_tensor=True, transient_for_loop=2, transient_foreach=1, held_by_loop=1),
    "adamw": OptimizerRule(states=2, step_tensor=True, transient_for_loop=2, transient_foreach=1, held_by_loop=1),
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
