"""The committed onnxruntime-gpu rows (benchmarks/results/cuda, an H100), scored on the CPU by
benchmarks/cuda/score_ort.py: the CUDA provider's rules (weights read in host memory stay there, cuDNN's conv
workspace above the live bytes) give every tiny_cnn and resnet18 row and bert's level-disable rows exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# the graphs come from the committed benchmarks/results/cuda/*-ort-graphs.zip (graph-only eval exports, the same
# the rows ran): no torch, torchvision or transformers needed to score them


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> list[tuple]:
    from benchmarks.cuda import score_ort

    lines, _ = score_ort.score([score_ort.RESULTS], tmp_path_factory.mktemp("ort-cuda-graphs"))
    return lines


def test_every_measured_row_is_scored(scored: list[tuple]) -> None:
    keys = {(line[0], line[1], line[2]) for line in scored}
    for model in ("tiny_cnn", "resnet18", "bert"):
        for level in ("disable", "basic", "extended", "all"):
            for batch in (1, 8):
                assert (model, level, batch) in keys


@pytest.mark.parametrize("model", ["tiny_cnn", "resnet18"])
def test_cnn_rows_exact_at_every_level(scored: list[tuple], model: str) -> None:
    rows = [line for line in scored if line[0] == model]
    assert len(rows) == 8
    for line in rows:
        # first run, later run (memory pattern) and weights: ours equals the allocation hooks' figure
        assert line[4] == line[3], line
        assert line[7] == line[6], line
        assert line[10] == line[9], line
        # the row's own estimate (before these rules) was short by the conv workspace
        assert line[12] < 0


def test_bert_exact_at_level_disable(scored: list[tuple]) -> None:
    rows = [line for line in scored if line[0] == "bert" and line[1] == "disable"]
    assert len(rows) == 2
    for line in rows:
        assert (line[5], line[8], line[11]) == (0, 0, 0), line


def test_bert_first_run_exact_at_every_level(scored: list[tuple]) -> None:
    # the optimized levels change bert's graph (onnxruntime's fusions, folded constants): the later run and the
    # weights follow the graph onnxruntime ran, which only validate on the GPU has; the first run's peak does not
    for line in scored:
        if line[0] == "bert":
            assert line[5] == 0, line


def test_workspace_rule_reads_the_conv_shape() -> None:
    import onnx
    from onnx import TensorProto, helper

    from onnxmem.passes.pipeline import analysis
    from onnxmem.targets.ort.cuda.provider import conv_workspaces

    def conv_model(channels: int, side: int) -> onnx.ModelProto:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", channels, side, side])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        w = helper.make_tensor("w", TensorProto.FLOAT, [128, channels, 3, 3], [0.0] * (128 * channels * 9))
        node = helper.make_node("Conv", ["x", "w"], ["y"], name="c", strides=[2, 2], pads=[1, 1, 1, 1])
        return helper.make_model(helper.make_graph([node], "g", [x], [y], [w]),
                                 opset_imports=[helper.make_opsetid("", 17)])

    measured = conv_model(64, 64)  # tiny_cnn's second conv: x + w + 16 bytes
    run = analysis(measured, {"n": 2}, provider="cuda")
    known, unknown = conv_workspaces(run.graph, run.loaded.proto)
    assert list(known.values()) == [2 * 64 * 64 * 64 * 4 + 128 * 64 * 9 * 4 + 16]
    assert unknown == ()
    other = analysis(conv_model(32, 64), {"n": 2}, provider="cuda")  # a shape never measured: not known
    known, unknown = conv_workspaces(other.graph, other.loaded.proto)
    assert known == {} and unknown == ("c",)
