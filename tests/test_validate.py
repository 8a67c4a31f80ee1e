"""validate: onnxruntime's real CPU allocations against the estimate, on graphs worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from onnxmem.cli import main

from . import graphs
from .graphs import T

pytest.importorskip("onnxruntime")

from onnxmem.validate import validate  # noqa: E402


@pytest.mark.parametrize(
    ("build", "first", "steady"),
    [
        # chain: a+b while Mul runs (2T); from run 2 the pattern block holds the intermediates' peak (2T) and
        # the output y (T) comes on top: 3T.
        (graphs.chain, 2 * T, 3 * T),
        # fan-out in onnxruntime's order (u1 u0 s1 u2 y): u1, u0, s1 live at s1 = 3T; block 3T + y = 4T.
        (graphs.fanout, 3 * T, 4 * T),
        # skip: a, b, c at c = b * b: 3T; block 3T + y = 4T.
        (graphs.skip, 3 * T, 4 * T),
        # Relu and Sigmoid in place: one buffer for a, b, c, plus y: 2T both runs (the block is T).
        (graphs.inplace, 2 * T, 2 * T),
        # Reshape and Unsqueeze are views of a: a and y, 2T.
        (graphs.alias, 2 * T, 2 * T),
        # Loop body: a and v_out (own buffer) + y + the counter (8 B) and condition (1 B) = 3T + 9.
        (graphs.loop, 3 * T + 9, 3 * T + 9),
    ],
)
def test_estimate_equals_onnxruntime_to_the_byte(build, first: int, steady: int) -> None:  # type: ignore[no-untyped-def]
    result = validate(build(), runs=2)
    assert [r.measured.peak_activation_bytes for r in result.runs] == [first, steady]
    assert [r.estimated.peak_activation_bytes for r in result.runs] == [first, steady]
    assert result.exact
    assert all(r.weights_difference_bytes == 0 for r in result.runs)


def test_prepacked_weights_are_the_arena_baseline() -> None:
    # W1 [256,512] and W2 [512,128] float32 are prepacked by MatMul: 512 and 128 columns are multiples of 16,
    # so their bytes are exactly what the arena holds before the first node.
    result = validate(graphs.symbolic_mlp(), {"batch": 5}, runs=1)
    run = result.runs[0]
    assert run.measured.weights_bytes == (256 * 512 + 512 * 128) * 4
    assert run.estimated.weights_bytes == run.measured.weights_bytes
    assert run.activation_difference_bytes == 0


def test_if_counts_the_branch_that_ran() -> None:
    # The run takes the then branch (cond is True): z + t1 = 2T. The profile names the then branch's nodes, so
    # the estimate counts that branch, not the larger else branch that `onnxmem report` counts.
    result = validate(graphs.if_branches(), runs=1)
    assert result.runs[0].measured.peak_activation_bytes == 2 * T
    assert result.runs[0].estimated.peak_activation_bytes == 2 * T
    assert result.raw_estimate.peak_activation_bytes > 2 * T
    assert any("branch onnxruntime ran" in note for note in result.notes)


def test_cli_json_has_measured_and_estimated_per_run(tmp_path: Path) -> None:
    path = tmp_path / "chain.onnx"
    onnx.save(graphs.chain(), str(path))
    result = CliRunner().invoke(main, ["validate", str(path), "--format", "json", "--runs", "2"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "onnxmem.validate/1"
    assert [run["measured"]["peak_activation_bytes"] for run in document["runs"]] == [2 * T, 3 * T]
    assert [run["estimated"]["peak_activation_bytes"] for run in document["runs"]] == [2 * T, 3 * T]
    assert {"weights_bytes"} <= set(document["runs"][0]["measured"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.onnx"]  # nothing left beside the model


def test_model_onnxruntime_cannot_run_is_a_one_line_error(tmp_path: Path) -> None:
    model = graphs.model([onnx.helper.make_node("Frobnicate", ["x"], ["y"], domain="example.custom")],
                         [graphs.value("x")], [graphs.value("y")])
    model.opset_import.append(onnx.helper.make_opsetid("example.custom", 1))
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxmem: error: onnxruntime cannot load the model")
    assert "Traceback" not in result.stderr


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.mark.parametrize(("name", "dims"), [
    ("gpt_decoder", {"batch": 2, "seq": 16}),
    ("transformer_encoder", {"batch": 2, "seq": 16}),
    ("transformer_contrib", {"batch": 2, "seq": 16}),
])
def test_extended_level_first_run_is_exact(name: str, dims: dict[str, int]) -> None:
    # At the extended level onnxruntime fuses into contrib operators (FusedMatMul, BiasGelu, ...). Its planner
    # knows their outputs only where it knows their inputs, and after a computed Reshape it knows nothing: the
    # planner shapes must not come from onnxruntime's symbolic (value-propagating) inference.
    model = FIXTURES / f"{name}.onnx"
    names = {d.dim_param for v in onnx.load(str(model), load_external_data=False).graph.input
             for d in v.type.tensor_type.shape.dim if d.dim_param}
    result = validate(model, {k: v for k, v in dims.items() if k in names}, opt_level="extended", runs=1)
    assert result.runs[0].activation_difference_bytes == 0
