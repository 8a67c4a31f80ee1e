"""--hf: a model sized from its transformers config.json alone (onnxmem.hf): no weight data anywhere, no hub; the
export's weights are the model's parameters at its dtype, and a stack of identical layers exported twice and
repeated in the graph gives the same answers as tracing every layer."""

from __future__ import annotations

import json
import os
import shutil
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
from onnxmem.frontends import hfcache  # noqa: E402
from onnxmem.frontends.templates import TEMPLATES_ENV  # noqa: E402
from onnxmem.training.step import TrainingOptions  # noqa: E402

from .cli import run  # noqa: E402

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
         "max_position_embeddings": 128, "dtype": "bfloat16"}


@pytest.fixture(scope="module", autouse=True)
def _export_cache(tmp_path_factory: Any) -> Any:
    """Every --hf export of this module kept in a cache folder of its own (never the user's ~/.cache)."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("hf-cache")
        patch.setenv(hfcache.CACHE_ENV, str(folder))
        patch.setenv(TEMPLATES_ENV, "off")  # (the export itself is tested here; tests/test_hf_templates.py
        # tests the templates)
        yield folder


@pytest.fixture(scope="module")
def config(tmp_path_factory: Any) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    (folder / "config.json").write_text(json.dumps(LLAMA))
    return folder


@pytest.fixture(scope="module")
def made(config: Path, tmp_path_factory: Any) -> hf.HfModel:
    return hf.export_config(config, tmp_path_factory.mktemp("export") / "llama.onnx", training=True)


def _meta_model() -> Any:
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{k: v for k, v in LLAMA.items()
                                                                          if k not in ("model_type", "dtype")}))


def test_the_export_holds_every_parameter_at_the_config_dtype_and_no_weight_data(made: hf.HfModel) -> None:
    model = _meta_model()
    parameters = dict(model.named_parameters())
    proto = onnx.load(str(made.path), load_external_data=False)
    initializers = {t.name: t for t in proto.graph.initializer}
    assert made.model_class == "LlamaForCausalLM" and made.task == "causal-lm"
    assert made.parameters == sum(p.numel() for p in parameters.values())
    assert made.parameter_bytes == made.parameters * 2  # bfloat16
    for name, parameter in parameters.items():  # named as named_parameters names them, every layer's
        assert name in initializers, name
        assert list(initializers[name].dims) == list(parameter.shape), name
        assert initializers[name].data_location == onnx.TensorProto.EXTERNAL
    data = made.path.parent / f"{made.path.name}.data"
    assert os.path.getsize(data) >= made.parameter_bytes
    assert os.stat(data).st_blocks * 512 < 1 << 20  # sparse: nothing written


def test_the_training_report_counts_the_models_parameters(made: hf.HfModel) -> None:
    report = onnxmem.analyze(made.path, {"batch": 1, "seq": 32}, training=TrainingOptions(device="cpu"))
    assert report.training is not None
    assert report.training.parameters == made.parameters
    assert report.training.trainable_parameters == made.parameters
    assert report.inference.weights_bytes >= made.parameter_bytes
    assert "missing-external-data" not in {w.code for w in report.warnings}


def test_the_export_names_the_layers_transformers_checkpoints(made: hf.HfModel) -> None:
    # every decoder layer (GradientCheckpointingLayer), though two were traced: --checkpoint layers takes them
    from onnxmem.training.rules import CHECKPOINT_LAYERS_PROPERTY

    proto = onnx.load(str(made.path), load_external_data=False)
    properties = {p.key: p.value for p in proto.metadata_props}
    layers = [f"model.layers.{i}" for i in range(LLAMA["num_hidden_layers"])]
    assert properties[CHECKPOINT_LAYERS_PROPERTY] == ",".join(layers)
    report = onnxmem.analyze(made.path, {"batch": 1, "seq": 32},
                             training=TrainingOptions(device="cpu", checkpoint="layers"))
    (warning,) = [w for w in report.warnings if w.code == "checkpoint-layers"]
    assert f"{len(layers)} blocks model.layers.N, as the model's library checkpoints them" in warning.message


def test_repeated_layers_answer_as_every_layer_traced(config: Path, made: hf.HfModel, tmp_path: Path) -> None:
    traced = hf.export_config(config, tmp_path / "traced.onnx", training=True, repeat_layers=False)
    options = TrainingOptions(device="cpu")
    a = onnxmem.analyze(made.path, {"batch": 2, "seq": 32}, training=options)
    b = onnxmem.analyze(traced.path, {"batch": 2, "seq": 32}, training=options)
    assert a.training is not None and b.training is not None
    assert (a.nodes, a.inference.weights_bytes, a.inference.peak_bytes) == \
        (b.nodes, b.inference.weights_bytes, b.inference.peak_bytes)
    assert a.training.first_step.peak_bytes == b.training.first_step.peak_bytes
    assert a.training.saved_activation_bytes == b.training.saved_activation_bytes


def test_report_hf_on_the_command_line(config: Path) -> None:
    code, out, err = run("report", "--hf", str(config), "--dim", "batch=1", "--dim", "seq=64", "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    model = _meta_model()
    assert document["inference"]["weights_bytes"] >= sum(p.numel() * 2 for p in model.parameters())


def test_report_hf_training_with_lora_trains_the_adapters_only(config: Path) -> None:
    pytest.importorskip("peft")
    code, out, err = run("report", "--hf", str(config), "--training", "--lora", "--dim", "batch=1", "--dim",
                         "seq=64", "--format", "json")
    assert code == 0, err
    training = json.loads(out)["training"]
    # PEFT's default LoraConfig on Llama: rank 8 on q_proj and v_proj of every layer: A [8, in] and B [out, 8]
    d = LLAMA["hidden_size"]
    kv = d // LLAMA["num_attention_heads"] * LLAMA["num_key_value_heads"]
    per_layer = (8 * d + d * 8) + (8 * d + kv * 8)
    assert training["trainable_parameters"] == LLAMA["num_hidden_layers"] * per_layer
    assert training["parameters"] == sum(p.numel() for p in _meta_model().parameters()) + \
        training["trainable_parameters"]


def test_check_hf_training_answers(config: Path) -> None:
    code, out, err = run("check", "--hf", str(config), "--training", "--dim", "batch=1", "--dim", "seq=64",
                         "--budget", "1TiB", "--format", "json", "--no-what-if")
    assert code == 0, err
    document = json.loads(out)
    assert document["mode"] == "training" and document["fits"]


def test_a_missing_config_is_one_line(tmp_path: Path) -> None:
    code, _, err = run("report", "--hf", str(tmp_path))
    assert code == 2
    assert "no transformers config here" in err


def test_an_export_failure_names_the_model_class_and_the_fix(config: Path, tmp_path: Path, monkeypatch: Any) -> None:
    def fails(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("Failed to export the model with torch.export.") from TypeError(
            "Found <class 'transformers.cache_utils.DynamicCache'> in output, which is not a known type.")

    monkeypatch.setattr(torch.onnx, "export", fails)
    with pytest.raises(onnxmem.OnnxMemError) as raised:
        hf.export_config(config, tmp_path / "x.onnx")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("LlamaForCausalLM: torch.onnx.export failed (TypeError: Found")
    assert "use_cache" in message


def test_a_config_transformers_does_not_know_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    code, _, err = run("report", "--hf", str(tmp_path))
    assert code == 2
    assert err.count("\n") == 1 and "does not take this config" in err
    assert "not a model type of this transformers" in err and len(err) < 400  # (not its list of every type)


def test_a_config_transformers_refuses_is_one_line_not_an_internal_error(tmp_path: Path) -> None:
    # huggingface_hub's strict-dataclass validation raises its own exception type (not a ValueError)
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "hidden_size": 70, "num_attention_heads": 3}))
    code, _, err = run("report", "--hf", str(tmp_path), "--dim", "batch=1", "--dim", "seq=8")
    assert code == 2, err
    assert err.count("\n") == 1 and "does not take this config" in err and "internal error" not in err


@pytest.mark.parametrize("attack", ["deep nesting", "over 16 MiB", "not utf-8"])
def test_a_hostile_config_is_one_line(tmp_path: Path, attack: str) -> None:
    config = tmp_path / "config.json"
    if attack == "deep nesting":  # json.loads raised RecursionError: a traceback
        config.write_text("[" * 100_000 + "]" * 100_000)
    elif attack == "over 16 MiB":  # read whole before
        config.write_text('{"model_type": "llama", "pad": "' + "x" * (16 << 20) + '"}')
    else:
        config.write_bytes(b'{"model_type": "llama"} \xff')
    code, _, err = run("report", "--hf", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert ("not a JSON config" if attack == "deep nesting" else "not a config file") in err


MIXTRAL = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 128}


def test_moe_experts_are_sized_as_grouped_mm_runs_them(tmp_path: Path) -> None:
    # transformers' default experts kernel exports with neither exporter; batched_mm, which does, copies each
    # (token, expert) pair's expert weights: [tokens x top-k, 2 x intermediate, hidden]. --hf sizes grouped_mm's
    # tensors instead: no tensor of the graph holds a pair's weights
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL))
    made = hf.export_config(tmp_path, tmp_path / "mixtral.onnx")
    with torch.device("meta"):
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            **{k: v for k, v in MIXTRAL.items() if k != "model_type"}))
    assert made.parameters == sum(p.numel() for p in model.parameters())
    batch, seq = 2, 32
    pairs = batch * seq * MIXTRAL["num_experts_per_tok"]
    report = onnxmem.analyze(made.path, {"batch": batch, "seq": seq})
    gathered_copy = pairs * 2 * MIXTRAL["intermediate_size"] * MIXTRAL["hidden_size"] * 4
    assert max(t.bytes for t in report.inference.live_at_peak) < gathered_copy // 8
    assert report.inference.peak_activation_bytes < gathered_copy


# --- the export cache: a second command on a config reads the export the first one kept -------------------------

TRAINING_REPORT = ("report", "--training", "--dim", "batch=2", "--dim", "seq=32", "--format", "json")


def _answer(out: str) -> dict[str, Any]:
    """Give a JSON report without the model's path (a temporary folder, or the cache's)."""
    document = json.loads(out)
    document.pop("model")
    return document


def _counting_exports(monkeypatch: Any) -> list[int]:
    calls: list[int] = []
    real = torch.onnx.export

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", counted)
    return calls


@pytest.fixture(scope="module")
def cached_once(config: Path, tmp_path_factory: Any) -> tuple[Path, dict[str, Any], str]:
    """A cache folder holding the training export of `config`, made by one CLI command; its answer and stderr."""
    folder = tmp_path_factory.mktemp("cached-once")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(hfcache.CACHE_ENV, str(folder))
        calls = _counting_exports(patch)
        before = sorted(config.iterdir())
        code, out, err = run(*TRAINING_REPORT, "--hf", str(config))
    assert code == 0, err
    assert len(calls) == 1
    assert sorted(config.iterdir()) == before  # nothing written beside the user's config
    return folder, _answer(out), err


def test_a_second_call_answers_from_the_cache_without_exporting(config: Path, cached_once: Any,
                                                                monkeypatch: Any) -> None:
    folder, first, first_err = cached_once
    assert "kept in the cache" in first_err
    monkeypatch.setenv(hfcache.CACHE_ENV, str(folder))

    def fails(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("exported again although the cache holds the export")

    monkeypatch.setattr(torch.onnx, "export", fails)
    code, out, err = run(*TRAINING_REPORT, "--hf", str(config))
    assert code == 0, err
    assert "the export from the cache" in err
    assert _answer(out) == first
    assert json.loads(out)["model"].startswith(str(folder))


def test_answers_with_and_without_the_cache_are_identical(config: Path, cached_once: Any, made: hf.HfModel,
                                                          tmp_path: Path) -> None:
    # `made` is export_config's file, written where it was told, not cached: the answer on it is the uncached one
    _, cached, _ = cached_once
    code, out, err = run(*TRAINING_REPORT, str(made.path))
    assert code == 0, err
    assert _answer(out) == cached


def test_a_corrupt_cache_entry_is_made_again(config: Path, cached_once: Any, tmp_path: Path,
                                             monkeypatch: Any) -> None:
    folder, first, _ = cached_once
    copy = tmp_path / "cache"
    shutil.copytree(folder, copy)
    [entry] = [p for p in copy.iterdir() if p.is_dir() and not p.name.startswith(".")]
    [onnx_file] = entry.glob("*.onnx")
    onnx_file.write_bytes(onnx_file.read_bytes()[: onnx_file.stat().st_size // 2])  # a torn write
    monkeypatch.setenv(hfcache.CACHE_ENV, str(copy))
    calls = _counting_exports(monkeypatch)
    code, out, err = run(*TRAINING_REPORT, "--hf", str(config))
    assert code == 0, err
    assert len(calls) == 1 and "kept in the cache" in err
    assert _answer(out) == first
    assert hfcache.read_entry(copy, entry.name) is not None  # whole again
    assert [p for p in copy.iterdir() if p.name.startswith(".")] == []  # no staging or stale folder left


def test_a_cache_folder_that_cannot_be_written_still_answers(config: Path, tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(hfcache.CACHE_ENV, str(blocked / "cache"))  # (a folder under a file: mkdir fails)
    calls = _counting_exports(monkeypatch)
    code, out, err = run(*TRAINING_REPORT, "--hf", str(config))
    assert code == 0, err
    assert len(calls) == 1 and "not cached" in err
    assert json.loads(out)["training"]["parameters"] == sum(p.numel() for p in _meta_model().parameters())


def test_the_cache_key_changes_with_the_config_and_the_options_only() -> None:
    key = hfcache.export_key(LLAMA, task=None, training=True, lora=None)
    assert hfcache.export_key(dict(reversed(LLAMA.items())), task=None, training=True, lora=None) == key
    assert hfcache.export_key({**LLAMA, "hidden_size": 128}, task=None, training=True, lora=None) != key
    assert hfcache.export_key({**LLAMA, "num_hidden_layers": 5}, task=None, training=True, lora=None) != key
    assert hfcache.export_key(LLAMA, task=None, training=False, lora=None) != key
    assert hfcache.export_key(LLAMA, task=None, training=True, lora=8) != key
    assert hfcache.export_key(LLAMA, task="causal-lm", training=True, lora=None) != key


def test_the_cache_folder_is_per_user_and_can_be_turned_off(tmp_path: Path) -> None:
    home = Path.home()
    assert hfcache.cache_folder({}) == home / ".cache" / "onnxmem" / "hf"
    assert hfcache.cache_folder({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "onnxmem" / "hf"
    assert hfcache.cache_folder({"XDG_CACHE_HOME": "relative"}) == home / ".cache" / "onnxmem" / "hf"
    assert hfcache.cache_folder({hfcache.CACHE_ENV: str(tmp_path / "x")}) == tmp_path / "x"
    for off in ("off", "0", "no", "false", "OFF"):
        assert hfcache.cache_folder({hfcache.CACHE_ENV: off, "XDG_CACHE_HOME": str(tmp_path)}) is None


def test_with_the_cache_off_nothing_is_kept(config: Path, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv(hfcache.CACHE_ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert hf.cached_export(config, training=True) is None
    assert list(tmp_path.iterdir()) == []


def test_a_torchvision_that_does_not_load_does_not_stop_an_export(config: Path, tmp_path: Path) -> None:
    # a torchvision wheel built for another torch fails while it registers its operators; transformers imports it
    # for its image utilities: onnxmem imports transformers without it (a process of its own: no shim there)
    import subprocess
    import sys

    broken = tmp_path / "site" / "torchvision"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken.parent), os.environ.get("PYTHONPATH", "")]),
                   "ONNXMEM_HF_CACHE": "off"}
    done = subprocess.run([sys.executable, "-m", "onnxmem", "report", "--hf", str(config), "--dim", "batch=1",
                           "--dim", "seq=16", "--format", "json"], capture_output=True, text=True, env=environment,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["inference"]["weights_bytes"] > 0


@pytest.mark.parametrize("layers", [{"num_hidden_layers": 100_000_000}, {"text_config": {"num_layers": 5000}}])
def test_a_config_of_more_layers_than_onnxmem_builds_is_refused_at_once(tmp_path: Path,
                                                                         layers: dict[str, Any]) -> None:
    # (the model is built whole on the meta device before two layers are traced: 10^8 layers took hours)
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **layers}))
    code, _, err = run("report", "--hf", str(tmp_path), "--dim", "batch=1", "--dim", "seq=8")
    assert code == 2 and err.count("\n") == 1 and "more layers than onnxmem builds (at most 4,096" in err
