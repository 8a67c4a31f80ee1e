"""A hostile corpus, generated (never stored): models written as an attacker would, by class, each run through the
CLI (`python -m onnxmem report MODEL`) and `onnxmem.analyze(MODEL)` in a subprocess under a time and an
address-space limit (30 s, 4 GiB by default). A run passes where it answers (exit 0) or refuses in one line
(exit 2, `onnxmem: error: ...`), with no traceback, and leaves the model's folder as it was (no file written
beside the model, none changed).

    python benchmarks/hostile_corpus.py [--timeout 30] [--memory-gib 4] [--only CLASS ...] [--show 5]
                                        [--checkout DIR] [--embedded-mib 64]

prints per class: cases, answers, clean errors, internal errors (a traceback, a crash, an exit other than 0 or 2,
an error of more than one line), hangs (over the time limit), writes beside the model, the largest RSS and the
longest run. tests/test_hostile_corpus.py runs the same cases.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import AttributeProto, TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measured_run import run_measured  # noqa: E402
from onnxmem.ir.embedded import length_delimited as _field  # noqa: E402 (protobuf's encoding, for byte tricks)
from onnxmem.ir.embedded import varint as _encode  # noqa: E402

OPSET = 17

# --- building blocks ------------------------------------------------------------------------------------------


def _value(name: str, dims: list[int | str] | None, dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, dims)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           initializers: Iterable[TensorProto] = (), opset: int | None = OPSET, **graph: object) -> onnx.ModelProto:
    made = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    for field, value in graph.items():
        getattr(made, field).extend(value)  # type: ignore[arg-type]
    model = helper.make_model(made, opset_imports=[helper.make_opsetid("", opset)] if opset is not None else [])
    if opset is None:
        del model.opset_import[:]
    model.ir_version = 8
    return model


def _relu(x: str = "x", y: str = "y", dims: list[int | str] | None = None) -> onnx.ModelProto:
    dims = [4, 8] if dims is None else dims
    return _model([helper.make_node("Relu", [x], [y])], [_value(x, dims)], [_value(y, dims)])


def _external(name: str, dims: list[int], **entries: str) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    return tensor


def _add_weight(weight: TensorProto, dims: list[int]) -> onnx.ModelProto:
    return _model([helper.make_node("Add", ["x", weight.name], ["y"])], [_value("x", dims)], [_value("y", dims)],
                  [weight])


# --- the classes: each writes its models into `folder` and gives their paths ---------------------------------


def huge_dims(folder: Path) -> list[Path]:
    """Dims whose product overflows: on an input, an output, an initializer stored externally, a Reshape's target
    shape given as a Constant, and an Expand to 2^62 elements."""
    big = 2**40
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [2**31, 2**31, 2**31])
    models = {
        "input": _relu(dims=[big, big]),
        "output": _model([helper.make_node("Relu", ["x"], ["y"])], [_value("x", [4])], [_value("y", [big, big])]),
        "initializer": _add_weight(_external("w", [big, big], location="w.bin"), [4]),
        "reshape": _model([helper.make_node("Constant", [], ["s"], value=shape),
                           helper.make_node("Reshape", ["x", "s"], ["y"])], [_value("x", [4])], [_value("y", None)]),
        "expand": _model([helper.make_node("Constant", [], ["s"], value=helper.make_tensor(
                              "s", TensorProto.INT64, [2], [2**31, 2**31])),
                          helper.make_node("Expand", ["x", "s"], ["y"])], [_value("x", [1])], [_value("y", None)]),
        "symbolic": _relu(dims=["n", "n", "n", "n"]),
    }
    return _save(folder, models)


def _nested_if(depth: int) -> bytes:
    """The bytes of a model of `depth` nested Ifs (built as bytes: onnx's own serializer stops at 100 levels)."""
    output = _value("y", [4]).SerializeToString()
    leaf = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "leaf", [], [_value("y", [4])])
    graph = other = leaf.SerializeToString()
    node = b""
    for _ in range(depth):
        attributes = [_field(1, name) + _field(6, body) + _encode(20 << 3) + _encode(AttributeProto.GRAPH)
                      for name, body in ((b"then_branch", graph), (b"else_branch", other))]
        node = _field(1, b"c") + _field(2, b"y") + _field(4, b"If") + b"".join(_field(5, a) for a in attributes)
        graph = _field(1, node) + _field(2, b"level") + _field(12, output)
    inputs = _value("x", [4]).SerializeToString(), _value("c", [], TensorProto.BOOL).SerializeToString()
    main = _field(1, node) + _field(2, b"g") + b"".join(_field(11, i) for i in inputs) + _field(12, output)
    opset = helper.make_opsetid("", OPSET).SerializeToString()
    return bytes([1 << 3]) + _encode(8) + _field(7, main) + _field(8, opset)


