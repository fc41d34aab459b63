"""Report.to_parquet: the Instruction and DmaPacket profile tables, read back with pyarrow and
queried with DuckDB; every number is checked against the report's own timeline and DMA
summaries."""

import collections
import json
import os
import sys

import numpy as np
import pytest

from tilelab import sim

pyarrow = pytest.importorskip("pyarrow")
parquet = pytest.importorskip("pyarrow.parquet")

SMALL = dict(prefill=[(128, 1024)], decode=[512, 300], num_heads=2, num_kv_heads=1)


def functional_report():
    """A run on numbers (simulate_flash_paged_attention): one large tile of 16 blocks of 32."""
    rng = np.random.default_rng(5)
    d, seq_q, blocks, block_size = 32, 128, 16, 32
    query = rng.standard_normal((1, 2, d, seq_q)).astype(np.float32)
    key = rng.standard_normal((1, 1, d, seq_q)).astype(np.float32)
    value = rng.standard_normal((1, 1, seq_q, d)).astype(np.float32)
    kv_cache = rng.standard_normal((2, blocks, 1, block_size, d)).astype(np.float32)
    block_tables = rng.permutation(blocks).astype(np.int32)
    mask = np.ones((seq_q, blocks * block_size + seq_q), dtype=bool)
    report, _ = sim.simulate_flash_paged_attention(
        query, key, value, kv_cache, block_tables, mask, LARGE_TILE_SZ=512
    )
    return report


@pytest.fixture(scope="module", params=["paged_batch", "matmul", "functional"])
def report(request):
    if request.param == "paged_batch":
        return sim.simulate_paged_attention_batch(**SMALL)
    if request.param == "functional":
        return functional_report()
    return sim.simulate("matmul", {"variant": "tiled", "M": 256, "K": 256, "N": 512})


@pytest.fixture(scope="module")
def tables(report, tmp_path_factory):
    directory = tmp_path_factory.mktemp("profile") / "nested" / "tables"  # created when missing
    paths = report.to_parquet(directory)
    return paths, parquet.read_table(paths[0]), parquet.read_table(paths[1])


def test_writes_two_files_named_as_neurons_tables(report, tables):
    paths, _, _ = tables
    assert [os.path.basename(p) for p in paths] == ["Instruction.parquet", "DmaPacket.parquet"]
    assert all(os.path.isabs(p) and os.path.isfile(p) for p in paths)
    for path in paths:
        metadata = parquet.read_schema(path).metadata
        assert metadata[b"tilelab.kernel"].decode() == report.kernel
        assert metadata[b"tilelab.machine"].decode() == report.machine
        assert json.loads(metadata[b"tilelab.parameters"]) == report.parameters
    again = report.to_parquet(os.path.dirname(paths[0]))  # files are replaced
    assert again == paths
    assert parquet.read_table(again[1]).equals(tables[2])


