"""MKL's sgemm packing blocks in the CPU training estimate (targets/torch/cpu/tables.py MklGemmBuffers): the law against
blocks measured with the malloc counter (benchmarks/gemm_buffers.py), the pool's growth over a step's GEMMs, and the
estimate gaining exactly the rule's bytes on small graphs; and the exact GELU's oneDNN eltwise primitives
(OnednnPrimitives.eltwise_gelu_*)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import onnx.helper as oh
import pytest

import onnxmem
from onnxmem.targets.torch import TorchCpu
from onnxmem.targets.torch.cpu.gemm import (
    Gemm,
    flash_attention_gemms,
    matmul_gemms,
    mkl_call_gemm,
    mkl_gemm_block,
    mkl_gemm_held,
    slow_conv2d_gemms,
)
from onnxmem.targets.torch.cpu.tables import CPU_ISAS, MklGemmBuffers
from onnxmem.training.step import TrainingOptions
from onnxmem.views.report import TrainingReport

from . import graphs

AVX2 = CPU_ISAS["avx2"]
G = MklGemmBuffers()
ROOT = Path(__file__).resolve().parents[1]


def weight(name: str, dims: list[int]) -> onnx.TensorProto:
    return graphs.external_header(name, onnx.TensorProto.FLOAT, dims)


def _step(model: onnx.ModelProto, **options: object) -> TrainingReport:
    values = {"optimizer": "sgd", "device": TorchCpu(isa="avx2"), "loss": "mean", **options}
    training = onnxmem.analyze(model, training=TrainingOptions(**values)).training  # type: ignore[arg-type]
    assert training is not None
    return training


def _without_mkl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make MKL's blocks cost nothing (the rest of the CPU rules as they are)."""
    zero = dataclasses.replace(G, first_use=0, block=0, element_bytes=(), low_precision_first_use=0,
                               low_precision_element_bytes=())
    monkeypatch.setitem(CPU_ISAS, "avx2", dataclasses.replace(AVX2, gemm=zero))


# (M, N, K) -> the heap one torch.mm left in a fresh process, measured with the malloc counter (torch 2.13.0+cpu,
# MKL 2024.2, AVX2, one thread; benchmarks/gemm_buffers.py): the first GEMM's block and MKL's first-use bytes
MEASURED = {(64, 64, 256): 117_616, (4096, 64, 1024): 658_288, (64, 1024, 200): 480_112, (64, 1024, 320): 756_592,
            (64, 4096, 1024): 3_266_744, (4096, 4096, 256): 2_513_080, (4096, 16384, 4096): 5_527_736,
            (16, 64, 1024): 93_040, (256, 64, 1024): 461_680, (64, 8192, 1024): 5_036_216}


@pytest.mark.parametrize(("m", "n", "k"), sorted(MEASURED))
def test_the_law_gives_the_measured_blocks(m: int, n: int, k: int) -> None:
    rule = mkl_gemm_block(m, n, k, 4, AVX2) + G.first_use
    assert abs(rule - MEASURED[m, n, k]) <= 3_500


def test_a_matrix_vector_product_or_an_unmeasured_dtype_takes_no_block() -> None:
    assert mkl_gemm_block(1, 64, 1024, 4, AVX2) == 0  # measured: 2,248 B, MKL's first use only
    assert mkl_gemm_block(64, 1, 1024, 4, AVX2) == 0
    assert mkl_gemm_block(64, 64, 1024, 8, AVX2) == 0
    # bf16 operands are packed as fp32: the same block
    assert mkl_gemm_block(64, 64, 1024, 2, AVX2) == mkl_gemm_block(64, 64, 1024, 4, AVX2)


