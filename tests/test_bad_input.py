"""Bad input: every case is a one-line error with exit code 2 (or a named warning), never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

import onnxmem

from . import graphs
from .cli import run, save


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("onnxmem: error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


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
        ["dims past were not given and took the default dim 3 (--default-dim, or default_dim= in Python)"]


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


# --- issue 15: every cause of a traceback, a hang or a silent wrong answer -------------------------------------

def _add_weight(weight: onnx.TensorProto, shape: list[int | str | None] | None = None) -> onnx.ModelProto:
    return graphs.model([graphs.node("Add", ["x", weight.name], ["y"])], [graphs.value("x", shape)],
                        [graphs.value("y", shape)], [weight])


def _serialized_with(model: onnx.ModelProto, old: bytes, new: bytes) -> bytes:
    data = model.SerializeToString()
    assert old in data
    return data.replace(old, new)


def test_a_declared_length_is_never_built(tmp_path: Path) -> None:
    # 2^62 int64 values declared over 8 bytes of data feeding Slice, and a 2^40-long graph input into Slice:
    # ONNX's data propagation would expand either value by value (minutes, terabytes)
    starts = onnx.TensorProto(name="starts", data_type=onnx.TensorProto.INT64, dims=[2**62], raw_data=b"\0" * 8)
    ends = onnx.helper.make_tensor("ends", onnx.TensorProto.INT64, [1], [1])
    slice_model = graphs.model([graphs.node("Slice", ["x", "starts", "ends"], ["y"])], [graphs.value("x", [4])],
                               [graphs.value("y", [None])], [starts, ends])
    code, _, err = run("report", save(slice_model, tmp_path / "a.onnx"))
    assert_one_line_error(code, err, "initializer 'starts'", "dims [4611686018427387904]")
    starts = onnx.TensorProto(name="starts", data_type=onnx.TensorProto.INT64, dims=[2**40], raw_data=b"\0" * 8)
    slice_model.graph.initializer[0].CopyFrom(starts)
    code, _, err = run("report", save(slice_model, tmp_path / "b.onnx"))
    assert_one_line_error(code, err, "initializer 'starts'", "holds at most", "need 8796093022208")
    long_input = graphs.model([graphs.node("Slice", ["x", "s", "ends"], ["y"])],
                              [graphs.value("x", [4]), graphs.value("s", [2**40], onnx.TensorProto.INT64)],
                              [graphs.value("y", [None])], [ends])
    code, _, err = run("report", save(long_input, tmp_path / "c.onnx"))
    assert_one_line_error(code, err, "graph input 's'", "vector of 1099511627776 integers")


@pytest.mark.parametrize(("old", "new", "needle"), [
    (b"Add_y", b"Add\xff\xfe", "its name is not valid UTF-8 ('Add\\xff\\xfe')"),
    (b"\x03Add", b"\x03A\xffd", "its op_type is not valid UTF-8"),
    (b"absent.bin", b"abs\xffnt.bin", "external-data 'location' is not valid UTF-8"),
])
def test_strings_that_are_not_utf8_are_named(tmp_path: Path, old: bytes, new: bytes, needle: str) -> None:
    model = _add_weight(graphs.external_header("w", onnx.TensorProto.FLOAT, [4, 4]))
    path = tmp_path / "m.onnx"
    path.write_bytes(_serialized_with(model, old, new))
    code, _, err = run("report", str(path))
    assert_one_line_error(code, err, needle)


@pytest.mark.parametrize(("tensor", "needle"), [
    (onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[4, 4], raw_data=b"\0" * 60),
     "initializer 'w' (FLOAT, dims [4, 4]) holds 60 bytes of data where its dims need 64"),
    (onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[4, 4]), "holds no data"),
    (onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[4, 4], float_data=[1.0] * 3),
     "holds 3 values in float_data where its dims need 16"),
    (onnx.TensorProto(name="w", data_type=99, dims=[4, 4], raw_data=b"\0" * 64), "data_type 99"),
    (onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[-4, -4], raw_data=b"\0" * 64),
     "negative dim: dims [-4, -4]"),
])
def test_initializer_data_that_does_not_fit_its_dims(tmp_path: Path, tensor: onnx.TensorProto, needle: str) -> None:
    code, _, err = run("report", save(_add_weight(tensor, [4, 4]), tmp_path / "m.onnx"))
    assert_one_line_error(code, err, needle)


@pytest.mark.parametrize(("location", "needle"), [
    ("a" * 5000, "is too long for a file name (5000 characters)"),
    ("/etc/passwd", "is absolute"),
    ("../outside.bin", "leaves the model's folder"),
])
def test_unusable_external_data_locations(tmp_path: Path, location: str, needle: str) -> None:
    model = _add_weight(graphs.external_header("w", onnx.TensorProto.FLOAT, [4, 4], location=location), [4, 4])
    code, _, err = run("report", save(model, tmp_path / "m.onnx"))
    assert_one_line_error(code, err, "initializer 'w': external-data location", needle)
    assert len(err) < 600


def test_a_duplicate_initializer_is_refused_not_counted_twice(tmp_path: Path) -> None:
    weight = onnx.helper.make_tensor("w", onnx.TensorProto.FLOAT, [4, 4], [1.0] * 16)
    model = _add_weight(weight, [4, 4])
    model.graph.initializer.append(weight)
    code, _, err = run("report", save(model, tmp_path / "m.onnx"))
    assert_one_line_error(code, err, "initializer 'w' is given twice")


def test_a_loop_body_of_the_wrong_type_is_refused(tmp_path: Path) -> None:
    model = graphs.loop()
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = next(a for a in loop.attribute if a.name == "body")
    body.CopyFrom(onnx.helper.make_attribute("body", 3))
    code, _, err = run("report", save(model, tmp_path / "m.onnx"), "--default-dim", "2")
    assert_one_line_error(code, err, "(Loop): attribute 'body' must be a graph (GRAPH), not INT")


def test_invalid_elem_type_and_recursive_function(tmp_path: Path) -> None:
    model = graphs.model([graphs.node("Relu", ["x"], ["y"])], [graphs.value("x", dtype=77)], [graphs.value("y")])
    code, _, err = run("report", save(model, tmp_path / "a.onnx"), "--default-dim", "2")
    assert_one_line_error(code, err, "graph input 'x' has elem_type 77")
    call = onnx.helper.make_node("F", ["a"], ["b"], domain="local")
    function = onnx.helper.make_function("local", "F", ["a"], ["b"], [call], [onnx.helper.make_opsetid("", 18)])
    model = graphs.model([onnx.helper.make_node("F", ["x"], ["y"], domain="local")], [graphs.value("x")],
                         [graphs.value("y")])
    model.functions.append(function)
    model.opset_import.append(onnx.helper.make_opsetid("local", 1))
    code, _, err = run("report", save(model, tmp_path / "b.onnx"), "--default-dim", "2")
    assert_one_line_error(code, err, "local function 'local::F' calls itself (local::F -> local::F)")


def test_an_opset_newer_than_onnx_knows_is_a_named_warning() -> None:
    model = graphs.model([graphs.node("Relu", ["x"], ["y"])], [graphs.value("x", [2])], [graphs.value("y", [2])],
                         opset=onnx.defs.onnx_opset_version() + 1)
    report = onnxmem.analyze(model)
    assert [w.code for w in report.warnings] == ["newer-opset"]
    assert report.inference.peak_activation_bytes == 8


@pytest.mark.parametrize("suffix", [".onnxtxt", ".json"])
def test_malformed_text_models(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"m{suffix}"
    path.write_text('ir_version: 8\ngraph { node { op_type: "Relu" ' if suffix == ".onnxtxt" else '{"graph": [}')
    code, _, err = run("report", str(path))
    assert_one_line_error(code, err, "could not be read as ONNX")


def test_endless_and_random_streams_are_refused_at_once() -> None:
    for device in ("/dev/zero", "/dev/urandom"):
        code, _, err = run("report", device)
        assert_one_line_error(code, err, "not a valid ONNX model")


def test_a_model_read_from_a_pipe_gives_the_files_answer(tmp_path: Path) -> None:
    import os
    import threading

    source = Path(__file__).parent.parent / "fixtures" / "mlp.onnx"
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(source.read_bytes()))
    writer.start()
    piped = onnxmem.analyze(str(fifo), {"batch": 4})
    writer.join()
    direct = onnxmem.analyze(str(source), {"batch": 4})
    assert piped.inference == direct.inference and piped.inference.weights_bytes > 0


def test_a_name_with_a_newline_and_200000_unbound_dims_stay_one_short_line(tmp_path: Path) -> None:
    model = graphs.model([graphs.node("Add", ["x", "gh\nost"], ["y"])], [graphs.value("x")], [graphs.value("y")])
    code, _, err = run("report", save(model, tmp_path / "a.onnx"))
    assert_one_line_error(code, err, "'gh\\nost'")
    inputs = [graphs.value(f"i{k}", [f"d{k}"]) for k in range(200_000)]
    model = graphs.model([graphs.node("Relu", ["i0"], ["y"])], inputs, [graphs.value("y", ["d0"])])
    code, _, err = run("report", save(model, tmp_path / "b.onnx"))
    assert_one_line_error(code, err, "unbound dims", "d0 (input 'i0' axis 0)", "and 199,990 more")
    assert len(err) < 2500


@pytest.mark.parametrize(("option", "value"), [("--top", "0"), ("--default-dim", "0"), ("--grad-accum", "0"),
                                                ("--micro-batch", "-1")])
def test_numeric_options_are_validated_by_click(tmp_path: Path, option: str, value: str) -> None:
    code, _, err = run("report", save(graphs.symbolic_mlp(), tmp_path / "m.onnx"), "--dim", "batch=2", option, value)
    assert code == 2 and "Invalid value" in err and "Traceback" not in err


def test_gpus_must_be_positive(tmp_path: Path) -> None:
    code, _, err = run("check", save(graphs.symbolic_mlp(), tmp_path / "m.onnx"), "--dim", "batch=2",
                       "--memory", "1GB", "--gpus", "0")
    assert code == 2 and "Invalid value for '--gpus'" in err


# The command run by the signal test, stopped where it is ready: an audit hook (sys.addaudithook) says so on a pipe,
# then waits there for the signal, so that the signal lands at that stage whatever the machine's load: "imports",
# once console.run has set its early handlers and starts importing the CLI; "analysis", as the model is opened.
_STOPPED_AT = """
import os, signal, sys, time
# as a command typed at a terminal starts: a shell's background job (nohup, &, a CI runner's) is started with SIGINT
# ignored, which console.run rightly keeps ignored; this test is about the signal arriving, so it starts as typed
signal.signal(signal.SIGINT, signal.default_int_handler)
stage, ready = sys.argv.pop(1), int(sys.argv.pop(1))
model = sys.argv[2]
fired = []

