"""PyTorch training on CPU: what the step model asks of the device, answered for CPU (TorchCpu).

Besides the tensors autograd keeps, PyTorch's CPU kernels and libraries allocate on the process's heap: a
convolution's oneDNN reorders and scratch or slow_conv2d's columns (convolution.py), a recurrent op's oneDNN
workspace or an unrolled GRU's cells (tables.py CPU_RECURRENT), a dropout's float noise, the math attention's fp32
copies (tables.py CPU_KERNELS), the autograd graph (tables.py CPU_AUTOGRAD_BYTES_PER_NODE), oneDNN's cached
primitives (primitives.py) and MKL's GEMM packing buffers (gemm.py), kept for the process's life. PyTorch's
intra-op threads and the CPU's instruction set change which kernels run: the device's two options.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import onnxmem.targets.torch.cpu.attention as attention
from onnxmem.errors import TrainingOptionError
from onnxmem.ir.graph import ModelGraph
from onnxmem.targets.torch.base import DeviceOption, HeldPeaks, LibraryBuffer, NodeContext, NodeFacts
from onnxmem.targets.torch.cpu.convolution import CpuRun, Primitive, channel_padded, node_convolution_scratch
from onnxmem.targets.torch.cpu.gemm import Gemm, mkl_gemm_held, node_gemms
from onnxmem.targets.torch.cpu.isa import detect_cpu_isa
from onnxmem.targets.torch.cpu.layout import channels_last
from onnxmem.targets.torch.cpu.primitives import node_primitives
from onnxmem.targets.torch.cpu.tables import (
    AUTOCAST_FP32_CPU,
    CPU_AUTOGRAD_BYTES_PER_NODE,
    CPU_ISAS,
    CPU_KERNELS,
    CPU_PROMOTED_INPUT_COPIES,
    CPU_RECURRENT,
    FROZEN_LSTM_FORWARD_HEAP,
    CpuIsa,
    CpuKernel,
    CpuRecurrent,
)
from onnxmem.training.rules import TYPE_PROMOTING
from onnxmem.training.values import RecurrentDims, StepNode, StepValue, known_shape, saves_rule

CAVEAT = ("the CPU device model counts PyTorch's CPU heap as measured with a malloc counter on torch 2.13 (AVX2, "
          "one thread; AVX-512's primitives and MKL blocks taken as AVX2's)")


@dataclass(frozen=True)
class CpuLibraryUses:
    """What the step's ops ask of oneDNN and MKL on CPU, per node: the primitives they create, the GEMMs they run."""

    primitives: dict[int, tuple[Primitive, ...]] = field(default_factory=dict)
    gemms: dict[int, tuple[Gemm, ...]] = field(default_factory=dict)


def _isa_names() -> Sequence[str]:
    return sorted(CPU_ISAS)


