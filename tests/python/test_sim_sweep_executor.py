"""tilelab.sim.sweep(executor=...): points run as tasks of a concurrent.futures executor (a real
dask.distributed LocalCluster with worker processes, process and thread pools) give the local
run's result in grid order, invalid points included; and the sweep's tqdm progress bar."""

import concurrent.futures
import math
import multiprocessing
import pathlib
import shutil
import sys

import pytest

from tilelab import sim

SMALL = dict(prefill=[(128, 1024)], decode=[512, 300], num_heads=2, num_kv_heads=1)
# 8 points, 4 of them invalid (block_size 48 is not a power of two); seeds share one run.
PAGED_GRID = {"block_size": [16, 48], "kv_buffers": [1, 2], "seed": [1, 2], "dtype": ["bf16"]}
PAGED_GRID_WITH_MACHINES = {
    "block_size": [32, 48],
    "machine": ["trn1", "trn2"],
    "machine.dma_bytes_per_ns_per_engine": [10.0, 40.0],
}
# Invalid points of two kinds: a bad variant and an M that is not a multiple of 128.
KERNEL_BASE = {"K": 256, "N": 512}
KERNEL_GRID = {"variant": ["tiled", "hoist_load", "bogus"], "M": [128, 256, 100]}
MACHINES_DIR = pathlib.Path(__file__).parents[2] / "sim" / "machines"


def rows_of(points):
    """The flat rows with NaN written as the string "nan", so that == compares invalid points."""
    return [
        {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in p.to_dict().items()}
        for p in points
    ]


def local_runs():
    return {
        "paged": sim.sweep(SMALL, grid=PAGED_GRID, progress=False),
        "paged_machines": sim.sweep(SMALL, grid=PAGED_GRID_WITH_MACHINES, progress=False),
        "kernel": sim.sweep(KERNEL_BASE, grid=KERNEL_GRID, kernel="matmul", progress=False),
    }


def executor_runs(executor):
    return {
        "paged": sim.sweep(SMALL, grid=PAGED_GRID, progress=False, executor=executor),
        "paged_machines": sim.sweep(
            SMALL, grid=PAGED_GRID_WITH_MACHINES, progress=False, executor=executor
        ),
        "kernel": sim.sweep(
            KERNEL_BASE, grid=KERNEL_GRID, kernel="matmul", progress=False, executor=executor
        ),
    }


@pytest.fixture(scope="module")
def local():
    runs = local_runs()
    # The grids do hold invalid points, reported with a reason and NaN metrics.
    assert [p.valid for p in runs["paged"]].count(False) == 4
    assert [p.valid for p in runs["kernel"]].count(False) == 5
    assert all(math.isnan(p["total_time_ns"]) and p.error for p in runs["kernel"] if not p.valid)
    return {name: rows_of(points) for name, points in runs.items()}


@pytest.fixture(scope="module")
def dask_executor():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client.get_executor()


def test_dask_local_cluster_gives_the_local_result(local, dask_executor):
    runs = executor_runs(dask_executor)
    for name, points in runs.items():
        assert isinstance(points, sim.SweepResult)
        assert rows_of(points) == local[name], name


def test_dask_workers_are_other_processes(dask_executor):
    import os

    pids = {dask_executor.submit(os.getpid).result() for _ in range(4)}
    assert os.getpid() not in pids


def test_dask_runs_large_grids_in_chunks(local, dask_executor):
    # More points than tasks: chunks of several points come back in grid order.
    grid = {"seed": list(range(1, 601)), "block_size": [16, 48]}
    here = sim.sweep(SMALL, grid=grid, progress=False)
    there = sim.sweep(SMALL, grid=grid, progress=False, executor=dask_executor)
    assert len(there) == 1200
    assert rows_of(there) == rows_of(here)


def test_process_pool_gives_the_local_result(local):
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        runs = executor_runs(pool)
    for name, points in runs.items():
        assert rows_of(points) == local[name], name


def test_thread_pool_gives_the_local_result(local):
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs = executor_runs(pool)
    for name, points in runs.items():
        assert rows_of(points) == local[name], name