def deep_nesting(folder: Path) -> list[Path]:
    """If nodes nested 30 deep (within protobuf's parse limit) and 1000 deep (beyond it)."""
    paths = []
    for depth in (30, 1000):
        path = folder / f"nested_if_{depth}.onnx"
        path.write_bytes(_nested_if(depth))
        paths.append(path)
    return paths


def many_values(folder: Path) -> list[Path]:
    """10^6 graph inputs (one used), and 10^5 nodes each reading all of 10 inputs."""
    inputs = [_value(f"i{k}", [1]) for k in range(10**6)]
    wide = _model([helper.make_node("Relu", ["i0"], ["y"])], inputs, [_value("y", [1])])
    return _save(folder, {"inputs_1e6": wide})


def long_names(folder: Path) -> list[Path]:
    """A node name, a tensor name, a dim name and a graph name of 1 MB each."""
    long = "n" * 2**20
    node = _relu()
    node.graph.node[0].name = long
    tensor = _relu(x=long)
    dim = _relu(dims=[long, 4])
    graph = _relu()
    graph.graph.name = long
    return _save(folder, {"node_name": node, "tensor_name": tensor, "dim_name": dim, "graph_name": graph})


def wiring(folder: Path) -> list[Path]:
    """Duplicate node outputs, a cycle of two nodes, a node reading its own output, an output no node makes, an
    input read by no node, a node whose input nothing makes."""
    dims = [4]
    x, y = _value("x", dims), _value("y", dims)
    models = {
        "duplicate_output": _model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
                                   [x], [y]),
        "output_is_input": _model([helper.make_node("Relu", ["x"], ["x"])], [x], [x]),
        "cycle": _model([helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
                         helper.make_node("Add", ["a", "x"], ["y"])], [x], [y]),
        "self_loop": _model([helper.make_node("Relu", ["a"], ["a"]), helper.make_node("Add", ["a", "x"], ["y"])],
                            [x], [y]),
        "dangling_input": _model([helper.make_node("Add", ["x", "nowhere"], ["y"])], [x], [y]),
        "unmade_output": _model([helper.make_node("Relu", ["x"], ["z"])], [x], [y]),
        "initializer_as_output": _model([helper.make_node("Relu", ["x"], ["y"])], [x],
                                        [y, _value("w", dims)], [helper.make_tensor("w", 1, dims, [1, 2, 3, 4])]),
    }
    return _save(folder, models)


def odd_initializers(folder: Path) -> list[Path]:
    """Initializers of type STRING (with strings, with none) and UNDEFINED, and of type FLOAT holding strings."""
    strings = helper.make_tensor("w", TensorProto.STRING, [2], [b"a", b"b"])
    empty_strings = TensorProto(name="w", data_type=TensorProto.STRING, dims=[2**20])
    undefined = TensorProto(name="w", data_type=TensorProto.UNDEFINED, dims=[4], raw_data=b"\0" * 16)
    mixed = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    mixed.string_data.extend([b"x", b"y"])
    identity = [helper.make_node("Identity", ["w"], ["y"])]
    models = {
        "string": _model(identity, [], [_value("y", [2], TensorProto.STRING)], [strings]),
        "string_no_data": _model(identity, [], [_value("y", [2**20], TensorProto.STRING)], [empty_strings]),
        "undefined": _model(identity, [], [_value("y", [4])], [undefined]),
        "float_with_strings": _model(identity, [], [_value("y", [2])], [mixed]),
    }
    return _save(folder, models)


