"""Bad input to tilelab.sim: every case is a TypeError or ValueError naming the argument, the
value and what is allowed; none crashes the interpreter, runs out of memory or is silently
replaced by another value."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from tilelab import sim

SCHEDULE_HEADER = '{"schema": "tilelab.paged_attention_schedule", "schema_version": 1, '


# --- request lengths ---


@pytest.mark.parametrize(
    ("batch", "error", "pattern"),
    [
        (
            {"decode": [2**63 - 1]},
            ValueError,
            r"decode\[0\]: context length 9223372036854775807 .*limit of 1073741824 tokens",
        ),
        ({"decode": [10**12]}, ValueError, r"decode\[0\]: context length 1000000000000"),
        (
            {"decode": [2**64]},
            ValueError,
            r"decode\[0\]: expected an int in \[-2\*\*63, 2\*\*63\), got 18446744073709551616",
        ),
        (
            {"prefill": [(2**63 - 1, 0)]},
            ValueError,
            r"prefill\[0\]: query length 9223372036854775807 .*limit of 1048576",
        ),
        ({"decode": [1.5]}, TypeError, r"decode\[0\]: expected an int, got float"),
        ({"decode": [True]}, TypeError, r"decode\[0\]: expected an int, got bool"),
    ],
    ids=[
        "decode_2_63",
        "decode_1e12",
        "decode_2_64",
        "prefill_2_63",
        "decode_float",
        "decode_bool",
    ],
)
def test_request_lengths_are_checked_before_allocating(batch, error, pattern):
    with pytest.raises(error, match=pattern):
        sim.simulate_paged_attention_batch(**batch)


def test_a_sweep_point_with_an_overflowing_length_is_invalid_not_a_crash():
    points = sim.sweep(grid={"decode": [[2**63 - 1], [512]]}, progress=False)
    assert not points[0].valid
    assert "decode[0]: context length 9223372036854775807" in points[0].error
    assert points[1].valid


def test_query_rows_are_padded_as_the_kernel_requires():
    # 512 + 2 rows: padded to 640 they were rejected with an error about seq_q; 1024 fits.
    prefill, decode = sim.default_batch()
    report = sim.simulate_paged_attention_batch(prefill=[*prefill, (2, 0)], decode=decode)
    assert report.parameters["query_len"] == "1024"


# --- softmax_scale and block tables of the array entry ---


def nki_arrays(rng, *, d=32, seq_q=128, block_size=32, large=512):
    num_active = large // block_size
    num_blocks = num_active + 3
    query = rng.standard_normal((1, 2, d, seq_q)).astype(np.float32)
    key = rng.standard_normal((1, 1, d, seq_q)).astype(np.float32)
    value = rng.standard_normal((1, 1, seq_q, d)).astype(np.float32)
    kv_cache = rng.standard_normal((2, num_blocks, 1, block_size, d)).astype(np.float32)
    block_tables = rng.permutation(num_blocks)[:num_active].astype(np.int64)
    context = num_active * block_size
    mask = np.zeros((seq_q, context + seq_q), dtype=bool)
    mask[:, :context] = True
    mask[:, context:] = np.tril(np.ones((seq_q, seq_q), dtype=bool))
    return {
        "query": query,
        "key": key,
        "value": value,
        "kv_cache": kv_cache,
        "block_tables": block_tables,
        "mask": mask,
    }


def attention(arrays, scale):
    """fp64 attention with `scale` (one kv head, natural-order mask)."""
    query, key, value = arrays["query"], arrays["key"], arrays["value"]
    kv_cache, block_tables, mask = arrays["kv_cache"], arrays["block_tables"], arrays["mask"]
    d = query.shape[2]
    keys = np.concatenate([kv_cache[0][block_tables, 0].reshape(-1, d), key[0, 0].T])
    values = np.concatenate([kv_cache[1][block_tables, 0].reshape(-1, d), value[0, 0]])
    out = np.empty((1, query.shape[1], query.shape[3], d))
    for h in range(query.shape[1]):
        scores = np.where(mask, scale * query[0, h].T.astype(np.float64) @ keys.T, -np.inf)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[0, h] = (p / p.sum(axis=1, keepdims=True)) @ values
    return out


@pytest.mark.parametrize("scale", [-0.5, 0.0, 0.05])
def test_a_given_softmax_scale_is_honoured(scale):
    # It was replaced by 1/sqrt(d) when <= 0, unlike the CPU kernel.
    arrays = nki_arrays(np.random.default_rng(3))
    _, out = sim.simulate_flash_paged_attention(
        **arrays, softmax_scale=scale, mixed_precision=False, LARGE_TILE_SZ=512
    )
    np.testing.assert_allclose(out, attention(arrays, scale), atol=2e-5)


@pytest.mark.parametrize(
    ("scale", "error", "pattern"),
    [
        (math.nan, ValueError, "softmax_scale: expected a finite value, got nan"),
        (math.inf, ValueError, "softmax_scale: expected a finite value, got inf"),
        (1e300, ValueError, "softmax_scale: expected a finite value, got inf"),
        (10**400, ValueError, r"softmax_scale: expected a finite value, got a huge int"),
        (True, TypeError, "softmax_scale: expected a float or None, got bool"),
        ("0.1", TypeError, "softmax_scale: expected a float or None, got str"),
        (1 + 2j, TypeError, "softmax_scale: expected a float or None, got complex"),
    ],
    ids=["nan", "inf", "1e300", "10_400", "bool", "str", "complex"],
)
def test_an_unusable_softmax_scale_is_rejected(scale, error, pattern):
    arrays = nki_arrays(np.random.default_rng(3))
    with pytest.raises(error, match=pattern):
        sim.simulate_flash_paged_attention(**arrays, softmax_scale=scale, LARGE_TILE_SZ=512)
    with pytest.raises(error, match=pattern):
        sim.simulate_paged_attention_batch(softmax_scale=scale, decode=[512])


def test_block_table_entries_beyond_int32_are_rejected_not_wrapped():
    arrays = nki_arrays(np.random.default_rng(3))
    arrays["block_tables"] = arrays["block_tables"] + np.int64(2**32)
    with pytest.raises(ValueError, match=r"block_tables: expected values that fit int32"):
        sim.simulate_flash_paged_attention(**arrays, LARGE_TILE_SZ=512)
    arrays["block_tables"] = arrays["block_tables"] - np.int64(2**32) - 1
    with pytest.raises(ValueError, match=r"block_tables: expected entries in \[0, 19\)"):
        sim.simulate_flash_paged_attention(**arrays, LARGE_TILE_SZ=512)


@pytest.mark.parametrize(
    ("arguments", "error", "pattern"),
    [
        ({"LARGE_TILE_SZ": "abc"}, TypeError, "LARGE_TILE_SZ: expected an int, got str 'abc'"),
        ({"LARGE_TILE_SZ": 512.9}, TypeError, "LARGE_TILE_SZ: expected an int, got float 512.9"),
        (
            {"mixed_precision": "False"},
            TypeError,
            "mixed_precision: expected a bool, got str 'False'",
        ),
        ({"mixed_precision": 1}, TypeError, "mixed_precision: expected a bool, got int 1"),
    ],
    ids=["tile_str", "tile_float", "mixed_str", "mixed_int"],
)
def test_kernel_options_are_exactly_ints_and_bools(arguments, error, pattern):
    arrays = nki_arrays(np.random.default_rng(3))
    with pytest.raises(error, match=pattern):
        sim.simulate_flash_paged_attention(**{"LARGE_TILE_SZ": 512, **arrays, **arguments})
    schedule = sim.PagedAttentionSchedule(large_tile_size=512)
    with pytest.raises(error, match=pattern):
        sim.simulate_flash_paged_attention(**arrays, schedule=schedule, **arguments)


# --- schedule and machine JSON ---


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        (
            '{"schema": "tilelab.paged_attention_schedule", "schema_version": 1.9}',
            "schema_version: expected 1, got 1.9",
        ),
        (
            SCHEDULE_HEADER + '"kv_buffers": 4294967298}',
            r"kv_buffers: expected an integer in \[1, 4\], got 4294967298",
        ),
        (
            SCHEDULE_HEADER + '"transpose": ' + "[" * 100000 + "]" * 100000 + "}",
            "JSON nested more than 64 levels deep",
        ),
        (
            SCHEDULE_HEADER + '"kv_buffers": 2, "kv_buffers": 3}',
            "key 'kv_buffers' appears twice in one object",
        ),
        ("nonsense", r"malformed JSON: parse error at line 1, column 2"),
        ("/nonexistent/schedule.json", "text: no schedule JSON file at '/nonexistent/schedule"),
    ],
    ids=[
        "version_1_9",
        "kv_buffers_2_32",
        "deep_transpose",
        "duplicate_key",
        "not_json",
        "missing_path",
    ],
)
def test_bad_schedule_json_is_named(text, pattern):
    with pytest.raises(ValueError, match=pattern) as raised:
        sim.PagedAttentionSchedule.from_json(text)
    assert "json.exception" not in str(raised.value)


def test_schedule_integers_are_not_truncated():
    with pytest.raises(ValueError, match=r"kv_buffers: expected an integer in \[1, 4\]"):
        sim.PagedAttentionSchedule(kv_buffers=2**32 + 2)


@pytest.mark.parametrize(
    ("field", "value", "error", "pattern"),
    [
        (
            "tensor_clock_ghz",
            math.nan,
            ValueError,
            "tensor_clock_ghz: expected a finite number, a bool or a list of numbers, got nan",
        ),
        ("tensor_clock_ghz", object(), TypeError, "tensor_clock_ghz: expected a finite number"),
        (
            "tensor_clock_ghz",
            10**400,
            ValueError,
            "tensor_clock_ghz: invalid JSON value: number overflow",
        ),
        ("partitions", True, ValueError, "key 'partitions': expected an integer, got true"),
        (
            "dma_efficiency_curve",
            json.loads("[" * 900 + "]" * 900),
            ValueError,
            "dma_efficiency_curve: JSON nested more than 64 levels deep",
        ),
    ],
    ids=["nan", "object", "10_400", "bool_integer", "deep_list"],
)
def test_bad_machine_values_are_named(field, value, error, pattern):
    machine = sim.Machine.preset("trn1")
    with pytest.raises(error, match=pattern) as raised:
        setattr(machine, field, value)
    assert "json.exception" not in str(raised.value)
    assert len(str(raised.value)) < 400


def test_a_directory_is_not_a_machine_file(tmp_path):
    with pytest.raises(ValueError, match="is a directory, expected a preset or a JSON file"):
        sim.Machine(os.fspath(tmp_path))


def test_a_machine_file_with_a_key_twice_is_rejected(tmp_path):
    source = (Path(__file__).parents[2] / "sim" / "machines" / "trn1.json").read_text()
    path = tmp_path / "twice.json"
    path.write_text(
        source.replace('"schema_version": 1', '"schema_version": 1, "schema_version": 1')
    )
    with pytest.raises(ValueError, match="key 'schema_version' appears twice in one object"):
        sim.Machine.from_json(path)


# --- program size ---


def test_program_size_is_limited_and_the_limit_can_be_raised():
    huge = {"variant": "tiled", "M": 65536, "K": 65536, "N": 65536}
    with pytest.raises(ValueError, match=r"more than 1073741824 elements \(max_buffer_elements"):
        sim.simulate("matmul", huge)
    previous = sim.set_program_limits(max_instructions=100)
    try:
        assert sim.program_limits()["max_instructions"] == 100
        with pytest.raises(ValueError, match=r"more than 100 instructions \(max_instructions\)"):
            sim.simulate("matmul", {"variant": "tiled"})
    finally:
        sim.set_program_limits(**previous)
    assert sim.program_limits() == previous
    with pytest.raises(ValueError, match=r"max_instructions: expected an int in \[1, 2\*\*64\)"):
        sim.set_program_limits(max_instructions=0)
    with pytest.raises(TypeError, match="max_buffer_elements: expected an int, got bool"):
        sim.set_program_limits(max_buffer_elements=True)


# --- report files ---


def test_report_write_errors_name_the_path(tmp_path):
    report = sim.simulate("matmul", {"variant": "tiled", "M": 128, "K": 256, "N": 512})
    with pytest.raises(ValueError, match="path: cannot write '/dev/full': No space left on device"):
        report.save_trace("/dev/full")
    with pytest.raises(ValueError, match=r"cannot write '.*missing/t\.json': No such file"):
        report.save_trace(tmp_path / "missing" / "t.json")
    report.save_html(tmp_path / "r.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]
