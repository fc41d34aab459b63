"""tilelab.sim: machines, schedules, reports, the functional entry and parallel sweeps."""

import json
import math
import sys

import numpy as np
import pytest

import tilelab
from tilelab import sim

# A small batch keeps each simulation in milliseconds: 2 requests, 256 query rows,
# 4096 context tokens (2 large tiles of 2048).
SMALL = dict(prefill=[(128, 2048), (100, 1024)], decode=[1024], num_heads=4, num_kv_heads=2)


def test_sim_is_exported():
    assert tilelab.sim is sim
    for name in sim.__all__:
        assert getattr(sim, name).__doc__, f"{name} has no docstring"


# --- Machine ---


def test_presets_load_with_readable_fields():
    assert {"trn1", "trn2"} <= set(sim.Machine.presets())
    trn1, trn2 = sim.Machine.preset("trn1"), sim.Machine.preset("trn2")
    assert trn1.name == "trn1" and trn2.nc_version == 3
    assert trn1.partitions == 128
    assert trn1.dma_bytes_per_ns_per_engine > 0
    assert "dma_bytes_per_ns_per_engine" in trn1.fields
    assert trn1.to_dict()["source_of_key"]["partitions"]


def test_machine_overrides_change_the_simulation():
    machine = sim.Machine.preset("trn1")
    slow = machine.with_overrides(
        dma_bytes_per_ns_per_engine=machine.dma_bytes_per_ns_per_engine / 4
    )
    assert machine.overrides == {} and slow.overrides
    fast_report = sim.simulate_paged_attention_batch(machine=machine, **SMALL)
    slow_report = sim.simulate_paged_attention_batch(machine=slow, **SMALL)
    assert slow_report.total_time_ns > fast_report.total_time_ns
    machine.vector_clock_ghz = 0.5
    assert machine.vector_clock_ghz == 0.5
    assert machine.to_dict()["source_of_key"]["vector_clock_ghz"] == "override"
    # Inconsistent numbers are rejected with the reason (the clock must match the peak flops).
    with pytest.raises(ValueError, match="tensor_peak_bf16_tflops"):
        machine.tensor_clock_ghz = 1.0


def test_machine_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="name: expected one of"):
        sim.Machine.preset("trn9")
    machine = sim.Machine.preset("trn1")
    with pytest.raises(ValueError, match="dma_bytes_per_ns_per_engine"):
        machine.dma_bytes_per_ns_per_engine = -1.0
    assert machine.dma_bytes_per_ns_per_engine > 0  # a rejected override leaves the machine as is
    with pytest.raises(AttributeError, match="no_such_field"):
        machine.no_such_field = 1
    with pytest.raises(ValueError, match="name"):
        machine.with_overrides(name="other")
    with pytest.raises(ValueError, match="path"):
        sim.Machine.from_json(tmp_path / "missing.json")


def test_machine_from_json(tmp_path):
    # The preset's own JSON, with one number changed, loads as a file.
    preset = sim.Machine.preset("trn2")
    path = tmp_path / "mine.json"
    text = {
        "schema": "tilelab.machine",
        "schema_version": 1,
        "name": "mine",
        "description": "trn2 with faster DMA",
        "sources": {"t": "test"},
        "parameters": {
            key: {"value": value, "source": "t"}
            for key, value in preset.to_dict().items()
            if key not in ("name", "description", "source_of_key")
        },
    }
    text["parameters"]["dma_bytes_per_ns_per_engine"]["value"] = 40.0
    path.write_text(json.dumps(text))
    mine = sim.Machine.from_json(path)
    assert mine.name == "mine" and mine.dma_bytes_per_ns_per_engine == 40.0
    assert sim.simulate_paged_attention_batch(machine=str(path), **SMALL).machine == "mine"


# --- PagedAttentionSchedule ---