def stop(event, args):
    if fired:
        return
    if (stage == "imports" and event == "import" and args[0] == "onnxmem.cli.commands") or \
            (stage == "analysis" and event == "open" and args and str(args[0]) == model):
        fired.append(event)
        os.write(ready, b"ready\\n")
        time.sleep(120)  # the signal ends the wait: its handler exits, or raises here

sys.addaudithook(stop)
sys.argv[0] = "onnxmem"
from onnxmem.cli.console import run
run()
"""


@pytest.mark.parametrize(("signum", "code", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                      (signal.SIGTERM, 143, "terminated")])
@pytest.mark.parametrize("stage", ["imports", "analysis"])
def test_a_signal_at_any_time_ends_with_one_line(tmp_path: Path, signum: int, code: int, word: str,
                                                 stage: str) -> None:
    # While the command starts (its imports) and while it analyses a graph: one line, no traceback. The child says
    # when it has reached the stage (no sleep: on a loaded machine a timed signal came before any handler).
    import select

    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen([sys.executable, "-c", _STOPPED_AT, stage, str(write_end), "report", path,
                                    "--dim", "batch=2", "--training"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, pass_fds=(write_end,),
                                   cwd=Path(__file__).resolve().parent.parent)
        os.close(write_end)
        write_end = -1
        assert select.select([read_end], [], [], 120)[0], "the command never reached the stage"
        assert os.read(read_end, 16) == b"ready\n"
        process.send_signal(signum)
        _, err = process.communicate(timeout=120)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    assert process.returncode == code, err[-2000:]
    assert err == f"onnxmem: {word}\n"


def test_a_background_jobs_ignored_sigint_stays_ignored(tmp_path: Path) -> None:
    # A shell starts a background job with SIGINT ignored (a Ctrl-C at the terminal is not for it): the command keeps
    # it so, and still ends on SIGTERM with one line. Both signals are pending when the child next runs; Linux
    # delivers the lower-numbered first, so an SIGINT that were handled would give 130, not 143.
    import select

    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    stopped_at = _STOPPED_AT.replace("signal.signal(signal.SIGINT, signal.default_int_handler)",
                                     "signal.signal(signal.SIGINT, signal.SIG_IGN)")
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen([sys.executable, "-c", stopped_at, "analysis", str(write_end), "report", path,
                                    "--dim", "batch=2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   pass_fds=(write_end,), cwd=Path(__file__).resolve().parent.parent)
        os.close(write_end)
        write_end = -1
        assert select.select([read_end], [], [], 120)[0], "the command never reached the stage"
        assert os.read(read_end, 16) == b"ready\n"
        process.send_signal(signal.SIGINT)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    assert process.returncode == 143, err[-2000:]
    assert err == "onnxmem: terminated\n"


def test_an_option_click_refuses_is_also_a_json_error_where_json_was_asked(tmp_path: Path) -> None:
    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    root = Path(__file__).resolve().parent.parent
    for fmt, json_out in (("json", True), ("jsonl", True), ("table", False)):
        done = subprocess.run([sys.executable, "-m", "onnxmem", "report", path, "--dim", "batch=2", "--top", "0",
                               "--format", fmt], capture_output=True, text=True, timeout=120, cwd=root)
        assert done.returncode == 2 and "Invalid value for '--top'" in done.stderr and "Traceback" not in done.stderr
        if json_out:
            document = json.loads(done.stdout)
            assert document["schema"] == "onnxmem.error/1" and document["code"] == "usage"
            assert "--top" in document["message"]
        else:
            assert done.stdout == ""
