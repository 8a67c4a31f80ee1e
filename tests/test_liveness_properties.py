"""Properties of liveness on random DAGs: the difference-array sweep equals a brute-force reference."""

from __future__ import annotations

from random import Random

import onnx
import onnx.helper as oh
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from onnxmem.ir.graph import ACTIVATION, OUTPUT, ModelGraph, build_graph
from onnxmem.passes.liveness import _size_keys, liveness
from onnxmem.passes.schedule import model_order, ort_order
from onnxmem.shapes.sizing import bind_and_infer
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES, NO_REUSE_RULES, InferenceRules

UNARY = ("Relu", "Sigmoid", "Neg", "Identity", "Exp")


@st.composite
def random_dag(draw: st.DrawFn) -> onnx.ModelProto:
    """A random graph of unary ops, Adds and Concats over [rows, 4] float tensors."""
    rows = {"x": draw(st.integers(1, 6))}
    nodes = []
    for i in range(draw(st.integers(1, 14))):
        names = sorted(rows)
        kind = draw(st.sampled_from(("unary", "add", "concat")))
        out = f"t{i}"
        a = draw(st.sampled_from(names))
        if kind == "unary":
            nodes.append(oh.make_node(draw(st.sampled_from(UNARY)), [a], [out], name=f"n{i}"))
            rows[out] = rows[a]
        elif kind == "add":
            b = draw(st.sampled_from([n for n in names if rows[n] == rows[a]]))
            nodes.append(oh.make_node("Add", [a, b], [out], name=f"n{i}"))
            rows[out] = rows[a]
        else:
            b = draw(st.sampled_from(names))
            nodes.append(oh.make_node("Concat", [a, b], [out], axis=0, name=f"n{i}"))
            rows[out] = rows[a] + rows[b]
    produced = [n.output[0] for n in nodes]
    outputs = sorted(set(draw(st.lists(st.sampled_from(produced), min_size=1, max_size=3))) | {produced[-1]})
    graph = oh.make_graph(
        nodes, "random", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [rows["x"], 4])],
        [oh.make_tensor_value_info(o, TensorProto.FLOAT, [rows[o], 4]) for o in outputs])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def sized(model: onnx.ModelProto) -> ModelGraph:
    return build_graph(model, bind_and_infer(model, {}).types)


def brute_force_live_bytes(graph: ModelGraph, order: list[int], rules: InferenceRules) -> list[int]:
    """Live bytes per step by sets: follow each tensor to the buffer it lives in, then check every step."""
    step_of = {op: s for s, op in enumerate(order)}
    end = len(order) - 1

    def last_read(t: int) -> int:
        tensor = graph.tensors[t]
        if tensor.kind == OUTPUT:
            return end
        return max([step_of[c] for c in tensor.consumers] + [step_of[tensor.producer]])  # type: ignore[index]

    home: dict[int, int] = {}  # tensor -> tensor whose buffer it uses
    members: dict[int, set[int]] = {}

    def root(t: int) -> int:
        while home.get(t, t) != t:
            t = home[t]
        return t

    for op in graph.ops:
        alias = rules.alias_input(op.op_type, op.domain)
        if alias is not None and graph.tensors[op.outputs[0]].kind != OUTPUT:  # outputs get their own buffer
            home[op.outputs[0]] = op.inputs[alias]
    for t in graph.tensors:
        members.setdefault(root(t.index), set()).add(t.index)
    def group_last(r: int) -> int:
        return max(last_read(m) for m in members[r])

    def same(a: int, b: int) -> bool:
        ta, tb = graph.tensors[a], graph.tensors[b]
        return ta.shape is not None and ta.shape == tb.shape and ta.dtype == tb.dtype

    free: list[int] = []  # onnxruntime's free list: most recently freed first, scanned from the front
    for step, op_index in enumerate(order):
        op = graph.ops[op_index]
        for slot, out in enumerate(op.outputs):
            if root(out) != out or graph.tensors[out].kind != ACTIVATION:
                continue
            target = None
            if slot == 0 and rules.may_run_in_place(op.op_type, op.domain):
                src = root(op.inputs[0])
                if src != out and graph.tensors[src].kind == ACTIVATION and group_last(src) == step \
                        and same(op.inputs[0], out):
                    target = src
            if target is None and rules.reuse_freed and graph.tensors[out].shape:
                target = next((b for b in free if same(b, out)), None)
                if target is not None:
                    free.remove(target)
            if target is not None:
                home[out] = target
                members[target] |= members.pop(out)
        if rules.reuse_freed:
            for t in (*op.inputs, *op.outputs):
                r = root(t)
                if graph.tensors[r].kind == ACTIVATION and group_last(r) == step and r not in free:
                    free.insert(0, r)
    live = []
    for step in range(len(order)):
        total = 0
        for owner, group in members.items():
            tensor = graph.tensors[owner]
            if tensor.kind not in (ACTIVATION, OUTPUT) or tensor.producer is None:
                continue
            held_to = max(last_read(m) for m in group)
            if rules.reuse_freed and tensor.kind == ACTIVATION and not any(graph.tensors[m].consumers for m in group):
                held_to = end  # no node reads the buffer: onnxruntime has no release action for it
            if step_of[tensor.producer] <= step <= held_to:
                total += tensor.nbytes or 0
        live.append(total)
    return live