# MKL called directly as PyTorch calls it (column-major: MKL_VERBOSE's (transa, transb, m, n, k)), one GEMM per
# fresh process, the heap it left (malloc counter; benchmarks/gemm_buffers.py --direct): sgemm, gemm_bf16bf16f32
DIRECT = {("T", "N", 65, 32, 32): (90_792, 111_680), ("N", "N", 32, 32, 65): (66_216, 91_712),
          ("N", "T", 32, 65, 32): (100_008, 121_280), ("T", "N", 300, 64, 64): (238_248, 339_904),
          ("N", "N", 64, 64, 300): (132_264, 294_336), ("T", "N", 65, 32, 200): (74_664, 160_736),
          ("N", "N", 65, 32, 32): (90_792, 112_064), ("N", "N", 64, 64, 197): (92_328, None),
          ("N", "N", 17, 64, 64): (98_984, None), ("T", "N", 65, 1, 32): (0, 0),
          # MKL's small-matrix path (N under 12 or M under 4): no block; bf16 still converts its operands
          ("N", "N", 4, 64, 64): (0, 25_880), ("N", "N", 11, 64, 64): (0, 27_928),
          ("N", "N", 12, 4, 64): (29_352, None), ("N", "N", 64, 3, 64): (0, None),
          ("T", "T", 12, 4, 300): (31_464, None)}


@pytest.mark.parametrize("call", sorted(DIRECT))
def test_the_law_gives_the_direct_calls_to_the_byte(call: tuple[str, str, int, int, int]) -> None:
    # odd sizes: N (MKL's m) rounds up to a multiple of 16, K // 2 for 192 < K < 384; bf16 operands are converted to
    # fp32 copies (their contiguous dim rounded up to 4) besides the block, and the first such GEMM takes 8,472 B
    for low, measured in zip((False, True), DIRECT[call], strict=True):
        if measured is None:
            continue
        held = sum(nbytes for _, nbytes in mkl_gemm_held([mkl_call_gemm(*call, low)], AVX2))
        # called directly, an sgemm does not take torch.mm's first-use bytes
        assert held == measured + (G.first_use if measured and not low else 0)


def test_bf16_gemms_share_the_pool_smallest_fit_first() -> None:
    # measured in one process (gemm_bf16bf16f32 called directly): the heap after each GEMM
    calls = [("T", "N", 65, 32, 32), ("N", "N", 32, 32, 65), ("N", "T", 32, 65, 32)]
    for order, measured in ((calls, [111_680, 177_896, 277_904]), (calls[1:2] + calls[:1] + calls[2:],
                                                                      [91_712, 182_504, 282_512])):
        held = dict(mkl_gemm_held([mkl_call_gemm(*c, True) for c in order], AVX2))
        assert [sum(held.get(j, 0) for j in range(i + 1)) for i in range(3)] == measured
    # after an sgemm (its block takes the first copy) the first bf16 GEMM takes 4,336 B of first use, not 8,472
    mixed = [Gemm(256, 256, 256), *(mkl_call_gemm(*c, True) for c in calls[:2])]
    held = dict(mkl_gemm_held(mixed, AVX2))
    assert [sum(held.get(j, 0) for j in range(i + 1)) - G.first_use for i in range(3)] == [410_280, 509_504, 575_720]


# The distinct MKL calls (MKL_VERBOSE: transa, transb, m, n, k) of F.scaled_dot_product_attention's forward and
# backward on torch 2.13.0+cpu, one thread: (batch, heads, query length, head dim, key length), dtype -> calls
FLASH_CALLS = {
    ((8, 4, 65, 32, 65), False): {("T", "N", 65, 32, 32), ("N", "N", 32, 32, 65), ("T", "N", 65, 1, 32),
                                  ("N", "N", 32, 1, 65), ("N", "T", 32, 65, 32), ("N", "T", 32, 65, 1)},
    ((8, 4, 65, 32, 65), True): {("T", "N", 65, 32, 32), ("N", "N", 32, 32, 65), ("T", "N", 65, 1, 32),
                                 ("N", "N", 32, 1, 65)},
    ((1, 1, 800, 64, 800), False): {("T", "N", 512, 256, 64), ("N", "N", 64, 256, 512), ("T", "N", 288, 256, 64),
                                    ("N", "N", 64, 256, 288), ("T", "N", 512, 32, 64), ("N", "N", 64, 32, 512),
                                    ("T", "N", 288, 32, 64), ("N", "N", 64, 32, 288), ("N", "T", 64, 512, 256),
                                    ("N", "T", 64, 288, 256), ("N", "T", 64, 512, 32), ("N", "T", 64, 288, 32)},
    ((1, 1, 70, 64, 600), True): {("T", "N", 512, 32, 64), ("N", "N", 64, 32, 512), ("T", "N", 88, 32, 64),
                                  ("N", "N", 64, 32, 88), ("T", "N", 512, 6, 64), ("N", "N", 64, 6, 512),
                                  ("T", "N", 88, 6, 64), ("N", "N", 64, 6, 88)},
}


