"""What onnxruntime's CUDA execution provider does differently from its CPU provider, for the memory report.

Taken from onnxruntime's source, not measured: no GPU was available to this project. The source read is
microsoft/onnxruntime as the project's source library stores it (not the 1.32.0 tag itself, which it does not hold):
the generated kernel list docs/OperatorKernels.md at commit 001d12d (its CUDA section: every CUDA kernel, its opset
ranges and type constraints; it lists CPU kernels up to opset 25, where the 1.32.0 wheel installed here registers
some at 28, so it is a little older than 1.32), and the kernels' own files named beside each entry below. Each table
names the file its rows come from; tests/test_cuda_provider.py checks what each rule does to a small graph.

How onnxruntime places a model's nodes on the CUDA provider (onnxmem.targets.ort.cuda.placement follows it):
- CUDAExecutionProvider::GetCapability (core/providers/cuda/cuda_execution_provider.cc) claims every node with a
  CUDA kernel for its op, opset and types (CUDA_KERNEL_TYPES); the others run on the CPU provider.
- GetCpuPreferredNodes (core/framework/fallback_cpu_capability.cc) then hands back to the CPU the nodes downstream
  of a tensor a CUDA kernel leaves in host memory (Shape's and Size's outputs: CUDA_CPU_OUTPUTS) whose every input is
  in host memory, a graph input, or an initializer of at most SMALL_INITIALIZER_ELEMENTS elements, none float16,
  bfloat16 or float8, and none read by the CUDA kernel in host memory anyway (CUDA_CPU_INPUTS): the shape
  subgraphs (Shape -> Gather -> Unsqueeze -> Concat -> Reshape's shape input). Its aggressive mode
  (GetShapeRelatedNodes) is off by default and not modelled.
- MemcpyTransformer (core/optimizer/transformer_memcpy.cc) inserts a MemcpyFromHost where a CUDA kernel reads in
  device memory a tensor made in host memory (a new device buffer), and a MemcpyToHost where a tensor made in device
  memory is read in host memory (a new host buffer; the device tensor is renamed '<name>_CUDAExecutionProvider').
  A graph input read both ways gets a MemcpyFromHost; one read only on the device is copied by the session.
- The allocation planner (core/framework/allocation_planner.cc) plans each location's buffers apart: a host
  tensor never shares a device buffer, so host tensors are no device bytes.
"""

from __future__ import annotations

from onnx import TensorProto

SOURCE_COMMIT = "001d12d2623fd411ce0f83d05abb5e82304a3389"  # docs/OperatorKernels.md as read

_F = TensorProto
HFD = frozenset({_F.FLOAT16, _F.FLOAT, _F.DOUBLE})
X = frozenset({_F.BFLOAT16})
HFDX = HFD | X
INTS = frozenset({_F.INT8, _F.INT16, _F.INT32, _F.INT64, _F.UINT8, _F.UINT16, _F.UINT32, _F.UINT64})
ANY = HFDX | INTS | frozenset({_F.BOOL, _F.FLOAT8E4M3FN, _F.FLOAT8E4M3FNUZ, _F.FLOAT8E5M2, _F.FLOAT8E5M2FNUZ})
HF = frozenset({_F.FLOAT16, _F.FLOAT})
HFX = HF | X
BOOL = frozenset({_F.BOOL})
I32_64 = frozenset({_F.INT32, _F.INT64})
U32_64 = frozenset({_F.UINT32, _F.UINT64})

