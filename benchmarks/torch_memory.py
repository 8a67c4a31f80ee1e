"""PyTorch's CPU allocator measured by its profiler: the one peak the training benchmarks and the torch tests read."""

from __future__ import annotations

from collections.abc import Callable


def c10_peak(work: Callable[[], object]) -> int:
    """Give the peak of live CPU bytes above those live before `work`, from the profiler's memory events (every
    allocation and free of PyTorch's c10 allocator, exact sizes), in the order they happened."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        work()
    events = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(prof.profiler.kineto_results.events())
                    if e.name() == "[memory]")
    live = peak = 0
    for _, _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak
