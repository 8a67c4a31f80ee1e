"""What a person sees: the verdict and its sums in the first lines of every format, text that fits its width, names
shortened in the middle (whole in JSON), and a dim given twice refused."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import onnxmem
from onnxmem.views.document import output_width, shorten_middle, text_table, wrap
from onnxmem.views.render import format_bytes

from . import graphs
from .cli import run, save

_SCOPE = "/model/transformer_encoder_with_a_very_long_module_path/layers.{i}/self_attention_block/projection"


def long_names(layers: int = 3) -> onnx.ModelProto:
    """A chain of MatMul + Relu whose node and tensor names are as long as a dynamo export's (200+ characters)."""
    nodes, inits = [], []
    previous = "input_with_a_long_name_" + "x" * 60
    for i in range(layers):
        scope = _SCOPE.format(i=i) * 2
        weight = f"{scope}/weight"
        inits.append(helper.make_tensor(weight, TensorProto.FLOAT, [64, 64], [0.0] * 64 * 64))
        out = f"{scope}/MatMul_output_0"
        nodes.append(helper.make_node("MatMul", [previous, weight], [out], name=f"{scope}/MatMul"))
        relu = f"{scope}/Relu_output_0"
        nodes.append(helper.make_node("Relu", [out], [relu], name=f"{scope}/Relu"))
        previous = relu
    graph = helper.make_graph(nodes, "long", [helper.make_tensor_value_info(
        "input_with_a_long_name_" + "x" * 60, TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, ["batch", 64])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def long_model(tmp_path: Path) -> str:
    return save(long_names(), tmp_path / "m.onnx")


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # not a terminal: 80 columns


# --- widths ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("report", "--dim", "batch=4"),
    ("report", "--dim", "batch=4", "--training", "--device", "cpu"),
    ("fit", "--memory", "1GiB", "--runtime", "onnxruntime"),
    ("check", "--dim", "batch=4", "--budget", "16GiB", "--runtime", "pytorch", "--training"),
])
def test_every_line_fits_80_columns_and_names_are_shortened_in_the_middle(long_model: str,
                                                                          args: tuple[str, ...]) -> None:
    code, out, err = run(args[0], long_model, *args[1:])
    assert code == 0, err
    widest = max(out.splitlines(), key=len)
    assert len(widest) <= 80, widest
    if args[0] == "report":
        assert "..." in out and "Mul_output_0" in out  # shortened, its own last part kept
        code, out, _ = run(args[0], long_model, *args[1:], "--format", "json")
        names = {t["name"] for t in json.loads(out)["inference"]["live_at_peak"]}
        assert any(len(n) > 200 for n in names)  # whole in JSON


