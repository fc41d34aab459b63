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


def alternating_medians_between_probes(calls, probe, warmup: int, repeats: int) -> list[float]:
    """alternating_medians of `calls`, with `probe` (an untimed measurement of the machine, such
    as bench_flash's MeasuredAlongside) run once before them and once after. Run between the
    calls instead, the probe slowed the call right after it (decode 10-20%, bf16 prefill 5-100%,
    B1 H16 S512 D128 on a 2-vCPU Zen 4 VM): another process's burst leaves the machine slower for
    a moment. The warmup calls (at least one) follow the first probe."""
    probe()
    medians = alternating_medians(calls, max(warmup, 1), repeats)
    probe()
    return medians
