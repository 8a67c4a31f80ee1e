"""benchmarks/cuda/singleops.py: the campaign's single-op part, dry-run on the CPU (every group at tiny sizes, rows
of the GPU's form), its plan (first in the campaign, inside its time budget, skipped once committed) and its
scorer (benchmarks/cuda/score_singleops.py: the allocator replay against measured figures)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.cuda import campaign, score_singleops, singleops  # noqa: E402
from benchmarks.cuda.common import PARTS, done_keys, make_row, pending_cases  # noqa: E402


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_configuration_has_its_own_key_and_the_dry_run_takes_some_of_them() -> None:
    for group in singleops.GROUP_NAMES:
        full, dry = singleops.keys(group), singleops.keys(group, small=True)
        assert full and dry and len(set(full)) == len(full)
        assert set(dry) <= set(full) and all(k.startswith(f"singleop/{group}/") for k in full)
    sdpa = singleops.configs("sdpa")
    assert {c["dtype"] for c in sdpa} == {"fp32", "fp16", "bf16"}
    assert {c["head_dim"] for c in sdpa} == {64, 80, 128, 256} and {c["seq"] for c in sdpa} == {128, 512, 2048}
    assert {c["batch"] for c in sdpa} == {1, 8}
    variants = singleops.configs("sdpa-variants")
    assert {c["mask"] for c in variants} == {None, "float", "bool"} and {c["gqa"] for c in variants} == \
        {None, "enable", "repeat"}
    assert {c["dropout_p"] for c in variants} == {0.0, 0.1} and {c["is_causal"] for c in variants} == {True, False}
    conv = singleops.configs("conv")
    assert {c["kernel"] for c in conv} == {"k1", "k3", "k7", "dw7"} and {c["batch"] for c in conv} == {1, 32, 64}
    assert all(singleops._conv_flops(c["batch"], c["in"], c["out"], c["side"], c["kernel"]) <=
               singleops.CONV_FLOP_LIMIT for c in conv)


def test_the_part_runs_first_and_fits_six_minutes_of_gpu_time() -> None:
    assert PARTS[0] == "singleop"
    assert singleops.budget_s() <= 360
    planned = campaign.plan_cases(["training", "singleop", "context"], None, dry_run=False)
    assert [c.part for c in planned][: len(singleops.GROUPS)] == ["singleop"] * len(singleops.GROUPS)
    first = planned[0]
    assert first.name == singleops.GROUPS[0].name and first.args == {"seconds": singleops.GROUPS[0].seconds}
    assert first.timeout_s > first.args["seconds"]


def test_committed_rows_skip_their_groups_and_budget_rows_are_measured_again() -> None:
    cases = campaign.plan_cases(["singleop"], ["allocator", "adamw"], dry_run=False)
    rows = [make_row("singleop", k) for k in singleops.keys("allocator")]
    rows += [make_row("singleop", k, error="not started", error_kind="budget") for k in singleops.keys("adamw")]
    todo, skipped = pending_cases(cases, done_keys(rows))
    assert [c.name for c in skipped] == ["allocator"] and [c.name for c in todo] == ["adamw"]


def test_every_free_of_an_allocator_sequence_releases_a_live_allocation() -> None:
    from onnxmem.targets.torch.cuda.allocator import replay

    for config in singleops.configs("allocator"):
        events = singleops.allocator_events(config["sequence"])
        frees = sum(1 for _, is_free in events if is_free)
        assert 0 < frees < len(events)
        peaks = replay(events)  # raises on a free of a size with nothing live
        assert peaks.reserved >= peaks.allocated > 0


@pytest.fixture(scope="module")
def dry_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The rows of every group run in this process at the dry run's sizes on the CPU."""
    pytest.importorskip("torch")
    from benchmarks.cuda.measure import Context

    path = tmp_path_factory.mktemp("singleops") / "rows.jsonl"
    for group in singleops.GROUP_NAMES:
        singleops.run_group(Context({"rows": str(path), "keys": list(singleops.keys(group, True)), "device": "cpu",
                                     "dry_run": True, "case": f"singleop/{group}", "name": group,
                                     "args": {"seconds": 600}}))
    return _lines(path)


def test_the_dry_run_writes_one_well_formed_row_per_configuration(dry_rows: list[dict[str, Any]]) -> None:
    wanted = {k for g in singleops.GROUP_NAMES for k in singleops.keys(g, True)}
    assert [r["key"] for r in dry_rows if r["error"] is not None] == []
    assert {r["key"] for r in dry_rows} == wanted and len(dry_rows) == len(wanted)
    for row in dry_rows:
        assert row["kind"] == "singleop" and row["device"] == "cpu" and row["dry_run"] is True
        assert row["group"] in singleops.GROUP_NAMES and row["config"]["op"] == row["op"]
        for run in (row.get("runs") or {}).values():
            if run["allowed"]:
                assert run["forward"] is None and run["output_bytes"] > 0 and run["grad_fn"]
                assert all({"shape", "dtype", "bytes", "role"} <= set(s) for s in run["saved"])