@pytest.mark.parametrize("case", sorted(FLASH_CALLS))
def test_flash_attention_runs_the_gemms_mkl_verbose_lists(case: tuple[tuple[int, ...], bool]) -> None:
    (b, h, length, e, keys), low = case
    gemms = flash_attention_gemms((b, h, length, e), (b, h, keys, e), (b, h, keys, e), True, 2 if low else 4, AVX2)
    assert {mkl_call_gemm(*call, low)[:3] + mkl_call_gemm(*call, low)[4:] for call in FLASH_CALLS[case]} == \
        {g[:3] + g[4:] for g in gemms}
    assert flash_attention_gemms((b, h, length, e), (b, h, keys, e), (b, h, keys, e), True, 8, AVX2) == ()
    forward = flash_attention_gemms((b, h, length, e), (b, h, keys, e), (b, h, keys, e), False, 4, AVX2)
    assert forward and not any(g.backward for g in forward)


def test_a_larger_gemm_adds_a_block_and_the_smaller_ones_stay() -> None:
    # measured in one process: 64x64x1024 then 64x4096x1024 left 166,768 + 3,264,496 B (both blocks kept);
    # 64x4096x1024 then 4096x64x1024 left nothing more for the second (the first's block served it)
    small, large = mkl_gemm_block(64, 64, 1024, 4, AVX2), mkl_gemm_block(64, 4096, 1024, 4, AVX2)
    assert mkl_gemm_held([Gemm(64, 64, 1024), Gemm(64, 4096, 1024)], AVX2) == [(0, small + G.first_use), (1, large)]
    assert mkl_gemm_held([Gemm(64, 4096, 1024), Gemm(4096, 64, 1024)], AVX2) == [(0, large + G.first_use)]
    assert abs(small + G.first_use - 166_768) + abs(large - 3_264_496) <= 7_000


def test_matmul_and_conv_gemms_by_their_layout() -> None:
    # a Linear's weight (read transposed) gets its gradient in its own layout: out x in, over the batch
    assert matmul_gemms((8, 32), (16, 32), (8, 16), True, True, b_transposed=True) == \
        (Gemm(8, 16, 32), Gemm(8, 32, 16, True), Gemm(16, 32, 8, True))
    assert matmul_gemms((8, 32), (32, 16), (8, 16), False, True) == (Gemm(8, 16, 32), Gemm(32, 16, 8, True))
    # batched on both sides: one GEMM per matrix; a 2-D right side folds the batch into M
    assert matmul_gemms((2, 8, 32), (2, 32, 16), (2, 8, 16), False, False) == (Gemm(8, 16, 32),)
    assert matmul_gemms((2, 8, 32), (32, 16), (2, 8, 16), False, False) == (Gemm(16, 16, 32),)
    # slow_conv2d, one sample: C_out x positions over C x kernel; channels-last swaps rows and columns
    x, w, y = (4, 16, 8, 8), (32, 16, 3, 3), (4, 32, 6, 6)
    assert slow_conv2d_gemms(x, w, y, True, True) == (Gemm(32, 36, 144), Gemm(144, 36, 32, True),
                                                      Gemm(32, 144, 36, True))
    assert slow_conv2d_gemms(x, w, y, True, True, channels_last=True) == (Gemm(36, 32, 144),
                                                                          Gemm(36, 144, 32, True),
                                                                          Gemm(144, 32, 36, True))


def two_matmuls(first: int, second: int) -> onnx.ModelProto:
    """y = (x [64, 512] @ A [512, first]) @ B [first, second]: two GEMMs, both weights trainable."""
    return graphs.model(
        [oh.make_node("MatMul", ["x", "A"], ["h"], name="a"), oh.make_node("MatMul", ["h", "B"], ["y"], name="b")],
        [graphs.value("x", [64, 512])], [graphs.value("y", [64, second])],
        [weight("A", [512, first]), weight("B", [first, second])])


