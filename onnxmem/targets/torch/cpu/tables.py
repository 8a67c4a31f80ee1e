"""PyTorch on CPU as data: what its kernels and libraries keep and allocate besides the tensors autograd saves.

The autograd graph's heap (CPU_AUTOGRAD_BYTES_PER_NODE), oneDNN's cached primitives (OnednnPrimitives), MKL's GEMM
packing buffers (MklGemmBuffers) and the GEMMs flash attention runs in MKL (CpuFlashAttention), by instruction set
(CPU_ISAS); how a convolution's backward runs and what it allocates (CPU_CONVOLUTION); what a recurrent op keeps
(CPU_RECURRENT); the CPU facts of each op (CPU_KERNELS, keyed as training/rules.py's SAVED_FOR_BACKWARD: ONNX op
types, 'domain::OpType', 'aten::<op>'); autocast's fp32 ops on CPU (AUTOCAST_FP32_CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

# PyTorch on CPU keeps its autograd graph on the heap, outside c10's allocator (what the profiler sees): the nodes,
# their edges and saved-variable records, and one gradient accumulator per parameter. Measured with an LD_PRELOAD
# malloc counter against the profiler's c10 peak, one training step each (benchmarks/accuracy_training.py's own
# models: Linear/ReLU and LayerNorm/Linear/GELU chains of 8 and 32 layers, the MLPs, a tiny GPT, a ViT block):
# 1,050-1,730 bytes per differentiable op of the graph and trainable parameter (840-1,420 per autograd node). Counted
# on CPU (on CUDA it is host memory, not the device's) from each op's forward to the step's end: the training loop
# holds the output, which holds the graph.
CPU_AUTOGRAD_BYTES_PER_NODE = 1200

# The heap peak of a frozen nn.LSTM's forward on CPU (nothing before it or in it needs a gradient: PyTorch runs
# oneDNN's inference primitive), above its input, in a fresh process, one thread (malloc counter,
# benchmarks/training_single_ops.py --frozen-lstm): 2,327,352 bytes for 1 layer of 64 -> 128 units, batch 4, 32
# steps; 2,641,008 with 2 layers; 3,719,984 at batch 8; 3,691,424 at 64 steps; 4,676,464 at 256 units; 2,483,208
# with 128 input features. Its output is 65-131 KB of it; the rest is not modelled (only a stated range, in the
# unmodelled-kernel warning), as its dependence on the shapes was not measured enough to write a rule.
FROZEN_LSTM_FORWARD_HEAP = (2_327_352, 4_676_464)


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
    # the process's first weight gradient by oneDNN's gemm convolution (x64:gemm:jit) JITs oneDNN's own sgemm
    # kernels, kept from then on: `gemm_first_use` at the first one of any kind, and `gemm_dense_first_use` more at
    # the first that is not depthwise. Measured with the malloc counter (fresh processes after warm_up, fp32, one
    # thread: what the first call of a convolution's backward keeps beyond a later new shape's primitives,
    # benchmarks/training_single_ops.py --gemm-conv-first-use): dense 3x3 on 2x2 (32-128 channels, batch 4-8) and
    # 5x5 on 2x2 keep 311.2-311.6 KB once; a depthwise 7x7 on 4x4 59.9 KB once, and a dense one after it 251.3 KB
    gemm_first_use: int = 59_900
    gemm_dense_first_use: int = 251_300
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


# By the CPU the training runs on (TorchCpu.isa; detect_cpu_isa for the machine onnxmem runs on):
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

    A channels-last input (its strides: targets/torch/cpu/layout.py) makes oneDNN run in NHWC, with other scratch
    (measured with the malloc counter, fp32, one thread, batch 4 and 8, 2x2 to 32x32 images: the malloc counter's
    single-op runs behind benchmarks/training_single_ops.py --conv-channels-last), where the kernel is not larger
    than the input: a dense convolution holds the weight in channels-last and reordered in forward (2 W) and in
    backward, with the weight's gradient blocked, 3 W (2 W for the input's gradient alone), whatever the batch and
    spatial size; a 1x1 one nothing (a GEMM on the NHWC input); a depthwise one its reordered weight, and for its
    weight's gradient with a kernel larger than `depthwise_jit_max_kernel` one column buffer of C x kernel x
    `channels_last_depthwise_positions` output positions (oneDNN's gemm convolution in NHWC, by blocks of
    output positions), whatever the batch and spatial size. A kernel larger than the input takes the NCHW rules.
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
    channels_last_depthwise_positions: int = 64


CPU_CONVOLUTION = CpuConvolution()



@dataclass(frozen=True)
class CpuRecurrent:
    """What a recurrent op keeps for backward on CPU besides its tensors, per direction, from its shapes (T steps,
    B batch, I input and H hidden features; ld(n) is oneDNN's leading dimension: n rounded up to 16 floats, plus
    16 more when that is a multiple of 256).

    oneDNN's RNN primitive, one call per layer: a workspace of fp32 rows of B x ld floats: T rows of gates
    (ld(gates x H)), state_rows x (T + 1) rows of states (ld(max(I, H))) and diff_rows x (T + 1) - 1 rows of
    state gradients (ld(H)). Its backward holds the weights reordered (I + H rows of ld(gates x H)) and the
    gates' scratch (T x B rows of ld(gates x H)) and four B x H state gradients for a moment.
    Without oneDNN (unrolled > 0): PyTorch runs the op as a loop of cells whose autograd keeps `unrolled` values
    per step, batch row and hidden unit (new tensors; the cell's inputs are views); its forward holds
    `unrolled_forward` more while the op runs (the input projection of every step at once).
    An input that is a transposed view (batch_first: a Transpose before the op) is copied contiguous and the copy
    kept (contiguous_input; LSTM: aten::clone before mkldnn_rnn_layer; GRU: the input projection's reshape),
    measured with the profiler; and oneDNN's backward makes a transposed output gradient contiguous (an
    output-sized temporary, contiguous_output_grad: the batch_first output's Transpose after the op).
    """

    gates: int
    state_rows: int
    diff_rows: int
    unrolled: int = 0
    unrolled_forward: int = 0
    # the unrolled op's autograd nodes (CPU_AUTOGRAD_BYTES_PER_NODE each) per step and per layer and direction,
    # besides its parameters' accumulators
    unrolled_nodes: tuple[int, int] = (0, 0)
    contiguous_input: bool = True
    contiguous_output_grad: bool = False


# By Saves.recurrent
CPU_RECURRENT: dict[str, CpuRecurrent] = {
    # oneDNN LSTM: states of the layer, iteration and cell (2 layers of T + 1 steps each); the gradients of
    # the layer and iteration states and of the cell
    "LSTM": CpuRecurrent(gates=4, state_rows=6, diff_rows=5, contiguous_output_grad=True),
    # PyTorch 2.13 runs GRU on CPU as an unrolled cell (aten::gru, no oneDNN): measured with saved-tensor hooks,
    # 7 new values per step, batch row and hidden unit (the gates, the reset product, the new state); its forward
    # projects the input of all steps at once (3 values per step, one mm, freed when the layer is done: measured
    # with the profiler); its autograd graph, counted from the output's grad_fn on nn.GRU at 4, 8 and 16 steps
    # and 1 and 2 layers: 14 nodes a step and 7 a layer besides the 4 parameters' accumulators
    "GRU": CpuRecurrent(gates=3, state_rows=0, diff_rows=0, unrolled=7, unrolled_forward=3, unrolled_nodes=(14, 7)),
}


@dataclass(frozen=True)
class CpuKernel:
    """What an op's CPU kernel keeps or allocates besides the tensors its rule in SAVED_FOR_BACKWARD keeps."""

    # temporaries while backward runs, in output-sized and input-sized (when input 0 needs a gradient) buffers:
    # oneDNN's convolution backward reorders the output gradient and computes the input's in a scratch
    backward_temporaries: tuple[int, int] = (0, 0)
    # the kernel whose backward scratch CPU_CONVOLUTION gives from the op's shapes (instead of the temporaries
    # above, where the shapes say how PyTorch runs it)
    convolution: bool = False
    # those temporaries are in oneDNN's blocked layout: channels (axis 1) padded to the CPU's channel block
    blocked_channels: bool = False
    # the extra the rule keeps (extra_bits_per_output_element) has output 0's dtype (aten::dropout's float noise)
    extra_like_output: bool = False
    # the op computes in fp32 from 16-bit inputs (the math path's query.to(float), under autocast too): the copies
    # and [..., q_len, kv_len] tensors its rule keeps are fp32
    fp32: bool = False
    # the math attention's backward (BmmBackward, the dropout's MulBackward, SoftmaxBackward, BmmBackward in turn,
    # each freeing what it kept as it ends) peaks at this many fp32 [..., q_len, kv_len] tensors and fp32 query-sized
    # ones over what was live before it (fp32 step; under autocast, where q, k and v's fp32 gradients are cast to
    # 16 bits, the second figure), within 9 KB: measured with the malloc counter on five shapes (batch 2-8, 2-8
    # heads, 32-199 tokens, head dim 8-64; benchmarks/training_single_ops.py --sdpa-dropout-backward)
    attention_backward: tuple[int, int] = (0, 0)
    attention_backward_autocast: tuple[int, int] = (0, 0)


CPU_KERNELS: dict[str, CpuKernel] = {
    "Conv": CpuKernel(backward_temporaries=(1, 1), blocked_channels=True, convolution=True),
    "ConvTranspose": CpuKernel(backward_temporaries=(1, 1), blocked_channels=True),
    "Dropout": CpuKernel(extra_like_output=True),
    # sdpa with dropout runs PyTorch's math path, in fp32 on CPU (measured under autocast to bf16: BmmBackward keeps
    # fp32 tensors)
    "aten::scaled_dot_product_attention(dropout)": CpuKernel(fp32=True, attention_backward=(1, 1),
                                                            attention_backward_autocast=(1, 2)),
    # and so does the math path it takes for k and v broadcast to more query heads (attention.py)
    "aten::scaled_dot_product_attention(math-gqa)": CpuKernel(fp32=True),
    "aten::scaled_dot_product_attention(dropout-gqa)": CpuKernel(fp32=True),
}

# On CPU, autocast's fp32 list is the losses (cross_entropy_loss, nll_loss, mse_loss, ...) and rarer ops, not
# softmax, layer_norm, exp or pow (they follow their inputs: measured, GPT-2's tanh GELU keeps bf16 tensors): the
# ops of the loss onnxmem appends, and these.
AUTOCAST_FP32_CPU: frozenset[str] = frozenset({
    "NegativeLogLikelihoodLoss", "MeanSquaredError", "SoftmaxCrossEntropyLoss", "ReduceProd", "CumSum",
})

# An elementwise op (training/rules.py TYPE_PROMOTING) whose inputs differ in float width computes in the promoted
# dtype; PyTorch's TensorIterator on CPU (no dynamic casting there, unlike CUDA) first copies each narrower input
# to that dtype, a temporary of the input's elements at the output's width held while the op runs. Measured under
# autocast to bf16 (benchmarks/training_zoo_amp_ops.py: linear_layernorm, nonorm_bottleneck; torch.add traced op by
# op with the malloc counter): a (4, 32, 128) bf16 Linear output added to an
# fp32 residual holds 65,536 B besides its fp32 output (the bf16 input at 4 bytes), a (4, 32, 64) one 32,768 B; an
# fp32 input times an fp32 weight none.
CPU_PROMOTED_INPUT_COPIES: bool = True
