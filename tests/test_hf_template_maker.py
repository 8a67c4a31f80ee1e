"""Graph templates made and checked (onnxmem/frontends/template_maker.py; torch and transformers): a template made
from one config of a family gives, for another config of it, the graph that config's own export gives (integer for
integer), is refused for a config it was not checked for, and answers as the export does. tests/test_hf_templates.py
tests the shipped templates without torch."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .shim import load_tvshim

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")
load_tvshim()
pytest.importorskip("transformers")

import onnxmem.hf as hf  # noqa: E402
from onnxmem.frontends import hfcache, template_maker, templates  # noqa: E402
from onnxmem.frontends.hfcache import _version  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# A small reference (few integer keys: each is one more export when the template is made) and a config of the
# same family at other sizes and another layer count.
REFERENCE = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128,
             "intermediate_size": 160, "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
             "vocab_size": 300, "dtype": "float32", "rms_norm_eps": 1e-5}
OTHER = {**REFERENCE, "hidden_size": 256, "intermediate_size": 176, "num_hidden_layers": 5,
         "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 512, "rms_norm_eps": 1e-6}
# Small configs of each shipped family, shaped as its reference (the keys the reference gives, its equalities).
SHIPPED_CHECKS = {
    "llama-causal-lm-training": {**REFERENCE, "dtype": "bfloat16", "tie_word_embeddings": False,
                                 "rope_theta": 1e4, "max_position_embeddings": 64, "bos_token_id": 1},
    "mixtral-decode": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 64,
                       "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 8,
                       "num_key_value_heads": 4, "vocab_size": 300, "max_position_embeddings": 64,
                       "num_local_experts": 8, "num_experts_per_tok": 2, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
                       "dtype": "bfloat16"},
    "qwen2-causal-lm-training": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 128,
                                 "intermediate_size": 160, "num_hidden_layers": 3, "num_attention_heads": 8,
                                 "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 64,
                                 "sliding_window": 64, "use_sliding_window": False, "max_window_layers": 3,
                                 "attention_dropout": 0.0, "hidden_act": "silu", "rope_theta": 1e6,
                                 "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "mistral-causal-lm": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 128,
                          "intermediate_size": 160, "num_hidden_layers": 3, "num_attention_heads": 8,
                          "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 64,
                          "sliding_window": None, "attention_dropout": 0.0, "hidden_act": "silu",
                          "rope_theta": 1e6, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                          "torch_dtype": "bfloat16"},
    "whisper-speech-seq2seq": {"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
                               "d_model": 64, "encoder_layers": 3, "decoder_layers": 3,
                               "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
                               "decoder_ffn_dim": 128, "num_mel_bins": 16, "max_source_positions": 40,
                               "max_target_positions": 32, "vocab_size": 51000, "dtype": "float16"},
}


@pytest.fixture(scope="module", autouse=True)
def _caches(tmp_path_factory: Any) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(hfcache.CACHE_ENV, "off")
        yield


@pytest.fixture(scope="module")
def made(tmp_path_factory: Any) -> templates.Template:
    folder = tmp_path_factory.mktemp("templates")
    path = template_maker.make_template(REFERENCE, folder, "llama-causal-lm", validate=({**OTHER, "_name": "other"},))
    return templates.Template(path, json.loads(path.read_text()))


def _config(folder: Path, values: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(values))
    return folder


def test_the_record_names_what_the_sizes_are(made: templates.Template) -> None:
    record = made.record
    assert set(record["sized"]) == {"hidden_size", "intermediate_size", "num_attention_heads",
                                    "num_key_value_heads", "vocab_size"}
    assert record["layers"] == {"model.layers": "num_hidden_layers"}
    # the head's dim is derived by the config class: hidden / heads
    assert record["derived"]["head_dim"] == [16, {"hidden_size": 1, "num_attention_heads": -1}]
    assert templates.graph_file(made.path).is_file()


def test_a_wrong_monomial_fails_the_check(made: templates.Template, tmp_path: Path) -> None:
    record = copy.deepcopy(made.record)
    slot = next(s for s in record["slots"] if s[0][0] == "init" and s[2] == {"intermediate_size": 1})
    slot[2] = {"hidden_size": 1}  # (the MLP's width said to follow the hidden size)
    with pytest.raises(template_maker.TemplateError, match="!=|differ"):
        template_maker.check_template(templates.Template(made.path, record), {**OTHER, "_name": "other"})


@pytest.mark.parametrize("change", [
    {"num_key_value_heads": 16},  # kv heads = heads: the code skips repeat_kv
    {"tie_word_embeddings": True},
    {"dtype": "bfloat16"},
    {"model_type": "mistral"},
    {"head_dim": 32},  # derived as 16 here
    {"num_hidden_layers": 1},
    {"hidden_size": 100},  # a head's dim 100 / 16: no whole number
    {"architectures": ["LlamaForSequenceClassification"]},
    {"attention_dropout": 0.1},
])
def test_a_config_it_was_not_checked_for_is_refused(made: templates.Template, change: dict[str, Any]) -> None:
    assert templates.applies(made.record, {**OTHER, **change}) is None


def test_values_no_graph_holds_do_not_matter(made: templates.Template) -> None:
    sizes = templates.applies(made.record, {**OTHER, "rms_norm_eps": 1e-3, "bos_token_id": 7, "head_dim": 16,
                                            "transformers_version": "4.0", "some_key_no_class_knows": 3})
    assert sizes == {"hidden_size": 256, "intermediate_size": 176, "num_attention_heads": 16,
                     "num_key_value_heads": 4, "vocab_size": 512, "num_hidden_layers": 5}
    assert templates.find_template(OTHER, training=False, task=None, lora=None, folder=made.path.parent) is not None
    assert templates.find_template(OTHER, training=True, task=None, lora=None, folder=made.path.parent) is None
    assert templates.find_template(OTHER, training=False, task=None, lora=8, folder=made.path.parent) is None
    assert templates.find_template(OTHER, training=False, task="decode", lora=None,
                                   folder=made.path.parent) is None


def test_the_answer_is_the_exports_and_torch_is_never_imported(made: templates.Template, tmp_path: Path) -> None:
    config = _config(tmp_path / "other", OTHER)
    dims = {"batch": 2, "seq": 48}
    script = (f"import sys, json; import onnxmem.frontends.templates as t; from pathlib import Path; "
              f"t.FOLDER = Path({str(made.path.parent)!r}); import onnxmem.hf as hf; "
              f"r = hf.analyze({str(config)!r}, {dims!r}); "
              f"print(json.dumps([r.inference.peak_bytes, r.inference.weights_bytes, 'torch' in sys.modules, "
              f"'transformers' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "ONNXMEM_HF_CACHE": "off", "PYTHONPATH": str(ROOT)})
    peak, weights, with_torch, with_transformers = json.loads(out.stdout)
    assert not with_torch and not with_transformers
    exported = hf.analyze(config, dims, templates=False)
    assert (peak, weights) == (exported.inference.peak_bytes, exported.inference.weights_bytes)


def test_the_cli_says_where_the_graph_came_from(made: templates.Template, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from .cli import run

    monkeypatch.setattr(templates, "FOLDER", made.path.parent)
    config = _config(tmp_path / "other", OTHER)
    code, out, err = run("report", "--hf", str(config), "--dim", "batch=1", "--dim", "seq=32", "--format", "json")
    assert code == 0, err
    assert "from onnxmem's llama template" in err
    monkeypatch.setenv(templates.TEMPLATES_ENV, "off")
    code, off, err = run("report", "--hf", str(config), "--dim", "batch=1", "--dim", "seq=32", "--format", "json")
    assert code == 0 and "template" not in err and "exported" in err
    mine, theirs = json.loads(out), json.loads(off)
    mine.pop("model"), theirs.pop("model")
    # every number is the export's; a tensor's name may differ by the exporter's numbering ('mul_206' for
    # 'mul_207': another config of the family traced its symbolic sizes in another count of ops)
    assert _numbered(mine) == _numbered(theirs)


def _numbered(answer: Any) -> str:
    return re.sub(r"(?<=[a-z]_)\d+\b", "#", json.dumps(answer, sort_keys=True))


@pytest.mark.parametrize("name", sorted(SHIPPED_CHECKS))
def test_a_shipped_template_is_its_familys_export(name: str) -> None:
    path = templates.FOLDER / f"{name}{templates.SUFFIX}"
    template = templates.Template(path, json.loads(path.read_text()))
    versions = template.record["versions"]
    if any(_version(package) != version for package, version in versions.items()):
        pytest.skip(f"{name} was exported with {versions}: another version exports another graph")
    template_maker.check_template(template, {**SHIPPED_CHECKS[name], "_name": name})


def test_a_refused_config_is_exported_and_says_why(made: templates.Template, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(templates, "FOLDER", made.path.parent)
    config = _config(tmp_path / "mha", {**OTHER, "num_key_value_heads": 16})
    said: list[str] = []
    with hf.exported(config, progress=said.append) as export:
        assert export.path.is_file()
    assert any("does not apply: num_attention_heads = num_key_value_heads" in line for line in said), said
    assert any("exported in" in line for line in said), said
    assert not any("from onnxmem's" in line for line in said)


def test_a_torn_template_is_no_error(made: templates.Template, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "torn"
    folder.mkdir()
    (folder / made.path.name).write_text(made.path.read_text())
    templates.graph_file(folder / made.path.name).write_bytes(b"\x1f\x8b not a whole gzip")
    (folder / f"broken{templates.SUFFIX}").write_text('{"format": 1, "model_type": "llama"}')
    monkeypatch.setattr(templates, "FOLDER", folder)
    said: list[str] = []
    with hf.exported(_config(tmp_path / "other", OTHER), progress=said.append) as export:
        assert export.path.is_file()
    assert any("not a whole template" in line for line in said) and any("exported in" in line for line in said)

