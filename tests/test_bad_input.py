"""Bad input: every case is a one-line error with exit code 2 (or a named warning), never a traceback."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

import onnxmem
from onnxmem.cli import main

from . import graphs


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("onnxmem: error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def save(model: onnx.ModelProto, path: Path) -> str:
    onnx.save(model, str(path))
    return str(path)


def test_missing_file(tmp_path: Path) -> None:
    code, _, err = run("report", str(tmp_path / "nope.onnx"))
    assert_one_line_error(code, err, "no such file")


def test_directory(tmp_path: Path) -> None:
    code, _, err = run("report", str(tmp_path))
    assert_one_line_error(code, err, "is a directory")


def test_text_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a model\n" * 20)
    code, _, err = run("report", str(path))
    assert_one_line_error(code, err, "not a valid ONNX model")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    code, _, err = run("report", str(path))
    assert_one_line_error(code, err, "not a valid ONNX model")


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.9])
def test_truncated_model(tmp_path: Path, keep: float) -> None:
    data = graphs.symbolic_mlp().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: int(len(data) * keep)])
    code, _, err = run("report", str(path), "--dim", "batch=1")
    assert_one_line_error(code, err)
    assert "not a valid ONNX model" in err or "produced by no" in err


def test_tensor_without_producer(tmp_path: Path) -> None:
    model = graphs.model([graphs.node("Add", ["x", "ghost"], ["y"])], [graphs.value("x")], [graphs.value("y")])
    code, _, err = run("report", save(model, tmp_path / "m.onnx"))
    assert_one_line_error(code, err, "'ghost'", "produced by no node")


def test_cycle(tmp_path: Path) -> None:
    model = graphs.model(
        [graphs.node("Add", ["x", "b"], ["a"]), graphs.node("Relu", ["a"], ["b"]), graphs.node("Neg", ["a"], ["y"])],
        [graphs.value("x")], [graphs.value("y")])
    code, _, err = run("report", save(model, tmp_path / "m.onnx"))
    assert_one_line_error(code, err, "cycle")


def test_unbound_dim_lists_dims_and_how_to_bind(tmp_path: Path) -> None:
    code, _, err = run("report", save(graphs.symbolic_mlp(), tmp_path / "m.onnx"))
    assert_one_line_error(code, err, "unbound dims", "batch", "--dim batch=N")


def test_unbound_dims_of_a_kv_cache_are_named_once_each(tmp_path: Path) -> None:
    # 40 KV-cache inputs share 'past'; 'past + seq' is bound with past and seq, so it is not asked for
    from benchmarks.llm_graphs import LlamaShape, make_llama

    model = make_llama(LlamaShape(layers=20, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256))
    code, _, err = run("report", save(model, tmp_path / "m.onnx"), "--dim", "batch=2")
    assert_one_line_error(code, err, "unbound dims: past (input 'past_key_values.0.key' axis 2, and 39 more inputs)",
                          "seq (input", "--dim past=N --dim seq=N")
    assert "past + seq" not in err and len(err) < 400


def test_default_dim_sizes_an_expression_dim_from_its_parts(tmp_path: Path) -> None:
    from benchmarks.llm_graphs import LlamaShape, make_llama

    model = make_llama(LlamaShape(layers=1, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256))
    report = onnxmem.analyze(model, {"batch": 2, "seq": 5}, default_dim=3)
    assert report.dims["past"] == 3 and report.dims["past + seq"] == 8  # not the default itself
    assert [w.message for w in report.warnings if w.code == "default-dim"] == \
        ["dims past were not given and took --default-dim 3"]


def test_default_dim_binds_with_a_warning(tmp_path: Path) -> None:
    code, out, _ = run("report", save(graphs.symbolic_mlp(), tmp_path / "m.onnx"), "--default-dim", "3",
                       "--format", "json")
    assert code == 0
    assert '"batch": 3' in out and "default-dim" in out


@pytest.mark.parametrize(("value", "needle"), [("0", "positive"), ("-4", "positive"), ("eight", "not an integer"),
                                               (str(2**63), "too large")])
def test_bad_dim_values(tmp_path: Path, value: str, needle: str) -> None:
    code, _, err = run("report", save(graphs.symbolic_mlp(), tmp_path / "m.onnx"), "--dim", f"batch={value}")
    assert_one_line_error(code, err, needle)


def test_malformed_dim_option(tmp_path: Path) -> None:
    code, _, err = run("report", save(graphs.symbolic_mlp(), tmp_path / "m.onnx"), "--dim", "batch")
    assert_one_line_error(code, err, "NAME=VALUE")


def test_misspelled_dim_is_named(tmp_path: Path) -> None:
    code, _, err = run("report", save(graphs.symbolic_mlp(), tmp_path / "m.onnx"), "--dim", "bach=2")
    assert_one_line_error(code, err, "unknown dim bach", "batch")


def test_unknown_operator_is_a_named_warning(tmp_path: Path) -> None:
    nodes = [graphs.node("Add", ["x", "x"], ["a"]),
             onnx.helper.make_node("Frobnicate", ["a"], ["b"], domain="example.custom", name="frob"),
             graphs.node("Relu", ["b"], ["y"])]
    model = graphs.model(nodes, [graphs.value("x")], [graphs.value("y")])
    model.opset_import.append(onnx.helper.make_opsetid("example.custom", 1))
    report = onnxmem.analyze(model)
    codes = {w.code for w in report.warnings}
    assert "unknown-operator" in codes
    # Its output's size is unknown, and the report says so instead of counting it as zero silently.
    assert "unknown-shape" in codes
    assert report.inference.unsized_tensors >= 1
    code, out, err = run("report", save(model, tmp_path / "m.onnx"))
    assert code == 0 and "Frobnicate" in out and "lower bound" in out


def test_missing_external_data_is_a_warning_and_weights_are_still_sized(tmp_path: Path) -> None:
    w = graphs.external_header("W", onnx.TensorProto.FLOAT, [1024, 1024], location="weights.bin")
    model = graphs.model([graphs.node("MatMul", ["x", "W"], ["y"])], [graphs.value("x", [2, 1024])],
                         [graphs.value("y", [2, 1024])], [w])
    path = save(model, tmp_path / "m.onnx")
    report = onnxmem.analyze(path)
    assert report.inference.weights_bytes == 4 * 1024 * 1024
    assert [w.code for w in report.warnings] == ["missing-external-data"]


def test_nothing_is_written_next_to_the_model_or_in_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    custom = graphs.model([onnx.helper.make_node("Frobnicate", ["x"], ["y"], domain="example.custom")],
                          [graphs.value("x")], [graphs.value("y")])
    custom.opset_import.append(onnx.helper.make_opsetid("example.custom", 1))
    custom_path = save(custom, tmp_path / "custom.onnx")
    for fmt in ("table", "json", "markdown"):
        assert run("report", path, "--dim", "batch=4", "--format", fmt)[0] == 0
        assert run("report", custom_path, "--format", fmt)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["custom.onnx", "m.onnx"]
