"""MKL's GEMMs on PyTorch's CPU: which GEMMs each op runs (a MatMul or Gemm, slow_conv2d, flash attention and the
math attention path), in forward and backward, and the packing buffers MKL's pool keeps for them
(tables.py MklGemmBuffers, CpuFlashAttention)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

from onnxmem.ir.graph import WEIGHT
from onnxmem.targets.torch.cpu.convolution import CpuRun, runs_onednn
from onnxmem.targets.torch.cpu.isa import detect_cpu_isa
from onnxmem.targets.torch.cpu.layout import channels_last_values
from onnxmem.targets.torch.cpu.tables import CPU_ISAS, CpuIsa
from onnxmem.training.rules import AUTOCAST_LOW_PRECISION, EXPORTER_WEIGHT_NAME
from onnxmem.training.values import StepNode, StepValue, known_shape


class Gemm(NamedTuple):
    """A GEMM a node runs in MKL on CPU (tables.py MklGemmBuffers): its output C is M x N (row-major) over K;
    run by the node's backward; with bf16 operands into an fp32 result (gemm_bf16bf16f32, which converts them);
    A (M x K) or B (K x N) read transposed (stored K x M, N x K)."""

    m: int
    n: int
    k: int
    backward: bool = False
    low_precision: bool = False
    a_transposed: bool = False
    b_transposed: bool = False


def node_gemms(nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool], differentiable: list[bool],
               cpu: CpuRun) -> dict[int, tuple[Gemm, ...]]:
    """Give, per node on CPU, the GEMMs it runs in MKL in its forward and backward (matmul_gemms, slow_conv2d's in
    slow_conv2d_gemms, flash attention's in flash_attention_gemms), for the packing buffers MKL keeps
    (tables.py MklGemmBuffers)."""
    made = {}
    laid_out = channels_last_values(nodes, values)
    for n, node in enumerate(nodes):
        inputs = node.inputs
        if len(inputs) < 2 or min(inputs[:2]) < 0 or not node.outputs or node.outputs[0] < 0:
            continue
        low = cpu.precision.startswith("amp-") and node.op_type in AUTOCAST_LOW_PRECISION
        if node.op_type.startswith("aten::scaled_dot_product_attention"):
            attention = _attention_gemms(node, values, differentiable[n] and any(needs_grad[t] for t in inputs[:3]),
                                         low, cpu)
            if attention:
                made[n] = attention
            continue
        out = values[node.outputs[0]]
        if low or not out.numel or out.nbytes // out.numel not in cpu.isa.gemm.element_bytes:
            continue
        a, b, y = (known_shape(values[t]) for t in (inputs[0], inputs[1], node.outputs[0]))
        if a is None or b is None or y is None:
            continue
        grads = differentiable[n] and needs_grad[inputs[0]], differentiable[n] and needs_grad[inputs[1]]
        gemms: tuple[Gemm, ...] = ()
        if node.domain in ("", "ai.onnx") and node.op_type in ("MatMul", "Gemm"):
            # B read transposed, as a Linear's weight: a Gemm's transB, a Transpose before it, or a weight the
            # exporter stored transposed (TorchScript's onnx::MatMul_* initializers of nn.Linear)
            producer, weight_b = values[inputs[1]].producer, values[inputs[1]]
            transposed = (b[0] == y[-1] and b[1] != y[-1]) if node.op_type == "Gemm" and len(b) == 2 \
                else (producer is not None and nodes[producer].op_type == "Transpose") or (
                    weight_b.kind == WEIGHT and re.match(EXPORTER_WEIGHT_NAME, weight_b.name) is not None)
            gemms = matmul_gemms(a, b, y, *grads, b_transposed=transposed)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Conv" and len(a) in (3, 4) \
                and not runs_onednn(a, b, y, out.nbytes // out.numel, cpu.threads, cpu.isa):
            gemms = slow_conv2d_gemms(a, b, y, *grads, channels_last=inputs[0] in laid_out)
        if gemms:
            made[n] = gemms
    return made


def _attention_gemms(node: StepNode, values: list[StepValue], backward: bool, low: bool,
                     cpu: CpuRun) -> tuple[Gemm, ...]:
    """Give the MKL GEMMs of an aten::scaled_dot_product_attention node (q, k, v [, mask]): flash attention's
    (flash_attention_gemms) in the dtype it runs in (16 bits under autocast or in a bf16 step: under autocast to
    fp16 the heap of flash attention's forward and backward is bf16's to within 600 bytes, measured at 3 shapes by
    training_single_ops.py --flash-fp16); with dropout, the math path's two batched matmuls, in fp32 on CPU under
    autocast too (training/rules.py's "scaled_dot_product_attention(dropout)"; MKL_VERBOSE shows sgemm), none in a
    bf16 step."""
    if len(node.inputs) < 3 or min(node.inputs[:3]) < 0:
        return ()
    q, k, v = (known_shape(values[t]) for t in node.inputs[:3])
    if q is None or k is None or v is None or min(len(q), len(k), len(v)) < 2:
        return ()
    if node.op_type == "aten::scaled_dot_product_attention":
        x = values[node.inputs[0]]
        element = 2 if low else x.nbytes // max(x.numel or 1, 1)
        return flash_attention_gemms(q, k, v, backward, element, cpu.isa)
    if cpu.precision == "bf16":
        return ()
    batch, length, keys = q[:-2], q[-2], k[-2]
    scores = matmul_gemms((*batch, length, q[-1]), (*batch, q[-1], keys), (*batch, length, keys), backward, backward)
    output = matmul_gemms((*batch, length, keys), (*batch, keys, v[-1]), (*batch, length, v[-1]), backward, backward)
    return (*(g for g in scores + output if not g.backward), *(g for g in output + scores if g.backward))


def matmul_gemms(a: tuple[int, ...], b: tuple[int, ...], y: tuple[int, ...], input_grad: bool,
                 weight_grad: bool, b_transposed: bool = False) -> tuple[Gemm, ...]:
    """Give the GEMMs of torch.matmul (or a Gemm, a 2-D addmm) of `a` by `b` into `y` and of its backward: the
    output's, then the first input's gradient (grad @ B^T), then the second's (A^T @ grad; where `b` is read
    transposed, as a Linear's weight, PyTorch's mm_mat2_backward makes it in B's own layout: grad^T @ A, N x K).
    A 2-D `b` folds `a`'s batch dims into M (as torch.matmul does); batched on both sides, each matrix is one GEMM
    of the batch (bmm). `b` of one dim, or a 1-D `a`, is a matrix-vector product: none (MklGemmBuffers)."""
    if len(a) < 2 or len(b) < 2 or len(y) < 2:
        return ()
    m, n = y[-2], y[-1]
    if len(a) == 2 and len(b) == 2:  # a Gemm may carry transA / transB: K is the dim of A that is not M
        k = a[1] if a[0] == m else a[0]
    else:
        k = a[-1]
    if len(b) == 2:
        m = math.prod(y[:-1])
    gemms = [Gemm(m, n, k)]
    if input_grad:
        gemms.append(Gemm(m, k, n, True))
    if weight_grad:
        gemms.append(Gemm(n, k, m, True) if b_transposed and len(b) == 2 else Gemm(k, n, m, True))
    return tuple(gemms)


def slow_conv2d_gemms(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], input_grad: bool,
                      weight_grad: bool, channels_last: bool = False) -> tuple[Gemm, ...]:
    """Give the GEMMs of ATen's slow_conv2d (a 1-D or 2-D convolution not run by oneDNN), one sample and one group
    at a time (named by MKL_VERBOSE): the output (C_out/g x output positions, over C/g x kernel), the input's
    columns' gradient (C/g x kernel by output positions, over C_out/g), the weight's gradient (C_out/g by C/g x
    kernel, over the output positions). On a channels-last input each GEMM's output is the transpose (output
    positions x C_out/g, ...): its rows and columns swap."""
    groups = x[1] // w[1] if w[1] else 1
    out_channels, reduce, positions = w[0] // max(groups, 1), math.prod(w[1:]), math.prod(y[2:])
    gemms = [Gemm(out_channels, positions, reduce)]
    if input_grad:
        gemms.append(Gemm(reduce, positions, out_channels, True))
    if weight_grad:
        gemms.append(Gemm(out_channels, reduce, positions, True))
    if channels_last:
        gemms = [g._replace(m=g.n, n=g.m) for g in gemms]
    return tuple(gemms)


def flash_attention_gemms(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], backward: bool,
                          element_bytes: int, isa: CpuIsa | None = None) -> tuple[Gemm, ...]:
    """Give the distinct GEMMs, in the order they first run, of PyTorch's CPU flash attention of queries `q`
    (..., L, E), keys `k` (..., S, E) and values `v` (..., S, Ev), and of its backward
    (tables.py CpuFlashAttention); none for an element size MKL does not run (MklGemmBuffers)."""
    rule = (CPU_ISAS[detect_cpu_isa()] if isa is None else isa)
    flash, low = rule.flash_attention, element_bytes in rule.gemm.low_precision_element_bytes
    if not low and element_bytes not in rule.gemm.element_bytes:
        return ()
    length, keys, e, ev = q[-2], k[-2], q[-1], v[-1]
    q_split = next((split for at_least, split in flash.q_split_by_length if length >= at_least), flash.q_split_min)

    def blocks(total: int, split: int) -> list[int]:
        split = min(split, total)
        return [split] + ([total % split] if split and total % split else []) if total > 0 else []

    def of(name: str, qb: int, kb: int, in_backward: bool) -> Gemm:
        shapes = {"scores": (qb, kb, e, False, True), "output": (qb, ev, kb, False, False),
                  "value_grad": (kb, ev, qb, True, False), "scores_grad": (qb, kb, ev, False, True),
                  "query_grad": (qb, e, kb, False, False), "key_grad": (kb, e, qb, True, False)}
        m, n, red, a_t, b_t = shapes[name]
        return Gemm(m, n, red, in_backward, low, a_t, b_t)

    pairs = [(qb, kb) for qb in blocks(length, q_split) for kb in blocks(keys, flash.kv_split)]
    made = [of(name, qb, kb, False) for qb, kb in pairs for name in ("scores", "output")]
    if backward:
        names = flash.backward_low_precision if low else flash.backward_fp32
        made += [of(name, qb, kb, True) for qb, kb in pairs for name in names]
    return tuple(dict.fromkeys(made))


def mkl_gemm_block(m: int, n: int, k: int, element_bytes: int = 4, isa: CpuIsa | None = None) -> int:
    """Give the bytes of the packing block MKL takes for an M x N output over K (tables.py MklGemmBuffers);
    0 for a small-matrix GEMM (a matrix-vector product among them) or a dtype MKL's GEMMs do not run. bf16
    operands (`element_bytes` 2) are packed as fp32, so their block is fp32's."""
    rule = (CPU_ISAS[detect_cpu_isa()] if isa is None else isa).gemm
    if m < rule.rows_min or n < rule.columns_min or k < 1 \
            or element_bytes not in rule.element_bytes + rule.low_precision_element_bytes:
        return 0
    if k <= rule.k_block_min:
        kc = rule.k_block_min
    elif k <= rule.k_block:
        kc = k
    elif k < 2 * rule.k_block:
        kc = k // 2
    else:
        kc = rule.k_block
    columns = -(-n // rule.column_multiple) * rule.column_multiple
    return rule.block + 4 * kc * (min(columns, rule.columns_max) + min(rule.rows_per_row * m, rule.rows_max))


def mkl_call_gemm(transa: str, transb: str, m: int, n: int, k: int, low_precision: bool = False) -> Gemm:
    """Give the Gemm of a column-major MKL call as MKL_VERBOSE shows it (transa, transb, m, n, k): C^T = op(B)^T
    op(A)^T, so M = n, N = m, and A is MKL's B, B MKL's A."""
    return Gemm(n, m, k, False, low_precision, transb == "T", transa == "T")


def mkl_gemm_requests(gemm: Gemm, isa: CpuIsa | None = None) -> list[int]:
    """Give the buffers (bytes, in the order asked) a GEMM takes from MKL's pool: its block; with bf16 operands
    first an fp32 copy of B and one of A (tables.py MklGemmBuffers). No buffer (an empty list) for a matrix-vector
    product."""
    rule = (CPU_ISAS[detect_cpu_isa()] if isa is None else isa).gemm
    block = mkl_gemm_block(gemm.m, gemm.n, gemm.k, 2 if gemm.low_precision else 4, isa)
    if not gemm.low_precision or min(gemm.m, gemm.n) <= 1:
        return [block] if block else []

    def converted(rows: int, contiguous: int) -> int:
        return 4 * rows * (-(-contiguous // rule.converted_multiple) * rule.converted_multiple)

    a = converted(gemm.k, gemm.m) if gemm.a_transposed else converted(gemm.m, gemm.k)
    b = converted(gemm.n, gemm.k) if gemm.b_transposed else converted(gemm.k, gemm.n)
    # MKL's A (column-major) is B here: converted first; a small-matrix GEMM converts without a block (measured)
    return [b, a, block] if block else [b, a]


def mkl_gemm_held(gemms: Sequence[Gemm], isa: CpuIsa | None = None) -> list[tuple[int, int]]:
    """Give what MKL's pool gains over GEMMs run one after another in a fresh process, as (index of the GEMM that
    makes it, bytes): a GEMM's request takes the smallest free buffer of the pool that fits, else makes one
    (mkl_gemm_requests); the first fp32 GEMM also takes MklGemmBuffers.first_use, the first bf16 one
    low_precision_first_use (low_precision_first_use_after_fp32 after an fp32 one). The process holds the sum from
    then on."""
    rule = (CPU_ISAS[detect_cpu_isa()] if isa is None else isa).gemm
    pool: list[int] = []
    held: list[tuple[int, int]] = []
    fp32_ran = low_ran = False  # (the first of each kind takes its first use)
    for i, gemm in enumerate(gemms):
        requests = mkl_gemm_requests(gemm, isa)
        free = sorted(pool)
        made = 0
        if requests and gemm.low_precision and not low_ran:
            made = rule.low_precision_first_use_after_fp32 if fp32_ran else rule.low_precision_first_use
            low_ran = True
        elif requests and not gemm.low_precision and not fp32_ran:
            made = rule.first_use
            fp32_ran = True
        for size in requests:
            fits = next((j for j, f in enumerate(free) if f >= size), None)
            if fits is None:
                pool.append(size)
                made += size
            else:
                del free[fits]
        if made:
            held.append((i, made))
    return held