def sparse(folder: Path) -> list[Path]:
    """Sparse initializers: a sound one, one of 2^80 elements, one whose indices point past its dims, one whose
    values are stored externally past the end of a file."""
    def sparse_tensor(dims: list[int], values: TensorProto, indices: list[int]) -> onnx.SparseTensorProto:
        index = helper.make_tensor("w_indices", TensorProto.INT64, [len(indices)], indices)
        return helper.make_sparse_tensor(values, index, dims)

    values = helper.make_tensor("w", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    models = {}
    for name, made in (("sound", sparse_tensor([10], values, [0, 4, 9])),
                       ("huge", sparse_tensor([2**40, 2**40], values, [0, 1, 2])),
                       ("indices_past_dims", sparse_tensor([10], values, [0, 4, 10**12])),
                       ("external_values", sparse_tensor([10], _external("w", [3], location="v.bin", offset="9999"),
                                                         [0, 1, 2]))):
        models[f"sparse_{name}"] = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_value("x", [10])],
                                          [_value("y", [10])], sparse_initializer=[made])
    return _save(folder, models)


def external_data(folder: Path) -> list[Path]:
    """External data that is a directory, a FIFO, /dev/zero (absolute, and through a symlink), the model itself,
    a negative offset or length, an offset of 10^30, and a location repeated 10^4 times."""
    cases: dict[str, dict[str, str]] = {
        "directory": {"location": "a_directory"},
        "fifo": {"location": "a_fifo"},
        "dev_zero": {"location": "/dev/zero"},
        "symlink_dev_zero": {"location": "zero_link"},
        "itself": {"location": "ext_itself.onnx", "offset": "0", "length": "64"},
        "negative_offset": {"location": "w.bin", "offset": "-5"},
        "negative_length": {"location": "w.bin", "length": "-1"},
        "offset_1e30": {"location": "w.bin", "offset": str(10**30)},
        "not_a_number": {"location": "w.bin", "offset": "0x10", "length": "1e3"},
    }
    (folder / "a_directory").mkdir(exist_ok=True)
    if not (folder / "a_fifo").exists():
        os.mkfifo(folder / "a_fifo")
    if not (folder / "zero_link").is_symlink():
        (folder / "zero_link").symlink_to("/dev/zero")
    (folder / "w.bin").write_bytes(b"\0" * 64)
    models = {f"ext_{name}": _add_weight(_external("w", [16], **entries), [16]) for name, entries in cases.items()}
    many = [_external(f"w{k}", [16], location="w.bin") for k in range(10**4)]
    models["ext_many"] = _model([helper.make_node("Add", ["x", "w0"], ["y"])], [_value("x", [16])],
                                [_value("y", [16])], many)
    return _save(folder, models)


def opsets(folder: Path) -> list[Path]:
    """No opset import, opset 10^9 of ONNX's domain, opset 2^63 - 1, a custom domain at 10^9, an IR version 10^9."""
    custom = _relu()
    custom.opset_import.add(domain="com.attacker", version=10**9)
    ir = _relu()
    ir.ir_version = 10**9
    models = {"opset_missing": _model([helper.make_node("Relu", ["x"], ["y"])], [_value("x", [4])],
                                      [_value("y", [4])], opset=None),
              "opset_1e9": _model([helper.make_node("Relu", ["x"], ["y"])], [_value("x", [4])], [_value("y", [4])],
                                  opset=10**9),
              "opset_max": _model([helper.make_node("Relu", ["x"], ["y"])], [_value("x", [4])], [_value("y", [4])],
                                  opset=2**63 - 1),
              "custom_domain_1e9": custom, "ir_version_1e9": ir}
    return _save(folder, models)


