"""Decoders with a KV cache as onnxruntime-genai's model builder and optimum export them, sized at prefill and
decode and checked against onnxruntime on CPU (issue 30, part 2).

    python benchmarks/kv_exports.py build --genai-python VENV/bin/python --optimum-python VENV2/bin/python
    python benchmarks/kv_exports.py measure [--set dev|held-out|all] [--batches 1 4] [--prefill 32 200]
                                            [--contexts 32 96 200]
    python benchmarks/kv_exports.py genai --genai-python VENV/bin/python

build: tiny random-weight decoders made from transformers' config classes (Llama, Qwen2, Mistral with one KV head,
Phi3; nothing downloaded), saved with save_pretrained and a word-level tokenizer, then exported by
`python -m onnxruntime_genai.models.builder` (fp32, fp16 and int4 (MatMulNBits), CPU) and by `optimum-cli export
onnx --task text-generation-with-past`, into --out (default ~/.cache/onnxmem-kv-exports) with an index.json. The two
exporters pin different transformers releases (optimum-onnx 0.1: transformers < 4.58), so each runs in the Python
given for it; this script's own Python needs neither.

measure: per export, prefill steps (past 0, each --prefill's tokens) and a decode step (one token) over each --contexts
cache, at each --batches: `onnxmem.analyze(..., provider="cpu")` (what `report --provider cpu` prints) against
onnxruntime CPU's first run at level disable, `onnxmem.validate` (first and steady runs, the profiler's allocator
statistics: notes/measuring-onnxruntime-memory.md), and the report's KV cache against the bytes of the past arrays
fed and the present arrays returned. Half the exports are held out (`--set held-out`): no rule was written looking
at them.

genai: onnxruntime-genai's own generator on the model builder's exports (past and present in one buffer of
--max-length positions: past_present_share_buffer), its session profiled (run in --genai-python), a prompt of each
--contexts length then two tokens: the arena's peak in the prefill and the decode step against onnxmem's estimate of
that step with the cache in the shared buffer (plan.kv's what-if) and the logits bound by the generator.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = Path("~/.cache/onnxmem-kv-exports").expanduser()
INDEX = "index.json"

# The tiny decoders: transformers config class, its keyword arguments (no weights are read from anywhere).
ARCHS: dict[str, tuple[str, str, dict[str, object]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
               "vocab_size": 512, "max_position_embeddings": 256}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 192,
               "vocab_size": 640, "max_position_embeddings": 256}),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 256,
                 "vocab_size": 512, "max_position_embeddings": 256, "sliding_window": None}),
    # (the builder reads a Phi3 whose original context differs from its context as LongRoPE: keep them equal)
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
              "vocab_size": 512, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
              "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
}
# name -> (exporter, arch, precision, held out)
EXPORTS: dict[str, tuple[str, str, str, bool]] = {
    "genai-llama-fp32": ("genai", "llama", "fp32", False),
    "genai-llama-int4": ("genai", "llama", "int4", False),
    "genai-qwen2-fp32": ("genai", "qwen2", "fp32", False),
    "genai-mistral-int4": ("genai", "mistral", "int4", False),
    # (the builder's fp16 CPU export: MultiHeadAttention and repeat_kv in plain ops; onnxruntime 1.32 fails it at
    # every level, "Shape mismatch attempting to re-use buffer" on a Cast it inserts: a row of its own)
    "genai-qwen2-fp16": ("genai", "qwen2", "fp16", False),
    "optimum-llama": ("optimum", "llama", "fp32", False),
    "optimum-mistral": ("optimum", "mistral", "fp32", False),
    "genai-qwen2-int4": ("genai", "qwen2", "int4", True),
    "genai-mistral-fp32": ("genai", "mistral", "fp32", True),
    "genai-phi3-fp32": ("genai", "phi3", "fp32", True),
    "optimum-qwen2": ("optimum", "qwen2", "fp32", True),
    "optimum-phi3": ("optimum", "phi3", "fp32", True),
}


# --- build (runs the exporters' Pythons) ---------------------------------------------------------------------------

def save_tiny_decoder(arch: str, folder: str) -> None:
    """Save a random-weight decoder of `arch` and a word-level tokenizer into `folder` (run in an exporter's
    Python: it imports torch and transformers)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    config_class, model_class, options = ARCHS[arch]
    config = getattr(transformers, config_class)(num_hidden_layers=2, rms_norm_eps=1e-5, **options)
    torch.manual_seed(0)
    getattr(transformers, model_class)(config).eval().save_pretrained(folder)
    vocab = {"<unk>": 0, **{f"t{i}": i for i in range(1, config.vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="t1",
                                         eos_token="t2", pad_token="<unk>").save_pretrained(folder)


def build(args: argparse.Namespace) -> None:
    """Export every decoder of EXPORTS into args.out (skipping those already there) and write the index."""
    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    pythons = {"genai": args.genai_python, "optimum": args.optimum_python}
    entries = []
    for name, (exporter, arch, precision, held_out) in EXPORTS.items():
        folder = out / name
        model = folder / "model.onnx"
        python = pythons[exporter]
        if not model.exists():
            if python is None:
                print(f"{name}: skipped (no --{exporter}-python)")
                continue
            source = out / f"hf-{exporter}-{arch}"
            if not (source / "config.json").exists():
                subprocess.run([python, __file__, "_save", arch, str(source)], check=True)
            started = time.perf_counter()
            if exporter == "genai":
                command = [python, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(folder),
                           "-p", precision, "-e", "cpu", "-c", str(out / "builder-cache")]
            else:
                command = [python, "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", str(source),
                           "--task", "text-generation-with-past", str(folder)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode or not model.exists():
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
                print(f"{name}: export failed: {tail[0][:200]}")
                continue
            print(f"{name}: exported in {time.perf_counter() - started:.0f} s")
        entries.append({"name": name, "exporter": exporter, "arch": arch, "precision": precision,
                        "held_out": held_out, "file": f"{name}/model.onnx"})
    (out / INDEX).write_text(json.dumps({"exports": entries}, indent=1))
    print(f"{len(entries)} exports in {out}")


# --- measure (this project's Python: onnxmem and onnxruntime) ------------------------------------------------------

def step_dims(entry: dict[str, object], folder: Path, batch: int, past: int, seq: int) -> dict[str, int]:
    """Give the dims of one step of an export: optimum's batch_size, sequence_length, past_sequence_length (its
    attention mask and presents are 'past_sequence_length + sequence_length'); the model builder's also
    total_sequence_length and kv_cache_dim (the head size, from its genai_config.json)."""
    dims = {"batch_size": batch, "sequence_length": seq, "past_sequence_length": past}
    if entry["exporter"] == "genai":
        config = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        dims.update(total_sequence_length=past + seq, kv_cache_dim=int(config["head_size"]))
    return dims


def ort_cache_bytes(path: Path, dims: dict[str, int]) -> tuple[int, int]:
    """Run one step in onnxruntime (CPU) and give the bytes of the past arrays fed and of the present arrays it
    returns (the inputs and outputs named past*/present*)."""
    import onnx
    import onnxruntime

    from onnxmem.measure.inputs import make_feeds

    model = onnx.load(str(path), load_external_data=False)
    feeds = make_feeds(model, dims)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    returned = dict(zip(names, session.run(names, feeds), strict=True))
    past = sum(a.nbytes for name, a in feeds.items() if name.startswith("past"))
    present = sum(a.nbytes for name, a in returned.items() if name.startswith("present"))
    return past, present


def measure_row(entry: dict[str, object], zoo: Path, batch: int, past: int, seq: int) -> list[str]:
    """Give one table row: the plain report and validate against onnxruntime CPU at one step."""
    import onnxmem

    path = zoo / str(entry["file"])
    dims = step_dims(entry, path.parent, batch, past, seq)
    step = f"prefill {seq}" if past == 0 else f"decode past {past}"
    head = [str(entry["name"]), "yes" if entry["held_out"] else "no", str(batch), step]
    try:
        result = onnxmem.validate(str(path), dims, provider="cpu")
        full = onnxmem.analyze(str(path), dims, provider="cpu")
    except onnxmem.OnnxMemError as exc:
        return [*head, "-", "-", "-", "-", "-", "-", f"{type(exc).__name__}: {' '.join(str(exc).split())[:70]}"]
    first, steady = result.runs
    measured = first.measured.peak_activation_bytes
    report = full.inference
    assert report is not None
    kv = report.kv_cache
    estimated_kv = (kv.past_bytes, kv.present_bytes) if kv is not None else (0, 0)
    ort_kv = ort_cache_bytes(path, result.dims)  # (the dims bound, 'past_sequence_length + sequence_length' too)
    kv_cell = f"{sum(estimated_kv):,} / {sum(ort_kv):,}" + ("" if estimated_kv == ort_kv else " (differs)")
    warnings = sorted({w.code for w in result.warnings} | {w.code for w in full.warnings})
    return [*head, f"{measured:,}", f"{report.peak_activation_bytes - measured:+,}",
            f"{first.activation_difference_bytes:+,} / {steady.activation_difference_bytes:+,}",
            f"{first.weights_difference_bytes:+,}",
            " / ".join(f"{run.estimated.arena_held_bytes - run.measured.arena_held_bytes:+,}" for run in result.runs),
            kv_cell, ", ".join(warnings)]


HEADERS = ("export", "held out", "batch", "step", "ORT run 1 activations B", "report - ORT B",
           "validate est-meas run 1 / run 2 B", "arena weights est-meas B", "arena held est-meas run 1 / run 2 B",
           "KV cache report / ORT arrays B", "warnings")


def measure(args: argparse.Namespace) -> None:
    """Print the table of every export of the chosen set at every batch, prefill and decode context."""
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    from tables import markdown_table

    zoo = Path(args.out).expanduser()
    index = zoo / INDEX
    if not index.exists():
        raise SystemExit(f"kv_exports: no {index}: build the exports first (python benchmarks/kv_exports.py build)")
    entries = [e for e in json.loads(index.read_text())["exports"]
               if args.set == "all" or e["held_out"] == (args.set == "held-out")]
    entries = [e for e in entries if not args.models or e["name"] in args.models]
    rows = []
    started = time.perf_counter()
    for entry in entries:
        for batch in args.batches:
            for past, seq in (*((0, n) for n in args.prefill), *((n, 1) for n in args.contexts)):
                rows.append(measure_row(entry, zoo, batch, past, seq))
    print("onnxruntime CPU, level disable, 1 thread, arena on, memory pattern on; activations in bytes; "
          "report: onnxmem.analyze(provider='cpu') on the file as exported")
    print(markdown_table(HEADERS, rows))
    summary = []
    for entry in entries:
        own = [r for r in rows if r[0] == entry["name"]]
        ran = [r for r in own if r[4] != "-"]
        summary.append([str(entry["name"]), "yes" if entry["held_out"] else "no", str(len(own)), str(len(ran)),
                        str(sum(1 for r in ran if r[5] == "+0")), str(sum(1 for r in ran if r[6] == "+0 / +0")),
                        str(sum(1 for r in ran if r[8] == "+0 / +0")),
                        str(sum(1 for r in ran if "differs" not in r[9])),
                        "; ".join(sorted({r[10].split(":")[0] for r in own if r[4] == "-"}))])
    print("\nPer export:")
    print(markdown_table(("export", "held out", "steps", "measured", "report exact", "validate exact (both runs)",
                          "arena held exact (both runs)", "KV cache exact", "refused or failed"), summary))
    measured = [r for r in rows if r[4] != "-"]
    exact_report = sum(1 for r in measured if r[5] == "+0")
    exact_validate = sum(1 for r in measured if r[6] == "+0 / +0")
    exact_held = sum(1 for r in measured if r[8] == "+0 / +0")
    exact_kv = sum(1 for r in measured if "differs" not in r[9])
    print(f"\n{len(rows)} steps, {len(rows) - len(measured)} refused or failed; of those measured: report exact "
          f"{exact_report}, validate exact (both runs) {exact_validate}, arena held exact (both runs) "
          f"{exact_held}, KV cache exact {exact_kv} "
          f"({time.perf_counter() - started:.0f} s)")


# --- genai: onnxruntime-genai's own generator ----------------------------------------------------------------------

# the session options the generator's session is pinned to (genai_config.json's decoder.session_options): the
# profiler on (its allocator statistics), one thread, the arena on, the graph as the file has it, and no memory
# pattern (every step's shapes differ)
GENAI_SESSION = {"intra_op_num_threads": 1, "enable_cpu_mem_arena": True, "enable_mem_pattern": False,
                 "graph_optimization_level": "ORT_DISABLE_ALL"}


def generate_profiled(folder: str, batch: int, prompt: int, new: int, max_length: int, out: str) -> None:
    """Run onnxruntime-genai's generator on a copy of the export at `folder` (batch sequences of `prompt` tokens,
    then `new` tokens, in buffers of max_length) with its session profiled, and write each run's arena peak (the
    profiler's mem_bytes_requested_in_use over the run's node events, less what the arena held before the first
    node: the prepacked weights) as JSON to `out` (run in --genai-python)."""
    import shutil
    import tempfile

    import numpy
    import onnxruntime_genai

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "model"
        shutil.copytree(folder, copy)
        config_path = copy / "genai_config.json"
        config = json.loads(config_path.read_text())
        config["model"]["decoder"]["session_options"].update(GENAI_SESSION, enable_profiling=str(copy / "profile"))
        config["search"].update(max_length=max_length, past_present_share_buffer=True)
        config_path.write_text(json.dumps(config))
        model = onnxruntime_genai.Model(str(copy))
        params = onnxruntime_genai.GeneratorParams(model)
        params.set_search_options(batch_size=batch, max_length=max_length)
        generator = onnxruntime_genai.Generator(model, params)
        generator.append_tokens(numpy.full((batch, prompt), 5, dtype=numpy.int32))
        made = 0
        while made < new and not generator.is_done():
            generator.generate_next_token()
            made += 1
        del generator, params, model  # (the profile is written when the session ends)
        profile = next(copy.glob("profile*.json"))
        events = json.loads(profile.read_text())
    runs: list[list[dict[str, object]]] = [[]]
    for event in events:  # (a run's Execute event comes after its node events)
        if event.get("cat") == "Session" and event.get("name") == "SequentialExecutor::Execute":
            runs.append([])
        elif event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            runs[-1].append(event["args"])
    runs = [r for r in runs if r]
    first = runs[0][0]
    baseline = int(first["mem_bytes_requested_in_use"]) - int(first["mem_requested_in_use_delta"])
    peaks = [max(int(a["mem_bytes_requested_in_use"]) for a in run) - baseline for run in runs]
    Path(out).write_text(json.dumps({"peaks": peaks, "baseline": baseline, "made": made}))


def genai_estimate(path: Path, dims: dict[str, int], max_length: int) -> tuple[int, int]:
    """Give the step's activations as onnxruntime-genai's arena holds them, estimated: the KV cache in one buffer
    of max_length (plan.kv's what-if: past inputs at max_length, presents written into them) and the logits in a
    buffer the generator binds (every graph output outside the arena); and the what-if's total peak."""
    import dataclasses

    from onnxmem.passes.pipeline import after_sizing, sizing
    from onnxmem.shapes.kvcache import cache_tensors, resized_cache, shared_buffer_size

    at = sizing(str(path), dims, provider="cpu")
    found = cache_tensors(at.graph)
    assert found is not None
    shared = shared_buffer_size(found, at.graph, max_length)
    assert shared is not None, "no in-place cache"
    whole = resized_cache(at.graph, found, shared)
    bound = resized_cache(at.graph, found, lambda t: 0 if t.index in at.graph.outputs else shared(t),
                          (*found.past, *found.present, *(o for o in at.graph.outputs if o >= 0)))
    assert whole is not None and bound is not None
    arena = after_sizing(dataclasses.replace(at, graph=bound)).report.inference
    total = after_sizing(dataclasses.replace(at, graph=whole)).report.inference
    assert arena is not None and total is not None
    return arena.peak_activation_bytes, total.peak_bytes


def plain_activations(path: Path, dims: dict[str, int]) -> str:
    """Give the plain report's activations at a step (the presents and the logits allocated by onnxruntime), or
    the reason it gives none."""
    import onnxmem

    try:
        inference = onnxmem.analyze(str(path), dims, provider="cpu").inference
    except onnxmem.OnnxMemError as exc:
        return type(exc).__name__
    assert inference is not None
    return f"{inference.peak_activation_bytes:,}"


def genai(args: argparse.Namespace) -> None:
    """Print the table of onnxruntime-genai's generator against the shared-buffer estimate, per run."""
    import tempfile

    sys.path.insert(0, str(HERE))
    from tables import markdown_table

    sys.path.insert(0, str(HERE.parent))
    if args.genai_python is None:
        raise SystemExit("kv_exports: genai needs --genai-python (a Python with onnxruntime-genai)")
    zoo = Path(args.out).expanduser()
    entries = [e for e in json.loads((zoo / INDEX).read_text())["exports"]
               if e["exporter"] == "genai" and e["precision"] != "fp16"
               and (args.set == "all" or e["held_out"] == (args.set == "held-out"))
               and (not args.models or e["name"] in args.models)]
    rows = []
    for entry in entries:
        folder = (zoo / entry["file"]).parent
        for batch in args.batches:
            for prompt in args.contexts:  # a prompt of N tokens, then two: prefill N and a decode step over N
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / "peaks.json"
                    subprocess.run([args.genai_python, __file__, "_generate", str(folder), str(batch), str(prompt),
                                    "2", str(args.max_length), str(out)], check=True)
                    measured = json.loads(out.read_text())
                for run, peak in enumerate(measured["peaks"][:2]):
                    seq, total_length = (prompt, prompt) if run == 0 else (1, prompt + 1)
                    dims = {**step_dims(entry, folder, batch, args.max_length, seq),
                            "total_sequence_length": total_length}
                    arena, total = genai_estimate(zoo / entry["file"], dims, args.max_length)
                    step = f"prefill {prompt}" if run == 0 else f"decode past {prompt}"
                    plain = plain_activations(zoo / entry["file"], step_dims(entry, folder, batch, *(
                        (0, prompt) if run == 0 else (prompt, 1))))
                    rows.append([str(entry["name"]), "yes" if entry["held_out"] else "no", str(batch), step,
                                 f"{peak:,}", plain, f"{arena:,}", f"{arena - peak:+,}", f"{total:,}"])
    print(f"onnxruntime-genai {args.genai_version or ''} generator (past_present_share_buffer, max_length "
          f"{args.max_length}), its session profiled: arena activations in bytes (the prepacked weights apart; the "
          "KV cache and the logits are the generator's own buffers, outside the arena)")
    print(markdown_table(("export", "held out", "batch", "run", "genai arena peak B", "plain report B",
                          "shared-buffer estimate B", "est-meas B", "what-if total peak B"), rows))
    exact = sum(1 for r in rows if r[7] == "+0")
    print(f"\n{exact} of {len(rows)} runs exact")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "_save":  # (in an exporter's Python: see build)
        save_tiny_decoder(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 8 and sys.argv[1] == "_generate":  # (in --genai-python: see genai)
        generate_profiled(sys.argv[2], *(int(a) for a in sys.argv[3:7]), sys.argv[7])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("build", "measure", "genai"))
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"the exports' folder (default {DEFAULT_OUT})")
    parser.add_argument("--genai-python", default=os.environ.get("GENAI_PYTHON"),
                        help="a Python with onnxruntime-genai (its model builder), transformers and torch")
    parser.add_argument("--optimum-python", default=os.environ.get("OPTIMUM_PYTHON"),
                        help="a Python with optimum-onnx, transformers < 4.58 and torch")
    parser.add_argument("--set", choices=("dev", "held-out", "all"), default="all")
    parser.add_argument("--models", nargs="+", default=None, help="only these exports")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--contexts", type=int, nargs="+", default=[32, 96, 200],
                        help="decode steps: the past cache's lengths")
    parser.add_argument("--prefill", type=int, nargs="+", default=[32, 200],
                        help="measure: the prefill steps' tokens")
    parser.add_argument("--max-length", type=int, default=256,
                        help="genai: the generator's max_length (the shared buffers' positions)")
    parser.add_argument("--genai-version", default="", help="genai: the onnxruntime-genai release, for the heading")
    args = parser.parse_args()
    if args.command == "build":
        build(args)
    elif args.command == "measure":
        measure(args)
    else:
        genai(args)


if __name__ == "__main__":
    main()