def test_the_estimate_gains_the_blocks_of_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # The GEMMs in the order they run: a's forward (64 x 256 over 512), b's (64 x 2048 over 256), b's backward:
    # grad h (64 x 256 over 2048) then grad B (256 x 2048 over 64), a's backward: grad A (512 x 256 over 64) (x is
    # an input: no gradient). Blocks, MKL's K block 192 for K >= 384, K / 2 below, 128 at K <= 128:
    a_forward = G.block + 4 * 192 * (256 + 2 * 64)
    b_forward = G.block + 4 * 128 * (2048 + 2 * 64)
    grad_b = G.block + 4 * 128 * (2048 + 2 * 256)
    assert a_forward < b_forward < grad_b
    assert G.block + 4 * 192 * (256 + 2 * 64) < b_forward  # grad h: served by b's forward block
    mkl = G.first_use + a_forward + b_forward + grad_b  # all made by b's backward; held to the step's end
    with_mkl = _step(two_matmuls(256, 2048))
    _without_mkl(monkeypatch)
    without = _step(two_matmuls(256, 2048))
    assert with_mkl.peak_bytes - without.peak_bytes == mkl
    # a later step starts with them
    assert with_mkl.later_step.phases[0].end_bytes - without.later_step.phases[0].end_bytes == mkl


def test_no_blocks_on_cuda_or_under_bf16_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = _step(two_matmuls(256, 2048), device="cuda")
    amp = _step(two_matmuls(256, 2048), precision="amp-bf16")
    _without_mkl(monkeypatch)
    assert _step(two_matmuls(256, 2048), device="cuda").peak_bytes == cuda.peak_bytes
    assert _step(two_matmuls(256, 2048), precision="amp-bf16").peak_bytes == amp.peak_bytes


def attention(b: int = 2, h: int = 4, n: int = 64, e: int = 16, dropout: bool = False) -> onnx.ModelProto:
    """softmax(q k^T * s) v of trainable q, k, v [b, h, n, e], every node marked as the dynamo exporter marks
    F.scaled_dot_product_attention (simulated as that op: PyTorch's CPU flash attention; with a Dropout of the
    probabilities, its math path)."""
    fx = ("%sdpa : [num_users=1] = call_function[target=torch.ops.aten.scaled_dot_product_attention.default]"
          "(args = (%q, %k, %v), kwargs = {})")
    nodes = [oh.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
             oh.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
             oh.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale"),
             oh.make_node("Softmax", ["scaled"], ["p0" if dropout else "probs"], name="softmax", axis=-1),
             *([oh.make_node("Dropout", ["p0", "ratio", "on"], ["probs"], name="drop")] if dropout else []),
             oh.make_node("MatMul", ["probs", "v"], ["out"], name="sdpa")]
    for node in nodes:
        entry = node.metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.fx_node", fx
    return graphs.model(nodes, [], [graphs.value("out", [b, h, n, e])],
                        [*(weight(name, [b, h, n, e]) for name in "qkv"),
                         oh.make_tensor("scale", onnx.TensorProto.FLOAT, [], [0.25]),
                         oh.make_tensor("ratio", onnx.TensorProto.FLOAT, [], [0.1]),
                         oh.make_tensor("on", onnx.TensorProto.BOOL, [], [True])])


