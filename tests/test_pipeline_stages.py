"""The pipeline is declared once (onnxmem/passes/pipeline.py: STAGES) and every entry point runs it: a report, a
training report, fit (its family's probes and its exact values), check and its what-ifs, validate's estimate. Each
test records the stages as they run (the declared list, wrapped) and checks that every run is a stretch of that
list, in its order."""

from __future__ import annotations

from pathlib import Path

import pytest

import onnxmem
from onnxmem.passes import pipeline
from onnxmem.passes.pipeline import STAGE_NAMES, PipelineRun, Stage

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODEL = FIXTURES / "transformer_encoder.onnx"
DIMS = {"batch": 2, "seq": 8}


@pytest.fixture
def stages(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, PipelineRun]]:
    """Give the stages run from now on, in order, each with the run it worked on (the declared list, wrapped)."""
    seen: list[tuple[str, PipelineRun]] = []

    def recorded(stage: Stage) -> Stage:
        def run(state: PipelineRun) -> None:
            seen.append((stage.name, state))
            stage.run(state)

        return Stage(stage.name, run)

    monkeypatch.setattr(pipeline, "STAGES", tuple(recorded(s) for s in pipeline.STAGES))
    return seen


def _runs(seen: list[tuple[str, PipelineRun]]) -> list[list[str]]:
    """Give the stage names of each run (a run is the stages that worked on one PipelineRun)."""
    by_run: dict[int, list[str]] = {}
    for name, state in seen:
        by_run.setdefault(id(state), []).append(name)
    return list(by_run.values())


def _is_stretch(names: list[str]) -> bool:
    start = STAGE_NAMES.index(names[0])
    return names == list(STAGE_NAMES[start:start + len(names)])


def test_the_stages_are_declared_once_with_unique_names() -> None:
    assert STAGE_NAMES == ("load", "provider", "graph", "planner types", "size", "order", "liveness", "summarize",
                           "training")


def test_a_report_runs_every_stage_once_in_order(stages: list[tuple[str, PipelineRun]]) -> None:
    onnxmem.analyze(MODEL, DIMS)
    assert _runs(stages) == [list(STAGE_NAMES[:5]), list(STAGE_NAMES[5:])]  # (sizing, then what reads it)


def test_a_training_report_runs_the_same_stages(stages: list[tuple[str, PipelineRun]]) -> None:
    onnxmem.analyze(MODEL, DIMS, training=onnxmem.TrainingOptions())
    assert [n for run in _runs(stages) for n in run] == list(STAGE_NAMES)


def test_fit_and_its_family_run_stretches_of_the_declared_stages(stages: list[tuple[str, PipelineRun]]) -> None:
    result = onnxmem.fit(MODEL, memory="1GiB", reserve=0, dims={"seq": 8}, runtime="onnxruntime")
    assert result.report is not None and result.report is result.report  # made when first read, then kept
    runs = _runs(stages)
    assert runs and all(_is_stretch(run) for run in runs)
    names = {n for run in runs for n in run}
    assert {"load", "provider", "graph", "planner types", "size", "order", "liveness", "summarize"} <= names


def test_check_and_every_what_if_run_stretches_of_the_declared_stages(
        stages: list[tuple[str, PipelineRun]]) -> None:
    result = onnxmem.check(MODEL, DIMS, memory="1MiB")
    assert result.what_ifs  # (the float16 and the memory-order what-ifs ran)
    runs = _runs(stages)
    assert len(runs) >= 3 and all(_is_stretch(run) for run in runs)


def test_validate_estimates_by_the_declared_stages(stages: list[tuple[str, PipelineRun]]) -> None:
    pytest.importorskip("onnxruntime")
    onnxmem.validate(MODEL, DIMS, runs=1)
    runs = _runs(stages)
    assert all(_is_stretch(run) for run in runs)
    # the estimate on the graph onnxruntime ran: the stages after sizing, with the validation's memory pattern
    assert ["order", "liveness", "summarize", "training"] in runs


@pytest.mark.parametrize("enabled", [True, False])
def test_the_stages_run_without_the_cycle_collector_and_give_it_back(monkeypatch: pytest.MonkeyPatch,
                                                                      enabled: bool) -> None:
    # (pipeline._no_cycle_collection: a full collection walks every object a large graph made, to free nothing)
    import gc

    collecting: list[bool] = []

    def observed(stage: Stage) -> Stage:
        def run(state: PipelineRun) -> None:
            collecting.append(gc.isenabled())
            stage.run(state)

        return Stage(stage.name, run)

    monkeypatch.setattr(pipeline, "STAGES", tuple(observed(s) for s in pipeline.STAGES))
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        onnxmem.analyze(str(MODEL), DIMS, training=onnxmem.TrainingOptions())
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
    assert collecting and not any(collecting)