def test_program_limits_go_with_the_tasks(dask_executor):
    # A limit lowered here makes every point invalid on the workers too.
    previous = sim.set_program_limits(max_instructions=10)
    try:
        local_rows = sim.sweep(SMALL, grid={"kv_buffers": [1, 2]}, progress=False)
        remote = sim.sweep(
            SMALL, grid={"kv_buffers": [1, 2]}, progress=False, executor=dask_executor
        )
    finally:
        sim.set_program_limits(**previous)
    assert [p.valid for p in local_rows] == [False, False]
    assert "max_instructions" in local_rows[0].error
    assert rows_of(remote) == rows_of(local_rows)
    assert all(p.valid for p in sim.sweep(SMALL, grid={"kv_buffers": [1]}, executor=dask_executor))


def test_a_task_exception_is_raised_with_its_message(tmp_path, dask_executor):
    path = tmp_path / "machine.json"
    shutil.copy(MACHINES_DIR / "trn1.json", path)
    machine = sim.Machine.from_json(path)
    path.unlink()  # the workers load the machine from its path, now gone
    with pytest.raises(ValueError, match=r"machine\.json") as local_error:
        sim.sweep(SMALL, grid={"seed": [1]}, machine=machine, progress=False)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        for executor in (dask_executor, pool):
            with pytest.raises(ValueError) as remote_error:
                sim.sweep(SMALL, grid={"seed": [1, 2]}, machine=machine, executor=executor)
            assert str(remote_error.value) == str(local_error.value)


def test_executor_of_a_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"executor: expected a concurrent\.futures\.Executor"):
        sim.sweep(SMALL, grid={"seed": [1]}, executor="dask")
    with pytest.raises(
        TypeError, match=r"got type \(the class ThreadPoolExecutor; pass an instance\)"
    ):
        sim.sweep(SMALL, grid={"seed": [1]}, executor=concurrent.futures.ThreadPoolExecutor)
    with pytest.raises(TypeError, match="executor: expected"):
        sim.sweep(grid={"M": [128]}, kernel="matmul", executor=object())


def test_a_forking_process_pool_is_refused():
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        with pytest.raises(ValueError, match=r"executor: .*'fork' start method.*'spawn'"):
            sim.sweep(SMALL, grid={"seed": [1]}, executor=pool)


def test_a_dask_client_is_refused_with_a_hint(dask_executor):
    client = dask_executor._client
    with pytest.raises(TypeError, match=r"got Client \(.*client.get_executor\(\)\)"):
        sim.sweep(SMALL, grid={"seed": [1]}, executor=client)


# --- progress bar ---


def test_progress_true_shows_a_tqdm_bar(capsys):
    pytest.importorskip("tqdm")
    sim.sweep(SMALL, grid={"seed": [1, 2]}, progress=True)
    err = capsys.readouterr().err
    assert "sweep: 0/2 points |" in err  # shown from the start
    assert "sweep: 2/2 points |" in err and "points/s" in err
    assert err.endswith("\n")


def test_progress_bar_counts_executor_tasks(capsys):
    pytest.importorskip("tqdm")
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        sim.sweep(SMALL, grid={"seed": [1, 2, 3]}, progress=True, executor=pool)
    assert "sweep: 3/3 points |" in capsys.readouterr().err


def test_progress_false_and_short_sweeps_print_nothing(capsys):
    sim.sweep(SMALL, grid={"seed": [1, 2]}, progress=False)
    sim.sweep(SMALL, grid={"seed": [1, 2]})  # None: a bar only after 2 s
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_progress_without_tqdm_is_a_counter(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import tqdm.auto now fails
    sim.sweep(SMALL, grid={"seed": [1, 2]}, progress=True)
    err = capsys.readouterr().err
    assert "\rsweep: 2/2 points" in err and err.endswith("\n") and "|" not in err
    sim.sweep(SMALL, grid={"seed": [1]}, progress=False)
    sim.sweep(SMALL, grid={"seed": [1]})
    assert capsys.readouterr().err == ""
