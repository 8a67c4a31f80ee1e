"""benchmarks/cuda: the CUDA truth campaign's driver, run without a GPU. The row writer, the skip-done logic, the
time budget, the child runner (a hung and a crashed case become rows) and the scorer need no torch; the end-to-end
dry run (--dry-run --device cpu, one tiny model) runs where torch is installed."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.cuda import campaign, score  # noqa: E402
from benchmarks.cuda.common import (  # noqa: E402
    PARTS,
    SCHEMA,
    Budget,
    Case,
    RowWriter,
    done_keys,
    make_row,
    order_cases,
    pending_cases,
    read_rows,
    run_child,
)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_writer_appends_one_parsable_line_per_row_from_many_threads(tmp_path: Path) -> None:
    writer = RowWriter(tmp_path / "out" / "rows.jsonl")

    def write(n: int) -> None:
        for i in range(25):
            writer.write(make_row("training", f"training/m{n}/{i}", payload="x" * 5000, value=i))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = _lines(writer.path)
    assert len(rows) == 100
    assert {r["key"] for r in rows} == {f"training/m{n}/{i}" for n in range(4) for i in range(25)}
    for row in rows:
        assert row["schema"] == SCHEMA and row["error"] is None and row["error_kind"] is None and row["time"]


def test_read_rows_skips_a_line_cut_by_a_killed_run_and_reads_folders(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps(make_row("context", "context/all")) + "\n{\"kind\": \"trai")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text(json.dumps(make_row("fit", "fit/gpt2/answer")) + "\n\n")
    rows = read_rows([tmp_path])
    assert sorted(r["key"] for r in rows) == ["context/all", "fit/gpt2/answer"]
    assert read_rows([tmp_path / "missing.jsonl"]) == []


def test_done_keys_retry_timeouts_and_budget_skips_but_not_failures() -> None:
    rows = [
        make_row("training", "training/a/full/sgd/fp32"),
        make_row("training", "training/b/full/sgd/fp32", error="ValueError: x", error_kind="failed"),
        make_row("training", "training/c", error="timed out after 150 s", error_kind="timeout"),
        make_row("training", "training/d", error="not started", error_kind="budget"),
        make_row("training", "training/e", error="exit code -9", error_kind="crashed"),
        make_row("ort", "ort/m/basic/b1", error="skipped: no bundle", error_kind="skipped"),
        make_row("env", "env"),
        make_row("campaign", "campaign"),
    ]
    assert done_keys(rows) == {"training/a/full/sgd/fp32", "training/b/full/sgd/fp32"}


def test_pending_cases_skip_a_case_only_when_all_its_keys_are_done() -> None:
    whole = Case("training", "a", ("k1", "k2"), 10, 1)
    half = Case("training", "b", ("k3", "k4"), 10, 1)
    todo, skipped = pending_cases([whole, half], {"k1", "k2", "k3"})
    assert [c.id for c in todo] == ["training/b"] and [c.id for c in skipped] == ["training/a"]
    assert half.todo({"k1", "k2", "k3"}) == ("k4",)


def test_cases_run_in_the_order_of_value() -> None:
    cases = [Case(p, "m", (p,), 10, 1) for p in reversed(PARTS)]
    assert [c.part for c in order_cases(cases, list(PARTS))] == list(PARTS)
    assert [c.part for c in order_cases(cases, ["fit", "context"])] == ["context", "fit"]
    planned = campaign.plan_cases(["estimate", "ort", "training", "context"], None, dry_run=False)
    parts = [c.part for c in planned]
    assert parts.index("context") < parts.index("training") < parts.index("ort")
    assert {c.lane for c in planned if c.part == "estimate"} == {"cpu"}
    assert all(c.keys for c in planned)


def test_the_budget_starts_a_case_only_when_its_minimum_fits_and_cuts_its_timeout() -> None:
    now = [100.0]
    budget = Budget(60.0, reserve_s=10.0, clock=lambda: now[0])
    case = Case("training", "m", ("k",), timeout_s=30.0, min_s=15.0)
    assert budget.left() == 50.0 and budget.may_start(case) and budget.timeout_for(case) == 30.0
    now[0] += 30.0  # 20 s left
    assert budget.may_start(case) and budget.timeout_for(case) == 20.0
    now[0] += 10.0  # 10 s left
    assert not budget.may_start(case)
    now[0] += 100.0
    assert budget.left() == 0.0 and budget.timeout_for(case) == 1.0


def test_run_child_kills_a_hung_child_at_its_timeout() -> None:
    # a shell prints at once (a Python child's start took most of the second on a busy machine, and was killed
    # before it printed); then it hangs, as a child whose CUDA call never returns
    result = run_child(["sh", "-c", "echo started; exec sleep 600"], timeout_s=1.0)
    assert result.timed_out and result.returncode is None and "started" in result.tail


def test_a_hung_and_a_crashed_case_are_rows_and_the_campaign_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "out"
    status = campaign.main(["--out", str(out), "--parts", "selftest", "--models", "hang", "crash", "ok",
                            "--device", "cpu", "--dry-run", "--budget-s", "60", "--reserve-s", "0"])
    assert status == 0
    rows = _lines(out / "rows.jsonl")
    by_key = {r["key"]: r for r in rows}
    assert by_key["selftest/hang-first-row"]["error"] is None  # made before the hang: kept
    assert by_key["selftest/hang"]["error_kind"] == "timeout" and "timed out" in by_key["selftest/hang"]["error"]
    assert by_key["selftest/crash"]["error_kind"] == "crashed" and "exit code 3" in by_key["selftest/crash"]["error"]
    assert by_key["selftest/ok"]["error"] is None and by_key["selftest/ok"]["value"] == 1
    assert rows[0]["kind"] == "campaign" and rows[-1]["kind"] == "summary"
    assert rows[-1]["outcomes"] == {"timeout": 1, "crashed": 1, "ok": 1}

    # a later window skips what is done and tries the timeout again
    again = tmp_path / "again"
    campaign.main(["--out", str(again), "--parts", "selftest", "--models", "hang", "ok", "--device", "cpu",
                   "--dry-run", "--budget-s", "60", "--reserve-s", "0", "--skip-done", str(out / "rows.jsonl")])
    second = _lines(again / "rows.jsonl")
    assert second[0]["already_done"] == ["selftest/ok"] and second[0]["planned"] == ["selftest/hang"]
    assert "selftest/ok" not in {r["key"] for r in second}


def test_a_case_is_not_started_when_the_budget_is_spent(tmp_path: Path) -> None:
    out = tmp_path / "out"
    campaign.main(["--out", str(out), "--parts", "selftest", "--models", "ok", "--device", "cpu", "--dry-run",
                   "--budget-s", "5", "--reserve-s", "5"])
    row = next(r for r in _lines(out / "rows.jsonl") if r["key"] == "selftest/ok")
    assert row["error_kind"] == "budget" and "not started" in row["error"]


def test_exports_are_packed_into_one_archive_as_they_come(tmp_path: Path) -> None:
    import zipfile

    args = campaign.parse_args(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--device", "cpu"])
    run = campaign.Campaign(args)
    exports = tmp_path / "work" / "exports"
    exports.mkdir(parents=True)
    (exports / "a.full.onnx").write_bytes(b"graph a")
    run.pack_exports()
    (exports / "b.lora.onnx").write_bytes(b"graph b")
    run.pack_exports()
    run.pack_exports()
    with zipfile.ZipFile(tmp_path / "out" / "exports.zip") as archive:
        assert sorted(archive.namelist()) == ["a.full.onnx", "b.lora.onnx"]
        assert archive.read("b.lora.onnx") == b"graph b"


def test_the_scorer_says_there_are_no_rows_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert score.main([str(tmp_path)]) == 0
    assert "no CUDA rows yet" in capsys.readouterr().out


def _training_row(first: int, later: int, reserved: int) -> dict[str, Any]:
    def step(n: int, peak: int) -> dict[str, Any]:
        return {"step": n, "peak_allocated": peak, "peak_reserved": reserved, "phases": {}}

    return make_row("training", "training/m/full/adamw/fp32", "training/m", model="m", variant="full",
                    optimizer="adamw", precision="fp32", batch=8, dims={"batch": 8}, train=[], device="cuda",
                    before_model={"allocated": 1000, "reserved": 2_000_000},
                    steps=[step(1, 1000 + first), step(2, 1000 + later), step(3, 1000 + later)])


def test_the_scorer_compares_the_recorded_estimate_and_memtracker(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    estimate = make_row("estimate", "estimate/m/full/adamw/fp32", "estimate/m", model="m",
                        first_step={"peak_bytes": 110 * 2**20}, later_step={"peak_bytes": 90 * 2**20})
    tracker = make_row("memtracker", "memtracker/m/adamw/fp32/real", "memtracker/m",
                       first={"tracker_peak": {"cuda:0": {"Total": 95 * 2**20}}})
    dry = make_row("training", "training/d/full/sgd/fp32", model="d", variant="full", optimizer="sgd",
                   precision="fp32", before_model={"allocated": None}, steps=[{"peak_allocated": None}])
    rows = [_training_row(100 * 2**20, 120 * 2**20, 2_000_000 + 125 * 2**20), estimate, tracker, dry,
            make_row("fit", "fit/m/at-answer", batch=12, ran=True, oom=False, expected="runs")]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert score.main([str(tmp_path), "--recorded"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("m "))
    # ours 110 MiB against 100 allocated (+10%) and 125 reserved (-12%); later 90 against 120; MemTracker 95
    assert "+10.0%" in line and "-12.0%" in line and "-25.0%" in line and "-5.0%" in line and "recorded" in line
    assert "d " not in out.split("training:")[1].split("\n\n")[0].splitlines()[-1][:2]
    assert "fit/m/at-answer: batch 12 ran=True" in out


def test_the_run_script_is_one_device_command() -> None:
    script = (ROOT / "benchmarks" / "cuda" / "run_on_gpu.sh").read_text()
    assert len(script) < 2000 and "--out" in script and "timeout" in script and "campaign.py" in script


def test_dry_run_end_to_end_on_the_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "out"
    status = campaign.main(["--out", str(out), "--work", str(tmp_path / "work"), "--dry-run", "--device", "cpu",
                            "--models", "tiny_cnn", "--parts", "context,training", "--budget-s", "240"])
    assert status == 0
    rows = _lines(out / "rows.jsonl")
    kinds = [r["kind"] for r in rows]
    assert kinds[0] == "campaign" and kinds[-1] == "summary" and "env" in kinds
    failed = [(r["key"], r["error"]) for r in rows if r["error"] is not None]
    assert not failed
    context = next(r for r in rows if r["key"] == "context/all")
    assert {"start", "context", "cublas", "cublaslt", "cudnn"} <= set(context["stages"])
    training = [r for r in rows if r["kind"] == "training"]
    assert len(training) == 10  # sgd and adamw x three precisions, frozen and LoRA x two
    assert {(r["variant"], r["precision"]) for r in training} >= {("full", "amp-fp16"), ("lora", "amp-bf16")}
    for row in training:
        assert len(row["steps"]) == 3 and row["device"] == "cpu" and row["dry_run"] is True
        assert set(row["steps"][0]["phases"]) == {"forward", "loss", "backward", "optimizer"}
        assert row["parameter_bytes"] > 0 and row["input_bytes"] > 0
    lora = next(r for r in training if r["variant"] == "lora")
    full = next(r for r in training if r["variant"] == "full")
    assert 0 < lora["trainable_parameters"] < full["trainable_parameters"]


def test_failures_the_harness_has_fixed_are_measured_again_and_others_stay_done() -> None:
    from benchmarks.cuda.common import fixed_since

    lora = make_row("training", "training/t5/lora/adamw/fp32", error="AttributeError: 'LoRALinear' object has no "
                    "attribute 'weight' | ...", error_kind="failed")
    other = make_row("training", "training/t5/full/adamw/fp32", error="ValueError: x", error_kind="failed")
    export = make_row("export", "export/mixtral_moe/full", error="OnnxMemError: ... No ONNX function found for "
                      "<OpOverload(op='transformers.grouped_mm_fallback', ...", error_kind="failed")
    assert fixed_since(lora) and fixed_since(export) and not fixed_since(other)
    assert done_keys([lora, other, export]) == {"training/t5/full/adamw/fp32"}
    assert done_keys([lora, make_row("training", "training/t5/lora/adamw/fp32")]) == {"training/t5/lora/adamw/fp32"}


def test_what_fake_tensors_cannot_run_is_an_unsupported_row_counted_as_done(tmp_path: Path) -> None:
    from benchmarks.cuda.measure import Context, is_unsupported

    class DataDependentOutputException(RuntimeError):  # the name FakeTensorMode's error has
        pass

    assert is_unsupported(DataDependentOutputException("aten._local_scalar_dense.default"))
    assert is_unsupported(RuntimeError("Expected inputs of BF16 type but got mat_a.dtype=torch.float32"))
    assert not is_unsupported(RuntimeError("CUDA error: an illegal memory access"))
    ctx = Context({"rows": str(tmp_path / "rows.jsonl"), "keys": [], "device": "cpu", "case": "memtracker/m"})
    with ctx.guarded("memtracker", "memtracker/m/sgd/fp32/fake", unsupported=is_unsupported):
        raise DataDependentOutputException("aten._local_scalar_dense.default")
    with ctx.guarded("memtracker", "memtracker/m/sgd/fp32/real"):
        raise DataDependentOutputException("aten._local_scalar_dense.default")
    rows = _lines(tmp_path / "rows.jsonl")
    assert [r["error_kind"] for r in rows] == ["unsupported", "failed"]
    assert done_keys(rows) == {r["key"] for r in rows}


def test_a_lora_wrapped_linear_reads_as_the_linear_it_wraps() -> None:
    torch = pytest.importorskip("torch")
    from benchmarks.cuda import models

    base = torch.nn.Linear(8, 4)
    wrapped = models.LoRALinear(base, rank=2)
    assert wrapped.weight is base.weight and wrapped.bias is base.bias
    assert (wrapped.in_features, wrapped.out_features) == (8, 4)
    assert {n for n, p in wrapped.named_parameters() if p.requires_grad} == {"lora_a.weight", "lora_b.weight"}
    x = torch.randn(3, 8)
    assert torch.equal(wrapped(x), base(x))  # lora_b starts at zero


def test_t5_with_lora_adapters_trains_a_step() -> None:
    pytest.importorskip("transformers")
    from benchmarks.cuda import models

    spec = models.SPECS["t5"]
    model = models.build(spec, small=True, variant="lora")
    output = model(*spec.inputs(2, True))
    models.loss_of(output, models.targets_for(spec, output.shape, 2, True)).backward()
    trained = [n for n, p in model.named_parameters() if p.grad is not None]
    assert trained and all("lora_" in n for n in trained)


def test_wav2vec2_trains_with_its_layerdrop_encoder_out_of_train_mode() -> None:
    pytest.importorskip("transformers")
    from benchmarks.cuda import models

    model = models.build(models.SPECS["wav2vec2"], small=True)
    modes = {type(m).__name__: m.training for m in model.modules()}
    assert model.training and modes["Wav2Vec2FeatureEncoder"] and modes["Dropout"]
    assert not any(modes[name] for name in models.LAYERDROP_ENCODERS if name in modes)
    model.eval()
    model.train()
    assert not any(m.training for m in model.modules() if type(m).__name__ in models.LAYERDROP_ENCODERS)


def test_moe_experts_export_with_the_grouped_product_translated(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("transformers.integrations.moe")
    from benchmarks.cuda import models

    class Experts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(3, 4, 5))

        def forward(self, x: Any) -> Any:
            offs = torch.tensor([2, 2, 6], dtype=torch.int32)  # expert 1 gets no row
            return torch.ops.transformers.grouped_mm_fallback(x, self.weight, offs=offs)

    x = torch.randn(6, 4)
    path = tmp_path / "experts.onnx"
    model = Experts().eval()
    original = torch.onnx.export
    with models.onnx_export_translations():
        torch.onnx.export(model, (x,), str(path), dynamo=True)
    assert torch.onnx.export is original  # put back after the block
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    expected = torch.cat([x[:2] @ model.weight[0], x[2:] @ model.weight[2]]).detach().numpy()
    assert got.shape == (6, 5) and abs(got - expected).max() < 1e-5


def test_fit_rows_are_measured_again_when_onnxmem_changed() -> None:
    # fit's answer is onnxmem's: a committed fit row counts as done only for the code that made it
    from benchmarks.cuda.common import done_keys, estimator_fingerprint, make_row

    now = make_row("fit", "fit/m/answer", max_value=3)
    assert now["estimator"] == estimator_fingerprint()
    older = {**now, "key": "fit/m/at-answer", "estimator": "0" * 16}
    training = make_row("training", "training/m/full/sgd/fp32")
    assert "estimator" not in training
    assert done_keys([now, older, training]) == {"fit/m/answer", "training/m/full/sgd/fp32"}


def test_the_new_architectures_are_held_out_and_trained_after_the_measured_ones() -> None:
    pytest.importorskip("torch")
    from benchmarks.cuda import models

    new = [s.name for s in models.NEW_SPECS]
    assert new and not set(new) & score.RULES_WRITTEN_ON
    assert list(campaign.TRAINING_MODELS[-len(new):]) == new  # after every measured model, in their order
    assert all(models.SPECS[name] is spec for name, spec in zip(new, models.NEW_SPECS, strict=True))

    def line(model: str, family: str) -> tuple:
        return (model, "full", "adamw", "fp32", 8, "-", "-", "-", "+4.0%", "-", "-", "-", "-", "now", family)

    sets = {key[0]: key[1] for key in score.summary_lines([line("qwen2", "decoder-gqa"),
                                                           line("resnet18", "cnn")])}
    assert sets == {"held out": "transformer", "rules written on": "CNN"}


def test_whisper_trains_with_its_layerdrop_stacks_out_of_train_mode_and_lora_on_every_linear() -> None:
    pytest.importorskip("transformers")
    from benchmarks.cuda import models

    spec = models.SPECS["whisper"]
    model = models.build(spec, small=True, variant="lora")
    stacks = [m for m in model.modules() if type(m).__name__ in ("WhisperEncoder", "WhisperDecoder")]
    assert len(stacks) == 2 and not any(m.training for m in stacks)
    assert any(type(m).__name__ == "WhisperEncoderLayer" and m.training for m in model.modules())
    features, decoder_ids = spec.inputs(2, True)
    output = model(features, decoder_ids)
    assert output.shape == (*decoder_ids.shape, models.DRY_VOCAB)
    models.loss_of(output, models.targets_for(spec, output.shape, 2, True)).backward()
    trained = [n for n, p in model.named_parameters() if p.grad is not None]
    assert trained and all("lora_" in n for n in trained)


def test_a_timm_model_takes_its_own_dry_run_arguments() -> None:
    pytest.importorskip("timm")
    from benchmarks.cuda import models

    small = models.build(models.SPECS["swin_tiny"], small=True)
    assert small.patch_embed.img_size == (32, 32) and len(small.layers) == 2
    output = small(*models.SPECS["swin_tiny"].inputs(2, True))
    assert output.shape == (2, 10)