def _function(name: str, nodes: list[onnx.NodeProto]) -> onnx.FunctionProto:
    return helper.make_function("local", name, ["a"], ["b"], nodes, [helper.make_opsetid("", OPSET)])


def functions(folder: Path) -> list[Path]:
    """10^5 local functions (one called), a function calling itself, two calling each other, one calling itself
    from inside an If body, and a chain of 10^4 functions."""
    def calling(functions: list[onnx.FunctionProto], first: str = "f0") -> onnx.ModelProto:
        model = _model([helper.make_node(first, ["x"], ["y"], domain="local")], [_value("x", [4])],
                       [_value("y", [4])])
        model.opset_import.add(domain="local", version=1)
        model.functions.extend(functions)
        return model

    relu = [helper.make_node("Relu", ["a"], ["b"])]
    many = [_function(f"f{k}", relu) for k in range(10**5)]
    chain = [_function(f"f{k}", [helper.make_node(f"f{k + 1}", ["a"], ["b"], domain="local")])
             for k in range(10**4 - 1)] + [_function(f"f{10**4 - 1}", relu)]
    branch = helper.make_graph([helper.make_node("f0", ["a"], ["t"], domain="local")], "b", [], [_value("t", [4])])
    hidden = _function("f0", [helper.make_node("Constant", [], ["c"], value=helper.make_tensor(
        "c", TensorProto.BOOL, [], [True])), helper.make_node("If", ["c"], ["b"], then_branch=branch,
                                                                    else_branch=branch)])
    hidden.opset_import.add(domain="local", version=1)
    models = {
        "functions_1e5": calling(many),
        "recursive": calling([_function("f0", [helper.make_node("f0", ["a"], ["b"], domain="local")])]),
        "mutual": calling([_function("f0", [helper.make_node("f1", ["a"], ["b"], domain="local")]),
                           _function("f1", [helper.make_node("f0", ["a"], ["b"], domain="local")])]),
        "recursive_in_if_body": calling([hidden]),
        "chain_1e4": calling(chain),
    }
    return _save(folder, models)


