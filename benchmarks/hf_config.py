"""--hf at scale: wall time and peak memory of `onnxmem report/fit --hf CONFIG` on full-size configs, the first
call (an empty export cache) and the next one (the export from the cache), and the weights it counts against the
model's own parameters.

    python benchmarks/hf_config.py [--configs llama3-70b,llama3-8b,mixtral-8x7b,whisper-large-v3] [--out DIR]
                                   [--commands LABEL,...] [--no-cache]

The configs are written by this script (the published shapes of Llama-3-70B, Llama-3-8B, Mixtral-8x7B and
Whisper-large-v3;
nothing is downloaded: HF_HUB_OFFLINE=1). Each command runs in its own process (the CLI; shared/tools/tvshim.py is
imported just before torchvision, which transformers imports, so a process that never imports transformers never
imports torch for it), timed from start to exit; its peak RSS is the process's own (os.wait4's ru_maxrss). Each row
runs twice with ONNXMEM_HF_CACHE set to a new empty folder of its own: "first" exports (or, where one of the shipped
graph templates applies, makes the graph from it: frontends/templates.py, not kept in the cache; run with
ONNXMEM_HF_TEMPLATES=off to time the export), "cached" reads the export the first one kept; "same" says whether
the two answers are equal (the JSON but for the model's path). --no-cache (ONNXMEM_HF_CACHE=off) runs each row
once, exporting, as onnxmem did before the cache.
Rows: report (inference), report --training --precision amp-bf16, fit --gpu H100-80GB (inference, the batch); for
causal LMs, the serving step with its KV cache (--hf-task decode): its report at 32 sequences of 8k context, a
prefill of 8k tokens (past=0), fit's largest context for 32 sequences and its largest concurrency at 8k. The last
table checks each decode report's KV cache against the config's arithmetic: 2 (key, value) x layers x batch x
kv_heads x length x head_dim x 2 bytes (bf16), past inputs at length past and present outputs at past + seq.
Weights: the model built on the meta device in this process gives its parameter count and their bytes at the
config's dtype; the report's training.parameters must equal the count, and inference.weights_bytes less the
parameters' bytes is what else the graph holds as weights (the rotary tables, the exporter's constants).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from benchmarks.zoo import SHIM_DIR  # noqa: E402

CONFIGS = {
    "llama3-70b": ({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8192,
                    "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
                    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
                    "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                    "bos_token_id": 128000, "eos_token_id": 128001, "dtype": "bfloat16"},
                   {"batch": 1, "seq": 4096}),
    "llama3-8b": ({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
                   "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
                   "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                   "bos_token_id": 128000, "eos_token_id": 128001, "dtype": "bfloat16"},
                  {"batch": 1, "seq": 4096}),
    "mixtral-8x7b": ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 4096,
                      "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                      "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
                      "num_local_experts": 8, "num_experts_per_tok": 2, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
                      "bos_token_id": 1, "eos_token_id": 2, "dtype": "bfloat16"},
                     {"batch": 1, "seq": 4096}),
    "whisper-large-v3": ({"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
                          "d_model": 1280, "encoder_layers": 32, "decoder_layers": 32, "encoder_attention_heads": 20,
                          "decoder_attention_heads": 20, "encoder_ffn_dim": 5120, "decoder_ffn_dim": 5120,
                          "num_mel_bins": 128, "max_source_positions": 1500, "max_target_positions": 448,
                          "vocab_size": 51866, "pad_token_id": 50256, "bos_token_id": 50257, "eos_token_id": 50257,
                          "decoder_start_token_id": 50258, "dtype": "float16"},
                         {"batch": 1, "decoder_seq": 448}),
}
COMMANDS = (
    ("report", ["report", "--format", "json"]),
    ("report --training amp-bf16", ["report", "--format", "json", "--training", "--precision", "amp-bf16"]),
    ("fit H100-80GB", ["fit", "--gpu", "H100-80GB", "--format", "json", "--no-what-if"]),
)
# The serving step of a causal LM (--hf-task decode), each at dims of its own (not the config's).
DECODE = ["--hf-task", "decode"]
DECODE_COMMANDS = (
    ("decode report b32 past8k", ["report", "--format", "json", *DECODE], {"batch": 32, "seq": 1, "past": 8192}),
    ("prefill report b1 seq8k", ["report", "--format", "json", *DECODE], {"batch": 1, "seq": 8192, "past": 0}),
    ("decode fit past b32 H100-80GB", ["fit", "--gpu", "H100-80GB", "--format", "json", "--no-what-if", *DECODE,
                                       "--search", "past"], {"batch": 32, "seq": 1}),
    ("decode fit batch past8k H100-80GB", ["fit", "--gpu", "H100-80GB", "--format", "json", "--no-what-if", *DECODE,
                                           "--search", "batch"], {"past": 8192, "seq": 1}),
)
# The CLI in a process of its own; the shim that lets torchvision (imported by transformers) load is imported when
# torchvision is first looked for (a command that reads its export from the cache imports neither).
SHIM_FINDER = """import importlib.abc, sys
class Shim(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            sys.meta_path.remove(self)
            sys.path.insert(0, {shim!r})
            import tvshim
        return None
sys.meta_path.insert(0, Shim())
sys.path.insert(0, {root!r})
"""
RUNNER = SHIM_FINDER + """from onnxmem.cli.commands import main
main(sys.argv[1:])
"""


def run_cli(arguments: list[str], cache: str) -> tuple[float, int, int, str]:
    """Give the wall time, the peak RSS in bytes, the exit code and the stdout of one CLI process, its export cache
    at `cache` (ONNXMEM_HF_CACHE)."""
    code = RUNNER.format(shim=str(SHIM_DIR), root=str(ROOT))
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen([sys.executable, "-c", code, *arguments], stdout=out,
                                   stderr=subprocess.PIPE, env={**os.environ, "ONNXMEM_HF_CACHE": cache})
        assert process.stderr is not None
        errors = [line for line in process.stderr.read().decode().splitlines() if line.startswith("onnxmem")]
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        text = out.read().decode()
    return wall, usage.ru_maxrss * 1024, process.returncode, text if process.returncode in (0, 1) else \
        (errors[-1] if errors else "")


def write_config(folder: Path, name: str) -> tuple[Path, dict[str, Any], dict[str, int]]:
    """Write CONFIGS[name]'s config.json in a folder of its own under `folder`; give its path, values and dims."""
    values, dims = CONFIGS[name]
    config = folder / name / "config.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(values))
    return config, values, dims


def parameters_of(config: Path) -> tuple[int, int]:
    """Give the elements and bytes of the parameters of the model the config builds (meta device)."""
    import onnxmem.hf as hf

    model, _, _ = hf.build(hf.load_config(config))
    return (sum(p.numel() for p in model.parameters()),
            sum(p.numel() * p.element_size() for p in model.parameters()))


def _without_path(text: str) -> str:
    """Give a JSON answer without the model's path (a temporary folder, or the cache's)."""
    try:
        document = json.loads(text)
    except ValueError:
        return text
    if isinstance(document, dict):
        document.pop("model", None)
    return json.dumps(document, sort_keys=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--commands", default=",".join([*(label for label, _ in COMMANDS),
                                                         *(label for label, _, _ in DECODE_COMMANDS)]),
                        help="which rows, by label (comma-separated)")
    parser.add_argument("--out", default=None, help="where to write the configs (default: a temporary folder)")
    parser.add_argument("--no-cache", action="store_true", help="each row once, with the export cache off")
    args = parser.parse_args()
    sys.path.insert(0, str(SHIM_DIR))
    __import__("tvshim")
    folder = Path(args.out or tempfile.mkdtemp(prefix="onnxmem-hf-bench-"))
    calls = ("off",) if args.no_cache else ("first", "cached")
    print("| config | command | " + " | ".join(f"{c}: wall s | {c}: peak RSS MiB" for c in calls) +
          " | exit | answer |" + (" same |" if len(calls) > 1 else ""))
    print("|---|---|" + "---:|---:|" * len(calls) + "---:|---|" + ("---|" if len(calls) > 1 else ""))
    checks = []
    caches = []
    for name in args.configs.split(","):
        config, values, dims = write_config(folder, name)
        count, nbytes = parameters_of(config)
        bound = [a for d, v in dims.items() for a in ("--dim", f"{d}={v}")]
        rows = [(label, command, None) for label, command in COMMANDS]
        if values["architectures"][0].endswith("ForCausalLM"):
            rows += list(DECODE_COMMANDS)
        for label, command, fixed in rows:
            if label not in args.commands.split(","):
                continue
            searched = bound if command[0] != "fit" else \
                [a for d, v in dims.items() if d != "batch" for a in ("--dim", f"{d}={v}")]  # fit searches batch
            if fixed is not None:
                searched = [a for d, v in fixed.items() for a in ("--dim", f"{d}={v}")]
            cache = "off" if args.no_cache else \
                tempfile.mkdtemp(prefix=f"cache-{name}-{command[0]}-", dir=folder)
            runs = [run_cli([*command, "--hf", str(config.parent), *searched], cache) for _ in calls]
            _, _, code, text = runs[0]
            answer = text.strip()[:200] or "-"
            if code in (0, 1) and text.strip():
                document = json.loads(text)
                if "inference" in document:
                    inference, training = document["inference"], document.get("training")
                    answer = f"weights {inference['weights_bytes']:,} B, peak {inference['peak_bytes']:,} B"
                    if inference.get("kv_cache_bytes") is not None:
                        answer += f", KV cache {inference['kv_cache_bytes']:,} B"
                        caches.append((name, fixed, inference["kv_cache"]))
                    if training:
                        answer += f"; training peak {training['peak_bytes']:,} B"
                        checks.append((name, count, training["parameters"], nbytes, inference["weights_bytes"]))
                    elif label == "report":
                        checks.append((name, count, None, nbytes, inference["weights_bytes"]))
                else:
                    answer = f"{document.get('dim')} max {document.get('max_value')}"
            measured = " | ".join(f"{wall:.1f} | {rss / 2**20:,.0f}" for wall, rss, _, _ in runs)
            same = "" if len(runs) < 2 else \
                f" {'yes' if len({(c, _without_path(t)) for _, _, c, t in runs}) == 1 else 'NO'} |"
            print(f"| {name} | {label} | {measured} | {code} | {answer} |{same}", flush=True)
    print()
    print("| config | parameters (model) | parameters (report) | equal | parameter bytes (count x dtype) | "
          "weights_bytes (report) | other weights |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for name, count, reported, nbytes, weights in checks:
        print(f"| {name} | {count:,} | {'-' if reported is None else f'{reported:,}'} | "
              f"{'-' if reported is None else ('yes' if reported == count else 'NO')} | {nbytes:,} | {weights:,} | "
              f"{weights - nbytes:,} |")
    if caches:
        print()
        print("| config | dims | past bytes (report) | present bytes (report) | by hand (past + present) | equal |")
        print("|---|---|---:|---:|---:|---|")
    for name, fixed, cache in caches:
        by_hand = cache_by_hand(CONFIGS[name][0], **fixed)
        reported = (cache["past_bytes"], cache["present_bytes"])
        print(f"| {name} | {', '.join(f'{d}={v}' for d, v in fixed.items())} | {reported[0]:,} | {reported[1]:,} | "
              f"{by_hand[0]:,} + {by_hand[1]:,} | {'yes' if reported == by_hand else 'NO'} |")


def cache_by_hand(values: dict[str, Any], batch: int, seq: int, past: int) -> tuple[int, int]:
    """Give a decoder's KV cache bytes from its config: the past inputs and the present outputs."""
    heads = values["num_attention_heads"]
    head_dim = values.get("head_dim") or values["hidden_size"] // heads
    per_position = 2 * values["num_hidden_layers"] * batch * values.get("num_key_value_heads", heads) * head_dim * \
        {"bfloat16": 2, "float16": 2, "float32": 4}[values["dtype"]]
    return per_position * past, per_position * (past + seq)


if __name__ == "__main__":
    main()