def test_flash_attention_adds_its_gemms_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    # q, k, v [2, 4, 64, 16]: query blocks of 32 rows, one key block of 64. fp32: the scores (32 x 64 over 16) make
    # a block, the output (32 x 16 over 64) fits in it, the backward's value gradient (64 x 16 over 32) makes a
    # larger one that the rest fit in. Blocks: MKL's K block 128 for K <= 128.
    scores, output, value_grad = (G.block + 4 * 128 * (n + 2 * m) for m, n in ((32, 64), (32, 16), (64, 16)))
    assert output < scores < value_grad
    fp32 = G.first_use + scores + value_grad
    # bf16 (autocast): the scores GEMM converts q's block (32 x 16) and k (64 x 16) to fp32 copies, then packs; the
    # output GEMM's copy of the scores (32 x 64) takes the scores' block, v's copy (64 x 16) k's, its own block is
    # new; the backward's scores and their gradient (grad_out 32 x 16, v 64 x 16) fit in what is there
    bf16 = G.low_precision_first_use + 4 * 32 * 16 + 4 * 64 * 16 + scores + output
    with_mkl = {p: _step(attention(), precision=p).peak_bytes for p in ("fp32", "amp-bf16")}
    _without_mkl(monkeypatch)
    without = {p: _step(attention(), precision=p).peak_bytes for p in ("fp32", "amp-bf16")}
    assert with_mkl["fp32"] - without["fp32"] == fp32
    assert with_mkl["amp-bf16"] - without["amp-bf16"] == bf16


def test_attention_with_dropout_adds_its_batched_matmuls_blocks_in_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    # The math path's matmuls (q k^T: 64 x 64 over 16; probabilities v: 64 x 16 over 64; their gradients) run in
    # fp32 sgemm under bf16 autocast too (MKL_VERBOSE: SGEMM_BATCH): the scores' block is the largest; the
    # backward's (64 x 64 over 16, 64 x 16 over 64, 16 x 64 over 64) fit in it
    scores = G.block + 4 * 128 * (64 + 2 * 64)
    assert all(G.block + 4 * 128 * (n + 2 * m) <= scores for m, n in ((64, 16), (16, 64)))
    with_mkl = {p: _step(attention(dropout=True), precision=p).peak_bytes for p in ("fp32", "amp-bf16", "bf16")}
    _without_mkl(monkeypatch)
    without = {p: _step(attention(dropout=True), precision=p).peak_bytes for p in ("fp32", "amp-bf16", "bf16")}
    assert with_mkl["fp32"] - without["fp32"] == G.first_use + scores
    assert with_mkl["amp-bf16"] - without["amp-bf16"] == G.first_use + scores
    assert with_mkl["bf16"] == without["bf16"]  # bf16 bmm: not in MKL


def channels_last_mlp() -> onnx.ModelProto:
    """x [4,16,4,4] -> NHWC -> LayerNorm -> back to NCHW (channels-last, as timm's LayerNorm2d) -> 1x1 Conv to 64."""
    return graphs.model(
        [oh.make_node("Transpose", ["x"], ["t"], name="to_nhwc", perm=[0, 2, 3, 1]),
         oh.make_node("LayerNormalization", ["t", "g"], ["n"], name="norm", axis=-1),
         oh.make_node("Transpose", ["n"], ["c"], name="to_nchw", perm=[0, 3, 1, 2]),
         oh.make_node("Conv", ["c", "w"], ["y"], name="fc1")],
        [graphs.value("x", [4, 16, 4, 4])], [graphs.value("y", [4, 64, 4, 4])],
        [weight("g", [16]), weight("w", [64, 16, 1, 1])])


def test_a_channels_last_1x1_convolution_swaps_its_gemms(monkeypatch: pytest.MonkeyPatch) -> None:
    # batch 4 < 16 on one thread: slow_conv2d, one sample at a time, its input channels-last: the forward's output
    # is 16 positions x 64 channels (over 16), the input's gradient 16 x 16 (over 64), the weight's 16 x 64 (over
    # 16 positions); as measured on timm's ConvNeXt with MKL_VERBOSE. In the NCHW layout it would be 64 x 16 first.
    forward = G.block + 4 * 128 * (64 + 2 * 16)
    grad_input = G.block + 4 * 128 * (16 + 2 * 16)
    grad_weight = G.block + 4 * 128 * (64 + 2 * 16)
    assert grad_input < forward and grad_weight == forward
    with_mkl = _step(channels_last_mlp())
    _without_mkl(monkeypatch)
    assert with_mkl.peak_bytes - _step(channels_last_mlp()).peak_bytes == G.first_use + forward
    assert forward != G.block + 4 * 128 * (16 + 2 * 64)  # the NCHW orientation gives another size