def loops(folder: Path) -> list[Path]:
    """Loops with a trip count of 2^62 and a body holding a Loop of 2^62 (work by arithmetic, not iteration)."""
    def loop(trips: int, body_nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
        body = helper.make_graph(body_nodes, "body", [_value("i", [], TensorProto.INT64),
                                                      _value("cond", [], TensorProto.BOOL), _value("v", [4])],
                                 [_value("cond_out", [], TensorProto.BOOL), _value("v_out", [4]),
                                  _value("scan", [4])])
        trip = helper.make_tensor("M", TensorProto.INT64, [], [trips])
        return _model([helper.make_node("Loop", ["M", "", "x"], ["y", "ys"], body=body)],
                      [_value("x", [4])], [_value("y", [4]), _value("ys", None)], [trip])

    step = [helper.make_node("Identity", ["cond"], ["cond_out"]), helper.make_node("Relu", ["v"], ["v_out"]),
            helper.make_node("Neg", ["v"], ["scan"])]
    inner = loop(2**62, step)
    nested_body = [helper.make_node("Identity", ["cond"], ["cond_out"]),
                   helper.make_node("Loop", ["M2", "", "v"], ["v_out", "scan_inner"],
                                    body=inner.graph.node[0].attribute[0].g),
                   helper.make_node("Neg", ["v"], ["scan"]),
                   helper.make_node("Constant", [], ["M2"], value=helper.make_tensor("M2", TensorProto.INT64, [],
                                                                                     [2**62]))]
    return _save(folder, {"loop_2e62": inner, "loop_in_loop_2e62": loop(2**62, nested_body)})


def data_propagation(folder: Path) -> list[Path]:
    """Vectors that ONNX's data propagation would expand value by value: a float vector input of 2^25, a Range of
    2^40, a ConstantOfShape of 2^40 values, a float ConstantOfShape of 10^8 beside a shape value, a float Constant
    declaring 10^8 values, an INT64 Constant of 2^23 values a Gather reads (as int64_data, as value_ints)."""
    vector = _model([helper.make_node("Add", ["x", "x"], ["y"])], [_value("x", [2**25])], [_value("y", [2**25])])
    start = helper.make_tensor("s", TensorProto.INT64, [], [0])
    limit = helper.make_tensor("l", TensorProto.INT64, [], [2**40])
    delta = helper.make_tensor("d", TensorProto.INT64, [], [1])
    ranged = _model([helper.make_node("Range", ["s", "l", "d"], ["r"]), helper.make_node("Shape", ["r"], ["y"])],
                    [], [_value("y", [1], TensorProto.INT64)], [start, limit, delta])
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [2**40])
    filled = _model([helper.make_node("ConstantOfShape", ["shape"], ["y"])], [], [_value("y", None)], [shape])
    # the same vector beside a shape only data propagation finds: the plain pass leaves it unsized, so the
    # propagating pass runs, and expands the float vector too
    shaped = _model([helper.make_node("Add", ["x", "x"], ["y"]), helper.make_node("Shape", ["x"], ["s"]),
                     helper.make_node("Reshape", ["x", "s"], ["z"])], [_value("x", [2**25])],
                    [_value("y", [2**25]), _value("z", None)])
    # a float vector of 10^8 values from a 162-byte file (ConstantOfShape), beside a shape value: data propagation
    # expanded it (5.7 GB before shapes.infer bounded vectors of every element type)
    ones = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    count = helper.make_tensor("count", TensorProto.INT64, [1], [10**8])
    spread = _model([helper.make_node("ConstantOfShape", ["count"], ["w"], value=ones),
                     helper.make_node("Add", ["w", "w"], ["y"]), helper.make_node("Shape", ["w"], ["s"]),
                     helper.make_node("Reshape", ["w", "s"], ["z"])], [], [_value("y", None), _value("z", None)],
                    [count])
    # a float Constant declaring 10^8 values that holds one (4 bytes): refused, its data read from no header
    declared = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10**8], raw_data=b"\0\0\x80?")
    tiny = _model([helper.make_node("Constant", [], ["w"], value=declared), helper.make_node("Add", ["w", "w"], ["y"]),
                   helper.make_node("Shape", ["w"], ["s"]), helper.make_node("Reshape", ["w", "s"], ["z"])], [],
                  [_value("y", None), _value("z", None)])
    # an INT64 Constant vector of 2^23 zeros written as int64_data (one byte each on disk: kept whole by ir.embedded,
    # 64 MiB parsed) whose one value a Gather reads into a Reshape's target: ONNX's data propagation would parse all
    # of it into a shape of 2^23 dims, and shapes.values decoded it whole
    zeros = TensorProto(name="w", data_type=TensorProto.INT64, dims=[2**23])
    zeros.int64_data.extend([0] * 2**23)
    index = helper.make_tensor("i", TensorProto.INT64, [1], [0])
    gathered = _model([helper.make_node("Constant", [], ["w"], value=zeros),
                       helper.make_node("Gather", ["w", "i"], ["g"]),
                       helper.make_node("Add", ["g", "four"], ["target"]),
                       helper.make_node("Reshape", ["x", "target"], ["y"])],
                      [_value("x", [2, 2])], [_value("y", None)],
                      [index, helper.make_tensor("four", TensorProto.INT64, [1], [4])])
    # the same as value_ints: proto2 writes each one as its own field (2 bytes each), which ir.embedded's walk read
    # one by one (8 s) before it gave up
    listed = onnx.ModelProto()
    listed.CopyFrom(gathered)
    listed.graph.node[0].CopyFrom(helper.make_node("Constant", [], ["w"], value_ints=[0] * 2**23))
    return _save(folder, {"float_vector_2e25": vector, "float_vector_beside_a_shape_value": shaped,
                          "range_2e40": ranged, "constant_of_shape_2e40": filled,
                          "float_constant_of_shape_1e8": spread, "float_constant_1e8_declared_tiny": tiny,
                          "int64_constant_2e23_gathered": gathered, "int64_value_ints_2e23_gathered": listed})