@dataclass(frozen=True)
class TorchCpu:
    """PyTorch on CPU: `threads` intra-op threads (torch.get_num_threads()), on a CPU of instruction set `isa` (a key
    of tables.py CPU_ISAS; None: the CPU onnxmem runs on, detect_cpu_isa)."""

    threads: int = 1
    isa: str | None = None
    name: str = "cpu"
    # measured: StableLM's attention output, transposed then .contiguous(), is a second storage while o_proj keeps it
    # (benchmarks/training_single_ops.py --clone)
    clone_makes_storage: bool = True
    # an elementwise op over inputs of different float widths copies each narrower one to the promoted dtype
    # (TensorIterator without dynamic casting on CPU; tables.py CPU_PROMOTED_INPUT_COPIES)
    promotes_by_copy: bool = CPU_PROMOTED_INPUT_COPIES
    options: Sequence[DeviceOption] = (
        DeviceOption("threads", int, "PyTorch's intra-op threads (torch.get_num_threads()); they pick the "
                     "convolution kernel and multiply its scratch (default 1)", minimum=1),
        DeviceOption("isa", str, "the instruction set of the CPU that trains (oneDNN's channel block and bf16 "
                     "kernels differ); default: this machine's", choices=_isa_names),
    )
    default_update_impl: str = "for-loop"
    autograd_node_bytes: int = CPU_AUTOGRAD_BYTES_PER_NODE
    caveat: str = CAVEAT

    @property
    def instruction_set(self) -> CpuIsa:
        """Give the kernel facts of the CPU's instruction set (tables.py CPU_ISAS), of `isa` or of this machine."""
        return CPU_ISAS[self.isa or detect_cpu_isa()]

    def check(self) -> None:
        """Raise TrainingOptionError for threads under 1 or an instruction set not in CPU_ISAS."""
        if self.threads < 1:
            raise TrainingOptionError("cpu_threads must be at least 1 (device option threads)")
        if self.isa is not None and self.isa not in CPU_ISAS:
            raise TrainingOptionError(f"unknown CPU instruction set '{self.isa}': choose one of {', '.join(CPU_ISAS)}")

    def autocast_fp32(self, key: str, appended_loss: bool) -> bool:
        """Say whether autocast on CPU runs the op in fp32: the loss onnxmem appends, and AUTOCAST_FP32_CPU."""
        return appended_loss or key in AUTOCAST_FP32_CPU

    def _run(self, precision: str) -> CpuRun:
        return CpuRun(precision, self.threads, self.instruction_set)

    def kernel_key(self, context: NodeContext) -> str:
        """Give the attention kernel's rule where the op is scaled_dot_product_attention (attention.py: flash
        attention, or the math path with dropout or with k and v broadcast to more query heads), the generic key
        otherwise."""
        if context.key not in (attention.FUSED, attention.WITH_DROPOUT):
            return context.key
        return attention.rule_key(context)

    def node_facts(self, context: NodeContext) -> NodeFacts:
        """Give what the op's CPU kernel keeps and allocates besides its tensors: a convolution's scratch (or the
        kernel's output- and input-sized temporaries, in oneDNN's blocked layout), a recurrent op's workspace and
        scratch, a dropout's float noise, the math attention's fp32 copies (tables.py CPU_KERNELS,
        CPU_RECURRENT)."""
        node, values, needs_grad = context.node, context.values, context.needs_grad
        inputs = node.inputs
        out0 = values[node.outputs[0]] if node.outputs and node.outputs[0] >= 0 else None
        kernel = CPU_KERNELS.get(context.key)
        kept = backward = forward = 0
        autograd_nodes = None
        if kernel is not None:
            per_output, per_input = kernel.backward_temporaries
            scratch = node_convolution_scratch(node, values, needs_grad, self._run(context.precision),
                                               _input_channels_last(context)) if kernel.convolution else None
            if scratch is not None:
                backward, forward = scratch
            elif out0 is not None and (per_output or per_input):
                first_input = inputs[0] if inputs and inputs[0] >= 0 else None
                input_bytes = values[first_input].nbytes if first_input is not None and needs_grad[first_input] else 0
                output_bytes = out0.nbytes
                if kernel.blocked_channels:
                    block = self.instruction_set.channel_block
                    output_bytes = channel_padded(out0, output_bytes, block)
                    input_bytes = channel_padded(values[first_input], input_bytes, block) \
                        if first_input is not None else 0
                backward = per_output * output_bytes + per_input * input_bytes
            backward += _attention_backward(context, kernel)
        recurrent = CPU_RECURRENT.get(context.recurrent) if context.recurrent else None
        if recurrent is not None:
            dims = context.recurrent_dims
            kept, scratch_bytes, forward_bytes = recurrent_bytes(recurrent, dims)
            if recurrent.contiguous_input and inputs and inputs[0] >= 0 \
                    and _producer_op_type(context.graph, values[inputs[0]].name) == "Transpose":
                kept += values[inputs[0]].nbytes
            if recurrent.contiguous_output_grad and out0 is not None and _read_transposed(context.graph, out0.name):
                backward += out0.nbytes
            backward += scratch_bytes
            forward += forward_bytes
            if recurrent.unrolled_nodes != (0, 0) and dims is not None:
                per_step, per_layer = recurrent.unrolled_nodes
                autograd_nodes = dims[1] * (per_step * dims[0] + per_layer)
        forward += _promoted_input_copies(context)
        return NodeFacts(kept_bytes=kept, backward_temporaries=backward, forward_temporaries=forward,
                         autograd_nodes=autograd_nodes,
                         mask_like_output=kernel is not None and kernel.extra_like_output,
                         math_in_fp32=kernel is not None and kernel.fp32)

    def library_uses(self, nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool],
                     differentiable: list[bool], precision: str) -> CpuLibraryUses:
        """Give the oneDNN primitives each op creates (primitives.py) and the GEMMs it runs in MKL (gemm.py)."""
        run = self._run(precision)
        return CpuLibraryUses(node_primitives(nodes, values, needs_grad, differentiable, run),
                              node_gemms(nodes, values, needs_grad, differentiable, run))

    def unmodelled(self, nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool],
                   differentiable: list[bool], precision: str) -> tuple[str, ...]:
        """Give a note where an LSTM runs without a backward (frozen, and nothing before it trains): PyTorch then
        runs oneDNN's inference primitive, whose scratch is not modelled (tables.py FROZEN_LSTM_FORWARD_HEAP)."""
        frozen = [n for n, node in enumerate(nodes) if not differentiable[n]
                  and (rule := saves_rule(node.op_type, node.domain)) is not None and rule.recurrent == "LSTM"]
        if not frozen:
            return ()
        low, high = FROZEN_LSTM_FORWARD_HEAP
        return (f"[unmodelled-kernel] {len(frozen)} LSTM node(s) run without a backward (frozen): PyTorch runs "
                f"oneDNN's inference primitive there, whose forward scratch is not counted (measured {low:,}-"
                f"{high:,} bytes on single 1-2 layer LSTMs of 64-256 hidden units, batch 4-8, 32-64 steps, growing "
                "with batch x steps x hidden: benchmarks/training_single_ops.py --frozen-lstm); the forward peak "
                "may be that much higher",)

    def library_buffers(self, uses: object, event: Callable[[int, bool], int]) -> list[LibraryBuffer]:
        """Give oneDNN's cached primitives (tables.py OnednnPrimitives: each distinct key once, from the first event
        that creates it) and then MKL's GEMM buffers (tables.py MklGemmBuffers: the step's GEMMs in the order they
        run, each that finds no free buffer in MKL's pool for what it asks adding one)."""
        assert isinstance(uses, CpuLibraryUses)
        made: list[LibraryBuffer] = []
        created: dict[tuple[object, ...], tuple[int, int]] = {}
        for n, primitives in uses.primitives.items():
            for key, nbytes, in_backward in primitives:
                at = event(n, in_backward)
                if at < 0:
                    continue
                if key not in created or at < created[key][1]:
                    created[key] = (nbytes, at)
        for key, (nbytes, at) in created.items():
            made.append(LibraryBuffer(f"{' '.join(map(str, key))} (oneDNN primitive)", "oneDNN primitives", nbytes,
                                      at))
        runs = []
        for n, gemms in uses.gemms.items():
            for i, gemm in enumerate(gemms):
                at = event(n, gemm.backward)
                if at >= 0:
                    runs.append((at, i, gemm))
        runs.sort()
        for index, nbytes in mkl_gemm_held([gemm for _, _, gemm in runs], self.instruction_set):
            at, _, gemm = runs[index]
            kind = "bf16 GEMM buffers" if gemm.low_precision else "sgemm block"
            made.append(LibraryBuffer(f"MKL {kind} ({gemm.m}x{gemm.n}x{gemm.k})", "MKL GEMM buffers", nbytes, at))
        return made

    def held_bytes(self, events: Sequence[tuple[int, bool]]) -> HeldPeaks:
        """Give the peak of the live bytes over (size, is a free) events, as both figures: the heap is counted as
        what it hands out (glibc's own overhead and caching are not modelled)."""
        live = peak = 0
        for nbytes, is_free in events:
            live += -nbytes if is_free else nbytes
            peak = max(peak, live)
        return HeldPeaks(peak, peak)


