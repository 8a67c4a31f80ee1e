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
    # on CPU, the kernel whose backward scratch CPU_CONVOLUTION gives from the op's shapes (instead of the
    # temporaries above, where the shapes say how PyTorch runs it)
    cpu_convolution: bool = False
    # those CPU temporaries are in oneDNN's blocked layout: channels (axis 1) padded to the CPU's channel block
    cpu_blocked_channels: bool = False
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
    # on CPU the op computes in fp32 from 16-bit inputs (the math path's query.to(float), under autocast too): the
    # copies and [..., q_len, kv_len] tensors above are fp32
    fp32_on_cpu: bool = False
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
    "Conv": Saves(inputs=(0, 1), cpu_backward_temporaries=(1, 1), cpu_blocked_channels=True, cpu_convolution=True),
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
    "InstanceNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=2, stats_axis=2),
    "GroupNormalization": Saves(inputs=(0, 1), stats="rows", stats_values=2, stats_axis=2),
    # the loss, appended after the model's output (see LOSSES)
    "NegativeLogLikelihoodLoss": UNARY_INPUT,
    # output.mean() is ReduceMean: nothing kept; its backward expands the gradient into a new output-sized one
    "MeanSquaredError": Saves(inputs=(0,), input_sized_extra=1),  # mse_loss(input, target) keeps both
    # recurrent: aten::mkldnn_rnn_layer (CPU) keeps its input, initial states, outputs and a workspace
    "LSTM": Saves(inputs=(0, 5, 6), outputs=(0, 1, 2), recurrent="LSTM"),
    "GRU": Saves(inputs=(0, 5), recurrent="GRU"),  # the cells keep the layer's input; the rest is in RECURRENT
}

# PyTorch on CPU keeps its autograd graph on the heap, outside c10's allocator (what the profiler sees): the nodes,
# their edges and saved-variable records, and one gradient accumulator per parameter. Measured with an LD_PRELOAD
# malloc counter against the profiler's c10 peak, one training step each (benchmarks/accuracy_training.py's own
# models: Linear/ReLU and LayerNorm/Linear/GELU chains of 8 and 32 layers, the MLPs, a tiny GPT, a ViT block):
# 1,050-1,730 bytes per differentiable op of the graph and trainable parameter (840-1,420 per autograd node). Counted
# on CPU (on CUDA it is host memory, not the device's) from each op's forward to the step's end: the training loop
# holds the output, which holds the graph.
CPU_AUTOGRAD_BYTES_PER_NODE = 1200


