"""A decoder's KV cache is its own line in every view, equal to its past and present tensors added up here; the
int8, fp8 and grouped-query what-ifs lower the peak by exactly the bytes re-sizing those tensors saves; a model with
no KV cache has no such line."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import onnxmem
from benchmarks.llm_graphs import SHAPES, LlamaShape, make_llama
from onnxmem.views.html import report_page
from onnxmem.views.render import render, render_check, render_fit
from onnxmem.views.series import inference_series

from .cli import run, save

FP16 = 2
# the tiny Llama: 2 layers, 4 query heads, 2 KV heads of 16 (grouped-query), float16
TINY = SHAPES["tiny"]
# an MHA decoder whose decode step peaks at the LM head (vocabulary 4096), after every layer wrote its present:
# every cache tensor is live at the peak, so a smaller cache lowers the peak by all it saves
MHA = LlamaShape(layers=2, hidden=64, heads=8, kv_heads=8, ffn=128, vocab=4096)


def cache_bytes(shape: LlamaShape, batch: int, positions: int, bytes_per_element: int = FP16) -> int:
    """The bytes of a key and a value of every layer, each [batch, kv_heads, positions, head_dim]."""
    head_dim = shape.hidden // shape.heads
    return shape.layers * 2 * batch * shape.kv_heads * positions * head_dim * bytes_per_element


def test_the_kv_line_is_the_past_and_present_tensors_in_every_format(tmp_path: Path) -> None:
    batch, seq, past = 2, 1, 16
    model = make_llama(TINY)
    report = onnxmem.analyze(model, {"batch": batch, "seq": seq, "past": past})
    # past inputs [2, 2, 16, 16] fp16 (2,048 B each, a key and a value per layer) + present outputs [2, 2, 17, 16]
    past_bytes, present_bytes = cache_bytes(TINY, batch, past), cache_bytes(TINY, batch, past + seq)
    assert (past_bytes, present_bytes) == (8192, 8704)
    kv = report.inference.kv_cache
    assert kv is not None and (kv.past_bytes, kv.present_bytes) == (past_bytes, present_bytes)
    assert kv.past_tensors == kv.present_tensors == 2 * TINY.layers and kv.dtype == "FLOAT16"
    total = past_bytes + present_bytes
    assert report.inference.kv_cache_bytes == total
    document = json.loads(render(report, "json"))
    assert document["inference"]["kv_cache_bytes"] == total
    assert document["inference"]["kv_cache"]["past_bytes"] == past_bytes
    assert document["inference"]["peak_bytes"] == report.inference.peak_bytes  # the existing keys stay
    for fmt in ("table", "markdown"):
        text = render(report, fmt)
        row = next(line for line in text.splitlines() if "KV cache (past + present)" in line)
        assert f"{total:,} B" in row
    assert f"{total:,} B" in report_page(report)
    assert inference_series(report).past_cache_bytes == past_bytes  # the band the pictures draw
    path = save(model, tmp_path / "decoder.onnx")
    code, out, _ = run("report", path, "--dim", "batch=2", "--dim", "seq=1", "--dim", "past=16", "--format", "json")
    assert code == 0 and json.loads(out)["inference"]["kv_cache_bytes"] == total
    code, out, _ = run("report", path, "--dim", "batch=2", "--dim", "seq=1", "--dim", "past=16", "--format", "html")
    assert code == 0 and "past KV cache" in out and f"{total:,} B" in out


def test_at_prefill_the_cache_is_the_present_outputs_alone() -> None:
    report = onnxmem.analyze(make_llama(TINY), {"batch": 2, "seq": 16, "past": 0})
    kv = report.inference.kv_cache
    assert kv is not None and kv.past_bytes == 0 and kv.present_bytes == cache_bytes(TINY, 2, 16)


def _decoder_with_named_cache() -> onnx.ModelProto:
    """One attention layer as an exporter writes it: past.0.key/value [b, 2, past, 8] float32 concatenated with the
    step's keys/values into present.0.key/value."""
    nodes, inputs, outputs = [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, "seq", 8])], []
    for part in ("key", "value"):
        name = f"past.0.{part}"
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 2, "past", 8]))
        nodes.append(helper.make_node("Relu", ["x"], [f"new_{part}"]))
        nodes.append(helper.make_node("Concat", [name, f"new_{part}"], [f"present.0.{part}"], axis=2))
        outputs.append(helper.make_tensor_value_info(f"present.0.{part}", TensorProto.FLOAT, None))
    nodes.append(helper.make_node("MatMul", ["x", "present.0.key"], ["scores"], name="scores"))  # [b, 2, seq, past+seq]
    outputs.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "decoder", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_cache_named_as_exporters_name_it() -> None:
    model = _decoder_with_named_cache()
    report = onnxmem.analyze(model, {"batch": 3, "seq": 8, "past": 5})  # (8: the MatMul's inner dim)
    kv = report.inference.kv_cache
    # past [3, 2, 5, 8] and present [3, 2, 13, 8] float32, a key and a value each
    assert kv is not None and kv.past_bytes == 2 * 3 * 2 * 5 * 8 * 4 and kv.present_bytes == 2 * 3 * 2 * 13 * 8 * 4


