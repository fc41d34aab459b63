"""Sweep results pinned exactly: every metric of every point (and every invalid point's message)
of a sweep like bench/sim/sweep_bench.py, in order, on one thread and on two. The digests were
computed before the simulator and the sweep were optimised for speed; a change here is a change
of simulation results."""

import hashlib
import json

import tilelab
from tilelab import sim

# A small batch (as test_sim.py's SMALL) over schedules with invalid points among them.
BASE = dict(prefill=[(128, 2048), (100, 1024)], decode=[1024, 300], num_heads=4, num_kv_heads=2)
GRID = {
    "block_size": [8, 32, 128],
    "large_tile_size": [512, 2048, 8192],
    "kv_buffers": [1, 3],
    "seed": [1, 2],
}
KERNEL_GRID = {"variant": ["tiled", "fully_optimized"], "M": [2048, 100], "K": [2048], "N": [2048]}

PAGED_DIGEST = "b094609d3e33e8ee2beaddf362d71e88f37ee3b270b9b873ba3d4c2f73799883"
KERNEL_DIGEST = "5fa2e14bf9ca073c954666d2edf1eb5d48e9c7e112973f3155565babf009938a"


def digest(rows) -> str:
    """sha256 of the points in order: grid values, validity, error text and all metrics, floats
    by repr (exact)."""
    points = []
    for r in rows:
        metrics = {k: repr(v) for k, v in sorted(r.metrics.items())}
        points.append([repr(list(r.settings.items())), r.valid, r.error, metrics])
    return hashlib.sha256(json.dumps(points).encode()).hexdigest()


def test_paged_sweep_results_are_pinned_and_thread_count_independent(restore_num_threads):
    tilelab.set_num_threads(1)
    serial = sim.sweep(BASE, grid=GRID, progress=False)
    tilelab.set_num_threads(2)
    parallel = sim.sweep(BASE, grid=GRID, progress=False)
    assert len(serial) == 36
    assert sum(not r.valid for r in serial) > 0
    assert digest(serial) == digest(parallel) == PAGED_DIGEST


def test_kernel_sweep_results_are_pinned_and_thread_count_independent(restore_num_threads):
    tilelab.set_num_threads(1)
    serial = sim.sweep(grid=KERNEL_GRID, kernel="matmul", progress=False)
    tilelab.set_num_threads(2)
    parallel = sim.sweep(grid=KERNEL_GRID, kernel="matmul", progress=False)
    assert [r.valid for r in serial] == [True, False, True, False]
    assert digest(serial) == digest(parallel) == KERNEL_DIGEST


def test_points_differing_in_the_seed_share_a_run_and_bad_seeds_stay_invalid():
    rows = sim.sweep(BASE, grid={"seed": [1, -1, 2, 2**32], "kv_buffers": [1, 2]}, progress=False)
    assert [r.valid for r in rows] == [True, True, False, False, True, True, False, False]
    assert rows[2].error == "seed: expected 0 <= seed < 2**32, got -1"
    assert rows[6].error == "seed: expected 0 <= seed < 2**32, got 4294967296"
    # The seed places blocks in the cache; a timing-only run is the same for every seed.
    assert rows[0].metrics == rows[4].metrics
    assert rows[1].metrics == rows[5].metrics
    # Each equals the point simulated on its own.
    single = sim.sweep(BASE, grid={"seed": [2], "kv_buffers": [2]}, progress=False)
    assert single[0].metrics == rows[5].metrics