@dataclass(frozen=True)
class OnednnPrimitives:
    """The heap oneDNN keeps for each convolution primitive it creates (PyTorch 2.13's mkldnn convolution, fp32),
    in bytes: measured with the malloc counter in one process, primitive by primitive, the kinds and
    implementations named by ONEDNN_VERBOSE=all's create:cache_miss lines (benchmarks/conv_backward.py
    --primitives). oneDNN keeps every primitive it creates in its primitive cache (1024 entries by default), keyed
    by its descriptor (shapes, strides, padding, data type, propagation kind, attributes): a second convolution of
    the same shapes creates nothing, so the bytes are counted once per distinct descriptor, held from the step that
    creates it to the process's end (nearly all of it: the first forward and backward free within 20 KB of what
    they keep). Besides the convolutions, the reorders to and from oneDNN's blocked layout are cached primitives
    too, one per (tensor shape, layout pair), shared by every convolution that reorders a tensor of that shape.

    By implementation (AVX2): `jit` (jit:avx2, any kernel but 1x1 and depthwise), `depthwise` (jit_dw),
    `one_by_one` (jit_1x1, a 1x1 convolution on the oneDNN path), `gemm` (the weights' gradient by oneDNN's gemm
    convolution, where CPU_CONVOLUTION says), `strided` (brgconv_strided: the input's gradient of a strided
    convolution that is not depthwise; 1x1: `strided_one_by_one`). The strided kernel's size varies with the shapes
    (109-183 KB for 3x3/2 on 4x4-32x32 inputs, 328 KB on a 2x2 input): the constant is its usual size.
    """

    forward_jit: int = 42_200
    forward_depthwise: int = 43_100
    forward_one_by_one: int = 53_400
    forward_strided_one_by_one: int = 59_200
    backward_data_jit: int = 43_300
    backward_data_depthwise: int = 45_200
    backward_data_one_by_one: int = 41_350
    backward_data_strided: int = 109_400
    backward_data_strided_one_by_one: int = 73_500
    backward_weights_jit: int = 20_400
    backward_weights_depthwise: int = 18_100
    backward_weights_one_by_one: int = 41_350
    backward_weights_gemm: int = 12_500
    reorder: int = 11_300  # a blocked reorder (jit:uni, jit:blk); a plain copy is 10,216
    # the exact (erf) GELU: ATen runs it in oneDNN's eltwise (jit:avx2) on a contiguous fp32 tensor of over one
    # element (not channels-last, not bf16 on AVX2, not tanh), one forward_training and one backward_data primitive
    # per distinct shape; measured with the malloc counter over six shapes, each in one process after the same
    # shapes' tensors (benchmarks/gemm_buffers.py --gelu): forward 15,352-15,736 B (19,488 for 8x65x768), forward
    # and backward together 32,352-33,008 B
    eltwise_gelu_forward: int = 15_600
    eltwise_gelu_backward: int = 17_200
    # the process's first such GELU takes more, once, in its forward (oneDNN's eltwise kernels made the first time):
    # measured with the malloc counter, the first GELU's forward and backward less a later new shape's, after
    # autograd's first-time work (benchmarks/gemm_buffers.py --gelu): 36,704-38,176 B over two shapes; 33,600 B after
    # a convolution's primitives (torchvision's ViT: its patch embedding comes first)
    eltwise_gelu_first_use: int = 36_700
    # oneDNN's LSTM (PyTorch's mkldnn_rnn_layer, fp32, forward_training and backward): per layer and direction a
    # forward and a backward RNN primitive and the reorders of its weights to and from oneDNN's packed layout, kept
    # in the primitive cache. Measured with the malloc counter (benchmarks/gemm_buffers.py --lstm): the heap a
    # training step of nn.LSTM leaves in a fresh process, over 1-3 layers, one or two directions, 8-100 input and
    # 16-200 hidden features, batch 2-8 and 4-32 steps (neither changes it): `lstm_first_use` once per process, then
    # `lstm_direction` per distinct (input features, hidden, direction) and `lstm_weights_reorder` per distinct
    # input width other than the hidden size (with it, the input and recurrent weights' reorders are one
    # descriptor); within 25 KB over (a hidden size not a multiple of 32 measured up to 24.8 KB more); about 1.8 KB
    # more per further layer of a descriptor already made (not counted)
    lstm_first_use: int = 341_100
    lstm_direction: int = 178_200
    lstm_weights_reorder: int = 24_600


