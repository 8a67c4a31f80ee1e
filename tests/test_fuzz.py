"""Fuzz: mutated fixtures (byte flips, truncations, splices, protobuf field changes, strings that are not UTF-8)
through the CLI in a subprocess. Every run answers (exit 0) or gives one clean line (exit 2): no traceback, no
internal error, within a time and an address-space limit. The longer run is benchmarks/fuzz.py."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz import FIXTURES, MUTATIONS, NAMES, fuzz_one, mutate, run_cli
from benchmarks.measured_run import run_measured

TIMEOUT_SECONDS = 60  # a run takes under a second; the limit is for a hang, not for speed
ADDRESS_SPACE = 4 * 2**30


@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NAMES), kind=st.sampled_from(sorted(MUTATIONS)), seed=st.integers(0, 2**32 - 1))
def test_every_mutated_model_is_answered_or_refused_in_one_line(name: str, kind: str, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        outcome = fuzz_one(name, kind, seed, Path(tmp) / "case", TIMEOUT_SECONDS, ADDRESS_SPACE)
    assert not outcome.timed_out, (name, kind, seed)
    assert not outcome.over_memory, (name, kind, seed, outcome.max_rss_bytes)
    assert outcome.code in (0, 1, 2), (name, kind, seed, outcome.code, outcome.stderr[-2000:])
    assert "Traceback" not in outcome.stderr, (name, kind, seed, outcome.stderr[-2000:])
    assert "out of memory" not in outcome.stderr, (name, kind, seed)
    if outcome.code == 2:
        lines = outcome.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("onnxmem: error: "), (name, kind, seed, outcome.stderr)
        assert len(lines[0]) < 2500


def test_mutations_are_reproducible_and_change_the_model() -> None:
    for kind in sorted(MUTATIONS):
        assert mutate("mlp.onnx", kind, 7) == mutate("mlp.onnx", kind, 7)
        assert mutate("mlp.onnx", kind, 7) != (Path(__file__).parent.parent / "fixtures" / "mlp.onnx").read_bytes()


def test_a_run_s_peak_rss_is_its_own_not_the_runner_s() -> None:
    # this process holds 600 MiB (touched); a child forked from it would report at least that (Linux keeps the
    # high-water mark of the image exec replaces): each run's peak must be its own, a few MiB either way
    held = b"\x01" * (600 * 2**20)
    small = run_measured([sys.executable, "-c", "pass"], TIMEOUT_SECONDS, ADDRESS_SPACE)
    large = run_measured([sys.executable, "-c", "held = b'\\x01' * (300 * 2**20)"], TIMEOUT_SECONDS, ADDRESS_SPACE)
    assert len(held) and small.code == large.code == 0, (small.stderr, large.stderr)
    assert small.max_rss_bytes < 64 * 2**20, small.max_rss_bytes
    assert 300 * 2**20 <= large.max_rss_bytes < 364 * 2**20, large.max_rss_bytes


def test_a_run_over_its_rss_limit_is_a_finding_whatever_it_answers(tmp_path: Path) -> None:
    model = tmp_path / "mlp.onnx"
    model.write_bytes((FIXTURES / "mlp.onnx").read_bytes())
    answered = run_cli(model, ["report", "--default-dim", "2"], "none", TIMEOUT_SECONDS, ADDRESS_SPACE)
    assert answered.verdict == "answer" and 0 < answered.max_rss_bytes < 2**30, answered
    over = run_cli(model, ["report", "--default-dim", "2"], "none", TIMEOUT_SECONDS, ADDRESS_SPACE,
                   rss_bytes=answered.max_rss_bytes // 2)
    assert over.code == 0 and over.verdict == "over memory", over
