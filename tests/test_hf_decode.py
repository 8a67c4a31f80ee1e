"""--hf-task decode: a causal LM's serving step exported from its config with its KV cache (past_key_values.N.key /
.value in, logits and present.N.key / .value out), its layers exported twice and repeated, each copy reading and
writing its own cache: the KV cache's bytes are the config's arithmetic, and onnxruntime runs the export (with real
weights written into its data file) to transformers' own outputs, at the shapes onnxmem sizes."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from .shim import load_tvshim

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")
load_tvshim()  # (transformers imports torchvision)
transformers = pytest.importorskip("transformers")

import onnx  # noqa: E402

import onnxmem  # noqa: E402
import onnxmem.hf as hf  # noqa: E402
from onnxmem.errors import OnnxMemError  # noqa: E402
from onnxmem.frontends import hfcache  # noqa: E402
from onnxmem.frontends.templates import TEMPLATES_ENV  # noqa: E402

from .cli import run  # noqa: E402

# grouped-query: 4 query heads share 2 key/value heads of 16; 4 layers (2 exported, 2 repeated)
GQA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
       "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
       "max_position_embeddings": 256, "dtype": "bfloat16"}
# multi-head (a key/value head per query head), head_dim given apart from hidden / heads, float32 (onnxruntime's
# CPU kernels), 3 layers
MHA = {**GQA, "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 24,
       "dtype": "float32"}


@pytest.fixture(scope="module", autouse=True)
def _export_cache(tmp_path_factory: Any) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(hfcache.CACHE_ENV, str(tmp_path_factory.mktemp("hf-cache")))
        patch.setenv(TEMPLATES_ENV, "off")  # (the export itself is tested here; tests/test_hf_templates.py
        # tests the templates)
        yield


def _config(folder: Path, values: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(values))
    return folder


@pytest.fixture(scope="module")
def gqa(tmp_path_factory: Any) -> hf.HfModel:
    made = hf.cached_export(_config(tmp_path_factory.mktemp("gqa"), GQA), task="decode")  # (the CLI's, later)
    assert made is not None
    return made


@pytest.fixture(scope="module")
def mha(tmp_path_factory: Any) -> tuple[Path, hf.HfModel]:
    config = _config(tmp_path_factory.mktemp("mha"), MHA)
    return config, hf.export_config(config, config / "decode.onnx", task="decode")


def _cache_bytes(values: dict[str, Any], batch: int, past: int, seq: int) -> tuple[int, int]:
    """The past and present bytes of a KV cache by hand: a key and a value per layer, [batch, kv_heads, length,
    head_dim] at the config's dtype."""
    head_dim = values.get("head_dim") or values["hidden_size"] // values["num_attention_heads"]
    per_position = 2 * values["num_hidden_layers"] * batch * values["num_key_value_heads"] * head_dim * \
        {"bfloat16": 2, "float16": 2, "float32": 4}[values["dtype"]]
    return per_position * past, per_position * (past + seq)


def _shapes(values: Any) -> dict[str, list[Any]]:
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}