def test_schedule_defaults_and_derived_values():
    schedule = sim.PagedAttentionSchedule()
    assert (schedule.large_tile_size, schedule.block_size, schedule.kv_buffers) == (2048, 32, 2)
    # 2048 / 32 = 64 blocks per large tile: each block is cut in 2 to span 128 partitions.
    assert schedule.block_size_tiling_factor == 2 and schedule.tiled_block_size == 16
    assert sim.PagedAttentionSchedule.from_json(schedule.to_json()) == schedule
    assert schedule.replace(kv_buffers=3).kv_buffers == 3


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"block_size": 48}, r"block_size: expected a power of two"),
        ({"large_tile_size": 1000}, r"large_tile_size \(LARGE_TILE_SZ\): expected a multiple"),
        ({"partition_tile": 64}, r"partition_tile \(B_P_SIZE\): expected 128"),
        ({"kv_buffers": 9}, r"kv_buffers"),
        ({"transpose": "swap"}, r"transpose: expected 'pe' or 'dma', got 'swap'"),
    ],
)
def test_schedule_errors_explain_the_constraint(fields, message):
    with pytest.raises(ValueError, match=message):
        sim.PagedAttentionSchedule(**fields)


@pytest.mark.parametrize(
    "fields, name",
    [({"block_size": 32.0}, "block_size"), ({"mixed_precision": 1}, "mixed_precision")],
)
def test_schedule_type_errors_name_the_field(fields, name):
    with pytest.raises(TypeError, match=name):
        sim.PagedAttentionSchedule(**fields)


# --- shape-based simulation and Report ---


@pytest.fixture(scope="module")
def report():
    return sim.simulate_paged_attention_batch(**SMALL)


def test_report_summary_fields(report):
    summary = report.to_dict()
    assert set(report.summary_fields) == set(summary)
    for key in (
        "total_time_ns",
        "dma_utilization_percent",
        "dma_achieved_gbps",
        "tensor_active_time_percent",
        "dma_gather_average_bytes_per_partition",
        "peak_sbuf_bytes_per_partition",
        "peak_psum_bytes_per_partition",
        "mfu_percent",
        "critical_path_dma_ns",
    ):
        assert getattr(report, key) == summary[key]
        assert math.isfinite(summary[key])
    assert report.total_time_ns > 0
    # The report's nested JSON says the same.
    nested = report.to_json()
    assert nested["schema"] == "tilelab.sim_report"
    assert nested["total_time_ns"] == report.total_time_ns
    assert report.machine == "trn1" and report.kernel == "paged-attention"
    assert report.parameters["prefill"] == "128:2048,100:1024"
    assert {e["name"] for e in report.engines} >= {"tensor", "vector", "scalar"}
    assert sum(s["contributed_ns"] for s in report.critical_path) == pytest.approx(
        report.total_time_ns, rel=1e-6
    )
    assert "total" in str(report)
    with pytest.raises(AttributeError, match="no_such"):
        report.no_such_field  # noqa: B018


def test_report_timeline(report):
    timeline = report.timeline
    assert timeline.dtype.names[:4] == ("instruction", "unit", "engine", "opcode")
    assert len(timeline) == report.instruction_count
    assert (timeline["end_ns"] >= timeline["start_ns"]).all()
    assert timeline["end_ns"].max() == pytest.approx(report.total_time_ns)
    dma = timeline[timeline["is_dma"]]
    assert (dma["unit"] == "dma").all() and (dma["dma_bytes"] > 0).all()
    assert timeline["dma_bytes"].sum() == report.dma_transfer_total_bytes
    assert timeline["on_critical_path"].sum() == report.critical_path_instructions
    assert set(np.unique(timeline["wait_reason"])) <= {
        "none", "dependency", "port", "dma_engine", "hbm", "dma_trigger"
    }


