"""render.json_text writes the same text as json.dumps(value, indent=2), faster."""

from __future__ import annotations

import collections
import json
import math

from hypothesis import given
from hypothesis import strategies as st

from onnxmem.views.render import json_text
from onnxmem.views.report import plain

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text()
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=30)


@given(VALUES)
def test_json_text_is_json_dumps_indented(value: object) -> None:
    assert json_text(value) == json.dumps(value, indent=2)


def test_json_text_leaves_other_keys_and_types_to_json() -> None:
    for value in ({1: "a", None: [1.5, -0.0]}, {"rows": collections.OrderedDict(b=1, a=[])}, [math.inf, "é\n"]):
        assert json_text(value) == json.dumps(plain(value), indent=2)  # as a report's dict: keys made str


def test_a_report_is_written_as_its_dict() -> None:
    from pathlib import Path

    import onnxmem
    from onnxmem.views.render import render_json

    report = onnxmem.analyze(Path(__file__).resolve().parent.parent / "fixtures" / "gpt_decoder.onnx",
                             default_dim=3, training=onnxmem.TrainingOptions())
    assert render_json(report) == json.dumps(report.to_dict(), indent=2)