def test_instruction_table_is_the_timeline(report, tables):
    _, instructions, _ = tables
    timeline = report.timeline
    assert instructions.num_rows == len(timeline)
    assert instructions.num_rows == report.instruction_count
    per_engine = collections.Counter(instructions["engine"].to_pylist())
    assert {
        e["name"]: e["instruction_count"] for e in report.engines if e["instruction_count"]
    } == (dict(per_engine))
    rows = instructions.to_pydict()
    assert rows["id"] == list(range(len(timeline)))
    assert rows["engine"] == timeline["engine"].tolist()
    assert rows["timeline_track"] == timeline["unit"].tolist()
    assert rows["opcode"] == timeline["opcode"].tolist()
    assert rows["start_ts"] == timeline["start_ns"].tolist()
    assert rows["end_ts"] == timeline["end_ns"].tolist()
    assert rows["issue_end_ts"] == timeline["issue_end_ns"].tolist()
    np.testing.assert_allclose(rows["duration_ns"], timeline["end_ns"] - timeline["start_ns"])
    assert rows["wait_reason"] == timeline["wait_reason"].tolist()
    assert rows["wait_on"] == [None if w < 0 else w for w in timeline["wait_on"].tolist()]
    assert rows["on_critical_path"] == timeline["on_critical_path"].tolist()
    assert rows["is_dma"] == timeline["is_dma"].tolist()
    dma = timeline["is_dma"]
    for name, expected in (
        ("queue_idx", timeline["dma_queue"]),
        ("transfer_bytes", timeline["dma_bytes"]),
        ("dma_trigger_start_ts", timeline["transfer_start_ns"]),
        ("dma_trigger_end_ts", timeline["end_ns"]),
    ):
        assert rows[name] == [
            v if d else None for v, d in zip(expected.tolist(), dma, strict=True)
        ], name
    for name in ("partitions", "bytes_per_partition", "source", "dest", "dma_wait_time_ns"):
        assert all((v is None) == (not d) for v, d in zip(rows[name], dma, strict=True)), name
    # pc: the instruction's index in its engine's queue.
    seen = collections.Counter()
    for engine, pc in zip(rows["engine"], rows["pc"], strict=True):
        assert pc == seen[engine]
        seen[engine] += 1
    # The built-in C++ kernels have no source lines.
    assert rows["nki_source_location"] == [None] * len(timeline)
    assert instructions.schema.field("nki_source_location").type == pyarrow.string()


def test_dma_columns_agree_with_the_report(report, tables):
    _, instructions, _ = tables
    rows = instructions.to_pydict()
    dma = [i for i, d in enumerate(rows["is_dma"]) if d]
    for i in dma:
        assert rows["partitions"][i] * rows["bytes_per_partition"][i] == rows["transfer_bytes"][i]
        assert rows["source"][i] in ("hbm", "sbuf", "psum")
        assert rows["dest"][i] in ("hbm", "sbuf", "psum")
    assert sum(rows["hbm_read_bytes"]) == report.hbm_read_bytes
    assert sum(rows["hbm_write_bytes"]) == report.hbm_write_bytes
    # Per DMA kind: transfers, bytes and mean bytes per partition as the report's DMA section.
    for kind in report.dma_by_kind:
        of_kind = [i for i in dma if rows["opcode"][i] == kind["kind"]]
        assert len(of_kind) == kind["transfers"]
        assert sum(rows["transfer_bytes"][i] for i in of_kind) == kind["bytes"]
        mean = np.mean([rows["bytes_per_partition"][i] for i in of_kind])
        assert mean == pytest.approx(kind["average_bytes_per_partition"])
    assert len(dma) == report.dma_transfer_count


def test_dma_packet_table_holds_every_piece(report, tables):
    _, instructions, packets = tables
    timeline = report.timeline
    rows = packets.to_pydict()
    assert sum(rows["transfer_bytes"]) == report.dma_transfer_total_bytes
    assert rows["id"] == list(range(packets.num_rows))
    assert set(rows["instruction_id"]) == set(np.flatnonzero(timeline["is_dma"]).tolist())
    engines = report.to_json()["dma"]["engines"]
    assert packets.num_rows == sum(e["pieces"] for e in engines)
    pieces_per_engine = collections.Counter(rows["engine_idx"])
    bytes_per_engine = collections.Counter()
    for engine, count in zip(rows["engine_idx"], rows["transfer_bytes"], strict=True):
        bytes_per_engine[engine] += count
    for e in engines:
        assert pieces_per_engine[e["engine"]] == e["pieces"]
        assert bytes_per_engine[e["engine"]] == e["bytes"]
    by_instruction = collections.defaultdict(list)
    for i, owner in enumerate(rows["instruction_id"]):
        by_instruction[owner].append(i)
    for owner, pieces in by_instruction.items():
        row = timeline[owner]
        assert [rows["packet_idx"][i] for i in pieces] == list(range(len(pieces)))
        assert sum(rows["transfer_bytes"][i] for i in pieces) == row["dma_bytes"]
        assert (
            sum(rows["partitions"][i] for i in pieces) == instructions["partitions"][owner].as_py()
        )
        assert min(rows["start_ts"][i] for i in pieces) == row["transfer_start_ns"]
        assert max(rows["end_ts"][i] for i in pieces) == row["end_ns"]
        for i in pieces:
            assert rows["queue_idx"][i] == row["dma_queue"]
            assert rows["opcode"][i] == row["opcode"]
            assert rows["duration_ns"][i] == pytest.approx(rows["end_ts"][i] - rows["start_ts"][i])
            assert rows["throughput"][i] == pytest.approx(
                rows["transfer_bytes"][i] / rows["duration_ns"][i] * 1e9
            )
    assert rows["nki_source_location"] == [None] * packets.num_rows