def test_report_files(report, tmp_path):
    other = sim.simulate_paged_attention_batch(tiling_factor=1, **SMALL)
    report.save_html(tmp_path / "r.html", compare={"tiling_factor=1": other}, title="small")
    html = (tmp_path / "r.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "<svg" in html
    assert "tiling_factor=1" in html
    report.save_trace(tmp_path / "t.json")
    trace = json.loads((tmp_path / "t.json").read_text())
    assert trace["traceEvents"]
    report.save_json(tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["schema"] == "tilelab.sim_report"
    with pytest.raises(TypeError, match=r"compare\['x'\]"):
        report.save_html(tmp_path / "bad.html", compare={"x": 1})


def test_tiling_trick_raises_dma_utilization():
    with_trick = sim.simulate_paged_attention_batch(**SMALL)
    without = sim.simulate_paged_attention_batch(tiling_factor=1, **SMALL)
    assert with_trick.parameters["tiling_factor"] == "auto"
    assert without.parameters["tiling_factor"] == "1"
    # Cutting each block in pieces spreads one gather over all 128 partitions, so all 16 DMA
    # engines serve it (each engine serves 8 partitions).
    assert with_trick.dma_gather_engines_used > without.dma_gather_engines_used
    assert with_trick.dma_utilization_percent > without.dma_utilization_percent
    assert with_trick.total_time_ns < without.total_time_ns


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"head_dim": 256}, ValueError, "head_dim"),
        ({"dtype": "int8"}, ValueError, "dtype: expected 'bf16', 'fp16' or 'fp32'"),
        ({"tiling_factor": 3}, ValueError, "tiling_factor"),
        ({"tiling_factor": 0}, ValueError, "tiling_factor"),
        ({"num_heads": 2.0}, TypeError, "num_heads: expected an int"),
        ({"prefill": [(1, 2, 3)]}, TypeError, r"prefill\[0\]"),
        ({"prefill": [], "decode": []}, ValueError, "prefill, decode"),
        ({"machine": 3}, TypeError, "machine"),
        ({"schedule": {"block_size": 32}}, TypeError, "schedule"),
    ],
)
def test_simulation_errors_name_the_argument(kwargs, error, message):
    args = {**SMALL, **kwargs}
    with pytest.raises(error, match=message):
        sim.simulate_paged_attention_batch(**args)


def test_dma_transpose_needs_nc_v3():
    schedule = sim.PagedAttentionSchedule(transpose="dma")
    with pytest.raises(ValueError, match="transpose"):
        sim.simulate_paged_attention_batch(schedule=schedule, machine="trn1", **SMALL)
    report = sim.simulate_paged_attention_batch(schedule=schedule, machine="trn2", **SMALL)
    assert report.total_time_ns > 0


# --- array-based (functional) entry ---


def nki_inputs(rng, *, n_heads=2, n_kv_heads=1, d=32, seq_q=128, block_size=32, large=512,
               dtype=np.float32):
    num_active = large // block_size
    num_blocks = num_active + 3
    query = rng.standard_normal((1, n_heads, d, seq_q)).astype(dtype)
    key = rng.standard_normal((1, n_kv_heads, d, seq_q)).astype(dtype)
    value = rng.standard_normal((1, n_kv_heads, seq_q, d)).astype(dtype)
    kv_cache = rng.standard_normal((2, num_blocks, n_kv_heads, block_size, d)).astype(dtype)
    block_tables = rng.permutation(num_blocks)[:num_active].astype(np.int32)
    context = num_active * block_size
    mask = np.zeros((seq_q, context + seq_q), dtype=bool)
    mask[:, :context] = True
    mask[:, context:] = np.tril(np.ones((seq_q, seq_q), dtype=bool))
    return query, key, value, kv_cache, block_tables, mask


def reference(query, key, value, kv_cache, block_tables, mask):
    """fp64 attention over the natural-order mask."""
    _, n_heads, d, seq_q = query.shape
    n_kv_heads = key.shape[1]
    k_cache = kv_cache[0][block_tables].transpose(1, 0, 2, 3).reshape(n_kv_heads, -1, d)
    v_cache = kv_cache[1][block_tables].transpose(1, 0, 2, 3).reshape(n_kv_heads, -1, d)
    out = np.empty((1, n_heads, seq_q, d))
    for h in range(n_heads):
        g = h // (n_heads // n_kv_heads)
        keys = np.concatenate([k_cache[g], key[0, g].T]).astype(np.float64)
        values = np.concatenate([v_cache[g], value[0, g]]).astype(np.float64)
        scores = query[0, h].T.astype(np.float64) @ keys.T / np.sqrt(d)
        scores = np.where(mask, scores, -9984.0)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[0, h] = (p / p.sum(axis=1, keepdims=True)) @ values
    return out


