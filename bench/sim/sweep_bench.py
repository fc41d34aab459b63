"""Sweep throughput: a 1,000-point sweep around the default paged attention configuration (trn1),
timed end to end through tilelab.sim.sweep (points per second, valid and skipped).

    PYTHONPATH=build/python .venv/bin/python bench/sim/sweep_bench.py [--threads N] [--points 1000]
"""

import argparse
import os
import time

import tilelab
from tilelab import sim


def cpu_model() -> str:
    """/proc/cpuinfo's first "model name", so that figures from different machines stay apart."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=tilelab.num_threads())
    parser.add_argument("--points", type=int, default=1000)
    args = parser.parse_args()
    tilelab.set_num_threads(args.threads)
    # 5 block sizes x 5 tile sizes x 4 buffer counts = 100 schedules (some invalid), each with
    # seeds (block placement) up to the requested point count: the default batch throughout.
    seeds = max(1, args.points // 100)
    grid = {"block_size": [8, 16, 32, 64, 128], "large_tile_size": [512, 1024, 2048, 4096, 8192],
            "kv_buffers": [1, 2, 3, 4], "seed": list(range(1, seeds + 1))}
    print(f"sweep throughput: CPU: {cpu_model()}, {os.cpu_count()} CPUs")
    start, cpu_start = time.perf_counter(), time.process_time()
    rows = sim.sweep(grid=grid, machine="trn1", progress=False)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    valid = sum(r.valid for r in rows)
    # CPU time over all threads: on a machine shared with other work, wall time also counts
    # the time other processes held the cores.
    print(f"{len(rows)} points ({valid} valid, {len(rows) - valid} skipped) on {args.threads} "
          f"threads: {seconds:.2f} s, {len(rows) / seconds:.0f} points/s "
          f"(CPU time {cpu_seconds:.2f} s)")


if __name__ == "__main__":
    main()
