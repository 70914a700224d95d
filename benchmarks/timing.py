"""Timing shared by the benchmarks: cases run alternately, so that load from other
processes on a shared machine hits every case alike."""

from __future__ import annotations

import time
from collections.abc import Callable


def interleaved_times(
    steps: dict[str, Callable[[], None]], repeats: int, sync: Callable[[], None] = lambda: None
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall, process CPU) seconds of each step per repeat, run alternately (a, b, a, b,
    ...). With one thread, CPU time leaves out the time the process spent descheduled."""
    for step in steps.values():  # warm-up: caches, allocator, kernel selection
        step()
    sync()
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            sync()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return wall, cpu