@pytest.mark.parametrize("tiling_factor", [None, 1])
def test_functional_run_matches_reference(rng, tiling_factor):
    query, key, value, kv_cache, block_tables, mask = nki_inputs(rng)
    expected = reference(query, key, value, kv_cache, block_tables, mask)
    # The mask in the kernel's order (the NKI convention); this schedule's tiling factor is
    # 128 / (512 / 32) = 8, so the context columns are permuted.
    nki = pytest.importorskip("tilelab.nki")
    reordered = nki.reorder_context_mask(mask, 512, 32)
    report, output = sim.simulate_flash_paged_attention(
        query, key, value, kv_cache, block_tables, reordered, mixed_precision=False,
        LARGE_TILE_SZ=512, tiling_factor=tiling_factor,
    )
    assert output.shape == (1, 2, 128, 32) and output.dtype == np.float32
    np.testing.assert_allclose(output, expected, atol=2e-4, rtol=2e-4)
    assert report.total_time_ns > 0 and report.parameters["large_tile_size"] == "512"


def test_functional_run_bf16(rng):
    import ml_dtypes

    inputs = nki_inputs(rng, block_size=64, large=1024, dtype=ml_dtypes.bfloat16)
    query, key, value, kv_cache, block_tables, mask = inputs
    expected = reference(*inputs)
    nki = pytest.importorskip("tilelab.nki")
    reordered = nki.reorder_context_mask(mask, 1024, 64)
    schedule = sim.PagedAttentionSchedule(large_tile_size=1024, block_size=64)
    report, output = sim.simulate_flash_paged_attention(
        query, key, value, kv_cache, block_tables, reordered, schedule=schedule, machine="trn2"
    )
    assert output.dtype == ml_dtypes.bfloat16 and report.machine == "trn2"
    np.testing.assert_allclose(output.astype(np.float64), expected, atol=3e-2, rtol=3e-2)


def test_functional_errors_name_the_argument(rng):
    query, key, value, kv_cache, block_tables, mask = nki_inputs(rng)
    good = dict(query=query, key=key, value=value, kv_cache=kv_cache, block_tables=block_tables,
                mask=mask, LARGE_TILE_SZ=512)
    cases = [
        ({"query": query[0]}, ValueError, r"query: expected shape \(1, n_heads, d, seq_q\)"),
        ({"key": key.astype(np.float16)}, TypeError, "key: expected dtype float32"),
        ({"value": value[:, :, :64]}, ValueError, "value: expected shape"),
        ({"block_tables": block_tables + 100}, ValueError,
         r"block_tables: expected entries in \[0, 19\) \(kv_cache blocks\), got \d+ at index 0"),
        ({"block_tables": block_tables.astype(np.float32)}, TypeError, "block_tables"),
        ({"mask": mask[:, :-1]}, ValueError, "mask: expected shape"),
        ({"query": [1, 2]}, TypeError, "query: expected a numpy.ndarray"),
    ]
    for change, error, message in cases:
        with pytest.raises(error, match=message):
            sim.simulate_flash_paged_attention(**{**good, **change})
    schedule = sim.PagedAttentionSchedule(large_tile_size=512, block_size=64)
    with pytest.raises(ValueError, match="kv_cache: block_size"):
        sim.simulate_flash_paged_attention(**{**good, "LARGE_TILE_SZ": None}, schedule=schedule)
    with pytest.raises(ValueError, match="large_tile_size: 1024 disagrees"):
        sim.simulate_flash_paged_attention(
            **{**good, "LARGE_TILE_SZ": 1024},
            schedule=sim.PagedAttentionSchedule(large_tile_size=512),
        )


# --- sweep ---


def test_sweep_list_of_dicts_with_invalid_points():
    rows = sim.sweep(
        SMALL,
        grid={"block_size": [16, 32, 48], "kv_buffers": [1, 2]},
        progress=False,
    )
    assert isinstance(rows, list) and len(rows) == 6
    assert [(r["block_size"], r["kv_buffers"]) for r in rows][:2] == [(16, 1), (16, 2)]
    invalid = [r for r in rows if not r["valid"]]
    assert {r["block_size"] for r in invalid} == {48}
    assert all("block_size: expected a power of two" in r["error"] for r in invalid)
    assert all(math.isnan(r["total_time_ns"]) for r in invalid)
    valid = [r for r in rows if r["valid"]]
    assert all(r["error"] is None and r["total_time_ns"] > 0 for r in valid)
    # A sweep point equals the same single simulation.
    single = sim.simulate_paged_attention_batch(
        schedule=sim.PagedAttentionSchedule(block_size=16, kv_buffers=2), **SMALL
    )
    assert rows[1]["total_time_ns"] == single.total_time_ns
    assert set(single.summary_fields) <= set(rows[1])