def test_attention_runs_each_backend_alone_and_says_which_one_the_default_took(
        dry_rows: list[dict[str, Any]]) -> None:
    attention = [r for r in dry_rows if r["op"] == "sdpa"]
    assert attention
    for row in attention:
        assert set(row["runs"]) == set(singleops.BACKENDS) and row["sdp_enabled"]["math"] is True
        assert row["runs"]["math"]["allowed"] and row["default_backend"] in ("flash", "math")
        refused = [run for run in row["runs"].values() if not run["allowed"]]
        assert refused and all(run["reason"] for run in refused)  # the CPU has no efficient or cuDNN kernel
    flash = next(r for r in attention if r["default_backend"] == "flash")["runs"]["flash"]
    roles = {s["role"] for s in flash["saved"]}
    assert {"q", "output"} <= roles  # flash attention keeps its query and its output for the backward
    repeat = next(r for r in attention if r["config"]["gqa"] == "repeat")
    sizes = repeat["sizes"]
    repeated = sizes["batch"] * sizes["heads"] * sizes["seq"] * sizes["head_dim"] * 2  # bf16, q's heads
    assert any(s["role"] == "new" and s["bytes"] == repeated for s in repeat["runs"]["default"]["saved"])


def test_the_other_groups_record_their_own_figures(dry_rows: list[dict[str, Any]]) -> None:
    by_op: dict[str, list[dict[str, Any]]] = {}
    for row in dry_rows:
        by_op.setdefault(row["op"], []).append(row)
    for row in by_op["conv2d"]:
        assert set(row["runs"]) == {"first", "second"} and row["runs"]["first"]["grad_bytes"] > 0
    for row in by_op["adamw"]:
        assert row["state_bytes"] >= 2 * row["parameter_bytes"] and len(row["steps"]) == 2
    embedding = by_op["embedding"][0]["runs"]["first"]
    assert [s["role"] for s in embedding["saved"]] == ["ids"]  # the dense backward keeps only the indices
    for row in by_op["allocator"]:
        assert row["after"] is None and row["events"] and row["after_fields"][:2] == ["allocated", "reserved"]
    assert {r["config"]["bias"] for r in by_op["linear"]} == {True, False}


