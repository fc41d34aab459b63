"""Sweep throughput: a 1,000-point sweep around the default paged attention configuration (trn1),
timed end to end through tilelab.sim.sweep (points per second, valid and skipped).

    PYTHONPATH=build/python .venv/bin/python bench/sim/sweep_bench.py [--threads N] [--points 1000]
"""

import argparse
import time

import tilelab
from tilelab import sim


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
    start = time.perf_counter()
    rows = sim.sweep(grid=grid, machine="trn1", progress=False)
    seconds = time.perf_counter() - start
    valid = sum(r.valid for r in rows)
    print(f"{len(rows)} points ({valid} valid, {len(rows) - valid} skipped) on {args.threads} "
          f"threads: {seconds:.2f} s, {len(rows) / seconds:.0f} points/s")


if __name__ == "__main__":
    main()