def test_sweep_machines_and_overrides():
    rows = sim.sweep(
        SMALL,
        grid={
            "machine": ["trn1", sim.Machine.preset("trn2")],
            "machine.dma_bytes_per_ns_per_engine": [10.0, 40.0],
        },
    )
    assert [r["machine"] for r in rows] == ["trn1", "trn1", "trn2", "trn2"]
    assert rows[0]["total_time_ns"] > rows[1]["total_time_ns"]  # slower DMA, longer run
    assert all(r["valid"] for r in rows)


def test_sweep_is_deterministic_across_thread_counts(restore_num_threads):
    grid = {"large_tile_size": [1024, 2048], "tiling_factor": [None, 1]}
    tilelab.set_num_threads(1)
    one = sim.sweep(SMALL, grid=grid)
    tilelab.set_num_threads(2)
    two = sim.sweep(SMALL, grid=grid)
    assert [r["total_time_ns"] for r in one] == [r["total_time_ns"] for r in two]


def test_sweep_errors_name_the_key():
    with pytest.raises(ValueError, match="grid: unknown key 'blocksize'"):
        sim.sweep(grid={"blocksize": [1]})
    with pytest.raises(ValueError, match="base: unknown key 'nope'"):
        sim.sweep({"nope": 1})
    with pytest.raises(ValueError, match=r"grid\['seed'\]: expected at least one value"):
        sim.sweep(grid={"seed": []})


def test_sweep_progress_counter(capsys):
    sim.sweep(SMALL, grid={"seed": [1, 2]}, progress=True)
    assert "sweep: 2/2 points" in capsys.readouterr().err


