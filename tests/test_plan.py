"""Plan: fit finds b where b fits and b + 1 does not; check gates a pipeline; targets, allocators and ZeRO sharding."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto

import onnxmem
from benchmarks.llm_graphs import SHAPES, make_llama
from onnxmem.errors import DimError, TargetError
from onnxmem.ir.graph import build_graph
from onnxmem.passes.liveness import liveness
from onnxmem.passes.order import memory_order
from onnxmem.passes.schedule import model_order
from onnxmem.plan.fit import (
    ALLOCATORS,
    MiB,
    budget_bytes,
    check,
    fit,
    parse_size,
    resolve_target,
)
from onnxmem.plan.gpus import GPUS, find_gpu
from onnxmem.plan.sharding import sharded_step
from onnxmem.shapes.sizing import bind_and_infer
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES
from onnxmem.training.step import TrainingOptions

from . import graphs
from .cli import run, save

ROOT = Path(__file__).resolve().parent.parent
T = graphs.T

# symbolic_mlp, worked by hand: weights W1 256x512 + W2 512x128 float32 = 786,432 B. Per batch row: input x 1 KiB;
# at the last MatMul r [b,512] (Relu wrote over h in place) and y [b,128] are live: 2 KiB + 512 B. So
# peak(b) = 786,432 + 3,584 b.
MLP_WEIGHTS, MLP_PER_ROW = 786_432, 3_584


def mlp_peak(b: int) -> int:
    return MLP_WEIGHTS + MLP_PER_ROW * b


def llama(dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    return make_llama(SHAPES["tiny"], dtype)


# --- sizes ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("24GiB", 24 * 2**30), ("16GB", 16 * 10**9), ("80000MB", 80_000 * 10**6), ("1.5TiB", 3 * 2**39),
    ("1024B", 1024), ("0", 0), ("512 B", 512), ("0.5KiB", 512), ("2gib", 2 * 2**30), (".25MiB", 2**18), ("1.1B", 1),
])
def test_sizes_parse_exactly(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(("text", "needle"), [("10XB", "unknown unit"), ("24G", "GiB for 2^30"), ("", "expected"),
                                              ("-1GB", "expected"), ("GB", "expected"),
                                              ("24", "has no unit: write 24GiB"), ("1024", "1024B for bytes")])
def test_bad_sizes_are_target_errors(text: str, needle: str) -> None:
    with pytest.raises(TargetError, match=re.escape(needle)):
        parse_size(text)


# --- targets ----------------------------------------------------------------------------------------------------

def test_gpu_names_match_loosely_and_ambiguity_is_named() -> None:
    assert find_gpu("a100 80gb").name == "A100-80GB"
    assert find_gpu("H200").name == "H200-141GB"
    with pytest.raises(TargetError, match="A100-40GB, A100-80GB"):
        find_gpu("A100")
    with pytest.raises(TargetError, match="not in the catalog"):
        find_gpu("GTX-480")


def test_fixed_costs_are_labelled_and_overridable() -> None:
    bare = resolve_target(memory="24GiB")
    assert bare.reserve == () and budget_bytes(bare) == 24 * 2**30 and bare.allocator == "exact"
    gpu = resolve_target(gpu="A100-80GB")  # a GPU process pays for its CUDA context
    assert [r.name for r in gpu.reserve] == ["cuda-context"]
    assert budget_bytes(gpu) == 80 * 2**30 - gpu.reserve_bytes
    torch = resolve_target(gpu="A100-80GB", runtime="pytorch")
    assert [r.name for r in torch.reserve] == ["cuda-context", "libraries", "workspaces"]
    assert all(r.source.startswith("measured on an H100") for r in torch.reserve)
    assert torch.allocator == "pytorch-caching"
    given = resolve_target(gpu="A100-80GB", runtime="pytorch", reserve="1GiB")
    assert given.reserve_bytes == 2**30 and given.reserve[0].source == "given: 1GiB"
    with pytest.raises(TargetError, match="exactly one"):
        resolve_target(memory="1GB", gpu="A100-80GB")
    with pytest.raises(TargetError, match="exactly one"):
        resolve_target()
    assert all(g.memory_bytes > 0 for g in GPUS.values())


def test_allocator_rounding_worked_by_hand() -> None:
    arena = ALLOCATORS["onnxruntime-arena"].held
    assert arena([100 * MiB]) == 128 * MiB  # 1 MiB doubles to 128 MiB to hold it
    assert arena([500 * MiB, 100 * MiB]) == 1024 * MiB  # 512 MiB region, 12 MiB free; then a 512 MiB region
    assert arena([MiB // 2, MiB // 4]) == MiB  # the second fits in the first region's free part
    assert arena([300, 0]) == MiB
    caching = ALLOCATORS["pytorch-caching"].held
    # 2 MiB segments, then the fragmentation allowance: 1 byte more per 99 held, rounded up
    assert caching([1, 3 * MiB]) == 6 * MiB + -(-6 * MiB // 99)
    assert caching([0, 2 * MiB]) == 2 * MiB + -(-2 * MiB // 99)
    assert caching([0, 99 * 2 * MiB]) == 100 * 2 * MiB
    assert ALLOCATORS["exact"].held([5, 7]) == 12


# --- fit --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("budget", [mlp_peak(1) - 1, mlp_peak(1), mlp_peak(7) + 100, mlp_peak(64), mlp_peak(1000) - 1,
                                    2**30])
def test_fit_gives_b_that_fits_and_b_plus_one_that_does_not(budget: int) -> None:
    model = graphs.symbolic_mlp()
    result = fit(model, memory=budget)
    b = result.max_value
    expected = max(0, (budget - MLP_WEIGHTS) // MLP_PER_ROW)  # the hand formula, exact here
    assert b == expected
    # independent of the search: full analysis at b and b + 1
    if b:
        assert onnxmem.analyze(model, {"batch": b}).inference.peak_bytes <= budget
    assert onnxmem.analyze(model, {"batch": b + 1}).inference.peak_bytes > budget
    p = result.max_power_of_two
    assert (p == 0) == (b == 0)
    if p:
        assert p & (p - 1) == 0 and p <= b < 2 * p
    assert result.budget_bytes == budget and result.bounded and result.monotonic


def test_a_budget_too_small_for_one_is_an_answer_not_an_error(tmp_path: Path) -> None:
    result = fit(graphs.symbolic_mlp(), memory=1000)
    assert result.max_value == 0 and result.max_power_of_two == 0
    assert any("nothing fits" in n for n in result.notes)
    code, out, err = run("fit", save(graphs.symbolic_mlp(), tmp_path / "m.onnx"), "--memory", "1000B")
    assert code == 0 and "nothing fits" in out and not err


def test_linear_formula_is_the_hand_formula_and_verified() -> None:
    result = fit(graphs.symbolic_mlp(), memory="1MiB")
    assert result.linear is not None
    assert (result.linear.intercept_bytes, result.linear.slope_bytes) == (MLP_WEIGHTS, MLP_PER_ROW)
    assert result.linear.verified and len(result.linear.checked_values) >= 3
    for point in result.curve:
        assert point.peak_bytes == mlp_peak(point.value)


@pytest.mark.parametrize(("search", "fixed", "budgets"), [
    ("batch", {"seq": 32, "past": 3}, ["600KiB", "2MiB", "9MiB"]),
    ("seq", {"batch": 2, "past": 1}, ["700KiB", "3MiB", "40MiB"]),
])
def test_fit_on_a_decoder_checks_against_full_analysis(search: str, fixed: dict[str, int],
                                                       budgets: list[str]) -> None:
    model = llama()
    for budget in budgets:
        result = fit(model, memory=budget, search=search, dims=fixed, what_if=False)
        b, limit = result.max_value, parse_size(budget)
        assert b >= 1, budget
        assert onnxmem.analyze(model, {**fixed, search: b}).inference.peak_bytes <= limit
        assert onnxmem.analyze(model, {**fixed, search: b + 1}).inference.peak_bytes > limit
    if search == "seq":  # attention scores grow with seq x (past + seq): no straight line to print
        assert result.linear is None
        assert any("not linear" in n for n in result.notes)
    else:
        assert result.linear is not None and result.linear.verified


def test_fit_with_a_runtime_compares_the_rounded_bytes() -> None:
    result = fit(graphs.symbolic_mlp(), memory="1GiB", runtime="pytorch", reserve="100MiB")
    budget = 2**30 - 100 * MiB
    assert result.budget_bytes == budget
    b = result.max_value
    by_value = {p.value: p for p in result.curve}
    assert by_value[b].required_bytes <= budget < by_value[b + 1].required_bytes
    assert all(p.required_bytes >= p.peak_bytes + p.peak_bytes // 99 for p in result.curve)


def test_fit_in_training_mode() -> None:
    model = llama()
    options = TrainingOptions()
    fixed = {"seq": 16, "past": 1}
    for budget in ("3MiB", "6MiB"):
        result = fit(model, memory=budget, dims=fixed, training=options, what_if=False)
        b, limit = result.max_value, parse_size(budget)
        assert result.mode == "training" and b >= 1
        at = onnxmem.analyze(model, {**fixed, "batch": b}, training=options).training
        after = onnxmem.analyze(model, {**fixed, "batch": b + 1}, training=options).training
        assert at is not None and after is not None
        assert at.peak_bytes <= limit < after.peak_bytes


def test_search_errors_name_the_dims() -> None:
    with pytest.raises(DimError, match="no dim named width .*batch, seq"):
        fit(llama(), memory="1GiB", search="width", dims={"seq": 4, "past": 1})
    with pytest.raises(DimError, match="binds the dim that fit searches"):
        fit(graphs.symbolic_mlp(), memory="1GiB", dims={"batch": 4})


# --- ZeRO sharding ----------------------------------------------------------------------------------------------

# (the stages, DeepSpeed's estimators and the gathered unit: tests/test_sharding.py)


def test_sharded_fit_is_per_gpu_and_needs_training() -> None:
    model = llama()
    fixed = {"seq": 8, "past": 1}
    options = TrainingOptions()
    alone = fit(model, memory="4MiB", dims=fixed, training=options, what_if=False)
    sharded = fit(model, memory="4MiB", dims=fixed, training=options, gpus=8, shard="zero3", what_if=False)
    assert sharded.sharding is not None and sharded.sharding.stage == "zero3"
    assert sharded.max_value >= alone.max_value
    # per GPU: the worst event of the sharded step (its activations and the states one GPU keeps), at max_value
    b = sharded.max_value
    at = onnxmem.analyze(model, {**fixed, "batch": b}, training=options).training
    assert at is not None
    point = next(p for p in sharded.curve if p.value == b)
    assert point.peak_bytes == sharded_step(at, "zero3", 8).peak_bytes == sharded.sharding.peak_bytes
    assert sharded.sharding.per_gpu_bytes < at.weights_bytes + at.gradient_bytes + at.optimizer_state_bytes
    with pytest.raises(TargetError, match="needs --training"):
        fit(model, memory="4MiB", dims=fixed, shard="zero2")


# --- memory-aware order -----------------------------------------------------------------------------------------

def sized(model: onnx.ModelProto, dims: dict[str, int] | None = None):  # type: ignore[no-untyped-def]
    return build_graph(model, bind_and_infer(model, dims or {}).types)


def test_memory_order_on_fanout_worked_by_hand() -> None:
    # Model order u0, u1, u2, s1, y holds u0, u1, u2 and s1 at once: 4T. Running s1 = u0 + u1 before u2 frees u0 and
    # u1 first: at most s1, u2 and y (3T).
    graph = sized(graphs.fanout())
    order = memory_order(graph)
    assert liveness(graph, model_order(graph), DEFAULT_INFERENCE_RULES).peak_bytes == 4 * T
    assert liveness(graph, order, DEFAULT_INFERENCE_RULES).peak_bytes == 3 * T
    names = [graph.ops[i].name for i in order]
    assert names.index("Add_s1") < names.index("Sub_u2")


@pytest.mark.parametrize("make", [graphs.chain, graphs.skip, graphs.inplace, graphs.alias, graphs.fanout])
def test_memory_order_is_topological_and_no_worse_than_the_files(make) -> None:  # type: ignore[no-untyped-def]
    graph = sized(make())
    order = memory_order(graph)
    position = {op: step for step, op in enumerate(order)}
    assert sorted(order) == list(range(len(graph.ops)))
    for op in graph.ops:
        for t in op.inputs:
            producer = graph.tensors[t].producer if t >= 0 else None
            if producer is not None:
                assert position[producer] < position[op.index]
    assert liveness(graph, order, DEFAULT_INFERENCE_RULES).peak_bytes <= \
        liveness(graph, model_order(graph), DEFAULT_INFERENCE_RULES).peak_bytes


def test_check_what_ifs_name_the_reordering_and_the_precision() -> None:
    result = onnxmem.check(graphs.fanout(), memory="16MiB", order="model")  # (onnxruntime's order is the best one)
    changes = {w.change: w for w in result.what_ifs}
    assert changes["memory-aware execution order"].saved_bytes == T
    assert changes["float32 -> float16 (weights and activations)"].peak_bytes == result.peak_bytes // 2
    assert [w.saved_bytes for w in result.what_ifs] == sorted((w.saved_bytes for w in result.what_ifs), reverse=True)
    # a chain's memory-aware order is its own order: no saving, so no what-if for it
    chain = onnxmem.check(graphs.chain(), memory="16MiB", order="model")
    assert "memory-aware execution order" not in {w.change for w in chain.what_ifs}


# --- check through the CLI --------------------------------------------------------------------------------------

def readme_keys(schema: str) -> set[str]:
    """Give the top-level keys the README documents for a JSON schema (its table's first column)."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"`{schema}`", 1)[1].split("\n#", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([a-z_]+)(?:\[\])?`", section, re.M)}


def test_check_exit_codes_and_json(tmp_path: Path) -> None:
    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    peak = mlp_peak(8)
    code, out, err = run("check", path, "--dim", "batch=8", "--budget", f"{peak}B", "--format", "json")
    assert code == 0, err
    document = json.loads(out)  # one JSON object, nothing else on stdout
    assert document["fits"] is True and document["peak_bytes"] == peak and document["headroom_bytes"] == 0
    assert set(document) == readme_keys("onnxmem.check/1")
    assert document["schema"] == "onnxmem.check/1"
    code, out, _ = run("check", path, "--dim", "batch=8", "--budget", f"{peak - 1}B", "--format", "json")
    assert code == 1 and json.loads(out)["fits"] is False and json.loads(out)["headroom_bytes"] == -1
    code, out, _ = run("check", path, "--dim", "batch=8", "--budget", f"{peak - 1}B")
    assert code == 1 and "DOES NOT FIT" in out
    code, out, _ = run("check", path, "--dim", "batch=8", "--gpu", "T4-16GB", "--runtime", "onnxruntime")
    assert code == 0 and "FITS" in out and "stated default" in out


@pytest.mark.parametrize(("args", "needle"), [
    (("--budget", "lots"), "size 'lots'"),
    (("--gpu", "GTX-480"), "not in the catalog"),
    ((), "exactly one of a memory size (--memory SIZE"),
    (("--budget", "1GB", "--shard", "zero2"), "needs --training"),
])
def test_check_bad_input_exits_2_with_one_line(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    code, out, err = run("check", path, "--dim", "batch=8", *args)
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("onnxmem: error: ") and needle in err, err
    code, _, err = run("check", str(tmp_path / "absent.onnx"), "--budget", "1GB")
    assert code == 2 and "no such file" in err


def test_fit_json_has_the_documented_keys(tmp_path: Path) -> None:
    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    code, out, err = run("fit", path, "--memory", "1MiB", "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert set(document) == readme_keys("onnxmem.fit/1")
    assert document["dim"] == "batch" and document["max_value"] == (2**20 - MLP_WEIGHTS) // MLP_PER_ROW
    assert document["max_power_of_two"] == 64 and document["budget_bytes"] == 2**20
    assert all(set(p) >= {"value", "peak_bytes"} for p in document["curve"])
    code, out, _ = run("fit", path, "--memory", "1MiB", "--format", "markdown")
    assert code == 0 and "| batch | peak | required | fits |" in out


def test_gpus_command_lists_the_catalog() -> None:
    code, out, _ = run("gpus")
    assert code == 0 and "A100-80GB" in out and "onnxruntime-arena" in out and "stated default" in out


# --- fixtures (real exported models), when present --------------------------------------------------------------

FIXTURES = sorted((ROOT / "fixtures").glob("*.onnx"))


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fit_on_fixtures(path: Path) -> None:
    model = onnx.load(str(path), load_external_data=False)
    names = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    if "batch" not in names:
        pytest.skip("no batch dim")
    fixed = {n: 8 for n in names if n != "batch" and "+" not in n}
    one = onnxmem.analyze(str(path), {**fixed, "batch": 1}).inference.peak_bytes
    for budget in (one - 1, 3 * one, 20 * one):
        result = fit(str(path), memory=budget, dims=fixed, what_if=False)
        b = result.max_value
        if budget < one:
            assert b == 0
            continue
        assert onnxmem.analyze(str(path), {**fixed, "batch": b}).inference.peak_bytes <= budget
        assert onnxmem.analyze(str(path), {**fixed, "batch": b + 1}).inference.peak_bytes > budget


def _lstm(hidden: int = 64) -> onnx.ModelProto:
    """LSTM over x [32, batch, 32], hidden 64, no bias: its W and R are packed into the arena, nothing else is held."""
    import numpy as np
    from onnx import helper, numpy_helper

    weights = [numpy_helper.from_array(np.full(shape, 0.01, np.float32), name)
               for name, shape in (("w", [1, 4 * hidden, 32]), ("r", [1, 4 * hidden, hidden]))]
    node = helper.make_node("LSTM", ["x", "w", "r"], ["y"], name="lstm", hidden_size=hidden)
    return graphs.model([node], [graphs.value("x", [32, "batch", 32])], [graphs.value("y", [32, 1, "batch", hidden])],
                        weights)


def test_fit_and_check_on_onnxruntime_count_what_its_arena_holds() -> None:
    # With --runtime onnxruntime, inference needs what onnxruntime's arena holds from the second run on (regions of
    # 1, 2, 4 ... MiB, the kernel's scratch, the memory pattern's block): the simulation validate checks against
    # onnxruntime's own count, equal here to the byte at each value, in check, in fit's search and in onnxruntime.
    pytest.importorskip("onnxruntime")
    from onnxmem.measure.validate import validate

    model = _lstm()
    target = {"memory": "64GiB", "runtime": "onnxruntime", "reserve": 0, "provider": "cpu"}
    for batch in (8, 32):
        steady = validate(model, {"batch": batch}, runs=2).runs[1]
        assert steady.estimated.arena_held_bytes == steady.measured.arena_held_bytes
        checked = check(model, {"batch": batch}, what_if=False, **target)  # type: ignore[arg-type]
        assert checked.required_bytes == steady.estimated.arena_held_bytes
    budget = check(model, {"batch": 48}, what_if=False, **target).required_bytes  # type: ignore[arg-type]
    result = fit(model, what_if=False, **{**target, "memory": budget})  # type: ignore[arg-type]
    assert result.max_value >= 48
    by_value = {p.value: p for p in result.curve}
    b = result.max_value
    assert by_value[b].fits and not by_value[b + 1].fits
    for value in (b, b + 1, 1, 2):
        assert by_value[value].required_bytes == check(  # fit's search (the family's fast path) agrees with check
            model, {"batch": value}, what_if=False, **{**target, "memory": budget}).required_bytes  # type: ignore[arg-type]
    assert by_value[b].required_bytes == validate(model, {"batch": b}, runs=2).runs[1].estimated.arena_held_bytes


def test_onnxruntime_on_cuda_reserves_every_initializer_and_copies_the_inputs() -> None:
    # The CUDA provider's arena: every initializer reserved on the device at its size, the inputs copied in each
    # run: what it holds is at least the weights, the inputs and the activation peak, and arena regions on top.
    result = check(_lstm(), {"batch": 8}, memory="64GiB", runtime="onnxruntime", reserve=0, what_if=False)
    weights = (256 * 32 + 256 * 64) * 4
    assert result.required_bytes >= result.peak_bytes
    assert (result.required_bytes - weights) % MiB == 0  # the rest is whole regions (powers of two from 1 MiB)


def test_fit_says_when_the_arenas_bytes_are_not_monotonic() -> None:
    # the two-layer LSTM fixture's arena holds 63.2 MiB at batch 512 and 53.2 MiB at 612 (regions double as
    # requests grow): the answer is verified (b fits, b + 1 does not), and the note says a larger value may fit too
    result = fit(ROOT / "fixtures" / "lstm.onnx", dims={"seq": 32}, memory="64MiB", runtime="onnxruntime", reserve=0,
                 provider="cpu", what_if=False)
    required = [p.required_bytes for p in result.curve]
    assert any(a > b for a, b in zip(required, required[1:], strict=False))
    assert any("not monotonic" in note for note in result.notes)
    assert not any("not monotonic in batch (the arena" in note
                   for note in fit(graphs.symbolic_mlp(), memory="1MiB", what_if=False).notes)


def test_a_decimal_budget_shows_its_gib_figure_and_a_bare_number_is_refused(tmp_path: Path) -> None:
    path = save(graphs.symbolic_mlp(), tmp_path / "m.onnx")
    code, out, _ = run("check", path, "--dim", "batch=8", "--budget", "24GB", "--format", "json")
    assert code == 0
    source = json.loads(out)["target"]["memory_source"]
    assert source == "given: 24GB = 22.35 GiB (GB, MB, TB: powers of 10)"  # 24e9 / 2^30 = 22.3517...
    code, out, _ = run("check", path, "--dim", "batch=8", "--budget", "24GiB", "--format", "json")
    assert json.loads(out)["target"]["memory_source"] == "given: 24GiB"
    code, _, err = run("check", path, "--dim", "batch=8", "--budget", "24")
    assert code == 2 and "size '24' has no unit: write 24GiB" in err and len(err.strip().splitlines()) == 1


def test_nvidia_smi_names_find_their_gpu() -> None:
    # as `nvidia-smi --query-gpu=name --format=csv,noheader` writes them
    assert find_gpu("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert find_gpu("NVIDIA H100 80GB HBM3").name == "H100-80GB"
    assert find_gpu("NVIDIA GeForce RTX 4090").name == "RTX4090-24GB"
    assert find_gpu("Tesla T4").name == "T4-16GB"
    for name in ("B200", "GB200", "L40", "A40", "RTX4080"):
        assert find_gpu(name).name.startswith(name)
    # the driver's figure where it is known: an A100 80GB reports 81,920 MiB
    assert find_gpu("A100-80GB").memory_bytes == 81920 * 2**20
    assert "nvidia-smi" in find_gpu("A100-80GB").source and "nominal" in find_gpu("B200").source


def test_the_h100_figures_are_the_committed_gpu_rows() -> None:
    # what CUDA lets a process use on the H100 the project measured: the rows' cudaMemGetInfo total, less than
    # nvidia-smi's memory.total; PyTorch's fixed costs are the context, libraries and workspaces those rows measured
    import json
    from pathlib import Path

    rows_file = Path(__file__).resolve().parent.parent / "benchmarks/results/cuda/2026-11-27-h100-80gb.jsonl"
    rows = {r["key"]: r for r in map(json.loads, rows_file.read_text().splitlines()) if r.get("key")}
    context = rows["context/all"]["stages"]
    total = context["context"]["mem_get_info_total"]
    h100 = find_gpu("NVIDIA H100 80GB HBM3")
    assert h100.memory_bytes == total < 81559 * 2**20 and h100.source.startswith("measured")
    torch = resolve_target(gpu="H100-80GB", runtime="pytorch")
    costs = {r.name: r.bytes for r in torch.reserve}
    torch_reserved = context["context"]["reserved"]
    assert costs["cuda-context"] == total - context["context"]["mem_get_info_free"] - torch_reserved
    assert costs["workspaces"] == rows["fit/resnet18/answer"]["warm_up"]["after"]["reserved"]
    # the second window's fit rows: after a first matmul and convolution, what the process cannot use is exactly the
    # three fixed costs (the free memory fit is measured against is the budget fit gives from the whole memory)
    later = rows_file.with_name("2026-11-27-h100-80gb-part3.jsonl")
    fits = [r for r in map(json.loads, later.read_text().splitlines()) if r.get("key", "").endswith("/answer")
            and r.get("kind") == "fit"]
    assert fits and all(r["mem_get_info"][1] == total for r in fits)
    assert all(total - r["mem_get_info"][0] == sum(costs.values()) for r in fits)
    assert budget_bytes(torch) == fits[0]["free_bytes"]


def test_fit_on_the_h100_answers_a_batch_that_ran(tmp_path: Path) -> None:
    # the second window bisected below fit's answer for real (fit/*/measured-max): fit's answer from the whole H100
    # must be a batch that ran, within 1% of the largest that ran (the allocator's fragmentation allowance)
    import zipfile

    results = Path(__file__).resolve().parent.parent / "benchmarks/results/cuda"
    probes = [r for r in map(json.loads, (results / "2026-11-27-h100-80gb-part5.jsonl").read_text().splitlines())
              if r.get("key", "").endswith("/measured-max")]
    assert {r["model"] for r in probes} == {"resnet18", "gpt2"}
    options = onnxmem.TrainingOptions(optimizer="adamw", precision="fp32", device="cuda", loss="cross_entropy")
    with zipfile.ZipFile(results / "2026-11-27-h100-80gb-exports.zip") as exports:
        for row in probes:
            path = Path(exports.extract(f"{row['model']}.full.onnx", tmp_path))
            answer = fit(path, gpu="H100-80GB", runtime="pytorch", training=options, search="batch",
                         what_if=False, provider="cuda", limit=16384).max_value
            ran = [p["batch"] for p in row["probes"] if p["ran"]]
            assert answer <= row["largest_run"] == max(ran) < row["smallest_oom"]
            assert answer >= row["largest_run"] * 0.99