def test_duckdb_small_transfers_by_queue_and_source(report, tables):
    duckdb = pytest.importorskip("duckdb")
    (instruction_path, packet_path), _, _ = tables
    # DMA transfers under 512 B per partition, by queue and source.
    small = duckdb.sql(
        f"""
        SELECT queue_idx, source, count(DISTINCT instruction_id) AS transfers,
               sum(transfer_bytes) AS bytes
        FROM read_parquet('{packet_path}')
        WHERE bytes_per_partition < 512
        GROUP BY queue_idx, source ORDER BY queue_idx, source
        """
    ).fetchall()
    # The report's histogram of bytes per partition has power-of-two buckets [min, max).
    histogram = report.to_json()["dma"]["bytes_per_partition_histogram"]
    below = [b for b in histogram if b["bytes_per_partition_max"] <= 512]
    assert sum(t for _, _, t, _ in small) == sum(b["transfers"] for b in below)
    assert sum(b for _, _, _, b in small) == sum(b["bytes"] for b in below)
    # Every DMA by queue: the report's queue table and the timeline.
    by_queue = duckdb.sql(
        f"""
        SELECT queue_idx, count(*) AS transfers, sum(transfer_bytes) AS bytes
        FROM read_parquet('{instruction_path}') WHERE is_dma GROUP BY queue_idx ORDER BY queue_idx
        """
    ).fetchall()
    queues = report.to_json()["dma"]["queues"]
    assert by_queue == [(q["queue"], q["transfers"], q["bytes"]) for q in queues]
    timeline = report.timeline[report.timeline["is_dma"]]
    from_timeline = sorted(
        (
            int(q),
            int((timeline["dma_queue"] == q).sum()),
            int(timeline["dma_bytes"][timeline["dma_queue"] == q].sum()),
        )
        for q in set(timeline["dma_queue"].tolist())
    )
    assert by_queue == from_timeline
    # The two tables join on the instruction: pieces add up to their transfer.
    mismatched = duckdb.sql(
        f"""
        SELECT i.id FROM read_parquet('{instruction_path}') i
        JOIN read_parquet('{packet_path}') p ON p.instruction_id = i.id
        GROUP BY i.id, i.transfer_bytes HAVING sum(p.transfer_bytes) <> i.transfer_bytes
        """
    ).fetchall()
    assert mismatched == []


def test_directory_errors_name_the_argument(report, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(NotADirectoryError, match=r"directory: '.*a_file' is a file"):
        report.to_parquet(a_file)
    with pytest.raises(OSError, match=r"directory: cannot create '.*a_file/below'"):
        report.to_parquet(a_file / "below")
    # /proc/self exists and takes no new files, even for root.
    with pytest.raises(OSError, match=r"directory: cannot write '/proc/self/Instruction\.parquet'"):
        report.to_parquet("/proc/self")
    if os.geteuid() != 0:
        read_only = tmp_path / "read_only"
        read_only.mkdir(mode=0o500)
        with pytest.raises(PermissionError, match="directory: cannot write"):
            report.to_parquet(read_only)
    with pytest.raises(TypeError, match="directory: expected a path"):
        report.to_parquet(3)


def test_without_pyarrow(report, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(
        ImportError, match=r"Report\.to_parquet needs pyarrow \(pip install pyarrow\)"
    ):
        report.to_parquet(tmp_path)
    assert list(tmp_path.iterdir()) == []
