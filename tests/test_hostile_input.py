"""Hostile input: models and files written to hang, exhaust or fool the analyser, generated here (no stored files).

Each class of attack ends in a one-line error with exit code 2 naming the problem, or in a named warning; a bound
on time is shown by a trip count so large that iterating would never end (no wall-time assertion), a bound on
memory by tracemalloc.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import onnxmem
from onnxmem.ir import load

from .cli import run, save
from .test_bad_input import assert_one_line_error

MiB = 1 << 20


# --- writing protobuf by hand: what onnx.helper never writes -----------------------------------------------------

def _varint(value: int, overlong: int = 0) -> bytes:
    """Give `value` as a protobuf varint (negative: ten bytes, as protobuf writes an int64), padded with
    `overlong` continuation bytes that add nothing (a parser accepts them; a byte search does not see the value)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            break
    if overlong:
        out[-1] |= 0x80
        out.extend([0x80] * (overlong - 1) + [0x00])
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """Give a length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _hidden_op_type(node: onnx.NodeProto) -> bytes:
    """Give the node serialized with its op type's length written as an overlong varint: the same node to a
    parser, but no byte search for the op type finds it."""
    plain = onnx.NodeProto()
    plain.CopyFrom(node)
    plain.ClearField("op_type")
    return plain.SerializeToString() + _varint(4 << 3 | 2) + _varint(len(node.op_type), overlong=2) \
        + node.op_type.encode()


def _model_bytes(model: onnx.ModelProto, node_bytes: list[bytes] = (), initializer_bytes: list[bytes] = ()) -> bytes:
    """Give the model serialized with `node_bytes` appended to its graph's nodes and `initializer_bytes` to its
    initializers, as written (GraphProto: node is field 1, initializer field 5; ModelProto: graph is field 7)."""
    graph = model.graph.SerializeToString() + b"".join(_field(1, n) for n in node_bytes) \
        + b"".join(_field(5, t) for t in initializer_bytes)
    shell = onnx.ModelProto()
    shell.CopyFrom(model)
    shell.ClearField("graph")
    return shell.SerializeToString() + _field(7, graph)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           initializers: list[onnx.TensorProto] = ()) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers)),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _value(name: str, dims: list[int], dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, dims)


def _loop(trips: int, n: int = 4, scan: bool = False) -> onnx.ModelProto:
    """y = Loop(M, "", x) with a Relu body, M a constant `trips` (a few hundred bytes whatever the count)."""
    outputs = [_value("c_out", [], TensorProto.BOOL), _value("a_out", [n])]
    nodes = [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Relu", ["a_in"], ["a_out"])]
    if scan:
        nodes.append(helper.make_node("Sigmoid", ["a_in"], ["s"]))
        outputs.append(_value("s", [n]))
    body = helper.make_graph(nodes, "body", [_value("i", [], TensorProto.INT64), _value("c_in", [], TensorProto.BOOL),
                                             _value("a_in", [n])], outputs)
    loop = helper.make_node("Loop", ["M", "", "x"], ["y", "ys"] if scan else ["y"], body=body)
    return _model([loop], [_value("x", [n])], [_value("y", [n])],
                  [helper.make_tensor("M", TensorProto.INT64, [], [trips])])


# --- hangs ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("trips", [10**9, 2**62, 2**63 - 1])
def test_a_loop_of_any_trip_count_is_worked_out_not_iterated(tmp_path: Path, trips: int) -> None:
    # Iterating 2^62 times would never end: the answer comes, its peak the same as a count of 100's (the body
    # holds nothing that grows), and a named warning says the iterations were summarized.
    path = save(_loop(trips), tmp_path / "loop.onnx")
    assert os.path.getsize(path) < 400
    code, out, err = run("report", path, "--format", "json")
    assert code == 0, err
    import json

    report = json.loads(out)
    assert "loop-iterations-summarized" in {w["code"] for w in report["warnings"]}
    assert report["inference"]["peak_activation_bytes"] == \
        onnxmem.analyze(_loop(100), {}).inference.peak_activation_bytes


def test_a_loop_whose_scan_outputs_grow_counts_every_iteration() -> None:
    # A scan output of 16 bytes an iteration, kept until the loop ends: 10^12 iterations hold 16 TB of them.
    few, many = (onnxmem.analyze(_loop(trips, scan=True), {}).inference.peak_activation_bytes
                 for trips in (100, 10**12))
    assert many - few == (10**12 - 100) * 16


def test_a_fifo_without_a_writer_is_refused_instead_of_blocking(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    monkeypatch.setattr(load, "PIPE_WAIT_S", 0.2)
    with pytest.raises(onnxmem.ModelFileError, match="a pipe that gave no bytes"):
        onnxmem.analyze(str(fifo), {})


def test_a_fifo_whose_writer_stalls_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    monkeypatch.setattr(load, "PIPE_WAIT_S", 0.2)
    # The writer is this process, ready before the reader opens: a FIFO opened for reading and writing opens at
    # once, and its first bytes wait in the pipe (a writer thread raced the reader's wait on a busy machine, and
    # blocked for ever in open() where the reader had given up first).
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(writer, _loop(3).SerializeToString()[:10])
        with pytest.raises(onnxmem.ModelFileError, match="a pipe that gave no bytes"):
            onnxmem.analyze(str(fifo), {})
        with pytest.raises(BlockingIOError):  # the reader took the first bytes, then waited for more
            os.read(writer, 16)
    finally:
        os.close(writer)


def test_a_socket_and_devices_are_refused_unopened(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        code, _, err = run("report", str(path))
        assert_one_line_error(code, err, "it is a socket, not a regular file")
    finally:
        server.close()
    for device in ("/dev/null", "/dev/zero"):
        code, _, err = run("report", device)
        assert_one_line_error(code, err, "it is a character device")


def test_a_file_of_2_gib_is_refused_before_it_is_read(tmp_path: Path) -> None:
    # A sparse file: 2 GiB by its size, no disk. Reading it whole took 20 s and 2 GB; its size alone refuses it.
    import tracemalloc

    path = tmp_path / "huge.onnx"
    with open(path, "wb") as file:
        file.truncate(2**31)
    tracemalloc.start()
    try:
        with pytest.raises(onnxmem.ModelFileError, match="2 GiB or more"):
            onnxmem.analyze(str(path), {})
        assert tracemalloc.get_traced_memory()[1] < 16 * MiB
    finally:
        tracemalloc.stop()


# --- checks a byte trick switched off: every check on the parsed model, at every depth --------------------------

def _branch(name: str, initializers: list[onnx.TensorProto] = (), nodes: list[onnx.NodeProto] | None = None,
            ) -> onnx.GraphProto:
    return helper.make_graph(nodes or [helper.make_node("Neg", ["x"], [f"{name}_out"])], name, [],
                             [_value(f"{name}_out", [4])], initializer=list(initializers))


def _if(then_branch: onnx.GraphProto, else_branch: onnx.GraphProto | None) -> tuple[onnx.ModelProto, bytes]:
    """Give an If over x with these branches: the model, and its bytes with the If's op type hidden from a byte
    search."""
    branches = {"then_branch": then_branch, **({"else_branch": else_branch} if else_branch is not None else {})}
    node = helper.make_node("If", ["c"], ["y"], **branches)
    model = _model([], [_value("x", [4]), _value("c", [], TensorProto.BOOL)], [_value("y", [4])])
    return model, _model_bytes(model, [_hidden_op_type(node)])


def _external(name: str, location: str) -> onnx.TensorProto:
    tensor = helper.make_tensor(name, TensorProto.FLOAT, [4], [0.0] * 4)
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _big(name: str, dims: list[int]) -> onnx.TensorProto:
    tensor = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, raw_data=b"")
    tensor.dims.extend(dims)
    return tensor


BRANCH_ATTACKS = {
    "a missing branch": (_branch("t"), None, "attribute 'else_branch' is missing"),
    "2^64 elements": (_branch("t", [_big("w", [2**32, 2**32])]), _branch("e"), "more than 64-bit sizes can count"),
    "a negative dim": (_branch("t", [_big("w", [-4, 1])]), _branch("e"), "has a negative dim"),
    "a duplicate initializer": (_branch("t", [helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])] * 2),
                                _branch("e"), "initializer 'w' is given twice (in graph 't')"),
    "an external location outside the folder": (
        _branch("t", [_external("w", "../../../../etc/passwd")]), _branch("e"), "leaves the model's folder"),
    "a nested body's absolute location": (
        _branch("t", nodes=[helper.make_node("If", ["c"], ["t_out"], then_branch=_branch(
            "deep", [_external("w", "/etc/passwd")]), else_branch=_branch("deep2"))]), _branch("e"),
        "is absolute"),
}


@pytest.mark.parametrize("attack", sorted(BRANCH_ATTACKS))
def test_an_if_whose_op_type_hides_from_a_byte_search_is_checked_all_the_same(tmp_path: Path, attack: str) -> None:
    then_branch, else_branch, needle = BRANCH_ATTACKS[attack]
    model, data = _if(then_branch, else_branch)
    assert data.endswith(b'"\x82\x80\x00If')  # no byte search for the If's op type finds it; a parser does:
    parsed = onnx.ModelProto.FromString(data)
    assert parsed.graph.node[0].op_type == "If"
    path = tmp_path / "hidden.onnx"
    path.write_bytes(data)
    code, _, err = run("report", str(path))
    assert_one_line_error(code, err, "invalid model", needle)
    with pytest.raises(onnxmem.ModelFileError, match="invalid model"):  # a ModelProto given: the same check
        onnxmem.analyze(parsed, {})


def test_a_negative_dim_written_packed_is_refused(tmp_path: Path) -> None:
    # TensorProto.dims (field 1) packed: one length-delimited field of varints, no per-dim tag byte to search for;
    # two negative dims make a positive count, which its 32 bytes of data fit.
    tensor = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, raw_data=bytes(32))
    packed = tensor.SerializeToString() + _field(1, _varint(-4) + _varint(-2))
    assert list(onnx.TensorProto.FromString(packed).dims) == [-4, -2]
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_value("x", [4])], [_value("y", [4])])
    path = tmp_path / "packed.onnx"
    path.write_bytes(_model_bytes(model, initializer_bytes=[packed]))
    code, _, err = run("report", str(path))
    assert_one_line_error(code, err, "initializer 'w' has a negative dim: dims [-4, -2]")


# --- silently wrong: weights inside a branch -------------------------------------------------------------------

def test_weights_inside_an_if_branch_are_named_with_their_graph() -> None:
    # 4 MiB of weights in the then-branch (an initializer) and 64 bytes in the else-branch (a Constant node)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [1024, 1024], bytes(4 * MiB), raw=True)
    then_branch = _branch("t", [weight], [helper.make_node("MatMul", ["x", "w"], ["t_out"])])
    constant = helper.make_tensor("k", TensorProto.FLOAT, [16], bytes(64), raw=True)
    else_branch = _branch("e", nodes=[helper.make_node("Constant", [], ["k"], value=constant),
                                      helper.make_node("Add", ["x", "k"], ["e_out"])])
    model = _model([helper.make_node("If", ["c"], ["y"], name="gate", then_branch=then_branch,
                                     else_branch=else_branch)],
                   [_value("x", [1024]), _value("c", [], TensorProto.BOOL)], [_value("y", [1024])])
    found = [w for w in onnxmem.analyze(model, {}).warnings if w.code == "subgraph-weights"]
    assert len(found) == 1
    message = found[0].message
    assert message.startswith(f"2 weights ({4 * MiB + 64:,} bytes)")
    assert f"graph 't' of If node 'gate', 'then_branch': 1 ({4 * MiB:,} bytes)" in message
    assert "graph 'e' of If node 'gate', 'else_branch': 1 (64 bytes)" in message


# --- never write over an input ---------------------------------------------------------------------------------

def _mlp_with_external_weights(folder: Path, weights: str) -> Path:
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], bytes(64), raw=True)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_value("x", [1, 4])], [_value("y", [1, 4])],
                   [weight])
    path = folder / "model.png"  # a model need not end in .onnx: the picture would land on it
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=weights,
              size_threshold=0)
    return path


@pytest.mark.parametrize("command", [["report"], ["check", "--memory", "1GiB"], ["fit", "--memory", "1GiB"]])
def test_plot_never_writes_over_the_model_or_its_weights(tmp_path: Path, command: list[str]) -> None:
    path = _mlp_with_external_weights(tmp_path, "weights.svg")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    (tmp_path / "link.svg").symlink_to(tmp_path / "weights.svg")
    for target, needle in ((path, "is the model"), (tmp_path / "weights.svg", "external data file 'weights.svg'"),
                           (tmp_path / "link.svg", "external data file 'weights.svg'"),
                           (tmp_path / "sub" / ".." / "model.png", "is the model")):
        (tmp_path / "sub").mkdir(exist_ok=True)
        code, _, err = run(command[0], str(path), *command[1:], "--plot", str(target))
        assert_one_line_error(code, err, "--plot", needle, "never writes over")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in before} == before


# --- library arguments checked at the door ---------------------------------------------------------------------

def _entry_points() -> dict[str, object]:
    return {"analyze": onnxmem.analyze, "analysis": onnxmem.analysis, "fit": lambda *a, **k: onnxmem.fit(
        *a[:1], dims=a[1], memory="1GiB", **k), "check": lambda *a, **k: onnxmem.check(*a, memory="1GiB", **k),
        "validate": lambda *a, **k: onnxmem.validate(*a, **{n: v for n, v in k.items() if n != "order"})}


@pytest.mark.parametrize("name", ["analyze", "analysis", "fit", "check", "validate"])
@pytest.mark.parametrize(("argument", "given", "error"), [
    ("model", 42, onnxmem.ArgumentError), ("model", b"m.onnx", onnxmem.ArgumentError),
    ("dims", [("batch", 2)], onnxmem.ArgumentError), ("dims", {"batch": "2"}, onnxmem.DimError),
    ("dims", {3: 2}, onnxmem.DimError), ("dims", {"batch": True}, onnxmem.DimError),
    ("default_dim", "4", onnxmem.DimError), ("order", 5, onnxmem.ArgumentError),
    ("provider", 3, onnxmem.ArgumentError), ("training", "adam", onnxmem.ArgumentError)])
def test_a_wrong_argument_is_an_error_that_names_it(tmp_path: Path, name: str, argument: str, given: object,
                                                     error: type[Exception]) -> None:
    if name == "validate" and argument in ("order", "training"):
        pytest.skip("validate takes no such argument")
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_value("x", ["batch", 4])], [_value("y", ["batch", 4])])
    path = save(model, tmp_path / "m.onnx")
    arguments: dict[str, object] = {"model": path, "dims": {"batch": 2}, argument: given}
    call = _entry_points()[name]
    with pytest.raises(error, match=rf"^{name}\({argument}=\.\.\.\)") as raised:
        call(arguments.pop("model"), arguments.pop("dims"), **arguments)  # type: ignore[operator]
    assert isinstance(raised.value, onnxmem.OnnxMemError)


def test_dims_that_make_a_peak_beyond_any_memory_are_refused_in_one_line(tmp_path: Path) -> None:
    # thousands of symbolic dims, each given --default-dim 2: a tensor of 2^3000 elements, which no figure of a
    # report can carry (str() refuses ints over 4300 digits, float() over 1e308); a DimError, never an internal one
    import json

    dims = [f"d{i}" for i in range(3000)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    path = tmp_path / "wide.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(onnxmem.DimError, match="beyond any memory"):
        onnxmem.analyze(path, default_dim=2)
    code, out, err = run("report", str(path), "--default-dim", "2", "--format", "json")
    assert code == 2 and json.loads(out)["code"] == "dim"
    assert len(err.strip().splitlines()) == 1 and "internal" not in err
    code, out, err = run("report", str(path), "--default-dim", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "beyond any memory" in err


@pytest.mark.parametrize("attack", ["fifo", "dev-zero", "over a MiB", "deep nesting", "not utf-8"])
def test_a_hostile_genai_config_beside_the_model_is_not_read(tmp_path: Path, attack: str) -> None:
    # plan/kv reads onnxruntime-genai's genai_config.json beside the model: a FIFO there (no writer) must not block,
    # a device must not be read endlessly, and nothing in it may raise; the what-if is then not offered
    from onnxmem.plan.kv import shared_buffer_length

    config = tmp_path / "genai_config.json"
    if attack == "fifo":
        os.mkfifo(config)
    elif attack == "dev-zero":
        config.symlink_to("/dev/zero")
    elif attack == "over a MiB":
        config.write_text('{"search": {"max_length": 64}, "pad": "' + "x" * (1 << 20) + '"}')
    elif attack == "deep nesting":
        config.write_text("[" * 100_000 + "]" * 100_000)
    else:
        config.write_bytes(b'{"search": {"max_length": 64}} \xff')
    assert shared_buffer_length(tmp_path / "model.onnx") is None
    config.unlink()
    config.write_text('{"search": {"max_length": 64}}')  # the same folder with a real config: it is read
    assert shared_buffer_length(tmp_path / "model.onnx") == 64


def test_an_input_beyond_any_memory_that_no_activation_follows_is_refused_in_one_line(tmp_path: Path) -> None:
    # read only by a Shape: the activations' timeline stays small while the input alone is 2^3002 bytes at
    # --default-dim 2 (the fuzz found one: an internal ValueError from the JSON writer); with the same dims fixed,
    # the load refuses it in a short line (it printed every dim, and str() may refuse the count itself)
    for dims, error in (([f"d{i}" for i in range(3000)], onnxmem.DimError), ([2] * 3000, onnxmem.ModelFileError)):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
        y = helper.make_tensor_value_info("y", TensorProto.INT64, [3000])
        model = helper.make_model(helper.make_graph([helper.make_node("Shape", ["x"], ["y"])], "g", [x], [y]))
        path = tmp_path / "wide_input.onnx"
        path.write_bytes(model.SerializeToString())
        with pytest.raises(error, match="beyond any memory|more than 64-bit sizes can count") as raised:
            onnxmem.analyze(path, default_dim=2)
        assert len(str(raised.value)) < 400 and "2^300" in str(raised.value)
        for fmt in ("json", "table"):
            code, _, err = run("report", str(path), "--default-dim", "2", "--format", fmt)
            assert code == 2 and len(err.strip().splitlines()) == 1 and "internal" not in err
