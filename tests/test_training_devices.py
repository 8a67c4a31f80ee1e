"""The training devices behind one interface (onnxmem/targets/torch/): the registry and its declared options, the
CLI's device options, and the replay of PyTorch's CUDA caching allocator, worked by hand from
c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch 001074d2; each case names the lines it follows)."""

from __future__ import annotations

from pathlib import Path

import pytest

import onnxmem
from onnxmem.errors import TrainingOptionError
from onnxmem.targets.torch import DEVICES, TorchCpu, TorchCuda, device_named
from onnxmem.targets.torch.cuda.allocator import (
    CachingAllocator,
    allocation_size,
    replay,
    round_size,
    roundup_power2_next_division,
)
from onnxmem.training.step import TrainingOptions

from . import graphs

KIB, MIB = 1024, 1024 * 1024


def test_round_size_rounds_to_512_bytes() -> None:
    # round_size: "if (size < kMinBlockSize) return kMinBlockSize; ... kMinBlockSize * ((size + kMinBlockSize - 1) /
    # kMinBlockSize)"; roundup_power2_divisions is off by default (divisions 0)
    assert [round_size(n) for n in (0, 1, 512, 513, 1000, 1024)] == [512, 512, 512, 1024, 1024, 1024]
    # roundup_power2_next_division's own example: 1200 in 4 divisions of 1024..2048 is 1280; round_size takes it only
    # when divisions are set and the size is over kMinBlockSize * divisions: 5000 in 2 divisions of 4096..8192
    assert roundup_power2_next_division(1200, 4) == 1280
    assert round_size(5000, roundup_power2_divisions=2) == 6144 and round_size(5000) == 5120
    assert round_size(1200, roundup_power2_divisions=4) == 1536  # (1200 is not over 512 x 4)


def test_allocation_size_picks_the_segment() -> None:
    # get_allocation_size: <= kSmallSize (1 MiB) -> kSmallBuffer (2 MiB); < kMinLargeAlloc (10 MiB) -> kLargeBuffer
    # (20 MiB); else rounded up to kRoundLarge (2 MiB)
    assert allocation_size(MIB) == 2 * MIB
    assert allocation_size(MIB + 512) == 20 * MIB
    assert allocation_size(10 * MIB - 512) == 20 * MIB
    assert allocation_size(10 * MIB) == 10 * MIB
    assert allocation_size(12 * MIB + 512) == 14 * MIB


def test_small_requests_share_a_2_mib_segment() -> None:
    # 1000 B rounds to 1024, small pool, a 2 MiB segment split (remaining >= kMinBlockSize: should_split's small
    # rule); the second request takes the best fit, the 2 MiB - 1024 remainder, and splits it again
    peaks = replay([(1000, False), (1000, False)])
    assert (peaks.allocated, peaks.reserved, peaks.segments) == (2048, 2 * MIB, 1)
    # three 1 MiB requests: 1 MiB is still small (size <= kSmallSize); two fill a segment, the third makes another
    peaks = replay([(MIB, False)] * 3)
    assert (peaks.allocated, peaks.reserved, peaks.segments) == (3 * MIB, 4 * MIB, 2)