def test_columns_sets_the_width(long_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    _, out, _ = run("report", long_model, "--dim", "batch=4")
    lengths = [len(line) for line in out.splitlines()]
    assert max(lengths) <= 120 and max(lengths) > 80  # the room is used
    monkeypatch.setenv("COLUMNS", "60")
    _, out, _ = run("report", long_model, "--dim", "batch=4")
    assert max(len(line) for line in out.splitlines()) <= 60
    assert output_width() == 60


def test_wrapping_keeps_words_and_sizes_whole() -> None:
    text = "needs 801.63 MiB = peak 265.01 MiB + onnxruntime's arena regions 536.62 MiB and more words here"
    lines = wrap(text, 40)
    assert all(len(line) <= 40 for line in lines)
    assert " ".join(line.strip() for line in lines) == text  # nothing lost, no word cut
    assert not any(line.rstrip().endswith(("801.63", "265.01", "536.62")) for line in lines)  # unit kept
    assert shorten_middle("abcdefghijklmnopqrstuvwxyz", 12) == "abcd...vwxyz"
    assert shorten_middle("short", 12) == "short"


def test_a_table_narrows_prose_first_then_names_never_numbers() -> None:
    rows = [("a" * 50, "12.00 MiB", "word " * 20)]
    lines = text_table(("name", "size", "how"), rows, right=(1,), wrap_columns=(2,), width=60)
    assert all(len(line) <= 60 for line in lines)
    assert "12.00 MiB" in lines[2] and "..." in lines[2]
    assert " ".join(" ".join(line.split()[3:]) if i == 0 else line.strip() for i, line in
                    enumerate(lines[2:])).split() == ("word " * 20).split()  # the prose wrapped whole


# --- the verdict and its sums -----------------------------------------------------------------------------------------

def test_the_sums_add_up_and_every_format_says_them(tmp_path: Path) -> None:
    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    gate = onnxmem.check(path, {"batch": 64}, memory="16GiB", runtime="onnxruntime")
    a = gate.arithmetic
    assert a.memory_bytes - a.fixed_costs_bytes == a.budget_bytes == gate.budget_bytes
    assert a.peak_bytes + a.allocator_rounding_bytes == a.required_bytes == gate.required_bytes
    assert a.budget_bytes - a.required_bytes == a.headroom_bytes == gate.headroom_bytes
    assert a.rounded_by == "onnxruntime's arena regions" and a.allocator_rounding_bytes > 0
    args = ("check", path, "--dim", "batch=64", "--budget", "16GiB", "--runtime", "onnxruntime")
    code, out, _ = run(*args)
    first = out.splitlines()[:4]
    assert first[1].startswith("FITS: needs") and f"arena regions {format_bytes(a.allocator_rounding_bytes)}" in \
        first[2] and f"fixed costs {format_bytes(a.fixed_costs_bytes)}" in first[3]
    code, out, _ = run(*args, "--format", "markdown")
    assert "arena regions" in "\n".join(out.splitlines()[:5])
    code, out, _ = run(*args, "--format", "json")
    assert json.loads(out)["arithmetic"]["allocator_rounding_bytes"] == a.allocator_rounding_bytes
    code, out, _ = run(*args, "--format", "html")
    head = out[:out.index("<svg")]
    assert "FITS" in head and "arena regions" in head and "fixed costs" in head
    assert f"headroom {format_bytes(a.headroom_bytes)}" in out[out.index("<svg"):]  # drawn


def test_fit_says_its_sums_at_the_answer(tmp_path: Path) -> None:
    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    result = onnxmem.fit(path, memory="4MiB", what_if=False)
    a = result.arithmetic
    assert a is not None and a.fits and a.required_bytes == next(
        p.required_bytes for p in result.curve if p.value == result.max_value)
    code, out, _ = run("fit", path, "--memory", "4MiB", "--no-what-if")
    lines = out.splitlines()
    assert lines[1].startswith("largest batch that fits") and lines[2].startswith(f"  at batch={result.max_value}")
    assert f"at {result.max_value + 1}: over by" in lines[2]


def test_a_training_answer_leaves_out_the_inference_providers_notes() -> None:
    decoder = str(Path(__file__).parent.parent / "fixtures" / "gpt_decoder.onnx")
    dims = ("--dim", "batch=1", "--dim", "seq=8")
    code, out, _ = run("check", decoder, *dims, "--budget", "1GiB")
    assert "[cuda-host-nodes]" in out  # an inference answer on the CUDA provider: said
    code, out, _ = run("check", decoder, *dims, "--budget", "1GiB", "--training", "--device", "cpu")
    assert code == 0 and "cuda-host-nodes" not in out  # the step PyTorch runs: not about it
    code, out, _ = run("report", decoder, *dims, "--training", "--device", "cpu")
    apart = out.split("Warnings about the inference figures", 1)
    assert len(apart) == 2 and "[cuda-host-nodes]" in apart[1] and "[cuda-host-nodes]" not in apart[0]
    code, out, _ = run("check", decoder, *dims, "--budget", "1GiB", "--training", "--device", "cpu", "--format",
                       "json")
    assert "cuda-host-nodes" in {w["code"] for w in json.loads(out)["warnings"]}  # JSON keeps every warning


# --- arguments ------------------------------------------------------------------------------------------------------

def test_a_dim_given_twice_is_refused_in_one_line(tmp_path: Path) -> None:
    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    for command in (("report", path), ("check", path, "--budget", "1GiB"), ("fit", path, "--memory", "1GiB")):
        code, out, err = run(*command, "--dim", "batch=2", "--dim", "batch=4")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "'batch' is given twice" in err and "batch=2" in err and "batch=4" in err
    code, _, err = run("report", path, "--dim", "batch=2", "--dim", "batch=2")  # the same value: no ambiguity
    assert code == 0, err


# --- pictures: the PNG and the page draw the same ---------------------------------------------------------------------

def test_the_png_and_the_page_draw_the_curve_on_the_same_axes() -> None:
    pytest.importorskip("matplotlib")
    from benchmarks.llm_graphs import SHAPES, make_llama
    from onnxmem.views.html import svg_curve
    from onnxmem.views.plot import _pyplot, draw_curve
    from onnxmem.views.series import curve_axes

    quadratic = onnxmem.fit(make_llama(SHAPES["tiny"], TensorProto.FLOAT), memory="40MiB", search="seq",
                            dims={"batch": 2, "past": 1}, what_if=False)
    axes = curve_axes(quadratic)
    assert axes.log and all(t & (t - 1) == 0 for t in axes.x_ticks + axes.y_ticks)  # powers of two
    plt = _pyplot()
    figure, ax = plt.subplots()
    try:
        draw_curve(ax, quadratic)
        assert ax.get_xscale() == ax.get_yscale() == "log"
        assert [int(t) for t in ax.get_xticks()] == list(axes.x_ticks)
        png_labels = [t.get_text() for t in ax.get_xticklabels()]
        png_y = [t.get_text() for t in ax.get_yticklabels()]
    finally:
        plt.close(figure)
    svg = svg_curve(quadratic)
    for label in (*png_labels, *png_y):
        assert f">{label}</text>" in svg, label  # the same tick, written the same
    assert "2^" not in "".join(png_labels) and "log scale" in svg


def test_check_plot_draws_the_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from onnxmem.views import plot

    drawn = []
    original = plot.draw_verdict
    monkeypatch.setattr(plot, "draw_verdict", lambda ax, a: (drawn.append(a), original(ax, a)))
    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    picture = tmp_path / "gate.png"
    code, _, err = run("check", path, "--dim", "batch=8", "--budget", "64MiB", "--runtime", "onnxruntime",
                       "--reserve", "0B", "--plot", str(picture))
    assert code == 0, err
    gate = onnxmem.check(path, {"batch": 8}, memory="64MiB", runtime="onnxruntime", reserve="0B")
    assert drawn == [gate.arithmetic] and picture.stat().st_size > 10_000
