"""The planner rounds whose learned types shapes/carry.carried_types carries, each checked against inferring the
whole graph again (what the round did before): the same types in the same order, or counted as different.

    python benchmarks/carried_rounds.py [--zoo DIR ...]

For the fixtures (at default_dim 4) and every model under each --zoo (ZOO.md: ~/.cache/onnxmem-zoo, -zoo2, -zoo3,
-zoo31), `analysis` on both providers; every planner round (targets/ort/planner._planner_rounds) that learns types
calls carried_types, and each call that carries is compared with _collect_types of ONNX's inference of the same
model. Prints one table: per source, the rounds carried, those left to inference (carried_types said None), and
the carried rounds whose types or order differ from the inference's (must be 0), with the seconds each way.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from tables import markdown_table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", action="append", type=Path, default=[])
    args = parser.parse_args()
    from fixture_dims import fixture_paths

    import onnxmem.targets.ort.planner as planner
    from onnxmem.ir.tensor_types import TypeDecoder
    from onnxmem.passes.pipeline import analysis
    from onnxmem.shapes.infer import _collect_types, _inferred

    carry = planner.carried_types
    counts: dict[str, float] = {}

    def checked(light, before, learned):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        got = carry(light, before, learned)
        counts["carry_s"] += time.perf_counter() - start
        if got is None:
            counts["left"] += 1
            return None
        start = time.perf_counter()
        again = _collect_types(_inferred(light, data_prop=False).graph, TypeDecoder())
        counts["infer_s"] += time.perf_counter() - start
        counts["carried"] += 1
        if got != again or list(got) != list(again):
            counts["different"] += 1
        return got

    planner.carried_types = checked
    sources = [("fixtures", [str(p) for p in fixture_paths()])]
    sources += [(zoo.name, sorted(str(p) for p in zoo.expanduser().rglob("*.onnx"))) for zoo in args.zoo]
    rows = []
    for name, paths in sources:
        counts.update(carried=0, left=0, different=0, carry_s=0.0, infer_s=0.0)
        failed = 0
        for path in paths:
            for provider in ("cpu", "cuda"):
                try:
                    analysis(path, {}, default_dim=4, provider=provider)
                except Exception:  # noqa: BLE001 - a model the analysis refuses: counted, not checked
                    failed += 1
        rows.append([name, str(len(paths)), str(int(counts["carried"])), str(int(counts["left"])),
                     str(int(counts["different"])), f"{counts['carry_s']:.3f}", f"{counts['infer_s']:.3f}",
                     str(failed)])
    print(markdown_table(["source", "models", "rounds carried", "left to inference", "different",
                          "carry s", "inference s (carried rounds)", "analyses refused"], rows))


if __name__ == "__main__":
    main()