@dataclass(frozen=True)
class MklGemmBuffers:
    """The packing buffers MKL's GEMMs take through malloc (outside PyTorch's allocator: the malloc counter sees
    them, the profiler does not) and keep for the process's life. Measured on torch 2.13.0+cpu (MKL 2024.2, AVX2,
    one thread) with the malloc counter, one fp32 torch.mm per fresh process over M in 1-4096, N in 64-16384,
    K in 2-4096 and every transpose (benchmarks/gemm_buffers.py), and MKL's sgemm and gemm_bf16bf16f32 called
    directly as PyTorch calls them over odd sizes (benchmarks/gemm_buffers.py --direct): the law below gives every
    measured block to within 3.5 KB under (to the byte up to about 1 MB, 3,424 B under above). For a GEMM whose
    output C is M x N (M rows, N contiguous columns; MKL_VERBOSE names them n and m: PyTorch hands MKL the
    column-major transpose) reducing over K, with N rounded up to a multiple of `column_multiple` and MKL's K block
    kc = `k_block_min` for K <= `k_block_min`, K up to `k_block`, K // 2 up to 2 `k_block`, else `k_block`:

        block = `block` + element x kc x (min(N, `columns_max`) + min(`rows_per_row` x M, `rows_max`))

    Transposes do not change it; a GEMM with M under `rows_min` or N under `columns_min` runs MKL's small-matrix
    path and takes none (measured: M of 1-3, N of 1-11, at K of 64-1024 and N up to 4,000).
    MKL keeps each buffer it frees in its own pool and hands it to any later request it fits (the smallest that
    fits): a GEMM larger than every block made before makes a new one, and the smaller blocks stay (measured:
    64x4096x1024 then 4096x4096x1024 in one process holds both blocks, 3.27 + 3.75 MB). So a step holds the blocks
    of the GEMMs that are each larger than all before them, from that GEMM on, and a later step holds them all from
    its start; plus `first_use` bytes the first GEMM of a process takes once (through torch.mm). MKL never returns
    them (mkl_free_buffers would; PyTorch does not call it). Checked against MKL_VERBOSE's list of a training
    step's sgemm calls: ResNet-50, timm's ConvNeXt-atto and GPT-2 give the same blocks from the graph as from the
    calls.

    bf16 operands into an fp32 result (MKL's gemm_bf16bf16f32, which PyTorch calls only where the result is fp32:
    flash attention's GEMMs, CpuFlashAttention; a bf16 torch.mm or Linear under autocast runs elsewhere and keeps
    nothing) are converted to fp32 first: the GEMM asks the pool for a copy of MKL's A (column-major: the row-major
    B), one of its B, then the block (each copy its stored rows x its contiguous dim rounded up to a multiple of
    `converted_multiple`, in fp32), the smallest free buffer that fits each; the process's first such GEMM takes
    `low_precision_first_use` once (`low_precision_first_use_after_fp32` where an sgemm ran before). Measured over
    26 shapes and 8 sequences of both kinds in one process: every figure to the byte up to 1 MB, within 11.5 KB
    above. fp16 not measured.
    With T threads each thread packs its own block (measured 1.71 MB at two threads for a 0.90 MB block at one):
    the rule is for one thread, as the benchmarks run; an AVX-512 CPU's MKL blocks differently (not measured:
    taken as AVX2's).
    """

    first_use: int = 2_248
    block: int = 17_064
    rows_min: int = 4
    columns_min: int = 12
    k_block: int = 192
    k_block_min: int = 128
    column_multiple: int = 16
    columns_max: int = 6_400
    rows_per_row: int = 2
    rows_max: int = 768
    element_bytes: tuple[int, ...] = (4,)
    low_precision_element_bytes: tuple[int, ...] = (2,)  # bf16 (gemm_bf16bf16f32)
    low_precision_first_use: int = 8_472
    low_precision_first_use_after_fp32: int = 4_336
    converted_multiple: int = 4


@dataclass(frozen=True)
class CpuFlashAttention:
    """The GEMMs of PyTorch's CPU flash attention (F.scaled_dot_product_attention without dropout), which run in
    MKL (sgemm in fp32, gemm_bf16bf16f32 in bf16: MklGemmBuffers). Per batch and head, the queries go in blocks of
    `q_split` rows (the first `q_split_by_length` entry whose length the query length reaches, else
    `q_split_min`; the last block the rest), the keys in blocks of `kv_split` (the last the rest); per pair of
    blocks the forward runs the scores (q_block k_block^T) and the output (scores v_block), the backward recomputes
    the scores, then the value's gradient (scores^T grad_out), the scores' gradient (grad_out v_block^T), the
    query's (grad_scores k_block) and the key's (grad_scores^T q_block). In bf16 the backward runs only the scores
    and their gradient in MKL (the rest accumulates elsewhere). Read from MKL_VERBOSE over query lengths 65, 70,
    300, 800 and key lengths 65, 300, 600, 800 (torch 2.13.0+cpu, one thread). A causal attention runs the same
    shapes (measured at 65 and 300) but skips key blocks past the diagonal (70 queries over 600 keys: the 88-key
    block never runs): counted here, as the graph does not say is_causal; a skipped block is never the largest."""

    q_split_by_length: tuple[tuple[int, int], ...] = ((768, 256), (192, 64))
    q_split_min: int = 32
    kv_split: int = 512
    backward_fp32: tuple[str, ...] = ("scores", "value_grad", "scores_grad", "query_grad", "key_grad")
    backward_low_precision: tuple[str, ...] = ("scores", "scores_grad")


@dataclass(frozen=True)
class CpuIsa:
    """What a CPU's instruction set changes in PyTorch's CPU kernels (oneDNN picks its kernels by it)."""

    channel_block: int  # oneDNN's blocked layout pads channels (axis 1) to this multiple
    mkldnn_element_bytes: tuple[int, ...]  # element sizes whose convolutions run in oneDNN (others: slow_conv2d)
    primitives: OnednnPrimitives = OnednnPrimitives()  # the heap each cached oneDNN primitive keeps
    gemm: MklGemmBuffers = MklGemmBuffers()  # MKL's GEMM packing buffers, kept for the process's life
    flash_attention: CpuFlashAttention = CpuFlashAttention()  # the GEMMs flash attention runs in MKL


