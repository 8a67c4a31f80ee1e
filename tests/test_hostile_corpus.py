"""The hostile corpus of benchmarks/hostile_corpus.py, generated here (no stored file): every model through the
CLI's report and onnxmem.analyze, each in a subprocess under an address-space limit: an answer or a one-line
refusal, no traceback, no hang, nothing written beside the model; and the models that are invalid refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.hostile_corpus import CLASSES, EMBEDDED_BYTES, run

ADDRESS_SPACE = 4 * 2**30
TIMEOUT_SECONDS = 120  # a run takes a second or a few (benchmarks/hostile_corpus.py); the limit is for a hang

# The models that are invalid (or past onnxmem's bounds), refused in one line; every other one is answered.
REFUSED = {
    "input", "output", "initializer", "symbolic",  # huge dims (symbolic: its dims left unbound)
    "nested_if_1000",  # deeper than protobuf parses
    "inputs_1e6",  # more inputs than MAX_GRAPH_VALUES
    "dim_name",  # left unbound
    "duplicate_output", "output_is_input", "cycle", "self_loop", "dangling_input", "unmade_output",
    "string_no_data", "undefined",
    "sparse_sound", "sparse_huge", "sparse_indices_past_dims", "sparse_external_values",  # not supported
    "ext_dev_zero", "ext_negative_offset", "ext_negative_length", "ext_not_a_number",
    "opset_missing",
    "recursive", "mutual", "recursive_in_if_body",
}

# Left to the benchmark: ONNX's data propagation expands this float vector of 2^25 values (shapes.infer bounds only
# integer ones) until the 4 GiB limit stops it (3.6 GB, 15 s, then an answer without inference): too heavy for a
# shared test machine until shapes.infer._bounded_inference bounds vectors of every element type.
HEAVY = {"float_vector_beside_a_shape_value"}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_hostile_model_is_answered_or_refused_in_one_line(tmp_path: Path, name: str) -> None:
    models = CLASSES[name](tmp_path)
    assert models
    for model in models:
        if model.stem in HEAVY:
            continue
        for mode in ("cli", "analyze"):
            outcome = run(model, mode, TIMEOUT_SECONDS, ADDRESS_SPACE)
            context = (model.name, mode, outcome.code, outcome.stderr[-1500:])
            assert outcome.verdict in ("answer", "clean error"), (outcome.verdict, *context)
            assert (outcome.verdict == "clean error") == (model.stem in REFUSED), context
            assert outcome.written == (), context
            if model.stem.startswith("embedded_") and "int64" not in model.stem:
                # memory: the file's bytes once and the interpreter (110 MB measured; 307-575 MB before ir.embedded)
                assert outcome.max_rss_bytes < EMBEDDED_BYTES + 200 * 2**20, (outcome.max_rss_bytes, *context)

