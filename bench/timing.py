"""Timing shared by the benchmark scripts: alternating calls, medians."""

from __future__ import annotations

import statistics
import time


def alternating_medians(calls, warmup: int, repeats: int) -> list[float]:
    """Median wall time in seconds of each of `calls`, timed in alternation (call 0, call 1, ...,
    call 0, ...) so that every call sees the same drift of a shared machine and their ratios are
    fair."""
    for _ in range(warmup):
        for call in calls:
            call()
    samples = [[] for _ in calls]
    for _ in range(repeats):
        for call, times in zip(calls, samples, strict=True):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]