def test_a_group_whose_seconds_are_spent_writes_budget_rows(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from benchmarks.cuda.measure import Context

    path = tmp_path / "rows.jsonl"
    keys = list(singleops.keys("adamw", True))
    singleops.run_group(Context({"rows": str(path), "keys": keys, "device": "cpu", "dry_run": True,
                                 "case": "singleop/adamw", "name": "adamw", "args": {"seconds": -1}}))
    rows = _lines(path)
    assert [r["key"] for r in rows] == keys and {r["error_kind"] for r in rows} == {"budget"}
    assert done_keys(rows) == set()


def test_the_campaign_runs_the_part_end_to_end_on_the_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "out"
    status = campaign.main(["--out", str(out), "--work", str(tmp_path / "work"), "--dry-run", "--device", "cpu",
                            "--parts", "singleop", "--models", "allocator", "linear", "--budget-s", "200"])
    assert status == 0
    rows = _lines(out / "rows.jsonl")
    made = [r for r in rows if r["kind"] == "singleop"]
    assert {r["key"] for r in made} == set(singleops.keys("allocator", True)) | set(singleops.keys("linear", True))
    assert all(r["error"] is None for r in made)
    assert rows[-1]["kind"] == "summary" and rows[-1]["outcomes"] == {"ok": 3}  # env and the two groups


def _allocator_row(events: list[tuple[int, bool]], settings: str | None = None) -> dict[str, Any]:
    """A GPU-like allocator row whose 'measured' figures are the replay's own (start: 2 MiB already held)."""
    from onnxmem.targets.torch.cuda.allocator import CachingAllocator

    parsed = score_singleops.parse_settings(settings)
    allocator = CachingAllocator(parsed["max_split_size"], int(parsed["roundup_power2_divisions"] or 0))
    live: dict[int, list[Any]] = {}
    after = []
    for size, is_free in events:
        if is_free:
            allocator.free(live[size].pop())
        else:
            live.setdefault(size, []).append(allocator.malloc(size))
        after.append([allocator.allocated + 512, allocator.reserved + 2**21, allocator.segments, 0, 0])
    return make_row("singleop", "singleop/allocator/test", group="allocator", op="allocator", settings=settings,
                    events=[[s, int(f)] for s, f in events], start={"allocated": 512, "reserved": 2**21},
                    after=after, device="cuda", dry_run=False)


def test_the_scorer_compares_the_replay_with_the_measured_allocator_figures() -> None:
    events = singleops.allocator_events("mid")
    same = score_singleops.replay_compare(_allocator_row(events))
    assert same["differences"] == {"allocated": 0, "reserved": 0} and same["first_difference"] is None
    assert same["measured"] == same["replay"] and same["replay"]["reserved"] > 0
    row = _allocator_row(events)
    row["after"][3][1] += 2**21  # one event where the device held a segment more
    moved = score_singleops.replay_compare(row)
    assert moved["differences"] == {"allocated": 0, "reserved": 1} and moved["first_difference"] == 3
    split = _allocator_row(singleops.allocator_events("random"), "roundup_power2_divisions:1,max_split_size_mb:64")
    assert score_singleops.replay_compare(split)["differences"] == {"allocated": 0, "reserved": 0}
    assert score_singleops.parse_settings("max_split_size_mb:64") == {"max_split_size": 64 * 2**20,
                                                                     "roundup_power2_divisions": 0}


def test_the_scorer_prints_a_table_per_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    phase = {"base_allocated": 0, "base_reserved": 0, "peak_allocated_above": 3 * 2**20,
             "end_allocated_above": 2 * 2**20}
    run = {"allowed": True, "forward": phase, "backward": {"peak_allocated_above": 5 * 2**20,
                                                          "end_allocated_above": 2**20},
           "output_bytes": 2**20, "saved_new_bytes": 2**20, "held_after_above": 0,
           "grad_fn": "ScaledDotProductFlashAttentionBackward0"}
    sdpa = make_row("singleop", "singleop/sdpa/bf16-b8-q512-d64-plain", group="sdpa", op="sdpa",
                    default_backend="flash", runs={"flash": run, "cudnn": {"allowed": False, "reason": "no kernel"}},
                    device="cuda", dry_run=False)
    rows = [sdpa, _allocator_row(singleops.allocator_events("fragment")),
            make_row("singleop", "singleop/conv/x", group="conv", error="ValueError: x", error_kind="failed")]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert score_singleops.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    flash = next(line for line in out.splitlines() if line.startswith("bf16-b8-q512-d64-plain  flash *"))
    # output 1 MiB; kept 2 - 1 = 1 MiB; forward transient 3 - 2 = 1 MiB; backward peak 5 and end 1 MiB
    assert flash.split()[3:11] == ["yes", "1.0", "1.0", "1.0", "1.0", "5.0", "1.0", "0.0"]
    assert "cudnn" in out and "no kernel" in out
    fragment = next(line for line in out.splitlines() if line.startswith("test "))
    assert fragment.split()[-3:] == ["0", "0", "-"]
    assert "singleop/conv/x: failed" in out
    assert score_singleops.main([str(tmp_path / "none")]) == 0
    assert "no single-op rows yet" in capsys.readouterr().out


def test_a_kernel_fault_that_breaks_the_context_ends_the_group_and_leaves_the_rest_to_a_later_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from benchmarks.cuda.measure import Context

    def faulty(probe: Any, config: dict[str, Any], small: bool) -> dict[str, Any]:
        if config["impl"] == "fused":
            singleops._check_sticky(RuntimeError("CUDA error: an illegal memory access was encountered"))
        return {"steps": []}

    monkeypatch.setitem(singleops.MEASURES, "adamw", faulty)
    path = tmp_path / "rows.jsonl"
    keys = list(singleops.keys("adamw", True))
    singleops.run_group(Context({"rows": str(path), "keys": keys, "device": "cpu", "dry_run": True,
                                 "case": "singleop/adamw", "name": "adamw", "args": {"seconds": 60}}))
    rows = {r["key"]: r for r in _lines(path)}
    assert [rows[k]["error_kind"] for k in keys] == [None, "failed", "crashed"]  # foreach, fused, forloop
    assert "illegal memory access" in rows[keys[1]]["error"] and keys[1] in rows[keys[2]]["error"]
    assert done_keys(rows.values()) == set(keys[:2])


def test_the_plan_prints_every_group() -> None:
    plan = singleops.plan_table()
    assert all(f"\n{g.name} " in plan for g in singleops.GROUPS) and f"total: {singleops.budget_s():.0f} s" in plan