def test_the_export_reads_and_writes_every_layers_cache(gqa: hf.HfModel) -> None:
    proto = onnx.load(str(gqa.path), load_external_data=False)
    inputs, outputs = _shapes(proto.graph.input), _shapes(proto.graph.output)
    layers = GQA["num_hidden_layers"]
    assert gqa.task == "decode" and gqa.dims == ("batch", "seq", "past")
    assert list(inputs) == ["input_ids", "attention_mask",
                            *(f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value"))]
    assert list(outputs) == ["logits", *(f"present.{i}.{k}" for i in range(layers) for k in ("key", "value"))]
    assert inputs["past_key_values.3.value"] == ["batch", 2, "past", 16]
    assert outputs["present.3.key"] == ["batch", 2, "past + seq", 16]
    assert outputs["logits"] == ["batch", "seq", GQA["vocab_size"]]
    # each layer's attention reads its own past (a copy reading the second layer's would leave the rest unread)
    read = {name for node in proto.graph.node for name in node.input}
    assert all(name in read for name in inputs)


@pytest.mark.parametrize(("batch", "past", "seq"), [(1, 0, 64), (3, 100, 1), (8, 1000, 1)])
def test_the_kv_cache_is_the_configs_arithmetic(gqa: hf.HfModel, batch: int, past: int, seq: int) -> None:
    report = onnxmem.analyze(gqa.path, {"batch": batch, "seq": seq, "past": past})
    cache = report.inference.kv_cache
    assert cache is not None and cache.dtype == "BFLOAT16"
    assert (cache.past_bytes, cache.present_bytes) == _cache_bytes(GQA, batch, past, seq)
    assert report.inference.kv_cache_bytes == sum(_cache_bytes(GQA, batch, past, seq))
    assert cache.past_tensors == cache.present_tensors == 2 * GQA["num_hidden_layers"]


def test_repeated_layers_answer_as_every_layer_traced(tmp_path: Path, gqa: hf.HfModel) -> None:
    config = _config(tmp_path / "traced", GQA)
    traced = hf.export_config(config, tmp_path / "traced.onnx", task="decode", repeat_layers=False)
    dims = {"batch": 2, "seq": 1, "past": 300}
    a, b = onnxmem.analyze(gqa.path, dims), onnxmem.analyze(traced.path, dims)
    assert (a.inference.weights_bytes, a.inference.input_bytes, a.inference.peak_bytes,
            a.inference.kv_cache_bytes) == \
        (b.inference.weights_bytes, b.inference.input_bytes, b.inference.peak_bytes, b.inference.kv_cache_bytes)


def _write_weights(model: Any, path: Path) -> None:
    """Write a real model's parameters and buffers into the export's (sparse) data file, each where its
    initializer points; a weight a MatMul reads as its right operand is the Linear's weight stored transposed."""
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    proto = onnx.load(str(path), load_external_data=False)
    transposed = {node.input[1] for node in proto.graph.node if node.op_type == "MatMul"}
    with open(path.parent / f"{path.name}.data", "r+b") as data:
        for initializer in proto.graph.initializer:
            if initializer.data_location != onnx.TensorProto.EXTERNAL:
                continue
            value = tensors[initializer.name].detach()
            value = value.T if initializer.name in transposed else value
            assert list(value.shape) == list(initializer.dims), initializer.name
            offset = int(next(e.value for e in initializer.external_data if e.key == "offset"))
            data.seek(offset)
            data.write(value.contiguous().numpy().tobytes())


@pytest.mark.parametrize(("batch", "past", "seq"), [(2, 5, 3), (2, 0, 7), (3, 33, 1)])
def test_onnxruntime_runs_the_export_as_transformers_runs_the_model(mha: tuple[Path, hf.HfModel], batch: int,
                                                                     past: int, seq: int) -> None:
    ort = pytest.importorskip("onnxruntime")
    import numpy as np

    config, made = mha
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(hf.load_config(config)).eval()
    _write_weights(model, made.path)
    layers, heads, head_dim = MHA["num_hidden_layers"], MHA["num_key_value_heads"], MHA["head_dim"]
    ids = torch.randint(0, MHA["vocab_size"], (batch, seq))
    cache = [(torch.randn(batch, heads, past, head_dim), torch.randn(batch, heads, past, head_dim))
             for _ in range(layers)]
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones((batch, past + seq), dtype=np.int64),
             **{f"past_key_values.{i}.{kind}": pair[k].numpy() for i, pair in enumerate(cache)
                for k, kind in enumerate(("key", "value"))}}
    session = ort.InferenceSession(str(made.path), providers=["CPUExecutionProvider"])
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    expected_cache = transformers.DynamicCache([(k.clone(), v.clone()) for k, v in cache], config=model.config)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=torch.ones(batch, past + seq, dtype=torch.long),
                         **{"cache" if "cache" in inspect.signature(model.forward).parameters else
                            "past_key_values": expected_cache}, use_cache=True)
    assert np.allclose(outputs["logits"], expected.logits.numpy(), atol=1e-5)
    for i, layer in enumerate(expected_cache.layers):
        assert np.allclose(outputs[f"present.{i}.key"], layer.keys.numpy(), atol=1e-5)
        assert np.allclose(outputs[f"present.{i}.value"], layer.values.numpy(), atol=1e-5)
    # onnxmem's sizes are onnxruntime's: the cache's bytes and the logits' shape
    report = onnxmem.analyze(made.path, {"batch": batch, "seq": seq, "past": past}, provider="cpu")
    assert report.inference.kv_cache is not None
    assert report.inference.kv_cache.past_bytes == sum(v.nbytes for n, v in feeds.items() if n.startswith("past"))
    assert report.inference.kv_cache.present_bytes == \
        sum(v.nbytes for n, v in outputs.items() if n.startswith("present"))
    assert outputs["logits"].shape == (batch, seq, MHA["vocab_size"])
    assert (report.inference.kv_cache.past_bytes, report.inference.kv_cache.present_bytes) == \
        _cache_bytes(MHA, batch, past, seq)


