"""The buffer plans a Schedules keeps (liveness's `plans`): a plan taken from the cache gives the very timeline
liveness makes without it, and is made once per size keys."""

from __future__ import annotations

import pytest

import onnxmem.passes.liveness as liveness_module
from benchmarks.llm_graphs import SHAPES, make_llama
from onnxmem.passes.pipeline import after_sizing
from onnxmem.plan.family import ModelFamily

from . import graphs


@pytest.mark.parametrize("provider", ["cuda", "cpu"])
@pytest.mark.parametrize("model", ["llama", "mlp"])
def test_a_kept_plan_gives_the_timeline_made_without_it(model: str, provider: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    made = []
    plan_buffers = liveness_module._plan_buffers

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        made.append(1)
        return plan_buffers(*args, **kwargs)

    monkeypatch.setattr(liveness_module, "_plan_buffers", counted)
    family = ModelFamily(make_llama(SHAPES["tiny"]) if model == "llama" else graphs.symbolic_mlp(), "batch",
                         {"seq": 16, "past": 8} if model == "llama" else {}, provider=provider)
    values = (1, 3, 40, 41)
    for value in values:
        sized = family.sizing(value)
        assert sized.schedules is not None
        kept = after_sizing(sized)
        plans = sized.schedules.plans
        assert plans
        sized.schedules.plans = {}  # (the same stages with no plan kept: made again)
        fresh = after_sizing(sized)
        sized.schedules.plans = plans
        assert kept.timeline == fresh.timeline
        assert kept.report.to_dict() == fresh.report.to_dict()
    # one plan for the family's probe and every value (the plan holds at every value: the planner's shapes are
    # symbolic), and one per fresh run above
    assert len(made) == 1 + len(values)
