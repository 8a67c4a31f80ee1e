"""The rule tables onnxruntime applies on every provider: control flow, how its inference and planner see shapes
(the operators it fuses, the dims it merges, the shape values it carries), the outputs that never take a freed
buffer. The CPU provider's kernels' own tables (in place, aliases, prepacked weights, scratch) are cpu/tables.py;
the CUDA provider's, cuda/tables.py.
"""

from __future__ import annotations

CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})  # the standard operators whose attributes hold graphs


# Control flow. An If's branch writes its outputs straight into the If's outputs; a Loop's or Scan's body
# outputs are buffers of their own each iteration (copied out), so they count inside the body too.
BODY_OUTPUTS_SEPARATE: set[str] = {"Loop", "Scan"}
# Scalars a control-flow op allocates to feed its body: Loop's iteration counter (int64) and condition (bool).
BODY_STATE_BYTES: dict[str, int] = {"Loop": 9}

# Operators whose outputs never take a buffer freed by an earlier tensor: each gets a buffer of its own.
# Measured (onnxruntime 1.32 CPU): two stacked LSTM, GRU or RNN nodes with unread Y_h (and Y_c): the second
# node's states do not take the first node's freed state buffers of the same shape, where a Slice does.
TAKES_NO_FREED_BUFFER: frozenset[str] = frozenset({"LSTM", "GRU", "RNN"})

# Operators whose output dims onnxruntime's inference merges from all inputs, the first known one winning (ONNX's
# mergeInDimensionInfo): op type -> the axis attribute's default, the one axis not merged. ONNX's Python
# inference names a dim it cannot infer 'unk__N' and that name wins the merge where onnxruntime's empty dim
# loses. Measured on fixtures/unet.onnx: the decoder's Concat of an upsampled tensor (batch unknown after
# Resize) with a skip connection [batch, 8, 32, 32] is [batch, 16, 32, 32] for onnxruntime's planner.
PLANNER_MERGES_DIMS: dict[str, int] = {"Concat": 0}

ALL_ATTRIBUTES = "*"  # in SHAPE_AS's dropped attributes: drop every one

# onnxruntime's fused operators (written into its optimized graphs) whose output shapes are those of a standard
# operator: shape inference runs them as that operator, with their extra attributes and inputs dropped.
# 'domain::OpType' -> (standard op type, inputs it keeps, attributes it drops)
SHAPE_AS: dict[str, tuple[str, int, frozenset[str]]] = {
    "com.microsoft::FusedConv": ("Conv", 3, frozenset({"activation", "activation_params"})),
    "com.microsoft::FusedGemm": ("Gemm", 3, frozenset({"activation", "activation_alpha", "activation_beta",
                                                        "activation_gamma"})),
    # Only without transposes (transA/transB/transBatch* = 0): a scaled MatMul, the fusion seen on the fixtures.
    "com.microsoft::FusedMatMul": ("MatMul", 2, frozenset({"alpha"})),
    # Elementwise operators whose output is their first input's type: inference runs them as an Identity, so a
    # chain of them (EfficientNet's SiLU as QuickGelu between convolutions) is typed in one inference, where the
    # shape rules (rules.shapes) would type one more of them per round.
    **{f"com.microsoft::{op}": ("Identity", 1, frozenset({ALL_ATTRIBUTES})) for op in (
        "QuickGelu", "Gelu", "FastGelu", "BiasGelu", "FusedGelu", "BiasAdd", "BiasSoftmax", "RotaryEmbedding",
        "QLinearLeakyRelu", "QLinearSigmoid", "QLinearSoftmax", "Affine", "ScaledTanh", "ThresholdedRelu")},
    # the copies between host and device memory onnxruntime's CUDA provider inserts (cuda_placement): a copy
    **{f"::{op}": ("Identity", 1, frozenset({ALL_ATTRIBUTES})) for op in ("MemcpyFromHost", "MemcpyToHost")},
}

# Operators onnxruntime's CPU provider has no kernel for and runs as their ONNX function body: while the op
# runs, the body's intermediates are live too. Op type -> extra buffers the size of output 0 (HardSwish runs as
# HardSigmoid then Mul: one intermediate; measured on the depthwise fixture).
EXPANDED_INTERMEDIATES: dict[str, int] = {
    "HardSwish": 1,
}

# How the size of a dim that symbolic inference could not name (ONNX's 'unk__N': a Concat of a KV cache along
# 'past' and 'seq', the -1 of a Reshape after it) follows from the node's input sizes once the dims are bound:
# op type -> rule ("concat": the axis sums, the other dims are the inputs'; "broadcast": numpy broadcasting;
# "reshape": a constant target, 0 and -1 resolved). The few tensors no rule sizes are inferred by ONNX on the
# nodes that make them (shapes._infer_rest).
DIM_FROM_INPUTS: dict[str, str] = {
    "Concat": "concat",
    "Reshape": "reshape",
    **{op: "broadcast" for op in ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "Where", "Max", "Min", "Sum", "Mean",
                                  "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor",
                                  "BitShift", "PRelu")},
}


# The operators whose inference reads a shape from an input (ONNX's getShapeInput: an initializer, else the values
# data propagation found), and that input's slot (onnx/defs: Reshape, Expand, ConstantOfShape, Resize's sizes,
# AffineGrid's size).
SHAPE_INPUT_SLOTS: dict[str, int] = {"Reshape": 1, "Expand": 1, "ConstantOfShape": 0, "Resize": 3, "AffineGrid": 1}
# The operators through which onnxruntime's graph resolution carries integer shape values to those inputs
# (planner.ort_shape_values): ONNX's PartialDataPropagationFunction (onnx/defs: Cast, Shape, Size, Concat, Slice,
# Gather, Squeeze, Unsqueeze, Add, Sub, Mul), which in onnxruntime reads only the values propagated so far, and
# onnxruntime's own (core/graph/data_propagation: Size, Squeeze, Unsqueeze, and Gather, Add, Sub, Mul, Div of
# scalars, which read initializers too and keep integers only). Measured: BART (TorchScript, level disable) sizes a
# ConstantOfShape of Shape(Shape(x)) [2], which then takes a freed [2] buffer; Swin's pad list, Sub(8,
# Gather(Shape(Concat(...)), [0])), stays unknown (its Gather's indices and Sub's 8 are initializers).
ORT_DATA_PROPAGATION_OPS: frozenset[str] = frozenset({
    "Constant", "Cast", "Shape", "Size", "Concat", "Slice", "Gather", "Squeeze", "Unsqueeze", "Add", "Sub", "Mul",
    "Div"})