# The CUDA kernels: 'domain::OpType' -> the element types of the input that selects the kernel (input 0, or the
# one CUDA_TYPED_INPUT names) at the op's newest registered opset; docs/OperatorKernels.md, CUDA section, as
# generated from the registrations in core/providers/cuda/cuda_execution_provider.cc (ONNX domain) and
# contrib_ops/cuda/cuda_contrib_kernels.cc (com.microsoft). An op of these domains missing here has no CUDA kernel
# and runs on the CPU provider (Mean, MeanVarianceNormalization, NonMaxSuppression, Unique, Celu, Mish, Hardmax,
# Det, the trigonometric ops but Sin and Cos, the Bitwise ops, DFT, Col2Im, ConvInteger, the QLinear ops,
# DynamicQuantizeLinear, SplitToSequence, GroupNormalization, LpNormalization, the window functions; com.microsoft
# DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm, ExpandDims, the NCHWc domain). Opset ranges are not kept:
# an op's older ranges are assumed to take the same types (they take fewer: e.g. Clip 6-11 float only).
CUDA_KERNEL_TYPES: dict[str, frozenset[int]] = {
    **{f"::{op}": HFDX for op in (
        "Attention", "AveragePool", "Conv", "Dropout", "Erf", "Exp", "Gelu", "Gemm", "HardSigmoid", "HardSwish",
        "LayerNormalization", "MatMul", "RMSNormalization", "Relu", "Sigmoid", "SimplifiedLayerNormalization",
        "Softmax", "Sqrt", "Sum", "Tanh")},
    **{f"::{op}": HFD for op in (
        "Affine", "ArgMax", "ArgMin", "BatchNormalization", "Ceil", "ConvTranspose", "Cos", "Crop", "DepthToSpace",
        "Einsum", "Elu", "Floor", "GlobalAveragePool", "GlobalMaxPool", "GRU", "ImageScaler",
        "InstanceNormalization", "LRN", "LSTM", "LeakyRelu", "Log", "LogSoftmax", "PRelu", "ParametricSoftplus",
        "RNN", "RandomNormal", "RandomUniform", "Reciprocal", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
        "Round", "ScaledTanh", "Selu", "Sin", "Softplus", "Softsign", "SpaceToDepth", "ThresholdedRelu")},
    **{f"::{op}": ANY for op in (
        "Cast", "Compress", "Concat", "ConcatFromSequence", "ConstantOfShape", "DynamicSlice", "Expand", "Flatten",
        "Gather", "GatherElements", "Identity", "If", "Loop", "MemcpyFromHost", "MemcpyToHost", "RandomNormalLike",
        "RandomUniformLike", "Reshape", "ReverseSequence", "Scan", "Scatter", "ScatterElements", "ScatterND",
        "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength",
        "Shape", "Size", "Slice", "Split", "Squeeze", "TensorScatter", "Transpose", "Trilu", "Unsqueeze")},
    **{f"::{op}": HFDX | INTS for op in ("Abs", "Add", "Div", "Mul", "Sign", "Sub")},
    "::And": BOOL, "::Or": BOOL, "::Xor": BOOL, "::Not": BOOL,
    "::Clip": HFD | frozenset({_F.INT8, _F.UINT8, _F.INT64, _F.UINT64}),
    "::CumSum": HFD | I32_64 | U32_64,
    "::DequantizeLinear": frozenset({_F.INT8, _F.UINT8, _F.INT4, _F.UINT4, _F.FLOAT8E4M3FN, _F.FLOAT8E5M2}),
    "::Equal": BOOL | HFD | I32_64 | U32_64,
    "::EyeLike": frozenset({_F.FLOAT, _F.DOUBLE, _F.INT32, _F.INT64, _F.UINT64}),
    "::GatherND": HFDX | frozenset({_F.BOOL, _F.INT64}),
    "::Greater": HFD | I32_64 | U32_64, "::GreaterOrEqual": HFD | I32_64 | U32_64,
    "::Less": HFD | I32_64 | U32_64, "::LessOrEqual": HFD | I32_64 | U32_64,
    "::GridSample": frozenset({_F.FLOAT}),
    "::IsInf": HFDX, "::IsNaN": HFDX,
    "::MatMulInteger": frozenset({_F.INT8}),
    "::Max": HFDX | I32_64 | U32_64, "::Min": HFDX | I32_64 | U32_64, "::Mod": HFDX | I32_64 | U32_64,
    "::MaxPool": HFD | frozenset({_F.INT8, _F.UINT8}),
    "::Neg": HFDX | frozenset({_F.INT8, _F.INT16, _F.INT32, _F.INT64}),
    "::NonZero": frozenset({_F.BOOL, _F.FLOAT, _F.FLOAT16, _F.INT32, _F.INT64, _F.UINT8}),
    "::OneHot": I32_64,
    "::Pad": HFD | BOOL,
    "::Pow": HFDX | I32_64,
    "::QuantizeLinear": HF,
    "::Range": frozenset({_F.FLOAT, _F.DOUBLE, _F.INT16, _F.INT32, _F.INT64}),
    "::ReduceL1": HFD | frozenset({_F.INT32}), "::ReduceL2": HFD | frozenset({_F.INT32}),
    "::ReduceMax": HFD | I32_64, "::ReduceMean": HFD | frozenset({_F.INT32}),
    "::ReduceMin": HFD | I32_64 | frozenset({_F.INT8, _F.UINT8}), "::ReduceProd": HFD | frozenset({_F.INT32}),
    "::ReduceSum": HFDX | I32_64,
    "::Resize": HFD | frozenset({_F.INT32, _F.UINT8}), "::Upsample": HFD | frozenset({_F.INT32, _F.UINT8}),
    "::RoiAlign": frozenset({_F.FLOAT, _F.DOUBLE}),
    "::RotaryEmbedding": HFX,
    "::Shrink": HFD | INTS,
    "::Tile": HFDX | I32_64,
    "::TopK": HFD | I32_64,
    "::Where": HFDX | I32_64 | frozenset({_F.UINT8}),
    **{f"com.microsoft::{op}": HFDX for op in (
        "BiasDropout", "BiasGelu", "BitmaskBiasDropout", "BitmaskDropout", "FastGelu", "FusedMatMul", "Gelu",
        "QuickGelu", "TransposeMatMul")},
    **{f"com.microsoft::{op}": HFX for op in (
        "Attention", "GatherBlockQuantized", "MatMulBnb4", "MatMulNBits", "MoE", "MultiHeadAttention",
        "RotaryEmbedding", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization")},
    **{f"com.microsoft::{op}": HF for op in (
        "BeamSearch", "BiasAdd", "BiasSplitGelu", "ComplexMul", "ComplexMulConj", "DecoderAttention",
        "DecoderMaskedMultiHeadAttention", "DecoderMaskedSelfAttention", "EmbedLayerNormalization",
        "GatedRelativePositionBias", "GreedySearch", "GroupNorm", "LongformerAttention", "NhwcConv",
        "PackedAttention", "PackedMultiHeadAttention", "RelativePositionBias", "RemovePadding", "RestorePadding",
        "Sampling", "SkipGroupNorm", "WhisperBeamSearch")},
    **{f"com.microsoft::{op}": HFD for op in ("BiasSoftmax", "Inverse", "Irfft", "Rfft")},
    "com.microsoft::GroupQueryAttention": frozenset({_F.FLOAT16, _F.BFLOAT16}),
    "com.microsoft::PagedAttention": frozenset({_F.FLOAT16, _F.BFLOAT16}),
    "com.microsoft::SparseAttention": frozenset({_F.FLOAT16, _F.BFLOAT16}),
    "com.microsoft::QMoE": frozenset({_F.FLOAT16, _F.BFLOAT16}),
    "com.microsoft::FusedConv": frozenset({_F.FLOAT}),
    "com.microsoft::GridSample": frozenset({_F.FLOAT}),
    "com.microsoft::ConvTransposeWithDynamicPads": frozenset({_F.FLOAT}),
    "com.microsoft::QAttention": frozenset({_F.INT8}),
    "com.microsoft::DequantizeLinear": frozenset({_F.INT8, _F.UINT8}),
    "com.microsoft::QuantizeLinear": frozenset({_F.FLOAT16}),
    **{f"com.microsoft::{op}": ANY for op in ("Trilu", "UnfoldTensor")},
}
# The input whose type selects the kernel where it is not input 0.
CUDA_TYPED_INPUT: dict[str, int] = {"::Where": 1, "com.microsoft::EmbedLayerNormalization": 2,
                                    "com.microsoft::GatherBlockQuantized": 2}
# Ops whose kernel is selected by an attribute-given output type, or by an input other than the tensors listed
# (their first input's type says nothing of it): not checked.
CUDA_UNTYPED: frozenset[str] = frozenset({
    "::ConstantOfShape", "::RandomNormal", "::RandomUniform", "::EyeLike", "::RandomNormalLike", "::RandomUniformLike",
    "::SequenceEmpty", "com.microsoft::BeamSearch", "com.microsoft::GreedySearch", "com.microsoft::Sampling",
    "com.microsoft::WhisperBeamSearch"})

# Inputs a CUDA kernel reads in host memory (KernelDefBuilder::InputMemoryType(OrtMemTypeCPUInput, i)): no
# MemcpyFromHost for them, and a shape subgraph feeding them stays where it is. Op key -> input slots, each from
# the kernel's file under core/providers/cuda/ (or contrib_ops/cuda/) as named.
CUDA_CPU_INPUTS: dict[str, tuple[int, ...]] = {
    "::Reshape": (1,),  # tensor/reshape.cc (also Alias(0, 0))
    "::Expand": (1,),  # tensor/expand.cc
    "::Slice": (1, 2, 3, 4),  # tensor/slice.cc, opset 10 and later
    "::ConstantOfShape": (0,),  # generator/constant_of_shape.cc
    "::Unsqueeze": (1,),  # tensor/unsqueeze.cc, opset 13 and later
    "::Squeeze": (1,),  # tensor/squeeze.cc, opset 13 and later (the stored file read predates 13: as Unsqueeze)
    "::Tile": (1,),  # tensor/tile.cc
    "::Clip": (1, 2),  # math/clip.cc, opset 11 and later
    "::Dropout": (1, 2),  # nn/dropout.cc, opset 12 and later
    "::If": (0,),  # controlflow/if.cc: 'cond'
    "::Loop": (0, 1),  # controlflow/loop.cc: 'M' and 'cond'
    "::MemcpyFromHost": (0,),  # cuda_execution_provider.cc
    # The reductions whose axes are an input (ReduceSum 13+, the others 18+; reduction/reduction_ops.cc registers
    # those versions with InputMemoryType(OrtMemTypeCPUInput, 1)). Measured (benchmarks/results/cuda/
    # 2026-11-27-h100-80gb.jsonl, ort/tiny_cnn and ort/resnet18, every level, b1 and b8): the ReduceMean's axes
    # initializer (int64[2], 16 bytes) is not among the device's weights, as the Reshape's shape is not.
    **{f"::{op}": (1,) for op in (
        "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
        "ReduceLogSumExp", "ReduceSumSquare")},
}
# Outputs a CUDA kernel leaves in host memory (OutputMemoryType(OrtMemTypeCPUOutput, i)).
CUDA_CPU_OUTPUTS: dict[str, tuple[int, ...]] = {
    "::Shape": (0,),  # tensor/shape_op.cc
    "::Size": (0,),  # tensor/size.cc (not re-read here: as Shape)
    "::MemcpyToHost": (0,),  # cuda_execution_provider.cc
}
# fallback_cpu_capability.cc: kSmallInitializerThreshold, an initializer's element count at most this is a CPU
# tensor to GetCpuPreferredNodes.
SMALL_INITIALIZER_ELEMENTS = 100
# fallback_cpu_capability.cc: inputs of these types keep a node on the device.
DEVICE_ONLY_TYPES = frozenset({_F.FLOAT16, _F.BFLOAT16, _F.FLOAT8E4M3FN, _F.FLOAT8E4M3FNUZ, _F.FLOAT8E5M2,
                               _F.FLOAT8E5M2FNUZ})

# Buffer reuse on CUDA (the planner reads the kernels' declarations). MayInplace(0, 0): the unary activations of
# activation/activations.cc (Elu, HardSigmoid, LeakyRelu, Relu, Selu, Sigmoid, Softplus, Softsign, Tanh,
# ThresholdedRelu), as on CPU. The CPU provider's other in-place ops are not in place on CUDA: Softmax and
# LogSoftmax (math/softmax.cc), Clip (math/clip.cc) and Cast (tensor/cast_op.cc) declare no MayInplace there, and
# Celu has no CUDA kernel. Alias(0, 0): Reshape, Squeeze, Unsqueeze, Flatten and Identity, as on CPU (tensor/*.cc;
# Dropout 7-11 too, tensor/identity_op.cc, not modelled: it keys on the opset); com.microsoft ExpandDims has no
# CUDA kernel.
CUDA_IN_PLACE: frozenset[str] = frozenset({
    "Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "Softplus", "Softsign", "ThresholdedRelu",
})
CUDA_ALIASES: dict[str, int] = {"Reshape": 0, "Squeeze": 0, "Unsqueeze": 0, "Flatten": 0, "Identity": 0}

# cuDNN's convolution workspace. conv.cc (cuDNN 9: the cudnn_frontend graph of CreateCudnnFeExecutionPlan, its plan
# chosen by heuristics mode A for cudnn_conv_algo_search HEURISTIC, B for EXHAUSTIVE, FALLBACK for DEFAULT) allocates
# get_workspace_size() bytes from the provider's allocator (GetWorkSpace -> GetScratchBuffer) in every Compute and
# frees it when Compute returns: the bytes are live only while the Conv runs, above every tensor live then (in a
# later run, above the memory pattern's block). Their size is the plan's, which cuDNN's heuristics pick inside the
# library from the shapes, the GPU and the cuDNN version: it is not a function onnxruntime's source states, so it is
# measured, per convolution shape. Each entry: (input C, H, W per sample, weight shape, strides, pads, dilations,
# group, element type) -> (the operands whose bytes the workspace holds, at the run's batch: x, w, y; extra bytes;
# or a fixed size where the measurement gave one figure). Read as "the plan reorders these operands into the
# layout its engine takes (NCHW -> NHWC for x and y, KCRS -> KRSC for w), plus 16 bytes": the form every
# binding peak of the rows fits exactly. Measured on an H100 80GB HBM3 (driver 580.159.04, CUDA 13, onnxruntime-gpu
# 1.31.1, HEURISTIC, cudnn_conv_use_max_workspace 0, TF32 on), float32, NCHW:
#   tiny_cnn's second conv: x + w + 16 at batch 1 and 8 (ort/tiny_cnn/*/b1 and b8: the peak, first and later runs);
#   resnet18's stem conv (7x7, stride 2): x + w + y + 16 at batch 8 (ort/resnet18/*/b8: the peak of both runs);
#     batch 1 does not reach the peak there (a bound only: ws <= 8651055);
#   resnet18's 512-channel 3x3 convs on 4x4: 9601327 bytes at batch 1 (ort/resnet18/*/b1: the peak of both runs,
#     first run above 98304 live bytes, later run above the 1310720-byte pattern block); at batch 8 a bound only
#     (<= 9999120).
# Every other conv of the two models stays under the peaks (bounds, not figures). A conv shape not here: the
# workspace is not known (a warning names it); the next GPU window measures each shape alone (see
# benchmarks/cuda/score_ort.py's docstring for the single-op measurement).
CONV_WORKSPACE_EXTRA = 16
# The ops that run a cuDNN convolution with a workspace from the provider's allocator (keyed as rules.InferenceRules:
# op type in ONNX's domain, else domain::op type): Conv (nn/conv.cc), whose workspace the tables above give, and the
# FusedConv that onnxruntime's ConvActivationFusion makes of a Conv and its activation from level extended on
# (contrib_ops/cuda/fused_conv.cc: a Conv<T, false> running cudnnConvolutionBiasActivationForward with its own
# algorithm's workspace): not measured, so each is named in the cuda-conv-workspace warning.
CUDNN_CONVOLUTIONS: frozenset[str] = frozenset({"Conv", "com.microsoft::FusedConv"})
ConvKey = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], int, int]
CUDNN_CONV_WORKSPACE: dict[ConvKey, tuple[str, int]] = {
    # (C, H, W), weight, strides, pads (begin..., end...), dilations, group, element type: (operands, extra bytes)
    ((64, 64, 64), (128, 64, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, _F.FLOAT): ("xw", CONV_WORKSPACE_EXTRA),
    ((3, 128, 128), (64, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1, _F.FLOAT): ("xwy", CONV_WORKSPACE_EXTRA),
}
# Workspaces measured at one batch only, as one figure: (ConvKey, batch) -> bytes.
CUDNN_CONV_WORKSPACE_AT: dict[tuple[ConvKey, int], int] = {
    (((512, 4, 4), (512, 512, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, _F.FLOAT), 1): 9601327,
}