def test_validate_measures_the_estimate_at_decode_and_prefill(mha: tuple[Path, hf.HfModel]) -> None:
    pytest.importorskip("onnxruntime")
    _, made = mha
    for dims in ({"batch": 2, "seq": 1, "past": 40}, {"batch": 2, "seq": 16, "past": 0}):
        result = onnxmem.validate(str(made.path), dims, provider="cpu")
        assert all(r.activation_difference_bytes == 0 for r in result.runs), dims


def test_fit_searches_the_context_and_the_concurrency(gqa: hf.HfModel, tmp_path: Path) -> None:
    config = _config(tmp_path / "cli", GQA)
    budget = 64 * 2**20
    code, out, err = run("fit", "--hf", str(config), "--hf-task", "decode", "--search", "past", "--dim", "batch=32",
                         "--dim", "seq=1", "--memory", f"{budget}B", "--no-what-if", "--format", "json")
    assert code == 0, err
    past = json.loads(out)["max_value"]
    assert past > 0
    fits = [onnxmem.analyze(gqa.path, {"batch": 32, "seq": 1, "past": p}).inference.peak_bytes <= budget
            for p in (past, past + 1)]
    assert fits == [True, False]
    code, out, err = run("fit", "--hf", str(config), "--hf-task", "decode", "--search", "batch", "--dim",
                         "past=2048", "--dim", "seq=1", "--memory", f"{budget}B", "--no-what-if", "--format", "json")
    assert code == 0, err
    batch = json.loads(out)["max_value"]
    fits = [onnxmem.analyze(gqa.path, {"batch": b, "seq": 1, "past": 2048}).inference.peak_bytes <= budget
            for b in (batch, batch + 1)]
    assert fits == [True, False]


def test_report_shows_the_kv_cache_line(tmp_path: Path) -> None:
    config = _config(tmp_path / "report", GQA)
    code, out, err = run("report", "--hf", str(config), "--hf-task", "decode", "--dim", "batch=4", "--dim", "seq=1",
                         "--dim", "past=1000")
    assert code == 0, err
    assert "KV cache (past + present)" in out
    assert f"{sum(_cache_bytes(GQA, 4, 1000, 1)):,} B" in out


def test_bad_task_combinations_are_one_line(tmp_path: Path) -> None:
    config = _config(tmp_path / "bad", GQA)
    code, _, err = run("report", "--hf", str(config), "--hf-task", "decode", "--training")
    assert code == 2 and "no training estimate" in err and "Traceback" not in err
    code, _, err = run("report", str(config / "config.json"), "--hf-task", "decode")
    assert code == 2 and "--hf-task takes --hf" in err
    with pytest.raises(OnnxMemError, match="unknown task"):
        hf.export_config(config, tmp_path / "x.onnx", task="decoding")


def test_the_cache_key_holds_the_task() -> None:
    keys = {task: hfcache.export_key(GQA, task=task, training=False, lora=None) for task in (None, "causal-lm",
                                                                                             "decode")}
    assert len(set(keys.values())) == 3


def test_the_grouped_query_what_if_is_offered_only_where_heads_are_not_shared(
        gqa: hf.HfModel, mha: tuple[Path, hf.HfModel]) -> None:
    # the export repeats a GQA cache for the query heads as transformers' repeat_kv does (Unsqueeze -> Slice ->
    # Expand -> Reshape): already shared, so no "grouped-query KV heads" what-if; the MHA model gets one
    def changes(model: hf.HfModel) -> list[str]:
        checked = onnxmem.check(model.path, {"batch": 2, "seq": 1, "past": 32}, memory="1GiB")
        return [w.change for w in checked.what_ifs]

    assert not [c for c in changes(gqa) if c.startswith("grouped-query")]
    assert "KV cache in int8" in changes(gqa)
    assert [c for c in changes(mha[1]) if c.startswith("grouped-query")] == ["grouped-query KV heads 2 -> 1"]
