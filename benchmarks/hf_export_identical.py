"""--hf exports written by two checkouts compared byte for byte, and the time each export's stages take.

    python benchmarks/hf_export_identical.py write OUT.json [--checkout DIR] [--cases NAME,...]
    python benchmarks/hf_export_identical.py compare BEFORE.json AFTER.json

`write` exports each case below in this one process with onnxmem.hf.export_config (no cache) from the onnxmem of
this checkout, or of DIR (a `git worktree` of the commit before a change), and writes per case the SHA-256 of the
ONNX file, the size of its sparse weight file, what export_config gave (HfModel less its path), and the process CPU
seconds of its stages: the config and model build, torch.onnx.export (capture, decompositions, translation) and
onnxmem's finish (the repeat of the layers, the rewrites, the save). The first case also pays the imports (torch,
transformers, onnxscript: the `imports` line). An answer of report/fit/--training is a function of the ONNX file
and the HfModel alone, so equal files mean equal answers. `compare` prints one table: per case, equal or not, and
the stage times of both.

The cases: the full-size configs of benchmarks/hf_config.py (Llama-3-70B, Mixtral-8x7B, Whisper-large-v3; inference
and training exports; Llama-3-8B's decode export) and the tiny configs of tests/test_hf_config.py and
tests/test_hf_decode.py (Llama GQA bf16 training and inference, Mixtral, the decode exports GQA and MHA).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from hf_config import CONFIGS  # noqa: E402
from tables import markdown_table  # noqa: E402
from zoo import SHIM_DIR  # noqa: E402

TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 256, "max_position_embeddings": 128, "dtype": "bfloat16"}
TINY_MIXTRAL = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 128}
TINY_GQA = {**TINY_LLAMA, "max_position_embeddings": 256}
TINY_MHA = {**TINY_GQA, "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 24,
            "dtype": "float32"}
# (case name, config, export_config's options)
CASES: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("llama3-70b", CONFIGS["llama3-70b"][0], {}),
    ("llama3-70b-training", CONFIGS["llama3-70b"][0], {"training": True}),
    ("mixtral-8x7b", CONFIGS["mixtral-8x7b"][0], {}),
    ("mixtral-8x7b-training", CONFIGS["mixtral-8x7b"][0], {"training": True}),
    ("whisper-large-v3", CONFIGS["whisper-large-v3"][0], {}),
    ("whisper-large-v3-training", CONFIGS["whisper-large-v3"][0], {"training": True}),
    ("llama3-8b-decode", CONFIGS["llama3-8b"][0], {"task": "decode"}),
    ("tiny-llama", TINY_LLAMA, {}),
    ("tiny-llama-training", TINY_LLAMA, {"training": True}),
    ("tiny-llama-traced", TINY_LLAMA, {"training": True, "repeat_layers": False}),
    ("tiny-mixtral-training", TINY_MIXTRAL, {"training": True}),
    ("tiny-gqa-decode", TINY_GQA, {"task": "decode"}),
    ("tiny-mha-decode", TINY_MHA, {"task": "decode"}),
)
STAGES = ("imports", "build", "torch.onnx.export", "finish")


def write(out: Path, checkout: Path | None, names: list[str]) -> None:
    """Export every case named with the onnxmem of `checkout` (else this one) and write what each made to `out`."""
    sys.path.insert(0, str(SHIM_DIR))
    started = time.process_time()
    __import__("tvshim")  # (transformers imports torchvision; the shim makes the wheel load: it imports torch)
    sys.path.insert(0, str(checkout or HERE.parent))
    import onnxmem.hf as hf

    assert Path(hf.__file__).resolve().is_relative_to((checkout or HERE.parent).resolve()), hf.__file__
    hf._transformers()
    __import__("torch.onnx._internal.exporter._core")
    imports = time.process_time() - started
    spent: dict[str, float] = {}

    def timed(stage: str, function: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            begun = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent[stage] = spent.get(stage, 0.0) + time.process_time() - begun
        return run

    hf.build = timed("build", hf.build)
    hf._exported_proto = timed("torch.onnx.export", hf._exported_proto)
    hf._finish = timed("finish", hf._finish)
    results: dict[str, Any] = {}
    for name, values, options in CASES:
        if names and name not in names:
            continue
        spent.clear()
        with tempfile.TemporaryDirectory(prefix="hf-identical-") as folder:
            config = Path(folder) / "config.json"
            config.write_text(json.dumps(values))
            begun, wall = time.process_time(), time.perf_counter()
            made = hf.export_config(config, Path(folder) / "model.onnx", **options)
            total, wall = time.process_time() - begun, time.perf_counter() - wall
            fields = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(made).items() if k != "path"}
            results[name] = {"sha256": hashlib.sha256(made.path.read_bytes()).hexdigest(),
                             "data_bytes": os.path.getsize(f"{made.path}.data"), "made": fields,
                             "cpu_s": {"imports": imports if not results else 0.0, **spent, "total": total},
                             "wall_s": wall}
        print(f"{name}: {results[name]['sha256'][:16]} cpu {total:.1f} s "
              f"({', '.join(f'{k} {v:.1f}' for k, v in spent.items())}), wall {wall:.1f} s", flush=True)
    out.write_text(json.dumps({"load_average": os.getloadavg(), "cases": results}, indent=1))


def compare(before: Path, after: Path) -> None:
    """Print, per case of both files, whether the exports are equal and the stage CPU seconds of each."""
    old, new = (json.loads(path.read_text())["cases"] for path in (before, after))
    rows = []
    for name in [n for n, _, _ in CASES if n in old or n in new]:
        a, b = old.get(name), new.get(name)
        same = "missing" if a is None or b is None else \
            "yes" if (a["sha256"], a["data_bytes"], a["made"]) == (b["sha256"], b["data_bytes"], b["made"]) else "NO"
        times = [" / ".join("-" if r is None else f"{r['cpu_s'].get(s, 0.0):.1f}" for r in (a, b))
                 for s in (*STAGES, "total")]
        rows.append([name, same, *times])
    print(markdown_table(["case", "identical", *(f"{s} cpu s before / after" for s in (*STAGES, "total"))], rows))
    print(f"\n{sum(r[1] == 'yes' for r in rows)}/{len(rows)} identical")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writing = commands.add_parser("write")
    writing.add_argument("out", type=Path)
    writing.add_argument("--checkout", type=Path, default=None)
    writing.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    comparing = commands.add_parser("compare")
    comparing.add_argument("before", type=Path)
    comparing.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "write":
        write(args.out, args.checkout, [n for n in args.cases.split(",") if n])
    else:
        compare(args.before, args.after)


if __name__ == "__main__":
    main()