# By the CPU the training runs on (TrainingOptions.cpu_isa; detect_cpu_isa for the machine onnxmem runs on):
CPU_ISAS: dict[str, CpuIsa] = {
    # nChw8c with jit:avx2 kernels (measured with ONEDNN_VERBOSE and the profiler on torch 2.13.0+cpu, oneDNN v3.12,
    # an AVX2 AMD EPYC: a 24- or 40-channel gradient is reordered at its own size); bf16/fp16 convolutions run
    # ATen's slow_conv2d (measured under torch.autocast).
    "avx2": CpuIsa(channel_block=8, mkldnn_element_bytes=(4,)),
    # nChw16c with AVX-512 kernels (measured on an AVX-512 CPU: the fixtures' training table of 2026-11-23 is exact
    # with it); bf16 convolutions run in oneDNN where AVX-512 BW/VL/DQ are present (ATen's
    # mkldnn_bf16_device_check), taken from the source, not measured here.
    # Its primitives' sizes are not measured: taken as AVX2's (its JIT kernels differ; the descriptors and
    # primitive objects that make most of the bytes do not).
    "avx512": CpuIsa(channel_block=16, mkldnn_element_bytes=(4, 2)),
}


@dataclass(frozen=True)
class CpuConvolution:
    """How PyTorch 2.13 runs a 1-D or 2-D convolution's backward on CPU (fp32, contiguous NCHW), and what it
    allocates besides the gradients it returns. Measured with the profiler's memory events on single convolutions
    (benchmarks/conv_backward.py), the kernels named by ONEDNN_VERBOSE; the paths from ATen's Convolution.cpp
    (ConvParams::use_mkldnn) and oneDNN's implementations' init_conf.

    Path: oneDNN (aten::mkldnn_convolution) unless ATen's slow_conv2d is taken: a 1x1 unstrided convolution of
    groups 1 with a batch under `mkldnn_min_batch_1x1` on one thread, or a batch-1 input of under
    `mkldnn_min_batch1_numel` elements (kernel not larger than 3 in both dims, groups 1).

    bf16 and fp16 (autocast included) run oneDNN only where the CPU supports them (CpuIsa.mkldnn_element_bytes):
    on the measured AVX2 CPU they take slow_conv2d.

    slow_conv2d: an im2col buffer of the batch x C x kernel x output-spatial elements in forward and again in
    backward (none for a 1x1 unstrided one); grouped, it runs one group at a time (C / groups channels), the
    groups' outputs and input gradients made apart and concatenated. oneDNN's forward reorders the input and the
    weight and computes the output blocked, then makes it dense (I_p + W_p + O_p, then O_p + O).

    oneDNN, the input's gradient first (when the input needs one), then the weight's; channels padded to
    the CPU's channel block (CpuIsa.channel_block) in the blocked tensors (the "_p" sizes):
    - input: the output gradient and the weight reordered, the input gradient in a blocked buffer (O_p + W_p +
      I_p), then that buffer and the dense gradient (I_p + I; a strided, not depthwise, one holds one more
      input-sized buffer: I_p + 2 I).
    - weight, by a jit kernel: the dense input gradient made above, the input and the output gradient reordered
      and the weight gradient blocked (I_p + O_p + W_p; an input of `flat_channels` channels is read as it is),
      then the blocked weight gradient and its dense copy. By oneDNN's gemm convolution (when the kernel is larger
      than the input in a dim or as wide as `jit_max_kernel_width`; for a depthwise one also any kernel larger
      than `depthwise_jit_max_kernel`): no reorders, the weight gradient and a scratchpad of
      `gemm_weight_copies` weight-sized buffers (oneDNN books the weights' bytes as floats) and an im2col buffer
      of C / groups x kernel x output-spatial elements, plus `gemm_scratch_alignment` bytes; once per thread
      where it threads over the batch (fewer than `gemm_outer_threading_max_spatial` output positions per thread
      and a batch over 1), else once. Its gemm also packs `gemm_pack_rows` rows of C / groups x kernel floats
      through malloc (outside PyTorch's allocator: the malloc counter sees it, the profiler does not) where the
      convolution has more than `gemm_pack_min_out_channels` output channels and over one output position, per
      thread as its scratchpad (measured 0.3-2.4 MB at 64-512 input channels; none at 128 or 256 output channels).
    The op's peak over its gradients is the largest of these moments less the gradients it returns.
    """

    mkldnn_min_batch_1x1: int = 16
    mkldnn_min_batch1_numel: int = 20481
    flat_channels: int = 3
    jit_max_kernel_width: int = 14
    depthwise_jit_max_kernel: int = 3
    gemm_weight_copies: int = 4
    gemm_scratch_alignment: int = 256
    gemm_outer_threading_max_spatial: int = 256
    gemm_pack_rows: int = 128
    gemm_pack_min_out_channels: int = 257