@settings(max_examples=150, deadline=None)
@given(random_dag())
def test_sweep_equals_brute_force_without_reuse(model: onnx.ModelProto) -> None:
    graph = sized(model)
    order = model_order(graph)
    timeline = liveness(graph, order, NO_REUSE_RULES)
    assert list(timeline.live_bytes) == brute_force_live_bytes(graph, order, NO_REUSE_RULES)


@settings(max_examples=150, deadline=None)
@given(random_dag())
def test_sweep_equals_brute_force_with_aliases_and_in_place(model: onnx.ModelProto) -> None:
    graph = sized(model)
    order = model_order(graph)
    timeline = liveness(graph, order, DEFAULT_INFERENCE_RULES)
    assert list(timeline.live_bytes) == brute_force_live_bytes(graph, order, DEFAULT_INFERENCE_RULES)


@settings(max_examples=100, deadline=None)
@given(random_dag())
def test_peak_is_bounded_by_the_sum_and_views_and_in_place_never_raise_it(model: onnx.ModelProto) -> None:
    graph = sized(model)
    order = model_order(graph)
    plain = liveness(graph, order, NO_REUSE_RULES)
    no_free_list = InferenceRules(DEFAULT_INFERENCE_RULES.aliases, DEFAULT_INFERENCE_RULES.in_place, reuse_freed=False)
    shared = liveness(graph, order, no_free_list)
    everything = liveness(graph, order, DEFAULT_INFERENCE_RULES)
    every_activation = sum(t.nbytes or 0 for t in graph.tensors if t.kind in (ACTIVATION, OUTPUT))
    assert shared.peak_bytes <= plain.peak_bytes <= every_activation
    # A freed buffer held for a later output can raise the peak, but never past the sum of all buffers.
    assert everything.peak_bytes <= every_activation
    # The largest single op output must be live at some point.
    assert plain.peak_bytes >= max(t.nbytes or 0 for t in graph.tensors if t.kind in (ACTIVATION, OUTPUT))


def _is_topological(graph: ModelGraph, order: list[int]) -> bool:
    step = {op: s for s, op in enumerate(order)}
    return sorted(order) == list(range(len(graph.ops))) and all(
        step[graph.tensors[t].producer] < step[op.index]  # type: ignore[index]
        for op in graph.ops for t in op.inputs if t >= 0 and graph.tensors[t].producer is not None)


