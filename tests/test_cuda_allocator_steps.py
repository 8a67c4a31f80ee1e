"""The caching-allocator replay (onnxmem/targets/torch/cuda/allocator.py) over whole training steps, against the
committed H100 rows (benchmarks/results/cuda: max_memory_reserved per phase, memory_stats at the step's end) through
benchmarks/cuda/score_reserved.py, which turns onnxmem's simulated first step into PyTorch's allocations. The
exports the rows were measured on are committed beside them (graphs only), so no GPU and no torch is needed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.cuda import score_reserved  # noqa: E402
from onnxmem.targets.torch.cuda.allocator import replay, replay_named, replay_phases  # noqa: E402

MIB = 2**20
TRANSFORMERS = {"gpt2", "llama_gqa", "vit_small", "bert", "t5"}  # architectures whose steps hold no convolution
CONVOLUTIONS = {"resnet18", "convnext_atto", "mobilenet_v3_small", "tiny_cnn"}

_scored: dict[tuple[frozenset[str], bool], list[dict[str, Any]]] = {}


def scored(models: set[str], as_emitted: bool = False) -> list[dict[str, Any]]:
    """Give score_reserved's rows for these models (every model's computed once per test session)."""
    key = (frozenset(TRANSFORMERS | CONVOLUTIONS if not as_emitted else models), as_emitted)
    if key not in _scored:
        _scored[key] = score_reserved.score_rows([score_reserved.RESULTS], as_emitted, set(key[0]))
    rows = [s for s in _scored[key] if s["row"].split("/")[0] in models]
    if not rows:
        pytest.skip("no committed training rows with exports")
    return rows


def test_a_free_releases_the_block_it_names_not_the_latest_of_its_size() -> None:
    # three 8 MiB activations: a and b share a 20 MiB segment (kLargeBuffer, split), c opens a second one. Freeing a
    # leaves 8 + 4 MiB free in the first segment and 12 MiB in the second: a 16 MiB request finds no block and makes
    # a segment. Freeing "the latest 8 MiB allocation" frees c instead, whose segment merges back to 20 MiB free and
    # takes the request.
    named = [("a", 8 * MIB, False), ("b", 8 * MIB, False), ("c", 8 * MIB, False), ("a", 8 * MIB, True),
             ("d", 16 * MIB, False)]
    assert replay_named(named).reserved == 56 * MIB
    assert replay([(n, f) for _, n, f in named]).reserved == 40 * MIB


def test_held_requests_lend_their_segments_spare_room_and_are_not_counted() -> None:
    events = [("x", 300_000, False), ("y", 600_000, False)]  # rounded to 512 bytes: 300_032 + 600_064
    alone = replay_named(events)
    assert (alone.allocated, alone.reserved, alone.small_segments) == (900_096, 2 * MIB, 1)
    after_warm_up = replay_named(events, held=(MIB,))  # the warm-up's 1 MiB in a 2 MiB small segment
    assert (after_warm_up.allocated, after_warm_up.reserved, after_warm_up.segments) == (900_096, 0, 0)
    with pytest.raises(ValueError, match="no live allocation"):
        replay_named([("x", 512, True)])


def test_each_phase_has_its_own_allocated_peak_and_keeps_the_segments_before_it() -> None:
    phases = replay_phases([("forward", "act", 30 * MIB, False), ("forward", "act", 30 * MIB, True),
                            ("backward", "grad", 4 * MIB, False), ("backward", "grad", 4 * MIB, True)])
    assert list(phases) == ["forward", "backward"]
    assert (phases["forward"].allocated, phases["forward"].reserved) == (30 * MIB, 30 * MIB)
    # the 4 MiB gradient splits the cached 30 MiB segment: no new segment, the phase's peak is its own
    assert (phases["backward"].allocated, phases["backward"].reserved, phases["backward"].segments) == \
        (4 * MIB, 30 * MIB, 1)


def test_the_baseline_parameters_and_inputs_reserve_what_the_rows_measured() -> None:
    rows = {r["key"]: r for r in score_reserved.read_rows([score_reserved.RESULTS])}
    for s in scored(TRANSFORMERS | CONVOLUTIONS):
        row = rows[f"training/{s['row']}"]
        measured = row["baseline"]["reserved"] - row["before_model"]["reserved"]
        replayed = s["phases"]["data"].reserved
        assert replayed == measured, (s["row"], replayed / MIB, measured / MIB)


def test_transformer_steps_reserve_max_memory_reserved_within_2_5_percent() -> None:
    rows = scored(TRANSFORMERS)
    assert len(rows) >= 25
    for s in rows:  # t5's 2.0% (6 MiB) is the largest
        assert abs(s["replay_reserved"] - s["reserved"]) <= 0.025 * s["reserved"], \
            (s["row"], s["replay_reserved"] / MIB, s["reserved"] / MIB)


def test_the_small_pool_is_replayed_to_within_one_segment_on_every_model() -> None:
    # memory_stats at the end of step 1 minus the warm-up's one 2 MiB small segment
    for s in scored(TRANSFORMERS | CONVOLUTIONS):
        measured = s["stats"]["segment.small_pool.current"] - 1
        replayed = s["phases"]["optimizer"].small_segments
        if s["row"].startswith("t5/"):
            assert abs(replayed - measured) <= 3, s["row"]
        else:
            assert abs(replayed - measured) <= 1, (s["row"], replayed, measured)


def test_adamw_states_and_foreach_temporaries_allocated_per_parameter_match_the_optimizer_phase() -> None:
    # the step model emits a parameter's two AdamW states as one buffer and the foreach update's exp_avg_sq_sqrt as
    # one buffer of all the parameters: replayed so, gpt2 and llama_gqa reserve 4-34 MiB too little (a
    # parameter's two states become one request, the temporaries one request in a segment of its own whose room the
    # states then share); replayed as PyTorch allocates them, the optimizer phase's reserved is the row's
    split = {s["row"]: s for s in scored({"gpt2", "llama_gqa"}) if "/adamw/" in s["row"]}
    emitted = {s["row"]: s for s in scored({"gpt2", "llama_gqa"}, as_emitted=True) if "/adamw/" in s["row"]}
    assert len(split) == 6
    for name, s in split.items():
        measured = s["measured_phases"]["optimizer"][1]
        assert s["phases"]["optimizer"].reserved == measured, name
        assert emitted[name]["phases"]["optimizer"].reserved <= measured - 4 * MIB, name


def test_a_convolution_backward_takes_its_two_cudnn_workspaces_between_its_gradients() -> None:
    # resnet18's layer2.1.conv1 (3x3, 128 channels on 16 x 16, the rows' rules cover it): grad_input, the
    # backward-data workspace taken and freed, grad_weight, the backward-filter workspace taken and freed
    run = score_reserved.first_step_run(*_resnet18("sgd", "fp32"))
    at = next(e for e, label in enumerate(run.events.label) if label.endswith(" node_conv2d_8") and
              run.events.phase[e] == "backward")
    temporaries = next(i for i, b in enumerate(run.buffers) if b.name == "node_conv2d_8 (backward temporaries)")
    scratch, weights = run.convolutions["node_conv2d_8 (backward temporaries)"]
    assert weights == ("layer2.1.conv1.weight",)
    assert scratch.backward_data == (4 + 4 + 0.5625) * MIB  # x + y + w: [32, 128, 16, 16] fp32 and 128x128x3x3
    assert scratch.backward_filter == scratch.backward_data + 128 * 31 * 1024
    names = {i: b.name for i, b in enumerate(run.buffers)}
    order = []
    for _, name, _, is_free in score_reserved.torch_events(run, "sgd"):
        label = names.get(name) if isinstance(name, int) else name[1] if name[0] == temporaries else None
        if label in ("grad relu_6", "data", "grad layer2.1.conv1.weight", "filter"):
            order.append((label, is_free))
    # (the weight's gradient is freed at the step's end)
    assert order[:7] == [("grad relu_6", False), ("data", False), ("data", True),
                         ("grad layer2.1.conv1.weight", False), ("filter", False), ("filter", True),
                         ("grad relu_6", True)]
    assert all(b.name != "node_conv2d_8 (backward temporaries)" or b.start == b.end == at for b in run.buffers)


@pytest.mark.xfail(strict=True, reason="the convolutions no single-op row covers (strided: resnet18's stem and "
                   "downsampling, tiny_cnn's second conv, mobilenet's and convnext's stems; 1x1 over 256 channels "
                   "or under 14x14 positions: convnext's and mobilenet's) carry no workspace in the replay, and "
                   "tiny_cnn's allocated peak itself is 21% under; the covered ones take their two cuDNN workspaces "
                   "(see BENCHMARKS.md 'CUDA reserved: cuDNN's two backward workspaces')")
def test_convolution_steps_reserve_max_memory_reserved_within_5_percent() -> None:
    for s in scored(CONVOLUTIONS):
        assert abs(s["replay_reserved"] - s["reserved"]) <= 0.05 * s["reserved"], s["row"]


def _resnet18(optimizer: str, precision: str) -> tuple[Any, dict[str, Any]]:
    rows = {r["key"]: r for r in score_reserved.read_rows([score_reserved.RESULTS])}
    exports = score_reserved.find_exports([score_reserved.RESULTS], [])
    if "resnet18.full.onnx" not in exports:
        pytest.skip("no committed resnet18 export")
    return exports["resnet18.full.onnx"], rows[f"training/resnet18/full/{optimizer}/{precision}"]
