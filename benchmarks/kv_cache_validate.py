"""A decoder with its KV cache, validated against onnxruntime on CPU at three contexts: prefill (past=0) and decode
steps over a cache of 16 and 64 positions.

    python benchmarks/kv_cache_validate.py [--batch 2] [--seq 16]

The model is benchmarks/llm_graphs.py's tiny Llama shape (2 layers, hidden 64, grouped-query attention) with its
weights written (random, float16), so that onnxruntime can run it; `onnxmem validate` plans it and measures the
session's arena. Prints one table: the estimate, the measurement and their difference at each context.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy
import onnx
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from llm_graphs import SHAPES, make_llama  # noqa: E402
from tables import markdown_table  # noqa: E402


def tiny_decoder_with_weights(path: Path) -> None:
    """Write the tiny decoder with random float16 weights inside the file."""
    model = make_llama(SHAPES["tiny"])
    rng = numpy.random.default_rng(0)
    for i, t in enumerate(model.graph.initializer):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            dims = tuple(t.dims)
            data = (rng.standard_normal(dims) * 0.02).astype(numpy.float16)
            if t.name in ("eps", "scale"):
                data = numpy.full(dims, 1e-5 if t.name == "eps" else 0.125, numpy.float16)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(data, t.name))
    onnx.save(model, str(path))


def kv_cache_row(path: Path, dims: dict[str, int]) -> list[str]:
    """Run one step of the decoder in onnxruntime (CPU) and add up the bytes of the past arrays it is fed and of
    the present arrays it returns (every output but the logits, the first: llm_graphs.make_llama's outputs);
    give the row that sets them beside the report's KV cache."""
    import onnxruntime

    import onnxmem
    from onnxmem.measure.inputs import make_feeds

    model = onnx.load(str(path))
    feeds = make_feeds(model, {**dims, "past + seq": dims["past"] + dims["seq"]})
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    returned = dict(zip(names, session.run(names, feeds), strict=True))
    past = sum(a.nbytes for name, a in feeds.items() if name.startswith("past_key_values."))
    present = sum(returned[name].nbytes for name in names[1:])
    kv = onnxmem.analyze(str(path), dims, provider="cpu").inference.kv_cache
    estimated = (kv.past_bytes, kv.present_bytes) if kv is not None else (0, 0)
    return [f"past={dims['past']}, seq={dims['seq']}", f"{estimated[0]:,}", f"{estimated[1]:,}",
            f"{sum(estimated):,}", f"{past + present:,}",
            "yes" if estimated == (past, present) else "no"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    args = parser.parse_args()
    import onnxmem

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama_tiny_weights.onnx"
        tiny_decoder_with_weights(path)
        kv_rows = [kv_cache_row(path, {"batch": args.batch, "seq": seq, "past": past})
                   for past, seq in ((0, args.seq), (16, 1), (64, 1))]
        for past, seq in ((0, args.seq), (16, 1), (64, 1)):
            dims = {"batch": args.batch, "seq": seq, "past": past}
            result = onnxmem.validate(str(path), dims, provider="cpu")
            for run in result.runs:
                rows.append([f"past={past}, seq={seq}", run.phase, f"{run.estimated.peak_activation_bytes:,}",
                             f"{run.measured.peak_activation_bytes:,}", f"{run.activation_difference_bytes:,}",
                             "yes" if run.activation_difference_bytes == 0 else "no"])
        # fit --search past, checked by validate at the answer and one past it: the budget is the estimated peak at
        # a context of 40 (so the answer is 40 where the peak grows with the context), decode steps of one token;
        # where validate is exact at both, onnxruntime's own peaks put the answer where fit put it
        decode = {"batch": args.batch, "seq": 1}
        inference = onnxmem.analyze(str(path), {**decode, "past": 40}, provider="cpu").inference
        assert inference is not None
        budget = inference.peak_bytes
        fitted = onnxmem.fit(str(path), memory=budget, search="past", dims=decode, provider="cpu")
        answer = fitted.max_value
        peaks = {p.value: p.peak_bytes for p in fitted.curve}
        fit_rows = []
        for past in (answer, answer + 1):
            result = onnxmem.validate(str(path), {**decode, "past": past}, provider="cpu")
            exact = all(run.activation_difference_bytes == 0 for run in result.runs)
            fit_rows.append([f"past={past}", f"{peaks.get(past, 0):,}", f"{budget:,}",
                             "yes" if peaks.get(past, budget + 1) <= budget else "no", "yes" if exact else "no"])
    print(markdown_table(["context", "run", "estimated activations (B)", "measured (B)", "difference (B)",
                          "exact"], rows))
    print(f"\nfit --search past (batch {args.batch}, one token per step) for a budget of {budget:,} B: "
          f"past={answer}; validate at the answer and one past it:\n")
    print(markdown_table(["context", "estimated peak (B)", "budget (B)", "fits", "validate exact (every run)"],
                         fit_rows))
    print("\nThe KV cache line (report.inference.kv_cache_bytes: past inputs + present outputs) against the arrays "
          "onnxruntime (CPU) is fed and returns in one step:\n")
    print(markdown_table(["context", "estimated past (B)", "estimated present (B)", "kv_cache_bytes",
                          "onnxruntime past + present (B)", "exact"], kv_rows))


if __name__ == "__main__":
    main()