@settings(max_examples=100, deadline=None)
@given(random_dag(), st.randoms(use_true_random=False))
def test_in_file_order_is_whether_every_op_reads_what_earlier_ops_made(model: onnx.ModelProto, rng: Random) -> None:
    # The orders trust the flag (no check of the file's order, no search for a cycle): it must be exact, and a
    # file in any other order must still get topological orders and the same timeline as the file in order.
    shuffled = onnx.ModelProto()
    shuffled.CopyFrom(model)
    nodes = list(shuffled.graph.node)
    rng.shuffle(nodes)
    del shuffled.graph.node[:]
    shuffled.graph.node.extend(nodes)
    for proto in (model, shuffled):
        graph = sized(proto)
        produced_before: set[str] = {"x"}
        in_order = True
        for node in proto.graph.node:
            in_order = in_order and all(name in produced_before for name in node.input)
            produced_before.update(node.output)
        assert graph.in_file_order is in_order
        for order in (model_order(graph), ort_order(graph)):
            assert _is_topological(graph, order)
        assert graph.with_sizes([t.shape for t in graph.tensors], [t.nbytes for t in graph.tensors]).in_file_order \
            is in_order
    in_order, out_of_order = sized(model), sized(shuffled)
    assert model_order(in_order) == list(range(len(model.graph.node)))
    # the same nodes run in the same sequence: the same timeline, whichever order the file lists them in (where
    # ONNX's inference, which reads the nodes in file order, sized the same tensors in both)
    sizes = {t.name: t.nbytes for t in in_order.tensors}
    if any(sizes[t.name] != t.nbytes for t in out_of_order.tensors):
        return
    position = {op.name: op.index for op in out_of_order.ops}
    same_run = [position[op.name] for op in in_order.ops]
    for rules in (NO_REUSE_RULES, DEFAULT_INFERENCE_RULES):
        assert liveness(in_order, model_order(in_order), rules).live_bytes == \
            liveness(out_of_order, same_run, rules).live_bytes


def test_size_numbers_equal_exactly_where_the_planner_compares_equal() -> None:
    # onnxruntime's SameSize: element bits and shape (a name equal to a name); an unknown dim or size is equal to
    # nothing; a scalar is never reused (a number below -1).
    values = [("a", TensorProto.FLOAT, [2, "n"]), ("b", TensorProto.INT32, [2, "n"]),
              ("c", TensorProto.FLOAT16, [2, "n"]), ("d", TensorProto.FLOAT, [2, "m"]),
              ("e", TensorProto.FLOAT, []), ("f", TensorProto.INT32, []), ("g", TensorProto.FLOAT, [2, None])]
    nodes = [oh.make_node("Identity", ["x"], [name]) for name, _, _ in values]
    graph = oh.make_graph(nodes, "sizes", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [oh.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in values])
    built = build_graph(oh.make_model(graph))
    types = {name: (dtype, tuple(shape), 1) for name, dtype, shape in values}
    built.set_types(types)  # type: ignore[arg-type]
    keys = dict(zip([t.name for t in built.tensors], _size_keys(built, None), strict=True))
    assert keys["a"] == keys["b"] > 0  # float32 and int32: 32 bits each
    assert len({keys["a"], keys["c"], keys["d"]}) == 3 and min(keys["c"], keys["d"]) > 0
    assert keys["e"] == keys["f"] < -1
    assert keys["g"] == -1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab/", max_size=8), min_size=1, max_size=6),
       st.lists(st.tuples(st.just("pkg.torch.onnx.name_scopes"), st.text(alphabet="ab/", max_size=6)), max_size=1))
def test_an_ops_layer_is_the_scope_its_name_carries(names: list[str], scopes: list[tuple[str, str]]) -> None:
    """The build's layer of an op is the name before its last '/', where a '/' stands between other characters
    ('/m/l/MatMul' -> '/m/l'; 'MatMul', '/MatMul', '//x', 'a/' -> ''), or the exporter's scope where it names
    one: the same whether the build reads node metadata or not."""
    nodes = [oh.make_node("Relu", [f"t{i - 1}" if i else "x"], [f"t{i}"], name=name) for i, name in enumerate(names)]
    for node in nodes:
        for key, value in scopes:
            node.metadata_props.add(key=key, value=value)
    model = oh.make_model(oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                        [oh.make_tensor_value_info(f"t{len(names) - 1}", TensorProto.FLOAT, [2])]))

    def scope(name: str) -> str:  # (the definition, by other means)
        inner = name.strip("/")
        return name[:name.rindex("/")] if "/" in inner else ""

    own = [scopes[0][1] if scopes and scopes[0][1] else scope(n or f"Relu_{i}") for i, n in enumerate(names)]
    assert [op.layer for op in build_graph(model, metadata=True).ops] == own
    if not scopes:
        assert [op.layer for op in build_graph(model, metadata=False).ops] == own
