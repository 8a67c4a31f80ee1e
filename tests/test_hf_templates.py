"""The shipped graph templates, without torch (onnxmem/frontends/templates.py): a config of a shipped family gets
its graph from the template, with the model's own parameter count, without torch or transformers imported; a config
the template was not checked for, or a hostile one, is refused with its reason, never an error.
tests/test_hf_template_maker.py makes templates and checks them against exports (torch and transformers)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from onnxmem.frontends import templates

ROOT = Path(__file__).resolve().parents[1]
BASE = {"rope_theta": 5e5, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "bos_token_id": 128000,
        "eos_token_id": 128001, "dtype": "bfloat16"}
LLAMA3_8B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "vocab_size": 128256, "max_position_embeddings": 131072, **BASE}
# Published shapes and their parameter counts (the model cards'; Llama's: 2 x V x H + L x (2 H^2 + 2 H x KV +
# 3 H x I + 2 H) + H).
PUBLISHED = {
    "Llama-3-8B": ("llama-causal-lm", LLAMA3_8B, 8_030_261_248),
    "Llama-3-70B": ("llama-causal-lm-training", {**LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672,
                                                 "num_hidden_layers": 80, "num_attention_heads": 64},
                    70_553_706_496),
    "Mixtral-8x7B": ("mixtral-causal-lm", {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                                           "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                                           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                                           "max_position_embeddings": 32768, "num_local_experts": 8,
                                           "num_experts_per_tok": 2, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
                                           "dtype": "bfloat16"}, 46_702_792_704),
    "Mistral-7B-v0.3": ("mistral-decode", {"model_type": "mistral", "architectures": ["MistralForCausalLM"],
                                           "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                                           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768,
                                           "max_position_embeddings": 32768, "sliding_window": None,
                                           "rope_theta": 1e6, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"},
                        7_248_023_552),
    "Qwen2.5-72B": ("qwen2-causal-lm", {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                                       "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
                                       "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 152064,
                                       "max_position_embeddings": 32768, "max_window_layers": 70,
                                       "sliding_window": 131072, "use_sliding_window": False, "rope_theta": 1e6,
                                       "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                                       "torch_dtype": "bfloat16"}, 72_706_203_648),
}


def _shipped(name: str) -> templates.Template:
    path = templates.FOLDER / f"{name}{templates.SUFFIX}"
    return templates.Template(path, json.loads(path.read_text()))


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_the_graph_holds_the_published_parameter_count(model: str) -> None:
    name, config, count = PUBLISHED[model]
    template = _shipped(name)
    sizes = templates.applies(template.record, config)
    assert sizes is not None, templates.sizes_or_reason(template.record, config)
    traced = templates.instantiate(template, sizes)
    assert traced.counts[0] == count and traced.counts[1] == 2 * count  # (bfloat16)
    layers = sizes.get("num_hidden_layers")
    assert traced.stacks == {"model.layers": layers}


def test_a_first_call_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    script = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
              "from onnxmem.cli.commands import main\n"
              f"main(['report', '--hf', {str(tmp_path)!r}, '--dim', 'batch=1', '--dim', 'seq=4096', "
              "'--format', 'json'])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "ONNXMEM_HF_CACHE": "off", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "from onnxmem's llama template" in done.stderr
    inference = json.loads(done.stdout)["inference"]
    assert inference["weights_bytes"] >= 2 * 8_030_261_248 and inference["peak_bytes"] > inference["weights_bytes"]


@pytest.mark.parametrize(("change", "reason"), [
    ({"num_key_value_heads": 32}, "num_attention_heads = num_key_value_heads"),  # no repeat_kv in the code
    ({"tie_word_embeddings": True}, "tie_word_embeddings true"),
    ({"dtype": "float16"}, "dtype"),
    ({"model_type": "mistral"}, "model_type"),
    ({"head_dim": 64}, "head_dim 64 is not the one its class derives"),  # 4096 / 32 = 128
    ({"num_hidden_layers": 1}, "the template traced 2 layers"),
    ({"hidden_size": 4000}, "a size of its graph is 62.5"),  # a head's dim 4000 / 32 = 125, its half 62.5
    ({"architectures": ["LlamaForSequenceClassification"]}, "architectures"),
    ({"attention_dropout": 0.1}, "attention_dropout"),
    ({"hidden_size": 2**62}, "a size of its graph is"),
    ({"vocab_size": "128256"}, "no vocab_size"),
])
def test_a_config_it_was_not_checked_for_is_refused(change: dict[str, Any], reason: str) -> None:
    found = templates.sizes_or_reason(_shipped("llama-causal-lm").record, {**LLAMA3_8B, **change})
    assert isinstance(found, str) and reason in found, found


def test_values_no_graph_holds_do_not_matter() -> None:
    record = _shipped("llama-causal-lm").record
    sizes = templates.applies(record, {**LLAMA3_8B, "rms_norm_eps": 1e-6, "rope_theta": 1e4, "bos_token_id": 1,
                                       "head_dim": 128, "transformers_version": "4.0", "some_key_no_class_knows": 3,
                                       "max_position_embeddings": 8192, "torch_dtype": "bfloat16"})
    assert sizes == {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "vocab_size": 128256, "num_hidden_layers": 32}
    assert templates.find_template(LLAMA3_8B, training=True, task=None, lora=None) is not None
    assert templates.find_template(LLAMA3_8B, training=False, task="decode", lora=None) is not None
    assert templates.find_template(LLAMA3_8B, training=False, task=None, lora=8) is None  # (LoRA: exported)
    assert templates.find_template(LLAMA3_8B, training=True, task="decode", lora=None) is None


def test_weights_past_any_file_are_refused_when_made() -> None:
    # each dim plausible, their product not: refused when the graph is made (the config is then exported, and the
    # exporter's overflow is its one-line error)
    template = _shipped("llama-causal-lm")
    sizes = templates.applies(template.record, {**LLAMA3_8B, "hidden_size": 2**40, "num_attention_heads": 2**10})
    assert sizes is not None
    with pytest.raises(templates.TooLarge, match="its weights would be"):
        templates.instantiate(template, sizes)


def test_mutated_configs_never_raise() -> None:
    # each key of a config given another type or an extreme value: a template applies (and makes its graph, or
    # refuses weights past any file) or says why, never raises
    template = _shipped("llama-causal-lm")
    odd: list[Any] = [None, True, -1, 0, 2**70, 1.5, float("nan"), "x", [], {}, [1, 2], {"a": 1}]
    draw = random.Random(7)
    made = 0
    for _ in range(200):
        config: dict[str, Any] = dict(LLAMA3_8B)
        for key in draw.sample(sorted(config), draw.randint(1, 3)):
            config[key] = draw.choice(odd)
        found = templates.sizes_or_reason(template.record, config)
        assert isinstance(found, (dict, str))
        if isinstance(found, dict) and made < 5:  # (a few made: each is a 32-layer graph)
            made += 1
            try:
                templates.instantiate(template, found)
            except templates.TooLarge:
                pass


def test_a_record_of_another_shape_is_no_template(tmp_path: Path) -> None:
    (tmp_path / f"broken{templates.SUFFIX}").write_text('{"format": 1, "model_type": "llama"}')
    (tmp_path / f"notjson{templates.SUFFIX}").write_text("{")
    assert templates.find_template(LLAMA3_8B, training=False, task=None, lora=None, folder=tmp_path) is None
    assert templates.refusal(LLAMA3_8B, training=False, task=None, folder=tmp_path) is None