def test_sweep_without_pandas(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    rows = sim.sweep(SMALL, grid={"seed": [1]})
    assert isinstance(rows, list)
    with pytest.raises(ImportError, match="pandas"):
        rows.to_pandas()
    with pytest.raises(ImportError, match="pandas"):
        sim.simulate_paged_attention_batch(**SMALL).to_dataframe()


def test_sweep_and_report_dataframes():
    pandas = pytest.importorskip("pandas")
    table = sim.sweep(SMALL, grid={"kv_buffers": [1, 2], "block_size": [32, 48]}).to_pandas()
    assert isinstance(table, pandas.DataFrame) and len(table) == 4
    assert table["valid"].tolist() == [True, False, True, False]
    assert table.loc[table.valid, "total_time_ns"].gt(0).all()
    frame = sim.simulate_paged_attention_batch(**SMALL).to_dataframe()
    assert len(frame) == 1 and "dma_utilization_percent" in frame.columns


# --- any registered kernel ---


def test_kernels_lists_the_registry():
    kernels = sim.kernels()
    assert {"paged-attention", "matmul"} <= set(kernels)
    matmul = kernels["matmul"]
    assert matmul["default_machine"] in sim.Machine.presets()
    assert "variant" in matmul["parameters"] and matmul["parameters"]["variant"]["help"]


def test_simulate_any_kernel():
    tiled = {"variant": "tiled", "M": 512, "K": 1024, "N": 1024}
    report = sim.simulate("matmul", tiled, machine="trn2")
    assert report.kernel == "matmul" and report.machine == "trn2"
    assert report.parameters["M"] == "512" and report.parameters["variant"] == "tiled"
    assert report.total_time_ns > 0 and report.tensor_instruction_count > 0
    bigger = sim.simulate("matmul", {**tiled, "M": 1024}, machine="trn2")
    assert bigger.total_time_ns > report.total_time_ns
    # The shape-based paged-attention entry and the generic one agree.
    batch = sim.simulate_paged_attention_batch(**SMALL)
    generic = sim.simulate(
        "paged-attention",
        {"prefill": "128:2048,100:1024", "decode": "1024", "num_heads": 4, "num_kv_heads": 2},
    )
    assert generic.total_time_ns == batch.total_time_ns
    assert generic.machine == "trn1"


def test_simulate_errors_name_the_kernel_and_parameter():
    with pytest.raises(ValueError, match=r"kernel 'nope': unknown; known kernels:.*matmul"):
        sim.simulate("nope")
    with pytest.raises(ValueError, match="kernel 'matmul': unknown parameter 'tile_q'"):
        sim.simulate("matmul", {"tile_q": 3})
    with pytest.raises(TypeError, match=r"params\['M'\]: expected a str, int, float or bool"):
        sim.simulate("matmul", {"M": [1]})
    with pytest.raises(TypeError, match="kernel: expected a kernel name"):
        sim.simulate(3)


def test_sweep_returns_typed_points_whether_or_not_pandas_imports(monkeypatch):
    with_pandas = sim.sweep(SMALL, grid={"kv_buffers": [1, 2]})
    monkeypatch.setitem(sys.modules, "pandas", None)
    without = sim.sweep(SMALL, grid={"kv_buffers": [1, 2]})
    for rows in (with_pandas, without):
        assert type(rows) is sim.SweepResult and all(type(p) is sim.SweepPoint for p in rows)
    point = without[1]
    assert point.settings == {"kv_buffers": 2} and point.valid and point.error is None
    total = point.metrics["total_time_ns"]
    assert total == point["total_time_ns"] == with_pandas[1]["total_time_ns"]
    assert point.to_dict()["kv_buffers"] == 2
    with pytest.raises(ImportError, match=r"SweepResult\.to_pandas needs pandas"):
        without.to_dataframe()


def test_sweep_any_kernel():
    rows = sim.sweep(
        {"variant": "tiled", "K": 1024, "N": 1024},
        grid={"M": [256, 512, 100], "machine": ["trn1", "trn2"]},
        kernel="matmul",
    )
    assert [(r["M"], r["machine"]) for r in rows][:2] == [(256, "trn1"), (256, "trn2")]
    assert [r.valid for r in rows] == [True, True, True, True, False, False]
    assert "M = 100 must be a positive multiple of 128" in rows[4].error
    single = sim.simulate(
        "matmul", {"variant": "tiled", "M": 512, "K": 1024, "N": 1024}, machine="trn2"
    )
    assert rows[3]["total_time_ns"] == single.total_time_ns
    assert rows[2]["total_time_ns"] > rows[0]["total_time_ns"]
    with pytest.raises(ValueError, match="grid: unknown key 'tile_q'"):
        sim.sweep(grid={"tile_q": [1]}, kernel="matmul")
    with pytest.raises(ValueError, match="kernel: unknown kernel 'nope'"):
        sim.sweep(kernel="nope")


def test_machine_fields_come_from_the_machine_key_table():
    table = {name: (kind, low, high) for name, kind, low, high in tilelab._core.SimMachine.fields()}
    machine = sim.Machine.preset("trn1")
    assert set(machine.fields) == {"name", "description", *table}
    assert table["partitions"] == ("integer", 1, 128)
    assert table["dma_efficiency_curve"][0] == "curve"
    assert "in [1, 128]" in type(machine).partitions.__doc__
    curve = machine.to_dict()["dma_efficiency_curve"]
    assert machine.dma_efficiency_curve == [list(p) for p in curve]
    copy = machine.with_overrides(dma_start_latency_ns=123.0)
    machine.dma_start_latency_ns = 7.0  # edits this machine only
    assert (machine.dma_start_latency_ns, copy.dma_start_latency_ns) == (7.0, 123.0)
    with pytest.raises(ValueError, match="key 'partitions': value 129 is out of range"):
        machine.partitions = 129
    assert machine.partitions == 128


def test_report_fields_are_properties_with_units(report):
    units = sim.Report.metric_units()
    assert list(units) == report.summary_fields
    assert units["total_time_ns"] == "ns" and units["dma_utilization_percent"] == "percent"
    assert units["tensor_instruction_count"] == "count" and units["dma_achieved_gbps"] == "GB/s"
    assert isinstance(sim.Report.total_time_ns, property)
    assert "[ns]" in sim.Report.total_time_ns.__doc__
    assert report.total_time_cycles == pytest.approx(report.to_json()["total_time_cycles"])
    with pytest.raises(AttributeError):
        report.total_cycles  # noqa: B018 (the old name is gone)
