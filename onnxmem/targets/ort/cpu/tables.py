"""Inference buffer rules, mirroring what onnxruntime's CPU kernels declare to its memory planner, and the weights
they prepack and the scratch they allocate (targets.ort.arena reads them).

Measured on onnxruntime 1.32.0 and read in its source (docs/ort-memory-planner.md):
ALIASES: the kernel's output 0 is a view of input N (KernelDefBuilder::Alias(N, 0)): it allocates nothing,
even over a graph input or an initializer. A graph output is never an alias: it gets its own buffer.
IN_PLACE: the kernel may write output 0 into input 0's buffer (MayInplace(0, 0)); the planner does so when this
node is the buffer's last reader, the input is an intermediate (not a graph input, initializer or output), and
both have the same element size and the same static shape.
Operators of other domains are keyed 'domain::OpType'. Anything not listed allocates a new output buffer
(measured for Add, Mul, Exp, Gelu, Transpose, Expand, Slice, Dropout, LayerNormalization, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

ALIASES: dict[str, int] = {
    "Reshape": 0,
    "Squeeze": 0,
    "Unsqueeze": 0,
    "Flatten": 0,
    "Identity": 0,
    "com.microsoft::ExpandDims": 0,
}

IN_PLACE: set[str] = {
    "Relu",
    "Sigmoid",
    "Tanh",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "HardSigmoid",
    "Softplus",
    "Softsign",
    "ThresholdedRelu",
    "Clip",
    "Softmax",
    "LogSoftmax",
    "Cast",  # only between types of the same element size (float32 -> int32), as the planner checks
}

# Kernels that may write output 0 into another input's buffer than input 0 (MayInplace(N, 0)), on the same terms as
# IN_PLACE: 'domain::OpType' -> N. The convolutions with a fused Sum input (input 3, the residual added after the
# activation) write into it: onnxruntime/contrib_ops/cpu/nchwc_ops.cc (NCHWc Conv of `--opt-level all`) and
# contrib_ops/cpu/fused_conv.cc (FusedConv). Measured: a ResNeXt's NCHWc Conv with the downsample branch as its
# Sum takes that branch's buffer (tests/test_validate.py).
IN_PLACE_FROM_INPUT: dict[str, int] = {
    "com.microsoft.nchwc::Conv": 3,
    "com.microsoft::FusedConv": 3,
}

# Weights onnxruntime's CPU kernels prepack into the arena at session creation (the only large initializers the
# arena counts): op type -> the input slots it packs. MLAS packs a float32 [K, N] MatMul weight (a [N, K] one for
# Gemm with transB) into K x round_up(N, 16) floats (measured on [1024,1024], [100,10], [37,21], [64,1000]:
# exact); LSTM packs W and R, ConvTranspose and com.microsoft Attention their weight, at their own size (measured
# on the fixtures: exact). Conv weights are not prepacked.
PREPACKED: dict[str, tuple[int, ...]] = {
    "MatMul": (1,),
    "Gemm": (1,),
    "com.microsoft::FusedGemm": (1,),  # (a Gemm with its activation fused at level extended: the same kernel)
    "com.microsoft::FusedMatMul": (1,),  # (a MatMul with its inputs' Transposes fused at level extended: MatMul's)
    "LSTM": (1, 2),
    "ConvTranspose": (1,),
    "com.microsoft::Attention": (1,),
}
# Float16 weights a CPU kernel converts to float32 copies when the session is created (LayerNormImpl::PrePack,
# ConvertMLFloat16ToFloatIfNeeded: the scale and the bias of a LayerNormalization run in float16): op type -> the
# input slots, each held at 4 bytes per element, once for every op reading it (measured: the float16 BERT's
# embedding norm, [64] scale and bias, 512 B; after level basic three norms share them: 1,536 B).
FLOAT16_WEIGHTS_AS_FLOAT32: dict[str, tuple[int, ...]] = {
    "LayerNormalization": (1, 2),
    "SimplifiedLayerNormalization": (1, 2),
    # (SkipLayerNorm::PrePack: a constant skip, gamma, beta and bias; measured: the model builder's float16 Qwen2,
    # four SkipSimplifiedLayerNormalization gammas of [96], 1,536 B; the non-simplified kernel is the same class)
    "com.microsoft::SkipSimplifiedLayerNormalization": (1, 2, 3, 4),
    "com.microsoft::SkipLayerNormalization": (1, 2, 3, 4),
}
# Prepacked weights the kernel allocates in the arena's regions (IAllocator::Alloc) rather than reserving them at
# their exact size outside the regions, as the others do (MakeUniquePtr with use_reserve): measured, a ConvTranspose
# weight of 2,048 B or 147,456 B leaves the arena holding its 1 MiB first region and nothing more.
PREPACKED_IN_REGIONS: frozenset[str] = frozenset({"ConvTranspose"})
PREPACK_PADDED_COLUMNS: dict[str, int] = {"MatMul": 16, "Gemm": 16, "com.microsoft::FusedGemm": 16,  # op -> columns
                                          "com.microsoft::FusedMatMul": 16}
# Quantized weights the CPU kernels prepack into the arena at session creation (their PrePack allocates from the
# kernel's allocator, the arena): op type -> (the weight's input slot, how it is packed). "gemm":
# MatMulIntegerBase::PrePack (MatMulInteger, QLinearMatMul, QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul)
# packs a 2-D [K, N] weight (QGemm with transB: [N, K]) by MlasGemmPackBSize: round_up(N, 16) int32 column sums and
# round_up(N, 16) x round_up(K, PackedK) bytes, the whole rounded up to 64 bytes. "conv": QLinearConv::PrePack packs
# an int8 weight of zero zero points by MlasConvSymPackWSize where MLAS has a symmetric kernel for it (a group-1
# conv: round_up(M, 16) x C x kernel bytes; a depthwise conv of groups a multiple of 16: groups x kernel bytes),
# else each group's [M/g, C x kernel] matrix as a gemm pack, else (a depthwise conv) the reordered weight at its
# own size. The constants are MLAS's AMD64 AVX2 dispatch (onnxruntime/core/mlas/lib/qgemm.h, convsym.cpp), the
# one measured: dynamic int8 BERT and Llama, static QDQ ResNet-18 (QLinearConv, QGemm) exact to the byte.
QUANTIZED_PREPACKED: dict[str, tuple[int, str]] = {
    "MatMulInteger": (1, "gemm"),
    "QLinearMatMul": (3, "gemm"),
    "com.microsoft::QGemm": (3, "gemm"),
    "com.microsoft::MatMulIntegerToFloat": (1, "gemm"),
    "com.microsoft::DynamicQuantizeMatMul": (1, "gemm"),
    "QLinearConv": (3, "conv"),
    "com.microsoft::QLinearConv": (3, "conv"),
    "com.microsoft::MatMulNBits": (1, "nbits"),
}
# "nbits": MatMulNBits::PrePack packs its [N, K/block, block x bits/8] weight by MlasQNBitGemmPackQuantBDataSize for
# the compute type its accuracy_level picks (measured on one-node graphs, onnxruntime 1.32 AVX2: 4-bit at levels
# 0-3 and 4 and 8-bit at level 4 are packed; any other width is not): bits -> {is level 4: compute type}.
NBITS_COMPUTE: dict[int, dict[bool, str]] = {4: {False: "fp32", True: "int8"}, 8: {True: "int8"}}
# The fp32 pack is the weight's blocks as they are, N x ceil(K / block) x block x bits/8 bytes; the int8 pack adds a
# float scale and NBITS_BLOCK_SUM_COLUMNS-column-padded float block sums per block and column, and a fixed
# NBITS_INT8_EXTRA_BYTES (the buffers' alignment slack): measured exact on 12 shapes (K 64-512, N 33-1000, blocks
# 16-128, with and without zero points).
NBITS_BLOCK_SUM_COLUMNS = 16
NBITS_INT8_EXTRA_BYTES = 126
QGEMM_COLUMN_ALIGNMENT = 16  # MLAS_QGEMM_STRIDEN_THREAD_ALIGN
QGEMM_PACKED_K: dict[bool, int] = {True: 4, False: 2}  # by whether the weight is int8: U8S8 and U8U8 AVX2 kernels
QGEMM_BUFFER_ALIGNMENT = 64  # MlasGetPreferredBufferAlignment
CONV_SYM_OUTPUT_PACK = 16  # MlasConvSymDispatchAvx2: FilterOutputChannelPackCount
CONV_SYM_INPUT_ALIGNMENT = 4  # KernelInputChannelAlignment
CONV_SYM_OUTPUT_ALIGNMENT = 8  # KernelOutputChannelAlignment
CONV_SYM_GROUP_ALIGNMENT = 16  # a depthwise conv's group count must be a multiple of this

# Initializers stored in the model file and smaller than this are copied into the arena; larger ones are used in
# place from the model's bytes, and external ones are loaded outside it (measured: float32 [31] in the arena, [32]
# not; int64 [2] in, [16] not; a 40-byte external bias not).
ARENA_COPIED_INITIALIZER_BYTES = 128

# Scratch memory a CPU kernel allocates from the arena while it runs (its temp-space allocator) and frees before
# it returns: not seen in the activation peak (measured at node ends), but it can make the arena grow a region.
# Op key -> a function of (input shapes, output shapes, element bytes of input 0, attributes) giving the bytes of
# each allocation in the kernel's order, after its outputs; a shape is None where the slot is omitted or unknown.
Shapes = Sequence[tuple[int, ...] | None]


def _attribute_text(value: object, default: str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value) if value is not None else default


def lstm_scratch(inputs: Shapes, outputs: Shapes, element: int, attributes: Mapping[str, object]) -> tuple[int, ...]:
    """LSTM (onnxruntime/core/providers/cpu/rnn/lstm_base.cc, uni_directional_lstm.cc, float32): a [directions,
    batch, hidden] buffer for Y_h and for Y_c where the node does not output them; per direction (forward, then
    reverse), UniDirectionalLstm::AllocateBuffers: hidden0 and internal_memory_prev [hidden], batched_hidden0,
    batched_internal_memory_prev and _clipped [batch, hidden], output_iofc [seq, batch, 4 hidden], with a bias
    four [hidden], a reverse direction inputs_reverse [seq, batch, input] and outputs_reverse [seq, batch, hidden],
    with peepholes three [hidden]; then, per direction as it computes, sequence_lengths [batch] int32 where the
    node has no sequence_lens (measured: the LSTM fixture at batch 32, 1,074,944 B at the kernel's peak)."""
    x = inputs[0] if inputs else None
    if x is None or len(x) != 3:
        return ()
    seq, batch, size = x
    recurrence = inputs[2] if len(inputs) > 2 else None
    hidden_attribute = attributes.get("hidden_size")
    hidden = hidden_attribute if isinstance(hidden_attribute, int) else \
        recurrence[2] if recurrence is not None and len(recurrence) == 3 else None
    if hidden is None:
        return ()
    direction = _attribute_text(attributes.get("direction"), "forward")
    directions = 2 if direction == "bidirectional" else 1

    def given(slot: int, shapes: Shapes) -> bool:
        return slot < len(shapes) and shapes[slot] is not None

    sizes = [directions * batch * hidden * element for slot in (1, 2) if not given(slot, outputs)]
    for reverse in ((False, True) if directions == 2 else (direction == "reverse",)):
        sizes += [hidden * element] * 2 + [batch * hidden * element] * 3 + [4 * hidden * batch * seq * element]
        if given(3, inputs):
            sizes += [hidden * element] * 4
        if reverse:
            sizes += [seq * batch * size * element, seq * batch * hidden * element]
        if given(7, inputs):
            sizes += [hidden * element] * 3
    if not given(4, inputs):
        sizes += [batch * 4] * directions
    return tuple(sizes)


def attention_scratch(inputs: Shapes, outputs: Shapes, element: int,
                      attributes: Mapping[str, object]) -> tuple[int, ...]:
    """com.microsoft Attention (onnxruntime/contrib_ops/cpu/bert/attention.cc, attention_cpu_base.h): the Q, K, V
    projections [batch, seq, q + k + v hidden]; in ApplyAttention, where a mask input is given or the attention
    is unidirectional, the mask [batch, seq, total seq]; the probabilities [batch, heads, seq, total seq]; the
    per-head output [batch, heads, seq, v head size] (measured: the contrib transformer fixture at batch 1, 8
    and 32; the kernel holds batch x 256 B more at its peak in onnxruntime 1.32, not found in its source, not
    counted). Total seq is seq plus the past's length."""
    x = inputs[0] if inputs else None
    weights = inputs[1] if len(inputs) > 1 else None
    heads = attributes.get("num_heads")
    if x is None or len(x) != 3 or weights is None or len(weights) != 2 or not isinstance(heads, int) or heads < 1:
        return ()
    batch, seq, _ = x
    sizes_attribute = attributes.get("qkv_hidden_sizes")
    if isinstance(sizes_attribute, (list, tuple)) and len(sizes_attribute) == 3:
        q_hidden, k_hidden, v_hidden = (int(s) for s in sizes_attribute)
    else:
        q_hidden = k_hidden = v_hidden = weights[1] // 3
    past = inputs[4] if len(inputs) > 4 else None
    total = seq + (past[3] if past is not None and len(past) == 5 else 0)
    unidirectional = attributes.get("unidirectional", 0) == 1
    sizes = [batch * seq * (q_hidden + k_hidden + v_hidden) * element]
    if (len(inputs) > 3 and inputs[3] is not None) or (unidirectional and seq > 1):
        sizes.append(batch * seq * total * element)
    sizes += [batch * heads * seq * total * element, batch * seq * v_hidden * element]
    return tuple(sizes)


def bias_gelu_scratch(inputs: Shapes, outputs: Shapes, element: int,
                      attributes: Mapping[str, object]) -> tuple[int, ...]:
    """com.microsoft BiasGelu and FastGelu with a bias (onnxruntime/contrib_ops/cpu/bert/bias_gelu.cc): a
    temporary the size of input 0 (measured: the transformer-optimized BERT at batch 8 grows a region there)."""
    x = inputs[0] if inputs else None
    if x is None or not x or len(inputs) < 2 or inputs[1] is None:
        return ()
    count = 1
    for d in x:
        count *= d
    return (count * element,)


# The attribute kernel_scratch adds to a QLinearConv's: whether it takes MLAS's symmetric conv path (its weight
# packed by MlasConvSymPackW), which decides the buffers it needs.
SYMMETRIC_CONV = "onnxmem.symmetric_conv"


def qlinear_conv_scratch(inputs: Shapes, outputs: Shapes, element: int,
                         attributes: Mapping[str, object]) -> tuple[int, ...]:
    """QLinearConv (onnxruntime/core/providers/cpu/quantization/qlinearconv.cc, Compute; constant weight): off the
    symmetric path an int32 result [M, output pixels]; in channels-first layout (the ONNX operator) the input and
    output of one image transposed to channels last; then, for a depthwise conv, or a conv with a kernel, stride or
    pads and the symmetric path, an indirection buffer of one pointer per kernel tap and output pixel; for any other
    non-pointwise conv an im2col buffer [kernel x input channels of a group, output pixels] (measured: the QDQ
    MobileNetV3's QLinearConv at batch 8 grows a region in the second run)."""
    x = inputs[0] if inputs else None
    w = inputs[3] if len(inputs) > 3 else None
    y = outputs[0] if outputs else None
    if not x or not w or not y or len(w) < 3 or len(x) != len(w) or len(y) != len(w):
        return ()
    channels_last = attributes.get("channels_last", 0) == 1
    spatial_in = x[1:-1] if channels_last else x[2:]
    spatial_out = y[1:-1] if channels_last else y[2:]
    channels = x[-1] if channels_last else x[1]
    outputs_m, group_inputs = w[0], w[1]
    groups = attributes.get("group", 1)
    if not isinstance(groups, int) or groups < 1 or outputs_m % groups:
        return ()
    input_pixels = output_pixels = kernel = 1
    for d in spatial_in:
        input_pixels *= d
    for d in spatial_out:
        output_pixels *= d
    for d in w[2:]:
        kernel *= d
    symmetric = bool(attributes.get(SYMMETRIC_CONV, False))
    group_outputs = outputs_m // groups
    depthwise = group_inputs == 1 and group_outputs == 1  # (reordered or symmetric: both paths call it depthwise)
    if depthwise:
        group_inputs, groups = groups, 1
    strides = attributes.get("strides")
    pads = attributes.get("pads")
    strides = strides if isinstance(strides, (list, tuple)) else ()
    pads = pads if isinstance(pads, (list, tuple)) else ()
    pointwise = kernel == 1 and all(s == 1 for s in strides) and not any(pads) and \
        attributes.get("auto_pad", b"NOTSET") in (b"NOTSET", b"VALID", "NOTSET", "VALID")
    sizes = []
    if not symmetric:
        sizes.append(4 * outputs_m * output_pixels)
    if not channels_last:
        sizes += [channels * input_pixels * element, outputs_m * output_pixels * element]
    if depthwise or (not pointwise and symmetric):
        batch = x[0] if symmetric and channels_last else 1
        sizes.append(8 * kernel * output_pixels * batch)
    elif not pointwise:
        column = group_inputs * kernel * output_pixels
        sizes.append((groups * column if len(w) - 2 > 2 else column) * element)
    return tuple(sizes)


def where_scratch(inputs: Shapes, outputs: Shapes, element: int, attributes: Mapping[str, object]) -> tuple[int, ...]:
    """Where (core/providers/cpu/tensor/where_op.cc): Select allocates X_selection = condition ? X : 0 and
    Y_selection = !condition ? Y : 0, each of the broadcast of the condition's shape with X's (Y's), before the
    output, which merges them; both are freed when the kernel returns. `element`: bytes of X's type. A known
    scalar comes as (1,) (SCRATCH_KNOWN_SCALARS), () is a shape not known."""
    condition, x, y = (inputs[i] if i < len(inputs) else None for i in range(3))
    if condition is None or x is None or y is None or () in (condition, x, y):
        return ()
    sizes = []
    for value in (x, y):
        rank = max(len(condition), len(value))
        padded = [(1,) * (rank - len(s)) + tuple(s) for s in (condition, value)]
        dims = [max(a, b) if 1 in (a, b) or a == b else -1 for a, b in zip(*padded, strict=True)]
        if any(d < 0 for d in dims):
            return ()
        count = 1
        for d in dims:
            count *= d
        sizes.append(count * element)
    return tuple(sizes)


# GroupQueryAttention's float32 flash path tiles its work by the L2 cache onnxruntime reads from the system
# (Env::GetL2CacheSize: sysconf's LEVEL2_CACHE_SIZE; 512 KiB on the machine measured) and gives each thread of its
# pool a buffer (one thread: the intra-op threads validate pins)
GQA_L2_CACHE_BYTES = 512 * 1024
GQA_THREADS = 1


def group_query_attention_scratch(inputs: Shapes, outputs: Shapes, element: int,
                                  attributes: Mapping[str, object]) -> tuple[int, ...]:
    """com.microsoft GroupQueryAttention (onnxruntime 1.32: contrib_ops/cpu/bert/group_query_attention.cc,
    gqa_attention_base.h), from its temp-space allocator, all freed when it returns: the query (packed QKV: all
    three) transposed to [batch, heads, seq, head], and separate K and V too; with do_rotary, the rotated copies of
    Q and K (packed: of all three); then, in float32 over a context longer than one position (the flash path:
    no softcap, smooth softmax, head sink or QK output), one buffer per thread, for a decode step (seq 1) the score
    row and an accumulator, (context + head) floats, for a prefill the tile's row statistics, scores and
    accumulator, (2 q + q kv + q head) floats with kv = min(L2 / (32 head), context) and q = min(kv, 2 head, seq);
    otherwise the attention probabilities [batch, heads, seq, present length] in float32 (and, in float16, each
    head's Q and K rows in float32, [head, seq + present length]). The context is taken as the present's length
    (the step's past + seq where the presents are the step's own)."""
    query = inputs[0] if inputs else None
    present = outputs[1] if len(outputs) > 1 else None
    heads, kv_heads = attributes.get("num_heads"), attributes.get("kv_num_heads")
    if not query or len(query) != 3 or not present or len(present) != 4 or not isinstance(heads, int) or \
            not isinstance(kv_heads, int) or heads < 1 or kv_heads < 1:
        return ()
    batch, seq, width = query
    packed = len(inputs) < 2 or inputs[1] is None
    head = width // (heads + 2 * kv_heads) if packed else width // heads
    length = present[2]
    q_bytes = batch * heads * seq * head * element
    kv_bytes = batch * kv_heads * seq * head * element
    transposed = [batch * (heads + 2 * kv_heads) * seq * head * element] if packed else [q_bytes, kv_bytes, kv_bytes]
    sizes = list(transposed)
    if attributes.get("do_rotary", 0) == 1:
        sizes += transposed[:1] if packed else [q_bytes, kv_bytes]
    head_sink = len(inputs) > 11 and inputs[11] is not None
    softcap = attributes.get("softcap", 0.0)
    # (smooth_softmax: on only at 1, the saved graph writes its -1 default; qk_output: 0 is no output)
    flash = element == 4 and length > 1 and not (isinstance(softcap, float) and softcap > 0) and \
        attributes.get("smooth_softmax", 0) != 1 and not head_sink and not attributes.get("qk_output", 0)
    if flash and seq == 1:
        sizes.append(GQA_THREADS * (length + head) * 4)
    elif flash:
        kv_block = min(max(GQA_L2_CACHE_BYTES // (4 * 4 * 2 * head), 1), length)
        q_block = min(kv_block, 2 * head, seq)
        sizes.append(GQA_THREADS * (2 * q_block + q_block * kv_block + q_block * head) * 4)
    else:
        sizes.append(batch * heads * seq * length * 4)
        if element == 2:
            sizes.append(head * (seq + length) * 4)
    return tuple(sizes)


KERNEL_SCRATCH: dict[str, Callable[[Shapes, Shapes, int, Mapping[str, object]], tuple[int, ...]]] = {
    "com.microsoft::GroupQueryAttention": group_query_attention_scratch,
    "LSTM": lstm_scratch,
    "com.microsoft::Attention": attention_scratch,
    "com.microsoft::BiasGelu": bias_gelu_scratch,
    "com.microsoft::FastGelu": bias_gelu_scratch,
    "QLinearConv": qlinear_conv_scratch,
    "com.microsoft::QLinearConv": qlinear_conv_scratch,
    "Where": where_scratch,
}
# Scratch rules whose element size is another input's than input 0 (op key -> that input): Where's temporaries
# are of X's type (input 1), its condition (input 0) is bool.
SCRATCH_ELEMENT_INPUT: dict[str, int] = {"Where": 1}
# Kernels that allocate their scratch before their outputs (the output is made from the scratch), freeing it
# when they return: their scratch comes first in the arena's sequence.
SCRATCH_BEFORE_OUTPUTS: frozenset[str] = frozenset({"Where"})
# Scratch rules that are given a known scalar input as (1,) (to the others, () is a shape not known).
SCRATCH_KNOWN_SCALARS: frozenset[str] = frozenset({"Where"})