@pytest.mark.parametrize("model", ["mlp.onnx", "gpt_decoder.onnx"])
def test_a_model_without_a_cache_has_no_kv_line(model: str) -> None:
    path = Path(__file__).resolve().parent.parent / "fixtures" / model
    report = onnxmem.analyze(str(path), default_dim=4)
    assert report.inference.kv_cache is None and report.inference.kv_cache_bytes is None
    assert json.loads(render(report, "json"))["inference"]["kv_cache_bytes"] is None
    for fmt in ("table", "markdown"):
        assert "KV cache" not in render(report, fmt)
    checked = onnxmem.check(str(path), default_dim=4, memory="1B")
    assert not [w for w in checked.what_ifs if "KV" in w.change]
    assert "KV cache" not in render_check(checked, "table")


def test_a_smaller_cache_lowers_the_peak_by_what_resizing_its_tensors_saves() -> None:
    batch, past = 2, 32
    model = make_llama(MHA)
    checked = onnxmem.check(model, {"batch": batch, "seq": 1, "past": past}, memory="1GiB")
    assert "lm_head" in checked.peak_where  # every present is written before the peak: all of the cache is live
    fp16 = cache_bytes(MHA, batch, past) + cache_bytes(MHA, batch, past + 1)
    elements = fp16 // FP16
    head_dim = MHA.hidden // MHA.heads
    int8 = elements + elements // head_dim * 2  # 1 B each, a float16 scale per token and head (head_dim elements)
    fp8 = elements + 4 * 4 * MHA.layers  # 1 B each, a float32 scale per cache tensor (4 per layer)
    saved = {w.change: w.saved_bytes for w in checked.what_ifs}
    assert saved["KV cache in int8"] == fp16 - int8
    assert saved["KV cache in fp8"] == fp16 - fp8
    assert saved["grouped-query KV heads 8 -> 1"] == fp16 - fp16 // 8
    by_change = {w.change: w for w in checked.what_ifs}
    assert by_change["KV cache in int8"].peak_bytes == checked.peak_bytes - (fp16 - int8)
    text = render_check(checked, "table", width=200)
    assert "KV cache in int8" in text and f"{fp16:,} B" in text  # the what-if and the cache's own line


def test_a_grouped_query_cache_gets_no_grouped_query_what_if() -> None:
    checked = onnxmem.check(make_llama(TINY), {"batch": 2, "seq": 1, "past": 64}, memory="1GiB")
    changes = [w.change for w in checked.what_ifs]
    assert "KV cache in int8" in changes and not [c for c in changes if c.startswith("grouped-query")]


def test_fit_says_what_each_context_position_adds_to_the_cache() -> None:
    model = make_llama(TINY)
    fitted = onnxmem.fit(model, memory="1MiB", search="past", dims={"batch": 2, "seq": 1})
    answer = fitted.max_value
    # one more position: a key and a value of every layer, in the past inputs and in the present outputs
    per_position = 2 * cache_bytes(TINY, 2, 1)
    note = next(n for n in fitted.notes if n.startswith("KV cache"))
    total = cache_bytes(TINY, 2, answer) + cache_bytes(TINY, 2, answer + 1)
    assert f"past={answer}: {total:,} B" in note and f"adds {per_position:,} B" in note
    assert note in render_fit(fitted, "table", width=300)