def test_a_large_request_splits_a_20_mib_segment_and_a_larger_one_rounds_to_2_mib() -> None:
    # 1.5 MiB: large pool, a kLargeBuffer segment; should_split's large rule: remaining 18.5 MiB > kSmallSize
    peaks = replay([(3 * MIB // 2, False)])
    assert (peaks.allocated, peaks.reserved) == (3 * MIB // 2, 20 * MIB)
    # 12 MiB + 1 B: rounds to 12 MiB + 512; a 14 MiB segment; the remaining 2 MiB - 512 is over 1 MiB: split
    peaks = replay([(12 * MIB + 1, False)])
    assert (peaks.allocated, peaks.reserved) == (12 * MIB + 512, 14 * MIB)
    # 11 MiB: a 12 MiB segment whose remaining 1 MiB is not over kSmallSize: not split, the block handed out whole
    # (memory_allocated counts block->size: alloc_found_block's increase_stat(allocated_bytes, block->size))
    peaks = replay([(11 * MIB, False)])
    assert (peaks.allocated, peaks.reserved) == (12 * MIB, 12 * MIB)


def test_a_freed_block_merges_with_its_free_neighbours() -> None:
    # two 1.5 MiB blocks split from one 20 MiB segment, both freed: free_block's try_merge_blocks joins them with
    # the 17 MiB remainder into one 20 MiB block, which an 18 MiB request then fits (get_free_block's lower_bound):
    # no new segment (unmerged, the largest free block would be the 17 MiB remainder)
    allocator = CachingAllocator()
    first, second = allocator.malloc(3 * MIB // 2), allocator.malloc(3 * MIB // 2)
    allocator.free(first)
    allocator.free(second)
    allocator.malloc(18 * MIB)
    assert (allocator.reserved, allocator.segments, allocator.allocated) == (20 * MIB, 1, 18 * MIB)


def test_best_fit_takes_the_smallest_free_block_that_fits() -> None:
    # one 20 MiB segment carved into a (3 MiB), b (2 MiB), c (4 MiB), d (2 MiB) and a 9 MiB remainder; a and c
    # freed (their neighbours are allocated: no merge). 2.5 MiB takes a (BlockComparatorSize orders the pool by
    # size: lower_bound gives the smallest block that fits), not c or the remainder; a's remaining 0.5 MiB is not
    # over kSmallSize, so a is handed out whole: memory_allocated grows by 3 MiB
    allocator = CachingAllocator()
    a, _, c, _ = (allocator.malloc(n * MIB) for n in (3, 2, 4, 2))
    allocator.free(a)
    allocator.free(c)
    before = allocator.allocated
    block = allocator.malloc(5 * MIB // 2)
    assert block.address == 0 and allocator.allocated - before == 3 * MIB and allocator.segments == 1


def test_max_split_size_keeps_small_requests_out_of_large_blocks() -> None:
    # with max_split_size 4 MiB, get_free_block refuses a block of max_split_size or more to a request under it
    # ("Do not return an oversized block for a large request"): the 18.5 MiB remainder of the first segment is
    # not handed to a 2 MiB request, which makes a second 20 MiB segment
    assert replay([(3 * MIB // 2, False), (2 * MIB, False)]).reserved == 20 * MIB
    assert replay([(3 * MIB // 2, False), (2 * MIB, False)], max_split_size=4 * MIB).reserved == 40 * MIB


def test_reserved_memory_stays_after_frees() -> None:
    # nothing returns a segment to the device without empty_cache (release_cached_blocks runs on a failed cudaMalloc)
    peaks = replay([(5 * MIB, False), (5 * MIB, True), (30 * MIB, False), (30 * MIB, True), (5 * MIB, False)])
    assert (peaks.allocated, peaks.reserved, peaks.segments) == (30 * MIB, 50 * MIB, 2)
    with pytest.raises(ValueError, match="no live allocation"):
        replay([(512, True)])


def test_the_device_models_expose_held_bytes() -> None:
    events = [(1000, False), (3 * MIB // 2, False), (1000, True)]
    cuda = TorchCuda().held_bytes(events)
    assert (cuda.allocated, cuda.reserved) == (1024 + 3 * MIB // 2, 2 * MIB + 20 * MIB)
    cpu = TorchCpu().held_bytes(events)
    assert cpu.allocated == cpu.reserved == 1000 + 3 * MIB // 2
    assert "H100" in TorchCuda().caveat and "convolution workspaces" in TorchCuda().caveat


def test_devices_are_registered_with_their_declared_options() -> None:
    assert set(DEVICES) == {"cuda", "cpu"}
    assert [o.name for o in DEVICES["cpu"].options] == ["threads", "isa"] and not DEVICES["cuda"].options
    assert device_named("cpu", {"threads": "4", "isa": "avx2"}) == TorchCpu(threads=4, isa="avx2")
    with pytest.raises(TrainingOptionError, match="takes no option 'threads'"):
        device_named("cuda", {"threads": 4})
    with pytest.raises(TrainingOptionError, match="whole number"):
        device_named("cpu", {"threads": "four"})
    with pytest.raises(TrainingOptionError, match="unknown device 'rocm'"):
        onnxmem.analyze(graphs.symbolic_mlp(), {"batch": 2}, training=TrainingOptions(device="rocm"))


def test_a_device_named_is_the_device_with_its_defaults() -> None:
    model = graphs.symbolic_mlp()
    for name, device in DEVICES.items():
        by_name = onnxmem.analyze(model, {"batch": 4}, training=TrainingOptions(device=name)).training
        by_object = onnxmem.analyze(model, {"batch": 4}, training=TrainingOptions(device=device)).training
        assert by_name is not None and by_name == by_object


def test_the_command_line_takes_device_options_and_refuses_another_device_s(tmp_path: Path) -> None:
    from .cli import run, save

    path = save(graphs.symbolic_mlp(), tmp_path / "mlp.onnx")
    common = ("report", path, "--dim", "batch=4", "--training", "--format", "json")
    code, new, err = run(*common, "--device", "cpu", "--device-option", "threads=2", "--device-option", "isa=avx2")
    assert code == 0, err
    code, old, err = run(*common, "--device", "cpu", "--cpu-threads", "2", "--cpu-isa", "avx2")
    assert code == 0 and old == new, err
    code, _, err = run(*common, "--device", "cuda", "--cpu-threads", "2")
    assert code == 2 and "--cpu-threads is an option of --device cpu" in err
    code, _, err = run(*common, "--device", "cuda", "--device-option", "isa=avx2")
    assert code == 2 and "device 'cuda' takes no option 'isa'" in err
    code, _, err = run("report", path, "--dim", "batch=4", "--device-option", "threads=2")
    assert code == 2 and "--device-option is a training option" in err
