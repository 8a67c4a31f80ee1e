"""The model builder's decoders bound as a user asks a step: past_sequence_length 0 for a prefill (the length of
the past cache's inputs, though no other dim adds it up), total_sequence_length following past + tokens where not
given, and the head size (kv_cache_dim, on the cache's last axis) still refused at 0."""

from __future__ import annotations

import pytest

import onnxmem
from onnxmem.errors import DimError
from tests.test_kv_exports import HEAD, KV_HEADS, genai_layer


def test_a_prefill_binds_an_empty_past_and_the_total() -> None:
    report = onnxmem.analyze(genai_layer(), {"batch_size": 2, "sequence_length": 6, "past_sequence_length": 0,
                                             "kv_cache_dim": HEAD}, provider="cpu")
    assert report.dims["total_sequence_length"] == 6
    kv = report.inference.kv_cache
    assert kv is not None and (kv.past_bytes, kv.present_bytes) == (0, 2 * 2 * KV_HEADS * 6 * HEAD * 4)


def test_a_given_total_is_kept_and_a_zero_head_size_refused() -> None:
    report = onnxmem.analyze(genai_layer(), {"batch_size": 1, "sequence_length": 1, "past_sequence_length": 8,
                                             "total_sequence_length": 9, "kv_cache_dim": HEAD}, provider="cpu")
    assert report.dims["total_sequence_length"] == 9
    with pytest.raises(DimError, match="positive"):
        onnxmem.analyze(genai_layer(), {"batch_size": 1, "sequence_length": 1, "past_sequence_length": 8,
                                        "kv_cache_dim": 0}, provider="cpu")
    with pytest.raises(DimError, match="positive"):  # the batch sizes the inputs too: no cache length
        onnxmem.analyze(genai_layer(), {"batch_size": 0, "sequence_length": 1, "past_sequence_length": 8,
                                        "kv_cache_dim": HEAD}, provider="cpu")


def test_fit_searches_the_past_with_the_total_following() -> None:
    dims = {"batch_size": 2, "sequence_length": 1, "kv_cache_dim": HEAD}
    budget = onnxmem.analyze(genai_layer(), {**dims, "past_sequence_length": 30}, provider="cpu").inference.peak_bytes
    fitted = onnxmem.fit(genai_layer(), memory=budget, search="past_sequence_length", dims=dims, provider="cpu")
    assert fitted.max_value == 30
