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
    "float_constant_1e8_declared_tiny",  # its value holds 4 bytes of 400 MB
}

# The most memory any run may take (a 4 GB run is a finding, even where it answers), and, where the model's bytes
# are its data (embedded weights, vectors ONNX's data propagation would expand), the most above the file's size:
# the interpreter and onnx (50 MB), the file once, and its largest tensor parsed (2^23 values of int64_data: 128 MB
# in protobuf, measured 250 MB in all; 4.9-5.7 GB for the float vectors before shapes.infer bounded every type).
ANY_RUN_RSS = 2**30
OVER_THE_FILE_RSS = 320 * 2**20
DATA_CLASSES = {"data propagation", "embedded weights"}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_hostile_model_is_answered_or_refused_in_one_line(tmp_path: Path, name: str) -> None:
    models = CLASSES[name](tmp_path)
    assert models
    for model in models:
        for mode in ("cli", "analyze"):
            outcome = run(model, mode, TIMEOUT_SECONDS, ADDRESS_SPACE)
            context = (model.name, mode, outcome.code, outcome.max_rss_bytes, outcome.stderr[-1500:])
            assert outcome.verdict in ("answer", "clean error"), (outcome.verdict, *context)
            assert (outcome.verdict == "clean error") == (model.stem in REFUSED), context
            assert outcome.written == (), context
            assert 0 < outcome.max_rss_bytes < ANY_RUN_RSS, context
            if name in DATA_CLASSES:
                assert outcome.max_rss_bytes < outcome.file_bytes + OVER_THE_FILE_RSS, context
            if model.stem.startswith("embedded_"):
                # memory: the file's bytes once and the interpreter (110 MB measured; 307-575 MB before ir.embedded)
                assert outcome.max_rss_bytes < EMBEDDED_BYTES + 200 * 2**20, context