CPU_CONVOLUTION = CpuConvolution()


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
    cpu_unrolled values per step, batch row and hidden unit (new tensors; the cell's inputs are views); its
    forward holds cpu_unrolled_forward more while the op runs (the input projection of every step at once).
    On CPU an input that is a transposed view (batch_first: a Transpose before the op) is copied contiguous and
    the copy kept (cpu_contiguous_input; LSTM: aten::clone before mkldnn_rnn_layer; GRU: the input projection's
    reshape), measured with the profiler; and oneDNN's backward makes a transposed output gradient contiguous (an
    output-sized temporary, cpu_contiguous_output_grad: the batch_first output's Transpose after the op).
    """

    gates: int
    state_rows: int
    diff_rows: int
    cuda_values: int
    cpu_unrolled: int = 0
    cpu_unrolled_forward: int = 0
    # the unrolled op's autograd nodes (CPU_AUTOGRAD_BYTES_PER_NODE each) per step and per layer and direction,
    # besides its parameters' accumulators
    cpu_unrolled_nodes: tuple[int, int] = (0, 0)
    cpu_contiguous_input: bool = True
    cpu_contiguous_output_grad: bool = False


RECURRENT: dict[str, Recurrent] = {
    # oneDNN LSTM: states of the layer, iteration and cell (2 layers of T + 1 steps each); the gradients of
    # the layer and iteration states and of the cell; cuDNN: 4 gates, the cell and hidden states per step
    "LSTM": Recurrent(gates=4, state_rows=6, diff_rows=5, cuda_values=6, cpu_contiguous_output_grad=True),
    # PyTorch 2.13 runs GRU on CPU as an unrolled cell (aten::gru, no oneDNN): measured with saved-tensor hooks,
    # 7 new values per step, batch row and hidden unit (the gates, the reset product, the new state); its forward
    # projects the input of all steps at once (3 values per step, one mm, freed when the layer is done: measured
    # with the profiler); its autograd graph, counted from the output's grad_fn on nn.GRU at 4, 8 and 16 steps
    # and 1 and 2 layers: 14 nodes a step and 7 a layer besides the 4 parameters' accumulators; cuDNN's reserve
    # space for GRU is not measured: cuda_values as LSTM's
    "GRU": Recurrent(gates=3, state_rows=0, diff_rows=0, cuda_values=6, cpu_unrolled=7, cpu_unrolled_forward=3,
                     cpu_unrolled_nodes=(14, 7)),
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
    "scaled_dot_product_attention(dropout)": Saves(copies=(0, 1), copies_when_view=(2,), attention_probabilities=3,
                                                   fp32_on_cpu=True),
}

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
# once per step into autocast's cache) and ops that run in fp32 (on CUDA; on CPU see AUTOCAST_FP32_CPU); the rest
# follow their inputs.
AUTOCAST_LOW_PRECISION: frozenset[str] = frozenset({
    "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "com.microsoft::Attention", "Attention",
    "aten::scaled_dot_product_attention",
})
# On CPU, autocast's fp32 list is the losses (cross_entropy_loss, nll_loss, mse_loss, ...) and rarer ops, not
# softmax, layer_norm, exp or pow (they follow their inputs: measured, GPT-2's tanh GELU keeps bf16 tensors): the
# ops of the loss onnxmem appends, and these.
AUTOCAST_FP32_CPU: frozenset[str] = frozenset({
    "NegativeLogLikelihoodLoss", "MeanSquaredError", "SoftmaxCrossEntropyLoss", "ReduceProd", "CumSum",
})
AUTOCAST_FP32: frozenset[str] = frozenset({
    "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization", "Exp", "Log", "Pow", "ReduceSum",
    "ReduceProd", "CumSum", "Reciprocal", "Softplus", "NegativeLogLikelihoodLoss", "MeanSquaredError",
    "aten::log_softmax", "aten::_log_softmax", "aten::softmax", "aten::_softmax", "aten::layer_norm",
    "aten::native_layer_norm", "aten::group_norm", "aten::native_group_norm", "aten::softplus", "aten::rms_norm",
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
