"""The user's path (issue 16): consistent options, the answer first, what-ifs that say whether they fit, several
models in one call, errors as JSON, schema first, help with examples, progress only on a terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import onnxmem
from onnxmem.cli.commands import _Progress
from onnxmem.errors import DimError, TargetError
from onnxmem.plan.fit import resolve_target
from onnxmem.shapes.dims import bind_dims, input_dims
from onnxmem.training.step import TrainingOptions
from onnxmem.views.series import round_ticks

from . import graphs
from .cli import run, save

# symbolic_mlp, worked by hand in tests/test_plan.py: peak(b) = 786,432 + 3,584 b.
MLP_WEIGHTS, MLP_PER_ROW = 786_432, 3_584


@pytest.fixture
def mlp(tmp_path: Path) -> str:
    return save(graphs.symbolic_mlp(), tmp_path / "mlp.onnx")


# --- consistent options -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [("report",), ("fit", "--memory", "1GiB"), ("check", "--budget", "1GiB")])
@pytest.mark.parametrize(("flag", "value"), [("--optimizer", "sgd"), ("--freeze", "W1"), ("--grad-accum", "2"),
                                             ("--checkpoint", "auto"), ("--loss", "mse"), ("--device", "cpu")])
def test_a_training_option_without_training_is_an_error_saying_to_add_it(mlp: str, command: tuple[str, ...],
                                                                         flag: str, value: str) -> None:
    dims = () if command[0] == "fit" else ("--dim", "batch=8")
    code, out, err = run(command[0], mlp, *command[1:], *dims, flag, value)
    assert code == 2 and not out
    assert err.startswith("onnxmem: error: ") and f"{flag} is a training option: add --training" in err
    code, _, err = run(command[0], mlp, *command[1:], *dims, flag, value, "--training")
    assert code in (0, 1), err  # the same option with --training is taken


def test_a_training_option_left_at_its_default_is_no_error(mlp: str) -> None:
    code, out, err = run("report", mlp, "--dim", "batch=8", "--optimizer", "adamw", "--training")
    assert code == 0, err
    code, out, err = run("report", mlp, "--dim", "batch=8")  # every training option at its default, none given
    assert code == 0 and "total peak" in out, err


def test_gpus_without_shard_says_what_to_add(mlp: str) -> None:
    code, _, err = run("fit", mlp, "--memory", "1GiB", "--gpus", "8", "--training")
    assert code == 2 and "8 GPUs but no sharding stage" in err and "--shard ddp|zero1|zero2|zero3" in err
    code, _, err = run("check", mlp, "--dim", "batch=8", "--budget", "1GiB", "--gpus", "8")
    assert code == 2 and "--shard" in err and "add --training" in err
    with pytest.raises(TargetError, match="shard="):  # the library says it in its own words too
        onnxmem.fit(graphs.symbolic_mlp(), memory="1GiB", gpus=4, training=TrainingOptions())
    code, _, err = run("fit", mlp, "--memory", "1GiB", "--gpus", "8", "--shard", "ddp", "--training",
                       "--no-what-if")
    assert code == 0, err


def test_fixed_costs_as_large_as_the_memory_are_an_error(mlp: str) -> None:
    with pytest.raises(TargetError, match="take all of the memory"):
        resolve_target(gpu="A100-80GB", reserve="100GiB")
    with pytest.raises(TargetError, match="reserve="):
        resolve_target(memory="256MiB", runtime="pytorch")  # the stated 576 MiB of fixed costs
    code, _, err = run("fit", mlp, "--gpu", "A100-80GB", "--reserve", "100GiB")
    assert code == 2 and "take all of the memory" in err and "--reserve SIZE" in err
    assert resolve_target(memory="1GiB", reserve="1023MiB").reserve_bytes == 1023 * 2**20  # less is fine


@pytest.mark.parametrize(("options", "step"), [(TrainingOptions(grad_accum=4), 4),
                                               (TrainingOptions(micro_batch=3), 3)])
def test_fit_with_accumulation_searches_multiples_that_divide(options: TrainingOptions, step: int) -> None:
    model = graphs.symbolic_mlp()
    budget = 4 * 2**20
    result = onnxmem.fit(model, memory=budget, training=options, what_if=False)
    assert result.step == step and result.mode == "training"
    assert all(p.value % step == 0 for p in result.curve)
    assert result.curve[0].value == step
    b = result.max_value
    if result.bounded:
        assert b > 0 and b % step == 0
        # independent of the search: full analyses at b and at the next multiple
        assert onnxmem.analyze(model, {"batch": b}, training=options).training.peak_bytes <= budget  # type: ignore[union-attr]
        after = onnxmem.analyze(model, {"batch": b + step}, training=options).training
        assert after is not None and after.peak_bytes > budget
    else:  # micro-batches: memory is that of one micro-batch whatever the batch
        assert len({p.peak_bytes for p in result.curve}) == 1 and result.max_value % step == 0
    assert any(f"multiples of {step}" in n for n in result.notes)


def test_fit_with_grad_accum_through_the_cli(mlp: str) -> None:
    code, out, err = run("fit", mlp, "--memory", "4MiB", "--training", "--grad-accum", "4", "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert document["step"] == 4 and document["max_value"] % 4 == 0 and document["max_value"] > 0
    assert all(p["value"] % 4 == 0 for p in document["curve"])


def test_a_pattern_that_matches_nothing_is_a_named_warning() -> None:
    model = graphs.symbolic_mlp()
    report = onnxmem.analyze(model, {"batch": 8}, training=TrainingOptions(freeze=("encoder.*", "W1")))
    warnings = [w for w in report.warnings if w.code == "unmatched-pattern"]
    assert len(warnings) == 1 and "freeze pattern 'encoder.*'" in warnings[0].message
    assert "'W1'" not in warnings[0].message  # W1 matched: it is frozen
    assert report.training is not None and report.training.trainable_parameters == 512 * 128
    report = onnxmem.analyze(model, {"batch": 8}, training=TrainingOptions(train=("nothing*",)))
    assert [w.message for w in report.warnings if w.code == "unmatched-pattern"][0].startswith(
        "no parameter's name or module path matches train pattern 'nothing*'")
    report = onnxmem.analyze(model, {"batch": 8}, training=TrainingOptions(freeze=("W*",)))
    assert not [w for w in report.warnings if w.code == "unmatched-pattern"]


def test_api_errors_read_naturally_from_python() -> None:
    free = input_dims(graphs.symbolic_mlp())
    with pytest.raises(DimError) as raised:
        bind_dims(free, {})
    assert "--dim batch=N" in str(raised.value) and "dims={'batch': N}" in str(raised.value)
    with pytest.raises(DimError, match="search= in Python"):
        onnxmem.fit(graphs.symbolic_mlp(), memory="1GiB", search="seq")


# --- the answer first -------------------------------------------------------------------------------------------

def test_every_format_leads_with_the_answer(mlp: str) -> None:
    peak = MLP_WEIGHTS + MLP_PER_ROW * 8
    code, out, _ = run("report", mlp, "--dim", "batch=8")
    lines = out.splitlines()
    assert lines[1].startswith("total peak 796.00 KiB at step 2 (MatMul node 'MatMul_y')"), lines[:3]
    assert lines[2].startswith("  = weights ") and "activations live" in lines[2]  # the peak's sum under it
    code, out, _ = run("report", mlp, "--dim", "batch=8", "--format", "markdown")
    assert out.splitlines()[2].startswith("**total peak")
    code, out, _ = run("report", mlp, "--dim", "batch=8", "--training")
    lines = out.splitlines()
    assert lines[1].startswith("training step peak") and lines[2].startswith("  = model states")
    assert next(line for line in lines[2:] if not line.startswith(" ")).startswith("inference peak")
    code, out, _ = run("check", mlp, "--dim", "batch=8", "--budget", f"{peak + 10}B")
    assert code == 0 and out.splitlines()[1] == "FITS: needs 796.00 KiB of 796.01 KiB (headroom 10 B)"
    # the verdict's arithmetic under it: needs = peak + rounding, budget = memory - fixed costs
    assert out.splitlines()[2] == "  needs 796.00 KiB = peak 796.00 KiB (no --runtime: no allocator rounding)"
    assert out.splitlines()[3] == "  budget 796.01 KiB = memory 796.01 KiB (no fixed costs)"
    code, out, _ = run("check", mlp, "--dim", "batch=8", "--budget", f"{peak - 1}B", "--format", "markdown")
    assert code == 1 and out.splitlines()[2].startswith("**DOES NOT FIT: needs")
    code, out, _ = run("fit", mlp, "--memory", f"{MLP_WEIGHTS + MLP_PER_ROW * 100}B")
    assert out.splitlines()[1].startswith("largest batch that fits: 100 (largest power of two: 64; budget")


def test_nothing_fits_is_said_once(mlp: str) -> None:
    code, out, _ = run("fit", mlp, "--memory", "1000B")
    assert code == 0 and out.count("nothing fits") == 1 and out.splitlines()[1].startswith("nothing fits")


def test_what_ifs_say_whether_each_change_alone_fits(mlp: str) -> None:
    # batch 8 needs 796 KiB; float16 halves everything (398 KiB); halving the batch saves only 14 KiB
    budget = 500 * 1024
    gate = onnxmem.check(graphs.symbolic_mlp(), {"batch": 8}, memory=budget)
    by_change = {w.change: w for w in gate.what_ifs}
    half = by_change["float32 -> float16 (weights and activations)"]
    assert half.fits is True and half.peak_bytes <= budget
    assert by_change["batch 8 -> 4"].fits is False and by_change["batch 8 -> 4"].peak_bytes > budget
    code, out, _ = run("check", mlp, "--dim", "batch=8", "--budget", f"{budget}B")
    header = next(line for line in out.splitlines() if line.startswith("change"))
    assert header.split()[:5] == ["change", "peak", "saves", "fits", "how"]
    code, out, _ = run("check", mlp, "--dim", "batch=8", "--budget", f"{budget}B", "--format", "json")
    assert [w["fits"] for w in json.loads(out)["what_ifs"]] == [w.fits for w in gate.what_ifs]


# --- JSON: schema first, errors as objects, gpus ----------------------------------------------------------------

def test_schema_is_the_first_key_of_every_document(mlp: str) -> None:
    for args in (("report", mlp, "--dim", "batch=8"), ("fit", mlp, "--memory", "1MiB"),
                 ("check", mlp, "--dim", "batch=8", "--budget", "1MiB"), ("gpus",)):
        code, out, err = run(*args, "--format", "json")
        assert code == 0, err
        assert next(iter(json.loads(out))) == "schema", args
    report = onnxmem.analyze(graphs.symbolic_mlp(), {"batch": 2})
    keys = list(report.to_dict())
    assert keys[0] == "schema" and keys[1:4] == ["model", "dims", "order"]  # the others keep their order


def test_gpus_as_json(mlp: str) -> None:
    code, out, _ = run("gpus", "--format", "json")
    document = json.loads(out)
    assert document["schema"] == "onnxmem.targets/1"
    a100 = next(g for g in document["gpus"] if g["name"] == "A100-80GB")
    assert a100["memory_bytes"] == 80 * 2**30
    assert {r["name"] for r in document["runtimes"]} == {"onnxruntime", "pytorch"}
    assert all(c["bytes"] > 0 for r in document["runtimes"] for c in r["fixed_costs"])


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_errors_are_json_objects_when_json_was_asked(tmp_path: Path, mlp: str, fmt: str) -> None:
    absent = str(tmp_path / "absent.onnx")
    for args, code_word in ((("report", absent), "model-file"), (("report", mlp), "dim"),
                            (("fit", mlp, "--gpu", "GTX-480"), "target"),
                            (("check", mlp, "--dim", "batch=8", "--budget", "1GB", "--loss", "mse"),
                             "training-option")):
        code, out, err = run(*args, "--format", fmt)
        assert code == 2 and err.startswith("onnxmem: error: ")  # the exit code and the stderr line are unchanged
        assert out.count("\n") == (1 if fmt == "jsonl" else out.count("\n")) and out.strip()
        document = json.loads(out)
        assert list(document) == ["schema", "model", "code", "message"]
        assert document["schema"] == "onnxmem.error/1" and document["code"] == code_word
        assert document["model"] == args[1] and document["message"] in err
    code, out, _ = run("report", absent)  # not asked for JSON: nothing on stdout
    assert code == 2 and out == ""


# --- several models in one call ---------------------------------------------------------------------------------

def make_folder(folder: Path) -> list[str]:
    folder.mkdir()
    save(graphs.symbolic_mlp(), folder / "b_mlp.onnx")
    save(graphs.chain(), folder / "a_chain.onnx")
    (folder / "c_broken.onnx").write_bytes(b"not a model")
    (folder / "notes.txt").write_text("not a model either, and not *.onnx")
    return [str(folder / n) for n in ("a_chain.onnx", "b_mlp.onnx", "c_broken.onnx")]


def test_a_folder_of_models_is_one_call_with_one_line_each(tmp_path: Path) -> None:
    paths = make_folder(tmp_path / "models")
    code, out, err = run("report", str(tmp_path / "models"), "--default-dim", "4", "--format", "jsonl")
    assert code == 2  # the broken model's exit code; the others are answered
    lines = out.splitlines()
    assert len(lines) == 3
    documents = [json.loads(line) for line in lines]
    assert [d["model"] for d in documents] == paths  # sorted by name
    assert [d["schema"] for d in documents] == ["onnxmem.report/1", "onnxmem.report/1", "onnxmem.error/1"]
    assert documents[1]["inference"]["peak_bytes"] == MLP_WEIGHTS + MLP_PER_ROW * 4
    assert documents[2]["code"] == "model-file" and "c_broken.onnx" in err
    code_pool, out_pool, _ = run("report", str(tmp_path / "models"), "--default-dim", "4", "--format", "jsonl",
                                 "--jobs", "2")
    assert (code_pool, out_pool) == (code, out)  # a pool of processes gives the same lines, in the same order


def test_several_models_as_tables_and_what_takes_one(tmp_path: Path) -> None:
    paths = make_folder(tmp_path / "models")
    code, out, err = run("report", paths[1], paths[0], "--default-dim", "2")
    assert code == 0, err
    titles = [line for line in out.splitlines() if line.startswith("onnxmem report: ")]  # (long paths: shortened)
    assert [t.endswith(Path(path).name) for t, path in zip(titles, (paths[1], paths[0]), strict=True)] == [True, True]
    for fmt in ("json", "html"):
        code, out, err = run("report", paths[0], paths[1], "--format", fmt)
        assert code == 2 and "takes one model" in err
    code, _, err = run("report", str(tmp_path))  # a folder with no *.onnx
    assert code == 2 and "no .onnx file" in err


# --- help, progress ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["report", "fit", "check", "validate", "gpus"])
def test_every_command_has_an_example(command: str) -> None:
    code, out, _ = run(command, "--help")
    assert code == 0 and "Example" in out and f"onnxmem {command} " in out.split("Example")[1]


def test_orders_are_explained_and_completion_documented() -> None:
    code, out, _ = run("fit", "--help")
    assert "greedy least-peak-first" in " ".join(out.split())
    code, out, _ = run("--help")
    assert "_ONNXMEM_COMPLETE=bash_source onnxmem" in out
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "_ONNXMEM_COMPLETE=bash_source onnxmem" in readme
    assert readme.index("## Answers at a glance") < readme.index("## What it reports")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_waits_a_second_then_rewrites_one_line() -> None:
    quick = _Progress(_Terminal(), after_s=60)
    quick("loading")
    quick.close()
    assert quick.stream.getvalue() == ""  # a short run says nothing
    stream = _Terminal()
    slow = _Progress(stream, after_s=0)
    slow("evaluating batch=8")
    slow("evaluating batch=16")
    slow.close()
    text = stream.getvalue()
    assert "onnxmem: evaluating batch=8" in text and text.endswith("\r\033[K") and "\n" not in text


def test_library_progress_names_the_phases_and_the_values() -> None:
    said: list[str] = []
    onnxmem.analyze(graphs.symbolic_mlp(), {"batch": 2}, training=TrainingOptions(), progress=said.append)
    assert said[0].startswith("loading") and "training step" in said[1]
    said.clear()
    result = onnxmem.fit(graphs.symbolic_mlp(), memory="1MiB", progress=said.append)
    evaluated = [int(s.split("=")[1]) for s in said if s.startswith("evaluating batch=")]
    assert sorted(evaluated) == [p.value for p in result.curve]


def test_no_progress_outside_a_terminal(mlp: str) -> None:
    code, out, err = run("fit", mlp, "--memory", "1MiB", "--format", "json")
    assert code == 0 and "\r" not in out + err and err == ""
    json.loads(out)


# --- charts -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("largest", [1, 7, 999, 1000, 1024, 3 * 2**20 + 5, 80 * 2**30, 10**13 + 7])
def test_round_ticks_are_four_to_six_round_steps(largest: int) -> None:
    from onnxmem.views.series import byte_unit

    unit = byte_unit(largest)
    ticks = round_ticks(largest, unit)
    assert 4 <= len(ticks) <= 6 and ticks[0] == 0 and ticks[-1] >= largest and ticks[-2] < largest or len(ticks) == 4
    step = ticks[1]
    assert all(b - a == step for a, b in zip(ticks, ticks[1:], strict=False))
    mantissa = step / unit
    while mantissa >= 10:
        mantissa /= 10
    while mantissa < 1:
        mantissa *= 10
    assert round(mantissa, 6) in (1, 2, 2.5, 5)