def test_torch_mm_leaves_the_rules_block_on_the_heap(tmp_path: Path) -> None:
    """One torch.mm in a fresh process under the malloc counter (skipped without torch, gcc or the counter)."""
    pytest.importorskip("torch")
    source = Path(os.environ.get("ONNXMEM_TOOLS", ROOT.parent / "shared" / "tools")) / "malloc_counter.c"
    if not source.exists() or shutil.which("gcc") is None:
        pytest.skip("no malloc counter source or gcc")
    library = tmp_path / "libmalloc_counter.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    script = ("import ctypes, torch\ntorch.set_num_threads(1)\nc = ctypes.CDLL(None)\n"
              "c.mc_current.restype = ctypes.c_int64\n"
              "a, b, o = torch.randn(256, 512), torch.randn(512, 1024), torch.empty(256, 1024)\n"
              "base = c.mc_current()\ntorch.mm(a, b, out=o)\nprint(c.mc_current() - base)\n")
    environment = {**os.environ, "LD_PRELOAD": str(library), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True,
                         check=True).stdout
    measured = int(out.split()[-1])
    import torch

    if "mkl" not in torch.__config__.show().lower() or not measured:
        pytest.skip("this torch does not run its GEMMs in MKL")
    assert abs(mkl_gemm_block(256, 1024, 512, 4, AVX2) + G.first_use - measured) <= 0.01 * measured


def gelus(channels_last: bool = False) -> onnx.ModelProto:
    """m = x [8,16,4,4] * w [16,1,1] (trainable); two Gelus of m's shape in a row, Concat of the second with
    itself (to [8,32,4,4]), a third Gelu. Channels-last: x comes in NHWC, transposed back (and only the first two
    Gelus). Opset 20: Gelu's."""
    shape = [8, 16, 4, 4]
    nodes = [oh.make_node("Mul", ["c" if channels_last else "x", "w"], ["m"], name="mul"),
             oh.make_node("Gelu", ["m"], ["g0"], name="gelu0"), oh.make_node("Gelu", ["g0"], ["g1"], name="gelu1")]
    if channels_last:
        nodes.insert(0, oh.make_node("Transpose", ["x"], ["c"], name="to_nchw", perm=[0, 3, 1, 2]))
        return graphs.model(nodes, [graphs.value("x", [8, 4, 4, 16])], [graphs.value("g1", shape)],
                            [weight("w", [16, 1, 1])], opset=20)
    nodes += [oh.make_node("Concat", ["g1", "g1"], ["c"], name="cat", axis=1),
              oh.make_node("Gelu", ["c"], ["y"], name="gelu2")]
    return graphs.model(nodes, [graphs.value("x", shape)], [graphs.value("y", [8, 32, 4, 4])],
                        [weight("w", [16, 1, 1])], opset=20)


def _without_gelu_primitives(monkeypatch: pytest.MonkeyPatch) -> None:
    zero = dataclasses.replace(AVX2.primitives, eltwise_gelu_forward=0, eltwise_gelu_backward=0,
                               eltwise_gelu_first_use=0)
    monkeypatch.setitem(CPU_ISAS, "avx2", dataclasses.replace(AVX2, primitives=zero))


def test_exact_gelu_creates_one_forward_and_one_backward_primitive_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    # the two Gelus of one shape share their primitives (oneDNN's cache); the third shape makes its own; the first
    # GELU of the process takes its first-use bytes once; a later step starts with all of them. A channels-last
    # input is not contiguous: ATen does not call oneDNN.
    each = AVX2.primitives.eltwise_gelu_forward + AVX2.primitives.eltwise_gelu_backward
    first = AVX2.primitives.eltwise_gelu_first_use
    with_primitives = {cl: _step(gelus(cl)) for cl in (False, True)}
    cuda = _step(gelus(), device="cuda")
    _without_gelu_primitives(monkeypatch)
    without = {cl: _step(gelus(cl)) for cl in (False, True)}

    def start(t: TrainingReport) -> int:
        return t.later_step.phases[0].end_bytes

    assert start(with_primitives[False]) - start(without[False]) == 2 * each + first
    assert start(with_primitives[True]) == start(without[True])
    assert cuda.peak_bytes == _step(gelus(), device="cuda").peak_bytes


