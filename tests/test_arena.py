"""onnxruntime's BFC arena, simulated (onnxmem/arena.py): regions, best fit, splitting and coalescing worked out by
hand from bfc_arena.cc, and the first run's held bytes of small graphs."""

from __future__ import annotations

from onnxmem.analyze import analysis
from onnxmem.arena import INITIAL_REGION, BFCArena, first_run_events, held_after, rounded

from . import graphs

MiB = 1 << 20


def test_regions_grow_by_powers_of_two_from_one_mib() -> None:
    arena = BFCArena()
    arena.alloc(100)  # a 1 MiB region (then the next region size doubles: 2 MiB)
    assert arena.regions == [INITIAL_REGION]
    arena.alloc(MiB)  # no free chunk of 1 MiB left: a region of 2 MiB (it needed no doubling: next 4 MiB)
    assert arena.regions == [MiB, 2 * MiB]
    arena.alloc(5 * MiB)  # 4 MiB doubles to 8 MiB to hold it (and stays the next size)
    assert arena.regions == [MiB, 2 * MiB, 8 * MiB]
    arena.alloc(8 * MiB)  # held 8 MiB region is split: 3 MiB left in it; a new region of 8 MiB
    assert arena.regions == [MiB, 2 * MiB, 8 * MiB, 8 * MiB]
    assert arena.held_bytes == 19 * MiB


def test_a_freed_chunk_coalesces_and_is_reused_best_fit() -> None:
    arena = BFCArena()
    a = arena.alloc(300 * 1024)
    b = arena.alloc(300 * 1024)
    arena.free(a)
    arena.free(b)  # a, b and the rest of the region coalesce into one 1 MiB chunk
    assert arena.alloc(MiB) == a and arena.regions == [MiB]


def test_best_fit_takes_the_smallest_chunk_that_holds_the_request() -> None:
    arena = BFCArena()
    small, keep, large, keep2 = (arena.alloc(n) for n in (1024, 256, 4096, 256))
    arena.free(large)
    arena.free(small)
    assert arena.alloc(1000) == small  # 1 KiB holds 1000 B (rounded to 1024): not the 4 KiB chunk
    assert rounded(1000) == 1024 and keep != keep2


def test_reserved_bytes_are_held_at_their_exact_size() -> None:
    assert held_after([], reserved=135_208) == 135_208


def test_a_chain_of_4_mib_tensors_holds_what_onnxruntime_holds() -> None:
    # chain: x -> 4 MiB activations one after another (measured: the arena holds 8 MiB after the first run: two
    # 4 MiB regions, as each tensor is freed once the next one is made)
    analysed = analysis(graphs.chain())
    assert held_after(first_run_events(analysed.graph, analysed.timeline)) == 8 * MiB


def test_validate_reports_the_arenas_held_bytes_as_simulated() -> None:
    # the arena's regions and reserved bytes after each run, measured by onnxruntime's profile and simulated
    import pytest

    pytest.importorskip("onnxruntime")
    from pathlib import Path

    from benchmarks.fixture_dims import dims_for
    from onnxmem.validate import validate

    for name, batch in (("mlp", 8), ("transformer_encoder", 32), ("gpt_decoder", 32)):
        path = Path(__file__).resolve().parent.parent / "fixtures" / f"{name}.onnx"
        result = validate(path, dims_for(path, batch), runs=2)
        assert [r.estimated.arena_held_bytes for r in result.runs] == \
            [r.measured.arena_held_bytes for r in result.runs], name
