"""A decoder with its KV cache at an empty cache: a zero dim is allowed where the model's arithmetic allows it (a
dim it adds to another: past in 'past + seq', a prefill), refused elsewhere, where negative and for --default-dim."""

from __future__ import annotations

from pathlib import Path

import pytest

import onnxmem
from benchmarks.llm_graphs import SHAPES, make_llama
from onnxmem.errors import DimError


def test_prefill_with_an_empty_cache() -> None:
    model = make_llama(SHAPES["tiny"])  # 2 layers, 2 KV heads of 16, float16
    prefill = onnxmem.analyze(model, {"batch": 2, "seq": 16, "past": 0})
    assert prefill.dims["past"] == 0 and prefill.dims["past + seq"] == 16
    # the past inputs are empty: the inputs are the ids (2 x 16 int64), the bias (2 x 1 x 16 x 16 fp16) and the
    # rotary tables (2 x 16 x 16 fp16): 256 + 1,024 + 1,024 bytes
    assert prefill.inference.input_bytes == 2 * 16 * 8 + 2 * 16 * 16 * 2 + 2 * 16 * 16 * 2
    decode = onnxmem.analyze(model, {"batch": 2, "seq": 1, "past": 16})
    # each layer's past key and value: 2 x 2 x 16 x 16 fp16 = 2,048 B, 4 of them, plus ids, bias, rotary tables
    assert decode.inference.input_bytes == 4 * 2048 + 2 * 8 + 2 * 17 * 2 + 2 * 16 * 2


def test_negative_dims_and_a_zero_default_are_refused() -> None:
    model = make_llama(SHAPES["tiny"])
    with pytest.raises(DimError, match="non-negative"):  # past is added to seq: 0 is allowed, -1 not
        onnxmem.analyze(model, {"batch": 2, "seq": 16, "past": -1})
    with pytest.raises(DimError, match="positive"):
        onnxmem.analyze(model, {"batch": 2, "seq": 16}, default_dim=0)
    with pytest.raises(DimError, match="positive"):  # a batch of 0 is no arithmetic the model does
        onnxmem.analyze(model, {"batch": 0, "seq": 16, "past": 4})


def test_fit_searches_the_context_and_validate_agrees_at_the_answer(tmp_path: Path) -> None:
    # the budget is the estimated peak at a context of 40: fit answers 40; onnxruntime (validate, CPU) measures the
    # estimate exactly at 40 and at 41, so its own peaks put the answer where fit did
    pytest.importorskip("onnxruntime")
    from benchmarks.kv_cache_validate import tiny_decoder_with_weights

    path = tmp_path / "decoder.onnx"
    tiny_decoder_with_weights(path)
    decode = {"batch": 2, "seq": 1}
    budget = onnxmem.analyze(str(path), {**decode, "past": 40}, provider="cpu").inference.peak_bytes
    fitted = onnxmem.fit(str(path), memory=budget, search="past", dims=decode, provider="cpu")
    assert fitted.max_value == 40 and fitted.dim == "past"
    for past in (40, 41):
        result = onnxmem.validate(str(path), {**decode, "past": past}, provider="cpu")
        assert all(run.activation_difference_bytes == 0 for run in result.runs)