def _promoted_input_copies(context: NodeContext) -> int:
    """Give the bytes of the copies an elementwise op makes of its narrower float inputs at its output's width
    (tables.py CPU_PROMOTED_INPUT_COPIES: a 16-bit Linear output added to an fp32 residual under autocast)."""
    node, values = context.node, context.values
    if not CPU_PROMOTED_INPUT_COPIES or node.op_type not in TYPE_PROMOTING or node.domain not in ("", "ai.onnx") \
            or not node.outputs or node.outputs[0] < 0:
        return 0
    out = values[node.outputs[0]]
    if not out.is_float or not out.numel:
        return 0
    width = out.nbytes // out.numel
    copies = 0
    for t in node.inputs:
        v = values[t] if t >= 0 else None
        if v is not None and v.is_float and v.numel and v.numel > 1 and v.nbytes // v.numel < width:
            copies += v.numel * width
    return copies


def _attention_backward(context: NodeContext, kernel: CpuKernel) -> int:
    """Give what the math attention's backward holds at its peak besides the gradients of q, k and v the step
    makes at that event (tables.py CpuKernel.attention_backward: fp32 [..., q_len, kv_len] and query-sized tensors);
    0 in a bf16 step (not measured) or where the shapes are not known."""
    node, values, needs_grad = context.node, context.values, context.needs_grad
    probabilities, queries = kernel.attention_backward_autocast if context.precision.startswith("amp-") \
        else kernel.attention_backward
    inputs = node.inputs
    if not probabilities and not queries or context.precision == "bf16" or len(inputs) < 3 or min(inputs[:3]) < 0:
        return 0
    q_shape, k_shape = known_shape(values[inputs[0]]), known_shape(values[inputs[1]])
    if q_shape is None or k_shape is None or len(q_shape) < 2 or len(k_shape) < 2 or not q_shape[-1]:
        return 0
    query = 4 * math.prod(q_shape)
    peak = probabilities * query // q_shape[-1] * k_shape[-2] + queries * query
    made = sum(values[t].nbytes for t in inputs[:3] if needs_grad[t])
    return max(0, peak - made)