EMBEDDED_BYTES = 64 * 2**20


def embedded_weights(folder: Path) -> list[Path]:
    """A weight of EMBEDDED_BYTES (64 MiB) embedded in the file: an initializer, a Constant's value, a Constant in
    an If branch, and an INT64 Constant (kept whole: passes decode such values); memory must stay a small multiple
    of the file."""
    import numpy
    from onnx import numpy_helper

    rows = EMBEDDED_BYTES // 4096
    weight = numpy_helper.from_array(numpy.ones((rows, 1024), numpy.float32), "w")
    dims: list[int | str] = [rows, 1024]
    add = helper.make_node("Add", ["x", "w"], ["y"])
    constant = helper.make_node("Constant", [], ["w"], value=weight)
    branch = helper.make_graph([helper.make_node("Constant", [], ["w_then"], value=weight)], "then", [],
                               [_value("w_then", dims)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["w_else"])], "else", [], [_value("w_else", dims)])
    integers = numpy_helper.from_array(numpy.ones((rows // 2, 1024), numpy.int64), "w")
    models = {
        "embedded_initializer": _model([add], [_value("x", dims)], [_value("y", dims)], [weight]),
        "embedded_constant": _model([constant, add], [_value("x", dims)], [_value("y", dims)]),
        "embedded_in_if": _model([helper.make_node("If", ["c"], ["w"], then_branch=branch, else_branch=other), add],
                                 [_value("x", dims), _value("c", [], TensorProto.BOOL)], [_value("y", dims)]),
        "embedded_int64_constant": _model([helper.make_node("Constant", [], ["w"], value=integers),
                                           helper.make_node("Add", ["x", "w"], ["y"])],
                                          [_value("x", [rows // 2, 1024], TensorProto.INT64)],
                                          [_value("y", [rows // 2, 1024], TensorProto.INT64)]),
    }
    return _save(folder, models)


def _save(folder: Path, models: dict[str, onnx.ModelProto]) -> list[Path]:
    paths = []
    for name, model in models.items():
        path = folder / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        paths.append(path)
    return paths


CLASSES: dict[str, Callable[[Path], list[Path]]] = {
    "huge dims": huge_dims, "deep nesting": deep_nesting, "many values": many_values, "long names": long_names,
    "wiring": wiring, "odd initializers": odd_initializers, "sparse": sparse, "external data": external_data,
    "opsets": opsets, "functions": functions, "loops": loops, "data propagation": data_propagation,
    "embedded weights": embedded_weights,
}

# --- running ---------------------------------------------------------------------------------------------------

_ANALYZE = """import sys
import onnxmem
from onnxmem.errors import OnnxMemError
try:
    onnxmem.analyze(sys.argv[1])
except OnnxMemError as error:
    print("onnxmem: error: " + str(error), file=sys.stderr)
    sys.exit(2)
"""


@dataclass(frozen=True)
class Outcome:
    """One run on one model: how it ended, and what it cost."""

    model: str
    mode: str  # "cli" or "analyze"
    code: int  # the exit status (-N: killed by signal N)
    seconds: float
    max_rss_bytes: int
    stderr: str
    timed_out: bool
    written: tuple[str, ...]  # files made or changed in the model's folder
    file_bytes: int = 0

    @property
    def verdict(self) -> str:
        """answer, clean error, or what went wrong: hang, internal error, wrote beside the model."""
        if self.timed_out:
            return "hang"
        if self.written:
            return "wrote"
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        if "Traceback" in self.stderr or self.code not in (0, 2):
            return "internal error"
        if self.code == 2:
            one = len(lines) == 1 and lines[0].startswith("onnxmem: error: ") and "internal error" not in lines[0]
            return "clean error" if one and "out of memory" not in lines[0] else "internal error"
        return "answer"


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {entry.name: (entry.stat(follow_symlinks=False).st_size, entry.stat(follow_symlinks=False).st_mtime_ns)
            for entry in os.scandir(folder)}


def run(model: Path, mode: str, timeout: float, memory_bytes: int, checkout: Path = ROOT) -> Outcome:
    """Run the CLI's report or onnxmem.analyze on `model` in a subprocess (its folder the working directory),
    under `timeout` seconds and `memory_bytes` of address space, with onnxmem from `checkout`; its peak RSS is the
    run's own (benchmarks.measured_run)."""
    command = [sys.executable, "-m", "onnxmem", "report", str(model)] if mode == "cli" else \
        [sys.executable, "-c", _ANALYZE, str(model)]
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    before = _snapshot(model.parent)
    measured = run_measured(command, timeout, memory_bytes, env, model.parent)
    after = _snapshot(model.parent)
    written = tuple(sorted(name for name, stamp in after.items() if before.get(name) != stamp))
    return Outcome(model.name, mode, measured.code, measured.seconds, measured.max_rss_bytes, measured.stderr,
                   measured.timed_out, written, model.stat().st_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--memory-gib", type=float, default=4.0)
    parser.add_argument("--only", nargs="*", default=None, help="class names (default: all)")
    parser.add_argument("--show", type=int, default=5, help="failures to print with their stderr")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="run onnxmem from this checkout (a before)")
    parser.add_argument("--embedded-mib", type=int, default=64, help="the embedded weights' size")
    args = parser.parse_args()
    global EMBEDDED_BYTES
    EMBEDDED_BYTES = args.embedded_mib * 2**20
    memory = int(args.memory_gib * 2**30)
    by_class: dict[str, list[Outcome]] = defaultdict(list)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="onnxmem-hostile-") as tmp:
        for name, make in CLASSES.items():
            if args.only and name not in args.only:
                continue
            folder = Path(tmp) / name.replace(" ", "_")
            folder.mkdir()
            for model in make(folder):
                for mode in ("cli", "analyze"):
                    by_class[name].append(run(model, mode, args.timeout, memory, args.checkout.resolve()))
    elapsed = time.perf_counter() - started
    columns = ["answer", "clean error", "internal error", "hang", "wrote"]
    load = os.getloadavg()[0]
    print(f"onnxmem from {args.checkout}; load average {load:.1f} on {os.cpu_count()} CPUs at the end")
    print(f"hostile corpus: {sum(len(v) for v in by_class.values())} runs (each model through the CLI's report and "
          f"onnxmem.analyze); limits {args.timeout:g} s and {args.memory_gib:g} GiB of address space per run; "
          f"{elapsed:.0f} s in all\n")
    print("| class | models | runs | " + " | ".join(columns) + " | max RSS MiB | max s |")
    print("|---|" + "---|" * (len(columns) + 4))
    everything = [o for group in by_class.values() for o in group]
    for name, group in [*by_class.items(), ("all", everything)]:
        verdicts = [o.verdict for o in group]
        print(f"| {name} | {len({o.model for o in group})} | {len(group)} | "
              + " | ".join(str(verdicts.count(c)) for c in columns)
              + f" | {max(o.max_rss_bytes for o in group) / 2**20:.0f} | {max(o.seconds for o in group):.1f} |")
    bad = [o for o in everything if o.verdict not in ("answer", "clean error")]
    for outcome in bad[: args.show]:
        print(f"\n{outcome.verdict}: {outcome.model} ({outcome.mode}) exit {outcome.code}, {outcome.seconds:.1f} s, "
              f"wrote {list(outcome.written)}: {outcome.stderr.strip()[-600:]}")
    print("\n| model | file MiB | mode | verdict | s | max RSS MiB |")
    print("|---|---|---|---|---|---|")
    for outcome in everything:
        print(f"| {outcome.model} | {outcome.file_bytes / 2**20:.1f} | {outcome.mode} | {outcome.verdict} | "
              f"{outcome.seconds:.1f} | {outcome.max_rss_bytes / 2**20:.0f} |")


if __name__ == "__main__":
    main()
