"""The fixtures and the dims the accuracy benchmarks bind them with (batch from the benchmark, the rest here)."""

from __future__ import annotations

from pathlib import Path

import onnx

from onnxmem.shapes.dims import input_dims

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OTHER_DIMS = {"seq": 32, "past": 8}  # any other symbolic dim: 16


def fixture_paths() -> list[Path]:
    """Give every fixture model, sorted by name."""
    return sorted(FIXTURES.glob("*.onnx"))


def dims_for(path: Path, batch: int) -> dict[str, int]:
    """Give a binding of every symbolic input dim of the fixture: batch, seq 32, past 8, anything else 16."""
    model = onnx.load(str(path), load_external_data=False)
    names = {d.name for d in input_dims(model)}
    return {name: batch if name == "batch" else OTHER_DIMS.get(name, 16) for name in names
            if "+" not in name and "-" not in name and "*" not in name}