def test_with_gradient_accumulation_the_micro_step_starts_with_the_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # the micro-step simulated is a later one (gradients live through its forward): MKL's blocks, made by the first
    # micro-step, are there from its start, as in a later step
    model = two_matmuls(256, 2048)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"

    def step() -> TrainingReport:
        training = onnxmem.analyze(model, {"batch": 64}, training=TrainingOptions(
            optimizer="sgd", device=TorchCpu(isa="avx2"), loss="mean", grad_accum=2)).training
        assert training is not None
        return training

    with_mkl = step()
    _without_mkl(monkeypatch)
    without = step()
    first = with_mkl.first_step.phases[0].end_bytes - without.first_step.phases[0].end_bytes
    later = with_mkl.later_step.phases[0].end_bytes - without.later_step.phases[0].end_bytes
    assert first == later > 0


def stacked_lstm(features: int, hidden: int, layers: int, directions: int = 1) -> onnx.ModelProto:
    """`layers` LSTM nodes over X [6, 4, features] (batch 4), each layer's Y [6, D, 4, H] reshaped to the next
    layer's input [6, 4, D x H], as nn.LSTM(num_layers=layers, bidirectional=directions == 2) exports."""
    nodes, inputs, weights = [], "x", []
    for layer in range(layers):
        width = features if layer == 0 else directions * hidden
        nodes += [oh.make_node("LSTM", [inputs, f"W{layer}", f"R{layer}"], [f"y{layer}"], name=f"lstm{layer}",
                               hidden_size=hidden, direction="bidirectional" if directions == 2 else "forward"),
                  oh.make_node("Transpose", [f"y{layer}"], [f"t{layer}"], name=f"t{layer}", perm=[0, 2, 1, 3]),
                  oh.make_node("Reshape", [f"t{layer}", "shape"], [f"h{layer}"], name=f"r{layer}")]
        weights += [weight(f"W{layer}", [directions, 4 * hidden, width]),
                    weight(f"R{layer}", [directions, 4 * hidden, hidden])]
        inputs = f"h{layer}"
    return graphs.model(nodes, [graphs.value("x", [6, 4, features])],
                        [graphs.value(inputs, [6, 4, directions * hidden])],
                        [*weights, oh.make_tensor("shape", onnx.TensorProto.INT64, [3], [6, 4, directions * hidden])])


def _without_lstm_primitives(monkeypatch: pytest.MonkeyPatch) -> None:
    zero = dataclasses.replace(AVX2.primitives, lstm_first_use=0, lstm_direction=0, lstm_weights_reorder=0)
    monkeypatch.setitem(CPU_ISAS, "avx2", dataclasses.replace(AVX2, primitives=zero))


@pytest.mark.parametrize(("features", "hidden", "layers", "directions", "descriptors", "reorders"), [
    (32, 64, 1, 1, 1, 1),  # measured 543,952 B
    (64, 64, 2, 1, 1, 0),  # the second layer's primitives are the first's (measured 521,280 B in all)
    (32, 64, 2, 1, 2, 1),  # the second layer reads 64 features: a new descriptor (measured 722,224 B)
    (32, 64, 2, 2, 4, 2),  # two directions each; the second layer reads 128 features (measured 1,103,104 B)
])
def test_an_lstm_keeps_its_onednn_primitives(monkeypatch: pytest.MonkeyPatch, features: int, hidden: int,
                                              layers: int, directions: int, descriptors: int,
                                              reorders: int) -> None:
    sizes = AVX2.primitives
    expected = sizes.lstm_first_use + descriptors * sizes.lstm_direction + reorders * sizes.lstm_weights_reorder
    model = stacked_lstm(features, hidden, layers, directions)
    with_primitives = _step(model)
    cuda = _step(model, device="cuda")
    _without_lstm_primitives(monkeypatch)
    without = _step(model)
    start = with_primitives.later_step.phases[0].end_bytes - without.later_step.phases[0].end_bytes
    assert start == expected
    assert _step(model, device="cuda").peak_bytes == cuda.peak_bytes
