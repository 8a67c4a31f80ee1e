"""The shipped graph templates (onnxmem/frontends/templates.py): made and checked here, then compared with the export
they stand for, answer for answer, on configs none was made or checked on.

    python benchmarks/hf_templates.py make [--only NAME,...]      # (re)make onnxmem/templates/ (torch, transformers)
    python benchmarks/hf_templates.py compare [--configs ...] [--commands LABEL,...]

make: each family's reference config is exported once, then once per integer key doubled (frontends/templates.py
says how the integers become monomials of the keys); each template is then checked on the validation configs
listed with it: the graph it makes for them must equal their own export integer for integer, its structure, stacks,
axes, properties and parameter counts too. A template that fails is not written.

compare: per config and command (benchmarks/hf_config.py's commands), two CLI processes with empty export caches:
"template" as a user runs it (a template applies where it can; the source column says which ran), "export" with
ONNXMEM_HF_TEMPLATES=off (the export a first call made before). Their JSON answers must be equal (but for the
model's path; "numbers": every number equal, some tensors' names numbered apart by the exporter); wall seconds
and peak RSS are each process's own. The held-out configs are other published shapes of
the families (and some a template must refuse: a KV head count equal to the head count, tied embeddings, another
expert count), which export as before.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hf_config import COMMANDS, CONFIGS, DECODE_COMMANDS, RUNNER, _without_path  # noqa: E402
from zoo import SHIM_DIR  # noqa: E402

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rms_norm_eps": 1e-5, "dtype": "bfloat16",
         "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
MIXTRAL = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "rms_norm_eps": 1e-5,
           "dtype": "bfloat16", "num_local_experts": 8, "num_experts_per_tok": 2, "bos_token_id": 1,
           "eos_token_id": 2}
WHISPER = {"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"], "dtype": "float16",
           "max_source_positions": 1500, "max_target_positions": 448, "pad_token_id": 50256, "bos_token_id": 50257,
           "eos_token_id": 50257, "decoder_start_token_id": 50258}


def _llama(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, positions: int, theta: float,
           **more: Any) -> dict[str, Any]:
    return {**LLAMA, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
            "max_position_embeddings": positions, "rope_theta": theta, **more}


def _whisper(d_model: int, layers: int, heads: int, ffn: int, mels: int, vocab: int) -> dict[str, Any]:
    return {**WHISPER, "d_model": d_model, "encoder_layers": layers, "decoder_layers": layers,
            "encoder_attention_heads": heads, "decoder_attention_heads": heads, "encoder_ffn_dim": ffn,
            "decoder_ffn_dim": ffn, "num_mel_bins": mels, "vocab_size": vocab}


QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu",
         "rms_norm_eps": 1e-6, "rope_theta": 1e6, "sliding_window": 131072, "use_sliding_window": False,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 152064,
         "max_position_embeddings": 32768, "bos_token_id": 151643, "eos_token_id": 151645}
MISTRAL = {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0,
           "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32768,
           "max_position_embeddings": 32768, "bos_token_id": 1, "eos_token_id": 2}


def _decoder(base: dict[str, Any], hidden: int, inter: int, layers: int, heads: int, kv: int, **more: Any) \
        -> dict[str, Any]:
    return {**base, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, **more}


# References of the families beyond hf_config's (published shapes, as their config.json write them).
REFERENCES = {
    "qwen2.5-72b": (_decoder(QWEN2, 8192, 29568, 80, 64, 8, max_window_layers=70), {"batch": 1, "seq": 4096}),
    "mistral-7b-v0.3": (_decoder(MISTRAL, 4096, 14336, 32, 32, 8), {"batch": 1, "seq": 4096}),
}
# Validation configs (a template is checked on them when it is made) and held-out ones (compare only).
VALIDATION = {
    "qwen2.5-7b": (_decoder(QWEN2, 3584, 18944, 28, 28, 4, max_window_layers=28), {"batch": 1, "seq": 4096}),
    "codestral-22b": (_decoder(MISTRAL, 6144, 16384, 56, 48, 8), {"batch": 1, "seq": 4096}),
    "llama3-8b": (CONFIGS["llama3-8b"][0], {"batch": 1, "seq": 4096}),
    "mixtral-8x22b": ({**MIXTRAL, "hidden_size": 6144, "intermediate_size": 16384, "num_hidden_layers": 56,
                       "num_attention_heads": 48, "num_key_value_heads": 8, "vocab_size": 32768,
                       "max_position_embeddings": 65536, "rope_theta": 1e6}, {"batch": 1, "seq": 4096}),
    "whisper-medium": (_whisper(1024, 24, 16, 4096, 80, 51865), {"batch": 1, "decoder_seq": 448}),
}
HELD_OUT = {
    "codellama-34b": (_llama(8192, 22016, 48, 64, 8, 32000, 16384, 1e6), {"batch": 1, "seq": 4096}),
    "tinyllama-1.1b": (_llama(2048, 5632, 22, 32, 4, 32000, 2048, 1e4), {"batch": 4, "seq": 2048}),
    "llama2-13b (kv = heads)": (_llama(5120, 13824, 40, 40, 40, 32000, 4096, 1e4), {"batch": 1, "seq": 4096}),
    "llama3.2-1b (tied)": (_llama(2048, 8192, 16, 32, 8, 128256, 131072, 5e5, tie_word_embeddings=True),
                           {"batch": 1, "seq": 4096}),
    "mixtral-small (top-3)": ({**MIXTRAL, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 12,
                          "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
                          "max_position_embeddings": 8192, "rope_theta": 1e6, "num_experts_per_tok": 3},
                         {"batch": 2, "seq": 2048}),
    "mixtral-4-experts": ({**MIXTRAL, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 12,
                           "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
                           "max_position_embeddings": 8192, "rope_theta": 1e6, "num_local_experts": 4},
                          {"batch": 2, "seq": 2048}),
    "qwen2.5-32b": (_decoder(QWEN2, 5120, 27648, 64, 40, 8, max_window_layers=64), {"batch": 1, "seq": 4096}),
    "qwen2.5-0.5b (tied)": (_decoder(QWEN2, 896, 4864, 24, 14, 2, max_window_layers=24, tie_word_embeddings=True),
                            {"batch": 4, "seq": 4096}),
    "mistral-3b-shaped": (_decoder(MISTRAL, 3072, 8192, 26, 24, 8), {"batch": 2, "seq": 4096}),
    "mistral-7b-v0.1 (sliding window)": ({**_decoder(MISTRAL, 4096, 14336, 32, 32, 8), "sliding_window": 4096,
                                          "vocab_size": 32000}, {"batch": 1, "seq": 4096}),
    "whisper-small": (_whisper(768, 12, 12, 3072, 80, 51865), {"batch": 2, "decoder_seq": 448}),
    "whisper-base": (_whisper(512, 6, 8, 2048, 80, 51865), {"batch": 4, "decoder_seq": 448}),
}
# The shipped families: name, reference config, validation config, task (decoders also get a decode template).
FAMILIES = (
    ("llama", "llama3-70b", "llama3-8b", "causal-lm"),
    ("mixtral", "mixtral-8x7b", "mixtral-8x22b", "causal-lm"),
    ("qwen2", "qwen2.5-72b", "qwen2.5-7b", "causal-lm"),
    ("mistral", "mistral-7b-v0.3", "codestral-22b", "causal-lm"),
    ("whisper", "whisper-large-v3", "whisper-medium", "speech-seq2seq"),
)
# The shipped templates: name, reference config, mode (training, task), validation configs.
TEMPLATES = tuple(
    (f"{family}-{name}", reference, training, asked, (check,))
    for family, reference, check, task in FAMILIES
    for name, training, asked in ((task, False, None), (f"{task}-training", True, None),
                                  *((("decode", False, "decode"),) if task == "causal-lm" else ())))
ALL = {**{name: CONFIGS[name] for name in CONFIGS}, **REFERENCES, **VALIDATION, **HELD_OUT}


def make(only: set[str] | None) -> None:
    from onnxmem.frontends.template_maker import TemplateError, make_template
    from onnxmem.frontends.templates import FOLDER

    print("| template | reference | checked on | integers rewritten | fixed keys | free keys | graph KiB | s |")
    print("|---|---|---|---:|---|---|---:|---:|")
    for name, reference, training, task, checks in TEMPLATES:
        if only and name not in only:
            continue
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as staging:
            try:
                path = make_template(ALL[reference][0], Path(staging), name, training=training, task=task,
                                     validate=tuple({**ALL[c][0], "_name": c} for c in checks),
                                     progress=lambda line, n=name: print(f"  {n}: {line}", file=sys.stderr))
            except TemplateError as error:
                print(f"| {name} | {reference} | not made: {error} | | | | | |")
                continue
            record = json.loads(path.read_text())
            FOLDER.mkdir(exist_ok=True)
            for made in Path(staging).iterdir():
                os.replace(made, FOLDER / made.name)
        size = (FOLDER / f"{name}.template.onnx.gz").stat().st_size
        print(f"| {name} | {reference} | {', '.join(checks)} | {len(record['slots'])} | "
              f"{', '.join(record['fixed']) or '-'} | {', '.join(record['free']) or '-'} | {size / 1024:.0f} | "
              f"{time.perf_counter() - start:.0f} |", flush=True)


def run(arguments: list[str], cache: str, templates: bool) -> tuple[float, int, int, str, str]:
    """Give one CLI process's wall time, peak RSS, exit code, stdout and where its export came from."""
    code = RUNNER.format(shim=str(SHIM_DIR), root=str(ROOT))
    env = {**os.environ, "ONNXMEM_HF_CACHE": cache, "ONNXMEM_HF_TEMPLATES": "on" if templates else "off"}
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen([sys.executable, "-c", code, *arguments], stdout=out, stderr=subprocess.PIPE,
                                   env=env)
        assert process.stderr is not None
        lines = process.stderr.read().decode().splitlines()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        text = out.read().decode()
    source = "template" if any(line.startswith("onnxmem:") and "from onnxmem's" in line for line in lines) else \
        "export" if any(line.startswith("onnxmem:") and " exported in " in line for line in lines) else "?"
    return wall, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status), text, source