def _onednn_ld(n: int) -> int:
    """Give oneDNN's leading dimension for n floats: a multiple of 16, not of 256 (4K aliasing)."""
    ld = -(-n // 16) * 16
    return ld + 16 if ld % 256 == 0 else ld


def _input_channels_last(context: NodeContext) -> bool:
    """Say whether the op's input 0 is held channels-last by PyTorch (layout.py)."""
    inputs = context.node.inputs
    index = context.graph.tensor_index.get(context.values[inputs[0]].name) if inputs and inputs[0] >= 0 else None
    return index is not None and channels_last(context.graph, index)


def _producer_op_type(graph: ModelGraph, name: str) -> str:
    """Give the op type of the graph op that makes tensor `name` ("" for a weight, an input or a loss value)."""
    index = graph.tensor_index.get(name)
    producer = graph.tensors[index].producer if index is not None else None
    return graph.ops[producer].op_type if producer is not None else ""


def _read_transposed(graph: ModelGraph, name: str) -> bool:
    """Say whether tensor `name` is read through a Transpose (directly or after a Squeeze or Reshape)."""
    index = graph.tensor_index.get(name)
    if index is None:
        return False
    for op in (graph.ops[c] for c in graph.tensors[index].consumers):
        if op.op_type == "Transpose":
            return True
        if op.op_type in ("Squeeze", "Reshape") and op.outputs and op.outputs[0] >= 0 \
                and any(graph.ops[c].op_type == "Transpose" for c in graph.tensors[op.outputs[0]].consumers):
            return True
    return False


def recurrent_bytes(rule: CpuRecurrent, dims: RecurrentDims | None) -> tuple[int, int, int]:
    """Give what a recurrent op of these dims (training/values.py node_recurrent_dims) keeps on CPU besides its
    tensors (workspace), its backward's scratch and its forward's, in bytes."""
    if dims is None:
        return 0, 0, 0
    steps, directions, batch, features, hidden = dims
    per_value = 4 * directions * steps * batch * hidden
    if rule.unrolled:
        return per_value * rule.unrolled, 0, per_value * rule.unrolled_forward
    if not features:
        return 0, 0, 0  # oneDNN's workspace needs the input's features
    gates = _onednn_ld(rule.gates * hidden)
    rows = steps * gates + rule.state_rows * (steps + 1) * _onednn_ld(max(features, hidden)) \
        + (rule.diff_rows * (steps + 1) - 1) * _onednn_ld(hidden)
    workspace = 4 * batch * rows
    # the weights reordered, the gates' scratch, the final states' gradients (zeros when unused) and the
    # initial states' gradients
    scratch = 4 * gates * (features + hidden + steps * batch) + 4 * 4 * batch * hidden
    return directions * workspace, directions * scratch, 0