def _numbered(text: str) -> str:
    """Give an answer with the exporter's numbering of names masked ('mul_206' -> 'mul_#')."""
    return re.sub(r"(?<=[a-z]_)\d+\b", "#", text)


def compare(configs: list[str], commands: list[str]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="onnxmem-templates-"))
    print("| config | command | source | template: wall s | template: peak MiB | export: wall s | "
          "export: peak MiB | same answer |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for name in configs:
        values, dims = ALL[name]
        config = folder / name.split(" ")[0] / "config.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps(values))
        rows = [(label, command, None) for label, command in COMMANDS]
        if values["architectures"][0].endswith("ForCausalLM"):
            rows += list(DECODE_COMMANDS)
        for label, command, fixed in rows:
            if label not in commands:
                continue
            bound = fixed if fixed is not None else {d: v for d, v in dims.items()
                                                     if command[0] != "fit" or d != "batch"}
            arguments = [*command, "--hf", str(config.parent), *(a for d, v in bound.items()
                                                                  for a in ("--dim", f"{d}={v}"))]
            mine = run(arguments, tempfile.mkdtemp(dir=folder), True)
            theirs = run(arguments, tempfile.mkdtemp(dir=folder), False)
            a, b = _without_path(mine[3]), _without_path(theirs[3])
            same = "yes" if mine[2] == theirs[2] and a == b else \
                "numbers (names numbered apart)" if mine[2] == theirs[2] and _numbered(a) == _numbered(b) else \
                f"NO (exit {mine[2]} / {theirs[2]})"
            print(f"| {name} | {label} | {mine[4]} | {mine[0]:.1f} | {mine[1] / 2**20:.0f} | {theirs[0]:.1f} | "
                  f"{theirs[1] / 2**20:.0f} | {same} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("make", "compare"))
    parser.add_argument("--only", default=None, help="make: these templates (comma-separated names)")
    parser.add_argument("--configs", default=",".join([*CONFIGS, *REFERENCES, *HELD_OUT]))
    parser.add_argument("--commands", default=",".join([*(label for label, _ in COMMANDS),
                                                         *(label for label, _, _ in DECODE_COMMANDS)]))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(SHIM_DIR))
    __import__("tvshim")
    if args.action == "make":
        make(set(args.only.split(",")) if args.only else None)
    else:
        compare(args.configs.split(","), args.commands.split(","))


if __name__ == "__main__":
    main()
